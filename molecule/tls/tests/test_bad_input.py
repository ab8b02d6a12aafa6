"""TLS settings that cannot work stop site.yml in preflight, before any host changes, with one message naming
the host, the variable and the fix; the running cluster keeps serving."""

import json
import re

import pytest
from cluster_helpers import assert_refused_in_preflight, SERVER_PORT, WORKERS, main_pid, run_playbook, wait_health


@pytest.fixture(scope="module")
def before(master, workers):
    pids = {"master": main_pid(master, "llama-server.service"),
            "clients": main_pid(master, "llama-rpc-tls-clients.service")}
    for name, host in workers.items():
        pids[name] = main_pid(host, "llama-rpc-server.service")
        pids[name + " tls"] = main_pid(host, "llama-rpc-tls.service")
    return pids


def assert_refused_before_any_change(result, message, before, master, workers):
    assert_refused_in_preflight(result, message)
    assert main_pid(master, "llama-server.service") == before["master"]
    assert main_pid(master, "llama-rpc-tls-clients.service") == before["clients"]
    for name in WORKERS:
        assert main_pid(workers[name], "llama-rpc-server.service") == before[name]
        assert main_pid(workers[name], "llama-rpc-tls.service") == before[name + " tls"]
    wait_health(master, SERVER_PORT, timeout=10)


def test_tls_without_a_ca(before, master, workers, tmp_path):
    """llama_tls_ca_create false and a CA directory without a CA: every host of the TLS cluster says so."""
    empty = tmp_path / "no-ca"
    empty.mkdir()
    result = run_playbook("site.yml", "-e", json.dumps({"llama_tls_ca_create": False, "llama_tls_ca_dir": str(empty)}),
                          timeout=600)
    message = (r"(master|worker\d): llama_rpc_transport is tls on worker1, worker2, but llama_tls_ca_dir "
               rf"\({re.escape(str(empty))}\) holds no CA \(ca\.crt and ca\.key\) and llama_tls_ca_create is false\. "
               r"Put the cluster CA there, or set llama_tls_ca_create: true")
    assert_refused_before_any_change(result, message, before, master, workers)
    assert list(empty.iterdir()) == []


def test_tls_worker_bound_to_every_address(before, master, workers):
    result = run_playbook("site.yml", "-e", "llama_rpc_bind_address=0.0.0.0", timeout=600)
    message = (r"worker\d: llama_rpc_bind_address is 0\.0\.0\.0 with llama_rpc_transport tls, but under tls the RPC "
               r"server itself listens on 127\.0\.0\.1:50052")
    assert_refused_before_any_change(result, message, before, master, workers)


def test_client_port_taking_the_api_port(before, master, workers):
    result = run_playbook("site.yml", "-e", f"llama_tls_client_port={SERVER_PORT - 1}", timeout=600)
    message = (rf"master: the local TLS client ports {SERVER_PORT - 1}, {SERVER_PORT} \(llama_tls_client_port "
               rf"{SERVER_PORT - 1} \+ one per worker\) include {SERVER_PORT}, taken by llama_server_port")
    assert_refused_before_any_change(result, message, before, master, workers)
