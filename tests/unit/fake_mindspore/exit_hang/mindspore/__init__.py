"""Fake MindSpore: exit_hang (see fakems_base)."""

from fakems_base import install

install(globals(), "exit_hang")
