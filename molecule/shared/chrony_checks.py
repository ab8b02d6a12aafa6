"""Checks shared by the chrony scenarios' testinfra tests (molecule/shared is on the verifier's PYTHONPATH)."""

import os
import time

import pytest
import testinfra.utils.ansible_runner

# testinfra's shared runner of the scenario's inventory (the one cluster_helpers.connect and the ansible:// hosts
# use): the inventory is read once per test session.
RUNNER = testinfra.utils.ansible_runner.AnsibleRunner.get_runner(os.environ["MOLECULE_INVENTORY_FILE"])
CONFIG = "/etc/chrony/chrony.conf"


def address_of(name):
    """The IPv4 address of the instance's default interface (what ansible_default_ipv4 reports)."""
    addresses = RUNNER.get_host(name).interface.default("inet").addresses
    return next(address for address in addresses if "." in address)


def directives(host, names):
    """The config lines whose directive is in `names`, in order."""
    lines = host.file(CONFIG).content_string.splitlines()
    return [line.strip() for line in lines if line.strip().split(" ", 1)[0] in names]


def sources(host):
    """`chronyc -c -n sources` as dicts: mode, state, address, stratum, reach (octal register)."""
    output = host.check_output("chronyc -c -n sources")
    rows = [line.split(",") for line in output.splitlines() if line]
    return [{"mode": r[0], "state": r[1], "address": r[2], "stratum": int(r[3]), "reach": int(r[5], 8)}
            for r in rows]


def wait_for_source(host, address, states=("*", "+"), timeout=200):
    """Poll until `address` answers (reach != 0) in one of `states`. Usually within seconds (iburst); 200 s covers
    three 64 s polls more: under the suite's load a container's chronyd can answer late, and chrony drops the
    samples whose delay is far above the others (seen: every packet answered, source still '?' after 70 s)."""
    deadline = time.monotonic() + timeout
    while True:
        current = sources(host)
        if any(s["address"] == address and s["reach"] and s["state"] in states for s in current):
            return current
        if time.monotonic() > deadline:
            details = host.run(f"chronyc -n ntpdata {address}").stdout
            pytest.fail(f"{address} not reachable in state {states} after {timeout}s: {current}\n{details}")
        time.sleep(2)
