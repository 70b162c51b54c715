"""Verification of provisioned hosts: testinfra modules (verify/testinfra) that run against any
host — a sandbox container, a real server through Ansible's inventory, or the local machine."""
