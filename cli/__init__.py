"""The toolkit's invoke tasks (tasks.py collects them; ./toolkit runs them).

fleet: the operator's commands on a fleet (provision, uninstall, fetch, verify, gpu-smoke, bench, doctor);
checks: lint and test; dev: setup and the local sandbox host. common: what they share (running a step,
the ansible-playbook command line, the inventory, the report summary); local: the local sandbox host and
fixture mirror that commands use without an inventory.

None of these modules imports the test bed (testbed/) or reads the catalog when it loads: `invoke --list`
parses nothing, and a real fleet's commands never load the test bed. Those that need it import it inside
the branch that does.
"""
