"""Fake MindSpore: jit (see fakems_base): the first GPU operation compiles unless the kernel cache has it."""

from fakems_base import install

install(globals(), "jit")
