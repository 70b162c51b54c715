"""Fake MindSpore: nokernel (see fakems_base): no kernel image for the GPU (cudaErrorNoKernelImageForDevice)."""

from fakems_base import install

install(globals(), "nokernel")
