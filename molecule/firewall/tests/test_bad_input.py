"""Bad input stops the run in preflight, before any host changes, with a message that starts with the host and
names llama_firewall (or the variable at fault) and the fix."""

import json
import re

import pytest
from cluster_helpers import failure_messages, run_playbook

PREFLIGHT = "playbooks/preflight.yml"


# nftables.service as an admin who enabled it would have it, minus its `flush ruleset` (which would also wipe ufw's
# rules and Docker's DNS redirection): what the preflight reads is systemd's view.
NFTABLES_DROPIN = "/run/systemd/system/nftables.service.d/test.conf"


@pytest.fixture()
def second_firewall(workers):
    """worker_ufw (ufw active) also runs nftables.service."""
    host = workers["worker_ufw"]
    dropin = "[Service]\nExecStart=\nExecStart=/bin/true\nExecStop=\nExecReload=\n"
    assert host.run(f"mkdir -p {NFTABLES_DROPIN.rpartition('/')[0]} && printf '{dropin}' > {NFTABLES_DROPIN} "
                    "&& systemctl daemon-reload && systemctl start nftables.service").rc == 0
    yield
    host.run(f"systemctl stop nftables.service; rm -f {NFTABLES_DROPIN}; systemctl daemon-reload")


def test_every_firewall_problem_in_one_run(second_firewall):
    """Two active firewalls (worker_ufw), a firewall other than the active one (worker_fwd), an API source that is
    no address (master): each host's message, in one run."""
    extra = {"llama_firewall": "nftables", "llama_server_allowed_sources": ["10.0.0.0/8", "the office"]}
    result = run_playbook(PREFLIGHT, "-e", json.dumps(extra))
    output = result.stdout + result.stderr
    assert result.returncode != 0, output[-3000:]
    messages = failure_messages(output)
    expected = [
        r"worker_ufw: llama_firewall is nftables, but nftables and ufw are active here, and two firewalls filter "
        r"every packet twice\. Turn all but one off \(systemctl disable --now nftables\.service; ufw disable\)",
        r"worker_fwd: llama_firewall is nftables, but firewalld is the active firewall here, and the role never "
        r"turns on a second one\. Set llama_firewall to firewalld \(or auto\)",
        r"master: llama_server_allowed_sources has the office, which is not an IP address or network",
    ]
    for pattern in expected:
        assert any(re.match(pattern, text) for text in messages), (pattern, messages)
    assert not any(text.startswith("worker_nft") for text in messages), messages
    assert not re.search(r"changed=[1-9]", output)


def test_an_unknown_backend():
    """Refused by role llama's argument_specs (the facts play lists it before its own checks run)."""
    result = run_playbook(PREFLIGHT, "-e", "llama_firewall=iptables")
    output = result.stdout + result.stderr
    assert result.returncode != 0, output[-3000:]
    assert any("llama_firewall must be one of: auto, nftables, firewalld, ufw, none, got: iptables" in text
               for text in failure_messages(output)), output[-3000:]
