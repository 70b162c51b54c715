"""The seed's command line (``python main.py --data_url=DIR [--train_url=DIR] [--device_target CPU|GPU]``)
on top of the fast harness: same model and hyperparameters, seed-style output, results JSON in --train_url.

Usage: ``python -m msgpu_verify seed --data_url=DIR ...`` or ``python path/to/seed_main.py ...``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import List, Optional

if __package__ in (None, ""):  # run as a script: make the package importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from msgpu_verify import mnist
    from msgpu_verify.bench import run_bench
else:
    from . import mnist
    from .bench import run_bench


def parse(argv: Optional[List[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--data_url", required=True, help="Location of data (train/ and test/, or the IDX files).")
    parser.add_argument("--train_url", default=None, help="Location of training outputs.")
    parser.add_argument("--device_target", default="CPU", help="CPU or GPU")
    parser.add_argument("--epochs", type=int, default=3)
    args, _unknown = parser.parse_known_args(argv)
    return args


def main(argv: Optional[List[str]] = None) -> int:
    args = parse(argv)
    out_dir = Path(args.train_url or tempfile.mkdtemp(prefix="msgpu-seed-out-"))
    out_dir.mkdir(parents=True, exist_ok=True)
    data = args.data_url
    if not mnist.is_complete(Path(data)):
        data = str(mnist.prepare(data, str(out_dir / "MNIST")))
    result = run_bench(device=args.device_target.upper(), data=data, epochs=args.epochs)
    (out_dir / "msgpu_bench.json").write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    if "error" in result:
        print("training failed:", result["error"], file=sys.stderr)
        return 1
    steps = result["samples_train"] // result["batch_size"]
    for epoch in result["epochs"]:
        print(f"epoch: {epoch['epoch']} step: {steps}, loss is {epoch['loss_last']}")
    print("Metrics:", {"acc": result["accuracy"]})
    print(f"images/s: {result['images_per_s']} (results in {out_dir / 'msgpu_bench.json'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
