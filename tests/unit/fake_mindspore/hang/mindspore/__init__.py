"""Fake MindSpore whose import never returns; it also starts a grandchild, which must die with it."""

import os
import subprocess
import time

_helper = subprocess.Popen(["sleep", "3600"])
_pidfile = os.environ.get("MSGPU_FAKE_PIDFILE")
if _pidfile:
    with open(_pidfile, "w") as handle:
        handle.write(f"{os.getpid()} {_helper.pid}\n")
while True:
    time.sleep(1)
