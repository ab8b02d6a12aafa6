"""Certificates are renewed on a re-run once they expire within llama_tls_renew_days: new ones are issued and
served, stunnel only reloads (no connection drops, llama-server keeps running), and the next run would change
nothing: `site.yml --check --diff` on the renewed cluster (which is also the converged-cluster check of check mode
with tls) reports no change."""

import pytest
from cluster_helpers import WORKERS, address, assert_check_changes_nothing, main_pid, recap, run_playbook
from tls_helpers import cert_fields, cluster_completion, presented_serial

DAYS = 365  # llama_tls_cert_days' default


@pytest.fixture(scope="module")
def renewal(master, workers):
    hosts = {"master": master, **workers}
    before = {name: cert_fields(host) for name, host in hosts.items()}
    pids = {"llama-server": main_pid(master, "llama-server.service"),
            "clients": main_pid(master, "llama-rpc-tls-clients.service"),
            **{name: main_pid(host, "llama-rpc-tls.service") for name, host in workers.items()}}
    # Every certificate expires within more days than it is valid: all are renewed.
    result = run_playbook("site.yml", "-e", f"llama_tls_renew_days={DAYS + 35}")
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    after = {name: cert_fields(host) for name, host in hosts.items()}
    return {"before": before, "after": after, "pids": pids, "recap": recap(output)}


def test_every_certificate_was_renewed(renewal):
    for name, before in renewal["before"].items():
        after = renewal["after"][name]
        assert after["serial"] != before["serial"], name
        assert after["notBefore"] != before["notBefore"], name
        assert (after["san"], after["eku"]) == (before["san"], before["eku"]), name
        assert renewal["recap"][name]["changed"] > 0


def test_workers_present_their_new_certificate(renewal, master, workers):
    for name in WORKERS:
        assert presented_serial(master, address(workers[name])) == renewal["after"][name]["serial"]


def test_renewal_reloads_without_restarting(renewal, master, workers):
    assert main_pid(master, "llama-server.service") == renewal["pids"]["llama-server"]
    assert main_pid(master, "llama-rpc-tls-clients.service") == renewal["pids"]["clients"]
    for name, host in workers.items():
        assert main_pid(host, "llama-rpc-tls.service") == renewal["pids"][name]


def test_cluster_serves_after_the_renewal(renewal, master):
    assert cluster_completion(master)["tokens_predicted"] == 16


def test_the_next_run_would_change_nothing(renewal):
    assert_check_changes_nothing()
