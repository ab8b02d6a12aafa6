"""Switching llama_rpc_transport on a running cluster, both ways, by re-running site.yml (back to plain, no key,
certificate or TLS unit stays on any host); the same greedy output either way, and no request of clients asking
through the front during the switch to tls fails. Measures, on the same containers, the model load (llama-server
start to /health 200) and the decode speed of a 64-token completion with plain and with tls, and prints them side
by side. The workers' restarts of a switch wait for the master play, llama-server stopped (its drain) first
(playbooks/workers.yml); a restart a run deferred and never made is made by the next run."""

import json
import os
import re
from pathlib import Path

import pytest
from cluster_helpers import RPC_PORT, ApiClients, address, main_pid, measure_serving, option, run_playbook
from suite_report import figures
from tls_helpers import cluster_completion, local_endpoints, network_endpoints, server_args

REPORT = Path(os.environ["MOLECULE_EPHEMERAL_DIRECTORY"]) / "tls-vs-plain.json"
DEFERRED = "/run/llama-rpc-deferred"
SWITCH_TASK = ("TASK [llamacpp.rpc_cluster.llama_server : Restart the workers' deferred units, in the order each "
               "listed them]")


def converge(*args):
    result = run_playbook("site.yml", *args)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    return output


def switched(output):
    """The workers whose units the master's switch restarted in this run (their deferred restarts)."""
    section = output.split(SWITCH_TASK, 1)[1].split("TASK [", 1)[0] if SWITCH_TASK in output else ""
    return sorted(re.findall(r"changed: \[master -> [^\]]*\] => \(item=([\w.-]+)\)", section))


def plant_deferred(worker):
    """The worker's RPC server and TLS terminator written down as restarts deferred to the master's switch, as a run
    that ended before it leaves them: {unit: its MainPID now}."""
    units = ("llama-rpc-server.service", "llama-rpc-tls.service")
    before = {unit: main_pid(worker, unit) for unit in units}
    worker.check_output(f"printf '%s\\n' {' '.join(units)} > {DEFERRED}")
    return before


# On this scenario's 586 MiB model a request takes seconds, not a tenth of one: the 8 clients ask every 6 s (not 2),
# which still has them all held at once through every outage, and each transport is measured once. With the default
# clients and medians of 3, this was the suite's heaviest test (374 CPU-s).
CLIENTS = (("1 client", 1, 0.5), ("8 clients", 8, 6.0))
RUNS = 1


@pytest.fixture(scope="module")
def measured(master, workers):
    found = {"tls": measure_serving(master, runs=RUNS), "tls_output": cluster_completion(master)["content"]}
    converge("-e", "llama_rpc_transport=plain")
    found["plain_args"] = server_args(master)
    found["plain_units"] = {name: host.service("llama-rpc-tls.service").is_running for name, host in workers.items()}
    found["plain_listeners"] = {name: host.check_output(f"ss -Hltn sport = :{RPC_PORT}").split()[3]
                                for name, host in workers.items()}
    # What TLS left on each host: its units' files and its directory (the key, the certificates, the configuration).
    found["plain_tls_files"] = {
        name: [path for path in ("/etc/llama.cpp/tls", "/etc/systemd/system/llama-rpc-tls.service",
                                 "/etc/systemd/system/llama-rpc-tls-clients.service") if host.file(path).exists]
        for name, host in dict(workers, master=master).items()}
    found["plain"] = measure_serving(master, runs=RUNS)
    found["plain_output"] = cluster_completion(master)["content"]
    with ApiClients(master, CLIENTS) as clients:
        clients.event("site.yml: plain -> tls")
        found["switch_output"] = converge()
    clients.report("clients through the front:")
    found["switch_failed"] = clients.failed()
    found["back_args"] = server_args(master)
    found["back_output"] = cluster_completion(master)["content"]
    REPORT.write_text(json.dumps({key: found[key] for key in ("tls", "plain")}, indent=2) + "\n")
    return found


def test_switch_to_plain_removes_the_tls_layer(measured, workers):
    assert option(measured["plain_args"], "--rpc") == ",".join(network_endpoints(workers))
    assert not any(measured["plain_units"].values())
    assert measured["plain_listeners"] == {name: f"{address(host)}:{RPC_PORT}" for name, host in workers.items()}
    # No key, certificate or TLS unit stays behind on any host.
    assert all(left == [] for left in measured["plain_tls_files"].values()), measured["plain_tls_files"]


def test_no_request_fails_during_the_switch_to_tls(measured, workers):
    assert all(failed == [] for failed in measured["switch_failed"].values()), measured["switch_failed"]
    # The workers' new units started at the master's switch, llama-server stopped first, not in the workers play.
    assert switched(measured["switch_output"]) == sorted(workers), measured["switch_output"][-4000:]
    for worker in workers.values():
        assert not worker.file(DEFERRED).exists


def test_a_restart_a_failed_run_deferred_is_made_by_the_next(measured, master, workers):
    """A run that ended between the workers play and the master's switch leaves its deferred restarts written down
    on the worker (planted here as such a run leaves them): the next run makes them, at its own switch, and the
    cluster serves."""
    worker = workers["worker1"]
    before = plant_deferred(worker)
    output = converge("--tags", "workers,master")
    assert switched(output) == ["worker1"], output[-4000:]
    assert all(main_pid(worker, unit) != pid for unit, pid in before.items()), output[-4000:]
    assert not worker.file(DEFERRED).exists
    assert cluster_completion(master)["content"] == measured["tls_output"]


def test_deferred_restarts_are_made_by_a_next_run_that_does_not_defer(measured, master, workers):
    """The same left-over restarts, and a next run that does not defer them (llama-server is not serving): it makes
    both at once, the RPC server's and its TLS terminator's (it made only the RPC server's, and dropped the
    terminator's), then starts llama-server."""
    worker = workers["worker1"]
    before = plant_deferred(worker)
    master.check_output("systemctl stop llama-server.service")
    output = converge("--tags", "workers,master")
    assert switched(output) == [], output[-4000:]
    assert all(main_pid(worker, unit) != pid for unit, pid in before.items()), output[-4000:]
    assert not worker.file(DEFERRED).exists
    assert cluster_completion(master)["content"] == measured["tls_output"]


def test_switch_back_to_tls(measured, master, workers):
    assert option(measured["back_args"], "--rpc") == ",".join(local_endpoints())
    for worker in workers.values():
        assert worker.service("llama-rpc-tls.service").is_running


def test_same_greedy_output_with_both_transports(measured):
    assert measured["tls_output"] == measured["plain_output"] == measured["back_output"]


def test_print_tls_vs_plain(measured):
    lines = [f"{'transport':10} {'model load (s)':>16} {'decode 64 tok (t/s)':>20}   runs"]
    for name in ("plain", "tls"):
        row = measured[name]
        lines.append(f"{name:10} {row['load_s']:16.2f} {row['decode_tps']:20.1f}   load {row['loads_s']} "
                     f"decode {[round(value, 1) for value in row['decodes_tps']]}")
    figures(f"tls vs plain on the same containers (medians of {RUNS})", lines)
    assert all(measured[name]["decode_tps"] > 0 for name in ("plain", "tls"))
