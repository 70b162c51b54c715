"""A stand-in for ``python -m msgpu_verify distributed-worker``: the real identity and argument parsing, fake training.

The launcher's judging is tested with real processes: a fake ``mpirun`` (written by the test) starts N copies
of this script with OMPI_COMM_WORLD_* set. FAKE_DIST_MODE picks the behaviour; FAKE_DIST_PIDS (a folder)
collects every rank's pid (file name; its local rank inside) so a test can check that nothing survived the launcher.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "verify"))

from msgpu_verify import distributed


def main() -> None:
    parser = argparse.ArgumentParser()
    distributed.add_worker_arguments(parser)
    args = parser.parse_args()
    mode = os.environ.get("FAKE_DIST_MODE", "ok")
    pids = os.environ.get("FAKE_DIST_PIDS")
    if pids:
        Path(pids, str(os.getpid())).write_text(os.environ.get("OMPI_COMM_WORLD_LOCAL_RANK", "0"))
    me = distributed.identity()
    rank = me["rank"]
    if mode == "hang" or (mode == "hang-one" and rank == 1):
        time.sleep(3600)  # blocked in NCCL, as far as the launcher can tell
    if mode == "missing" and rank == 1:
        os._exit(0)  # dies without a word
    time.sleep(float(os.environ.get("FAKE_DIST_SECONDS", "0")))
    code = 0
    if me["gpu"] is None:  # what the real worker meets: set_context(device_id=...) on an invisible GPU
        me["error"] = f"RuntimeError: device_id {me['device_id']} is not visible (CUDA_VISIBLE_DEVICES)"
        code = 1
    elif mode == "error" and rank == 1:
        me["error"] = "RuntimeError: NCCL init failed: unhandled system error"
        code = 1
    else:
        if mode == "device0":  # a script that hard-codes device_id=0
            me["device_id"], me["gpu"] = 0, "0"
        steps = args.steps
        first, final, accuracy = 2.3026, 0.41, float(os.environ.get("FAKE_DIST_ACCURACY", "0.9712"))
        if mode == "nan":
            final = float("nan")
        if mode in ("plateau", "plateau-up"):
            # Still on the seed's LeNet5 loss plateau: the loss moved by noise (down or up), every image gets the
            # same digit, so the held-out accuracy is that digit's share (rank 0's test shard: 1s, 0.1182).
            final, accuracy = (2.3019 if mode == "plateau" else 2.3031), 0.1182
        me.update(
            {
                "steps": 0 if mode == "idle" and rank == 1 else steps,
                "samples": steps * args.batch_size,
                "loss_first": first,
                "loss_final": final,
                "seconds": 2.0 + rank * 0.1,
                "images_per_s": round(steps * args.batch_size / (2.0 + rank * 0.1), 1),
                "param_checksum": 1234.5678 + (rank * 10.0 if mode == "diverged" else 0.0),
                "mindspore_version": "1.5.1",
                "heldout_accuracy": accuracy,
                "heldout_samples": 10000 // me["size"],
            }
        )
        if mode == "noheldout":  # a worker from before the held-out rule
            del me["heldout_accuracy"], me["heldout_samples"]
    sys.stdout.write("rank chatter before the result line\n")
    sys.stdout.write(distributed.RANK_MARKER + " " + json.dumps(me) + "\n")
    sys.stdout.flush()
    os._exit(code)


if __name__ == "__main__":
    main()
