"""llama_firewall: none on hosts this project's firewall rules were on: each host's rules go (the nftables table, the
firewalld and ufw rules its record names), the play says so on each, everyone else's rules stay, and a second run
changes nothing. Then back to the inventory's backends, which admit the cluster's ports again."""

from cluster_helpers import RPC_PORT, recap, run_playbook
from conftest import BACKEND, WORKERS

CONVERGE = "molecule/firewall/converge.yml"
SAID = "{host}: llama_firewall is none: removing the firewall rules an earlier run of this project made here ({backend}"
RULES = {  # is the project's rule for the RPC port there, in each backend's own terms
    "nftables": "nft list table inet llama_cluster",
    "firewalld": f"firewall-cmd --list-rich-rules | grep -q 'port=\"{RPC_PORT}\"'",
    "ufw": f"ufw status | grep -Eq '^{RPC_PORT}/tcp '",
}


def test_going_to_none_removes_the_project_s_rules_and_says_so(master, workers):
    hosts = {"master": master, **workers}
    backends = {"master": "nftables", **BACKEND}
    for name in WORKERS:
        assert workers[name].run(RULES[BACKEND[name]]).rc == 0, f"{name}: no rule of the project to begin with"
    try:
        result = run_playbook(CONVERGE, "-e", "llama_firewall=none")
        output = " ".join((result.stdout + result.stderr).split())
        assert result.returncode == 0, output[-3000:]
        for name, backend in backends.items():
            assert SAID.format(host=name, backend=backend) in output, (name, output[-3000:])
        for name in WORKERS:
            assert workers[name].run(RULES[BACKEND[name]]).rc != 0, f"{name}: the project's rule is still there"
        assert master.run(RULES["nftables"]).rc != 0
        assert all(not host.file("/etc/llama.cpp/firewall-rules.json").exists for host in hosts.values())
        again = run_playbook(CONVERGE, "-e", "llama_firewall=none")
        output = " ".join((again.stdout + again.stderr).split())
        assert again.returncode == 0 and "removing the firewall rules" not in output, output[-3000:]
        assert all(counts["changed"] == 0 for counts in recap(again.stdout).values()), output[-3000:]
    finally:
        back = run_playbook(CONVERGE)
        assert back.returncode == 0, (back.stdout + back.stderr)[-3000:]
    for name in WORKERS:
        assert workers[name].run(RULES[BACKEND[name]]).rc == 0, f"{name}: the project's rule did not come back"
