"""Tasks of the MindSpore GPU toolkit (run them through ./toolkit, which sets up .venv first).

./toolkit --list                  all tasks
./toolkit provision               provision one local sandbox host (no GPU), end to end
./toolkit provision -i inventory/mysite/hosts.yml
./toolkit test                    lint + unit + integration + fleet + serving + molecule, as CI runs it

Once .venv exists, the same tasks run with invoke itself, from the root or any folder below it:
. .venv/bin/activate; invoke --list; invoke verify -i inventory/mysite/hosts.yml

The tasks live in cli/: fleet.py (provision, uninstall, fetch, verify, gpu-smoke, bench, doctor),
checks.py (lint, test), dev.py (setup, sandbox). Listing them loads neither the test bed nor the catalog.
"""

from __future__ import annotations

import sys
from pathlib import Path

from invoke import Collection

sys.path.insert(0, str(Path(__file__).resolve().parent))

from cli import checks, dev, fleet  # after the root is on sys.path (invoke may run in a folder below it)

ns = Collection(
    dev.setup, checks.lint, checks.test, fleet.provision, fleet.uninstall, fleet.verify, fleet.bench, fleet.fetch
)
ns.add_task(dev.sandbox_host, name="sandbox")
ns.add_task(fleet.doctor)
ns.add_task(fleet.gpu_smoke, name="gpu-smoke")
