"""Bad input stops site.yml before any host changes, with one message that names the host, the variable and
the fix, and leaves the running cluster alone."""

import json
import re

import pytest
from cluster_helpers import (RPC_PORT, SERVER_PORT, WORKERS, address, assert_refused_in_preflight,
                             run_playbook, service_pids, wait_health)

# (extra vars, the failing host's message: the whole `msg`, from its start, matched as a regex)
CASES = {
    "short commit": ({"llamacpp_commit": "0c1e570"}, r"master: llamacpp_commit must be a full 40-hex"),
    "non-hex commit": ({"llamacpp_commit": "z" * 40}, r"\w+: llamacpp_commit must be a full 40-hex"),
    "archive checksum": ({"llamacpp_archive_sha256": "0" * 64},
                         r"\w+: llamacpp_archive .* has sha256 [0-9a-f]{64}, not llamacpp_archive_sha256 0{64}"),
    "git without a URL": ({"llamacpp_source": "git", "llamacpp_git_url": ""},
                          r"\w+: llamacpp_source is 'git', so llamacpp_git_url must be a repository URL .* got ''"),
    # Numbers out of their range (a port 70000, a hold of 0 s) are refused by the variable checks, before any host is
    # contacted: tests/test_preflight.py, a test per number option. What follows needs the hosts or other variables.
    # The front (llama_front haproxy, the default).
    "internal port is the API's": ({"llama_server_internal_port": 8080},
                                   r"master: llama_server_internal_port equals llama_server_port \(8080\): with "
                                   r"llama_front haproxy, the front listens on llama_server_port"),
    "hold longer than the front lets a client wait": (
        {"llama_front_hold_seconds": 700},
        r"master: llama_front_hold_seconds \(700\) is longer than llama_front_timeout \(600\), the time the front "
        r"lets a client wait: .* raise llama_front_timeout to 700 or more\."),
    "drain longer than the front lets a client wait": (
        {"llama_front_drain_seconds": 650},
        r"master: llama_front_drain_seconds \(650\) is longer than llama_front_timeout \(600\): a request still running "
        r"when the drain ends has already been cut by the front\. .* raise llama_front_timeout to 650 or more\."),
    "bind address not the cluster address": (
        {"llama_rpc_bind_address": "10.255.255.1"},
        r"worker\d: llama_rpc_bind_address is '10\.255\.255\.1', but the master dials this worker at its cluster "
        r"address [\d.]+ .*Leave llama_rpc_bind_address empty"),
    "cluster address not on the host": (
        {"llama_cluster_address": "10.255.255.1"},
        r"\w+: llama_cluster_address 10\.255\.255\.1 \(from llama_cluster_address\) is not an IPv4 address of this "
        r"host \(it has [\d.]+\): set llama_cluster_address"),
    # No silent fallback to the CPU: a CUDA build needs the toolkit on the build host.
    "missing CUDA toolkit": ({"llamacpp_backend": "cuda", "llamacpp_cuda_architectures": "86"},
                             r"master: llamacpp_backend is cuda but /usr/local/cuda/bin/nvcc does not exist"),
    "missing model": ({"llama_model_path": "/srv/models/missing.gguf"},
                      r"master: llama_model_path '/srv/models/missing\.gguf' cannot be read as a GGUF model on "
                      r"master: .*Put the model there, or point llama_model_path at it\."),
    # Metrics (role llama_metrics) and the monitor (role llama_monitor, on the master here).
    "exporter port is the RPC port": ({"llama_metrics_port": 50052},
                                      r"worker\d: llama_metrics_port 50052 equals llama_rpc_port: node-exporter and "
                                      r"that service would take the same port"),
    # Planner errors name the inventory variables, not the filter's arguments.
    "tensor split count": ({"llama_tensor_split": [1, 2, 3]},
                           r"master: llama_tensor_split has 3 values but the cluster has 2 devices \(RPC0, RPC1\)"),
    # Every host's device overridden down to 20 MiB (17 MiB budget each): two workers hold 34 MiB, the
    # model needs ~90 (the master's CPU is no device of its own).
    "model does not fit": ({"llama_devices": [{"name": "CPU", "memory_mib": 20}]},
                           r"master: model needs \d+ MiB \(weights \+ KV at llama_server_ctx_size=2048\) but the devices' budgets "
                           r"total 34 MiB: short by \d+ MiB; add a device, lower llama_server_ctx_size or "
                           r"llama_split_reserve_fraction$"),
}


# Mistakes argument_specs catches, all in one run: the Variables play reports every one of them at once.
SPEC_CASES = {
    "port not a number": ({"llama_rpc_port": "fifty"}, r"worker\d: llama_rpc_port must be an int, got 'fifty'\. "),
    "unknown backend": ({"llamacpp_backend": "rocm"},
                        r"\w+: llamacpp_backend must be one of: cpu, cuda, hip, vulkan, got: rocm\."),
    "misspelt variable": ({"llama_rpc_prot": 50053},
                          r"\w+: llama_rpc_prot is not a variable of any role \(did you mean llama_rpc_port\?\)"),
    "unknown front": ({"llama_front": "nginx"}, r"\w+: llama_front must be one of: haproxy, none, got: nginx\."),
    "unknown firewall backend": ({"llama_firewall": "iptables"},
                                 r"\w+: llama_firewall must be one of: auto, nftables, firewalld, ufw, none, "
                                 r"got: iptables\."),
}


@pytest.fixture(scope="module")
def before(master, workers):
    return service_pids(master, workers)


