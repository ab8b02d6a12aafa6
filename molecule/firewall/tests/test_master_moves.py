"""Changing the master's address and re-running moves the rule: each worker admits the new address, drops the
old one, and keeps the rules someone else added meanwhile. Then back, with llama_firewall: auto everywhere,
which finds each worker's active firewall (firewalld, ufw, the cluster's own nftables table)."""

import ipaddress
import json

import pytest
from cluster_helpers import RPC_PORT, address, recap, run_playbook
from conftest import BACKEND, WORKERS, tcp_connect

CONVERGE = "molecule/firewall/converge.yml"
FOREIGN = {  # someone else's rule, added after the converge, in each backend's own terms: (add, is it there)
    "worker_fwd": ("firewall-cmd --permanent --add-port=9999/tcp && firewall-cmd --add-port=9999/tcp",
                   "firewall-cmd --list-ports | grep -w 9999/tcp && firewall-cmd --permanent --list-ports | grep -w 9999/tcp"),
    "worker_ufw": ("ufw allow 9999/tcp comment foreign", "ufw status | grep -E '^9999/tcp .*# foreign'"),
    "worker_nft": ("nft add table inet foreign && nft add chain inet foreign input '{ type filter hook input priority 0; }'"
                   " && nft add rule inet foreign input tcp dport 9999 drop",
                   "nft list table inet foreign | grep 'tcp dport 9999 drop'"),
}
state = {}


def spare_address(host):
    """An unused address of the master's network (the top of the range: Docker hands out from the bottom)."""
    cidr = host.check_output(f"ip -4 -o addr show to {address(host)} | awk '{{print $4}}'")
    network = ipaddress.ip_interface(cidr).network
    return str(network.broadcast_address - 5), network.prefixlen


@pytest.fixture(scope="module")
def moved(master, workers, tmp_path_factory):
    old = address(master)
    new, prefix = spare_address(master)
    for name, (add, _) in FOREIGN.items():
        assert workers[name].run(add).rc == 0
    assert master.run(f"ip addr add {new}/{prefix} dev eth0").rc == 0
    inventory = tmp_path_factory.mktemp("inventory") / "moved.yml"
    inventory.write_text(json.dumps({"all": {"hosts": {"master": {"llama_cluster_address": new}}}}))
    state.update(old=old, new=new, prefix=prefix)
    result = run_playbook(CONVERGE, "-i", str(inventory))
    yield {"old": old, "new": new, "result": result}
    if not state.get("restored"):  # the last test did not get to move it back
        run_playbook(CONVERGE)
        master.run(f"ip addr del {new}/{prefix} dev eth0")


def test_the_run_moves_the_rules(moved):
    result = moved["result"]
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    stats = recap(result.stdout)
    assert all(stats[name]["changed"] > 0 for name in WORKERS), stats


@pytest.mark.parametrize("name", WORKERS)
def test_the_new_address_is_admitted_and_the_old_dropped(name, moved, listening, master):
    assert tcp_connect(master, listening[name], RPC_PORT, source=moved["new"]) == "connected"
    assert tcp_connect(master, listening[name], RPC_PORT, source=moved["old"]) == "timeout"


@pytest.mark.parametrize("name", WORKERS)
def test_no_rule_names_the_old_address(name, moved, workers):
    show = {"nftables": "nft list table inet llama_cluster", "firewalld": "firewall-cmd --list-rich-rules; "
            "firewall-cmd --permanent --list-rich-rules", "ufw": "ufw status"}[BACKEND[name]]
    rules = workers[name].check_output(show)
    assert moved["new"] in rules and moved["old"] not in rules, rules


@pytest.mark.parametrize("name", WORKERS)
def test_the_rules_of_others_survive(name, moved, workers):
    assert workers[name].run(FOREIGN[name][1]).rc == 0


def test_moving_back_with_auto_everywhere(moved, master, workers, listening):
    """Every worker keeps its firewall under auto (the active one; nftables where none is), the rules move back."""
    result = run_playbook(CONVERGE, "-e", "llama_firewall=auto")
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    assert master.run(f"ip addr del {state['new']}/{state['prefix']} dev eth0").rc == 0
    state["restored"] = True
    for name, host in workers.items():
        record = json.loads(host.file("/etc/llama.cpp/firewall-rules.json").content_string)
        assert record["backend"] == BACKEND[name]
        assert tcp_connect(master, listening[name], RPC_PORT) == "connected"
