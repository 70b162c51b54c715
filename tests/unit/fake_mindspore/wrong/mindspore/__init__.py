"""Fake MindSpore: wrong (see fakems_base)."""

from fakems_base import install

install(globals(), "wrong")