def assert_refused_before_any_change(result, message, before, master, workers):
    # It stopped in the facts or preflight plays: no later play started, no host changed.
    assert_refused_in_preflight(result, message)
    # The running cluster is untouched: same processes, still serving.
    assert service_pids(master, workers) == before
    wait_health(master, SERVER_PORT, timeout=10)


# Cases that one run shows together: each host's checks all run, whatever the others found, and the host fails once
# with every problem (playbooks/preflight.yml). Their checks are in different groups (a failed check skips the rest of
# its group): the commit, the source and the backend are llamacpp's three; the others are other roles'. The cases
# of the facts play (the cluster address, the bind address, the model, the split) stop the run where they are found:
# a run each.
TOGETHER = [
    ["short commit", "git without a URL", "missing CUDA toolkit", "internal port is the API's",
     "hold longer than the front lets a client wait", "drain longer than the front lets a client wait",
     "exporter port is the RPC port"],
    ["non-hex commit", "archive checksum"],
]


@pytest.fixture(scope="module")
def refusals():
    """site.yml run with a case's extra vars (and those of the cases it runs with), once per run."""
    results = {}

    def refused(case):
        group = next((group for group in TOGETHER if case in group), [case])
        if group[0] not in results:
            extra_vars = {}
            for name in group:
                assert not set(CASES[name][0]) & set(extra_vars), f"{name} sets a variable another case of its run sets"
                extra_vars.update(CASES[name][0])
            results[group[0]] = run_playbook("site.yml", "-e", json.dumps(extra_vars), timeout=600)
        return results[group[0]]
    return refused


@pytest.mark.parametrize("case", CASES)
def test_preflight_rejects(case, refusals, before, master, workers):
    assert_refused_before_any_change(refusals(case), CASES[case][1], before, master, workers)


def test_rpc_port_equal_to_the_api_port_on_a_host_in_both_groups(before, master, workers, tmp_path):
    """The RPC server would take the API's port and llama-server would crash-loop: refused in preflight."""
    both = tmp_path / "master-is-a-worker.yml"
    both.write_text("llama_workers:\n  hosts:\n    master:\n")
    result = run_playbook("site.yml", "-i", str(both), "-e", f"llama_rpc_port={SERVER_PORT}", timeout=600)
    message = (r"master is in llama_master and llama_workers, and llama_rpc_port equals llama_server_port "
               rf"\({SERVER_PORT}\): the RPC server would take the API's port")
    assert_refused_before_any_change(result, message, before, master, workers)


def test_ports_taken_by_other_programs(before, master, workers):
    """Both of the master's ports held by other programs: one run names each, with the program that holds it."""
    ports = {"llama_server_port": 18080, "llama_server_internal_port": 18081}
    for port in ports.values():
        assert master.run(f"systemd-run --unit=port-thief-{port} python3 -m http.server {port}").rc == 0
    try:
        for port in ports.values():
            listening = f"ss -Hltn 'sport = :{port}' | grep -q ."
            assert master.run(f"for i in $(seq 50); do {listening} && exit 0; sleep 0.2; done; exit 1").rc == 0
        result = run_playbook("site.yml", "-e", json.dumps(ports), timeout=600)
    finally:
        master.run("systemctl stop " + " ".join(f"port-thief-{port}" for port in ports.values()))
    for variable, port in ports.items():
        message = (rf"master: .*{variable} {port} is in use by python3 on (0\.0\.0\.0|\*|\[::\]).* Choose a free "
                   r"port in the inventory, or stop that program\.")
        assert_refused_before_any_change(result, message, before, master, workers)


def test_workers_bound_to_every_address_are_dialled_at_their_cluster_addresses(workers):
    """0.0.0.0 is a bind address, never a destination: the master's --rpc lists each worker's cluster address
    (two workers on 0.0.0.0:50052 are two endpoints, not "the same endpoint")."""
    result = run_playbook("playbooks/preflight.yml", "-e", "llama_rpc_bind_address=0.0.0.0", "-v", timeout=600)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    published = re.search(r'"llama_server_rpc": (\[[^\]]*\])', output)
    assert published, output[-3000:]
    assert json.loads(published.group(1)) == [f"{address(workers[name])}:{RPC_PORT}" for name in WORKERS]


def test_every_variable_mistake_is_named_in_one_run(before, master, workers):
    extra_vars = {name: value for extra, _ in SPEC_CASES.values() for name, value in extra.items()}
    result = run_playbook("site.yml", "-e", json.dumps(extra_vars), timeout=600)
    output = result.stdout + result.stderr
    errors = [error for failure in re.findall(r"FAILED! => (\{.*\})$", output, re.M)
              for error in json.loads(failure).get("errors", [])]
    for case, (_, message) in SPEC_CASES.items():
        assert any(re.match(message, error) for error in errors), (case, errors)
    assert_refused_before_any_change(result, r"\w+: ", before, master, workers)


def test_a_host_on_an_unsupported_release_is_named(before, master, workers):
    """A host whose release the roles do not know (worker1 made to say Debian 11 in /etc/debian_version, where
    Ansible reads a Debian host's version) is refused in the facts play, named with its release and the ones known."""
    worker = workers["worker1"]
    worker.check_output("cp -a /etc/debian_version /root/debian_version.saved && echo 11.11 > /etc/debian_version")
    try:
        result = run_playbook("site.yml", timeout=600)
    finally:
        worker.check_output("mv /root/debian_version.saved /etc/debian_version")
    message = (r"worker1: Debian 11 \(11\.11\) is not supported: the roles know Debian 12 and 13 \(tested\) and Ubuntu "
               r"22\.04 and 24\.04 \(written from their package names, untested\)\.")
    assert_refused_before_any_change(result, message, before, master, workers)
