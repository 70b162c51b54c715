"""Fake MindSpore 2.0.0: noplugin (see fakems_base)."""

from fakems_base import install

install(globals(), "noplugin", "2.0.0")
