"""Fake MindSpore: ok (see fakems_base)."""

from fakems_base import install

install(globals(), "ok")
