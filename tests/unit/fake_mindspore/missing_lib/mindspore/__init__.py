"""Fake MindSpore that needs cuDNN 7 at import, like mindspore-gpu built for CUDA 10.1: a real OSError."""

import ctypes

ctypes.CDLL("libcudnn.so.7")
__version__ = "1.5.1"
