"""Fake MindSpore 2.0.0: ok (see fakems_base)."""

from fakems_base import install

install(globals(), "ok", "2.0.0")
