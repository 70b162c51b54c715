"""msgpu_verify: prove a provisioned host works.

Commands (``python -m msgpu_verify <command>``): ``judge`` (MindSpore's run_check plus an independent
computation, classified into one verdict), ``warmup`` (the first CUDA context once per host and user, so
the driver's JIT compilation of MindSpore's kernels is timed on its own), ``gpu-smoke`` (GPU probe, first
and second CUDA context, judge and a quick benchmark in one JSON), ``mnist`` (prepare the MNIST layout MindSpore reads),
``bench`` (the seed's LeNet5 training, measured), ``distributed`` (data-parallel LeNet5 under mpirun),
``serving`` (the trained LeNet5 as a MindSpore Serving servable, queried with the client), ``report``
(Markdown + self-contained HTML over many hosts) and ``seed`` (the seed's ``main.py`` command line on top
of the fast harness).

Runs on Python 3.8 (the MindSpore venv on Ubuntu 20.04) and newer. MindSpore, Serving and numpy are
imported only inside child processes.
"""

from __future__ import annotations

__version__ = "0.1.0"
