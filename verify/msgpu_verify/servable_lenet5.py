"""MindSpore Serving servable for the benchmark's LeNet5 (deployed as <servables>/lenet5/servable_config.py).

Method ``predict_digit``: input ``image``, the 784 raw bytes of one MNIST test image (28x28, row-major, as in the
IDX file); outputs ``digit`` (top-1 class, int) and ``score`` (its softmax probability, float).

Its Python stages, ``preprocess`` and ``postprocess``, live beside this file in lenet5_pipeline.py (numpy only:
servable_lenet5_pipeline.py in the package), so that `python -m msgpu_verify serving` can run them around the
MindIR without Serving installed. This file loads that one by its path, under a module name of its own: that works
however this file is imported - Serving's worker appends the servables' folder to sys.path and imports
``lenet5.servable_config`` (a namespace package), the check imports it as ``servable_config`` - and whatever
else is on sys.path. Serving keys a Python stage by ``<servable folder>.<function __name__>`` and keeps the
function object itself, in the worker process that imported this file, so functions defined in another module
are stages like any other.

Serving imports this file itself; nothing here may depend on the msgpu_verify package.
"""

import importlib.util
import os
import sys

from mindspore_serving.server import register

PIPELINE_FILE = "lenet5_pipeline.py"
PIPELINE_MODULE = "lenet5_servable_pipeline"


def _load_pipeline():
    """lenet5_pipeline.py from this file's folder, freshly executed, registered as PIPELINE_MODULE."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), PIPELINE_FILE)
    if not os.path.isfile(path):
        raise RuntimeError(f"{path} is missing: the servable's pre/post-processing is deployed beside {__file__}")
    spec = importlib.util.spec_from_file_location(PIPELINE_MODULE, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[PIPELINE_MODULE] = module
    spec.loader.exec_module(module)
    return module


_pipeline = _load_pipeline()
preprocess = _pipeline.preprocess
postprocess = _pipeline.postprocess

model = register.declare_model(model_file="lenet5.mindir", model_format="MindIR", with_batch_dim=True)


@register.register_method(output_names=["digit", "score"])
def predict_digit(image):
    x = register.add_stage(preprocess, image, outputs_count=1)
    x = register.add_stage(model, x, outputs_count=1)
    digit, score = register.add_stage(postprocess, x, outputs_count=2)
    return digit, score
