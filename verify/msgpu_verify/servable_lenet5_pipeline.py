"""Pre- and post-processing of the LeNet5 servable, numpy only (deployed as <servables>/lenet5/lenet5_pipeline.py).

The servable's config (servable_lenet5.py, deployed as servable_config.py beside this file) loads this file by its
path and hands ``preprocess`` and ``postprocess`` to Serving as Python stages; `python -m msgpu_verify serving` runs
the same file's functions around the exported MindIR on the CPU (its ``pipeline`` step), which therefore needs
MindSpore and numpy but not MindSpore Serving.

``preprocess``: the 784 raw bytes of one MNIST test image (28x28, row-major, as in the IDX file) -> the tensor the
benchmark trained on (msgpu_verify.lenet: MindSpore's Resize 28->32, bilinear, then Rescale 1/(255*0.3081) and
shift -0.1307/0.3081), in numpy only: a bilinear resize with half-pixel centres and edge replication (OpenCV's
INTER_LINEAR, which MindSpore's Resize runs), rounded back to uint8 like Resize's uint8 output. OpenCV's
fixed-point arithmetic can differ by one grey level on a few pixels; the check measures the largest difference
against the benchmark's own tensors and the accuracy of this exact pipeline. Padding 28->32 instead would shrink
the digits the network learned at full size. ``postprocess``: logits -> top-1 digit and its softmax probability.

Deployed alone: nothing here may depend on the msgpu_verify package or on MindSpore Serving.
"""

import numpy as np

SIDE_IN = 28
SIDE_OUT = 32
MEAN = 0.1307
STD = 0.3081


def _taps(size_in, size_out):
    """Source indices and weights of a 1-D bilinear resize (half-pixel centres, edges replicated)."""
    centre = (np.arange(size_out, dtype=np.float64) + 0.5) * (size_in / size_out) - 0.5
    low = np.floor(centre)
    weight = centre - low
    low = low.astype(np.int64)
    return np.clip(low, 0, size_in - 1), np.clip(low + 1, 0, size_in - 1), weight


def _raw_pixels(image):
    """The image as a flat uint8 array, whatever form Serving hands the bytes in (bytes, uint8 or bytes_ array)."""
    if isinstance(image, (bytes, bytearray, memoryview)):
        flat = np.frombuffer(bytes(image), dtype=np.uint8)
    else:
        array = np.asarray(image)
        flat = array.reshape(-1) if array.dtype == np.uint8 else np.frombuffer(array.tobytes(), dtype=np.uint8)
    if flat.size != SIDE_IN * SIDE_IN:
        raise ValueError(
            f"image: expected {SIDE_IN * SIDE_IN} raw bytes (one 28x28 MNIST image, uint8), got {flat.size}"
        )
    return flat


def preprocess(image):
    """784 raw bytes -> float32 (1, 32, 32) in C order: bilinear resize to 32x32, uint8 rounding, (x/255 - mean)/std."""
    pixels = _raw_pixels(image).reshape(SIDE_IN, SIDE_IN).astype(np.float64)
    y0, y1, wy = _taps(SIDE_IN, SIDE_OUT)
    x0, x1, wx = _taps(SIDE_IN, SIDE_OUT)
    rows = pixels[y0] * (1.0 - wy)[:, None] + pixels[y1] * wy[:, None]
    resized = rows[:, x0] * (1.0 - wx)[None, :] + rows[:, x1] * wx[None, :]
    resized = np.clip(np.floor(resized + 0.5), 0, 255)
    scaled = resized * (1.0 / (255.0 * STD)) - MEAN / STD
    # C order: the fancy indexing above leaves a Fortran-ordered array, which Serving 2.0.2's worker refuses as a
    # stage result ("Get illegal result data with type <class 'numpy.ndarray'>"; measured) and then exits.
    return np.ascontiguousarray(scaled, dtype=np.float32).reshape(1, SIDE_OUT, SIDE_OUT)


def postprocess(logits):
    """Logits of one image -> (top-1 digit, its softmax probability)."""
    values = np.asarray(logits, dtype=np.float64).reshape(-1)
    shifted = np.exp(values - values.max())
    probabilities = shifted / shifted.sum()
    digit = int(probabilities.argmax())
    return digit, float(probabilities[digit])
