"""TLS settings that cannot work stop site.yml in preflight, before any host changes, each with a message naming
the host, the variable and the fix, all in one run; the running cluster keeps serving."""

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


@pytest.fixture(scope="module")
def no_ca(tmp_path_factory):
    """A CA directory without a CA."""
    return tmp_path_factory.mktemp("no-ca")


@pytest.fixture(scope="module")
def refused(no_ca):
    """One site.yml run with three TLS mistakes, each in its own group of the role's checks: all are named at once.
    llama_tls_ca_create false with an empty CA directory (every host of the TLS cluster), a tls worker bound to every
    address (each worker), the master's client ports over its API port (the master)."""
    return run_playbook("site.yml", "-e", json.dumps({"llama_tls_ca_create": False, "llama_tls_ca_dir": str(no_ca),
                                                      "llama_rpc_bind_address": "0.0.0.0",
                                                      "llama_tls_client_port": SERVER_PORT - 1}), timeout=600)


def test_tls_without_a_ca(refused, no_ca, before, master, workers):
    message = (r"(master|worker\d): llama_rpc_transport is tls on worker1, worker2, but llama_tls_ca_dir "
               rf"\({re.escape(str(no_ca))}\) holds no CA \(ca\.crt and ca\.key\) and llama_tls_ca_create is false\. "
               r"Put the cluster CA there, or set llama_tls_ca_create: true")
    assert_refused_before_any_change(refused, message, before, master, workers)
    assert list(no_ca.iterdir()) == []


def test_tls_worker_bound_to_every_address(refused, before, master, workers):
    message = (r"worker\d: llama_rpc_bind_address is 0\.0\.0\.0 with llama_rpc_transport tls, but under tls the RPC "
               r"server itself listens on 127\.0\.0\.1:50052")
    assert_refused_before_any_change(refused, message, before, master, workers)


def test_client_port_taking_the_api_port(refused, before, master, workers):
    message = (rf"master: the local TLS client ports {SERVER_PORT - 1}, {SERVER_PORT} \(llama_tls_client_port "
               rf"{SERVER_PORT - 1} \+ one per worker\) include {SERVER_PORT}, taken by llama_server_port")
    assert_refused_before_any_change(refused, message, before, master, workers)
