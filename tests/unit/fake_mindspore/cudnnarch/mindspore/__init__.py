"""Fake MindSpore: cudnnarch (see fakems_base): cuDNN refuses the GPU's architecture (CUDNN_STATUS_ARCH_MISMATCH)."""

from fakems_base import install

install(globals(), "cudnnarch")
