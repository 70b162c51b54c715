"""Fake MindSpore: nogpu (see fakems_base)."""

from fakems_base import install

install(globals(), "nogpu")
