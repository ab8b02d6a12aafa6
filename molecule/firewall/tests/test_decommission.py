"""playbooks/decommission.yml: refuses without --limit; with --limit worker_fwd,worker_ufw removes the project's
units, rules, files and user there and leaves everything else, there and on the other hosts. Runs last."""

import re

import pytest
from cluster_helpers import RPC_PORT, assert_decommissioned, recap, run_playbook
from conftest import LISTENER, start_listener

DECOMMISSION = "playbooks/decommission.yml"
# What a deployed worker has besides the firewall (the converge only ran the firewall): the user, the
# directories, a unit of the project's, enabled and running.
DEPLOYED = """
set -e
id llama >/dev/null 2>&1 || useradd --system --no-create-home --home-dir /var/lib/llama --shell /usr/sbin/nologin llama
mkdir -p /opt/llama.cpp/build-1/bin /var/cache/llama.cpp/rpc /var/cache/llama-vulkan-shaders /var/lib/llama.cpp \\
  /usr/local/sbin
touch /opt/llama.cpp/build-1/bin/rpc-server /usr/local/sbin/llama-wait-workers /usr/local/sbin/llama-server-watch \\
  /usr/local/sbin/llama-rpc-session /usr/local/sbin/llama-switch
printf '[Service]\\nExecStart=/bin/sleep infinity\\nUser=llama\\n[Install]\\nWantedBy=multi-user.target\\n' \
  > /etc/systemd/system/llama-rpc-tls.service
systemctl daemon-reload
systemctl enable --now llama-rpc-tls.service
"""


@pytest.mark.parametrize(("args", "message"), [
    ((), r"decommission\.yml removes the llama\.cpp cluster from the hosts you name: run it with --limit HOSTS "
         r"\(no --limit given\)"),
    (("--limit", "all"), r"decommission\.yml .*\(--limit all names every host of the inventory\)\. To take down "
                         r"all 5 hosts of the inventory on purpose, add -e confirm=true\."),
])
def test_it_refuses_without_a_limit(args, message):
    result = run_playbook(DECOMMISSION, *args)
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert re.search(message, output), output[-3000:]
    assert not re.search(r"changed=[1-9]", output)


LIMIT = "worker_fwd,worker_ufw"
GONE = ("worker_fwd", "worker_ufw")


@pytest.fixture(scope="module")
def decommissioned(workers):
    for name in GONE:
        host = workers[name]
        start_listener(host)
        assert host.run(DEPLOYED).rc == 0
        assert host.service(LISTENER).is_running and host.service("llama-rpc-tls.service").is_running
    return run_playbook(DECOMMISSION, "--limit", LIMIT)


def test_it_ran(decommissioned):
    assert decommissioned.returncode == 0, (decommissioned.stdout + decommissioned.stderr)[-3000:]


@pytest.mark.parametrize("name", GONE)
def test_it_removes_the_project(name, decommissioned, workers):
    host = workers[name]
    assert_decommissioned(host)
    if name == "worker_fwd":  # no rich rule but the project's was there
        assert host.check_output("firewall-cmd --list-rich-rules; firewall-cmd --permanent --list-rich-rules") == ""
    else:
        # The cluster's rules are gone. The SSH admission the role added when it turned ufw on stays, as ufw stays
        # on: removing it would lock Ansible and the operator out.
        rules = host.check_output("ufw status")
        assert not re.search(rf"^{RPC_PORT}/tcp ", rules, re.M), rules
        ssh = r"22/tcp( \(v6\))? +ALLOW +Anywhere( \(v6\))? +# llama.cpp cluster: SSH"
        ours = [line for line in rules.splitlines() if "llama.cpp cluster" in line]
        assert ours and all(re.match(ssh, line) for line in ours), rules


def test_it_leaves_everything_else(decommissioned, workers, master):
    """Each firewall stays on with someone else's rule; the other hosts keep theirs."""
    ufw = workers["worker_ufw"].check_output("ufw status")
    assert "Status: active" in ufw and re.search(r"^9999/tcp .*# foreign", ufw, re.M), ufw
    firewalld = workers["worker_fwd"]
    assert firewalld.run("firewall-cmd --state").rc == 0
    assert firewalld.run("firewall-cmd --list-ports | grep -w 9999/tcp").rc == 0
    assert "llama.cpp cluster: RPC" in workers["worker_nft"].check_output("nft list table inet llama_cluster")
    assert workers["worker_nft"].file("/etc/llama.cpp/firewall-rules.json").exists
    assert "someone else's rule" in master.check_output("nft list table inet foreign")
    assert "llama.cpp cluster: API" in master.check_output("nft list table inet llama_cluster")


def test_a_second_run_changes_nothing(decommissioned):
    result = run_playbook(DECOMMISSION, "--limit", LIMIT)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    stats = recap(result.stdout)
    assert all(stats[name]["changed"] == 0 for name in GONE), result.stdout[-3000:]
