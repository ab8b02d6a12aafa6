"""Bad input stops site.yml in preflight, naming host and variable, and leaves the running cluster alone."""

import json
import os
import re
import subprocess

import pytest
from conftest import PROJECT, SERVER_PORT, WORKERS, main_pid, wait_health

CASES = {
    "short commit": ({"llamacpp_commit": "0c1e570"}, r"\[master\].*llamacpp_commit must be a full 40-hex"),
    "non-hex commit": ({"llamacpp_commit": "z" * 40}, r"llamacpp_commit must be a full 40-hex"),
    "archive checksum": ({"llamacpp_archive_sha256": "0" * 64},
                         r"llamacpp_archive .* has sha256 [0-9a-f]{64}, not llamacpp_archive_sha256 0{64}"),
    "shared endpoint": ({"llama_rpc_bind_address": "10.255.255.1"},
                        r"worker\d: llama_rpc_bind_address:llama_rpc_port 10\.255\.255\.1:50052 is also used by worker\d"),
    "port out of range": ({"llama_rpc_port": 70000}, r"llama_rpc_port must be a port number 1-65535, got '70000'"),
    "unknown backend": ({"llamacpp_backend": "rocm"},
                        r"llamacpp_backend must be one of: cpu, cuda, hip, vulkan, got: rocm"),
    # No silent fallback to the CPU: a CUDA build needs the toolkit on the build host.
    "missing CUDA toolkit": ({"llamacpp_backend": "cuda", "llamacpp_cuda_architectures": "86"},
                             r"master: llamacpp_backend is cuda but /usr/local/cuda/bin/nvcc does not exist"),
    # Every host's device overridden down to 20 MiB (17 MiB budget each): two workers hold 34 MiB, the
    # model needs ~90 (the master's CPU is no device of its own).
    "model does not fit": ({"llama_devices": [{"name": "CPU", "memory_mib": 20}]},
                           r"model needs \d+ MiB \(weights \+ KV at ctx_size=2048\) but the devices' budgets "
                           r"total 34 MiB: short by \d+ MiB"),
}


def run_site(extra_vars):
    # JSON results: each failure on one line, as the user's message says it (no YAML folding or quoting).
    env = dict(os.environ, ANSIBLE_CONFIG=str(PROJECT / "ansible.cfg"), ANSIBLE_NOCOLOR="1",
               ANSIBLE_FORCE_COLOR="0", ANSIBLE_CALLBACK_RESULT_FORMAT="json")
    args = ["ansible-playbook", "site.yml", "-i", os.environ["MOLECULE_INVENTORY_FILE"]]
    args += ["-e", json.dumps(extra_vars)]
    return subprocess.run(args, cwd=PROJECT, env=env, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def before(master, workers):
    pids = {"master": main_pid(master, "llama-server.service")}
    pids.update({name: main_pid(host, "llama-rpc-server.service") for name, host in workers.items()})
    return pids


@pytest.mark.parametrize("case", CASES)
def test_preflight_rejects(case, before, master, workers):
    extra_vars, message = CASES[case]
    result = run_site(extra_vars)
    output = result.stdout + result.stderr
    assert result.returncode != 0, output[-3000:]
    assert re.search(message, output), output[-3000:]
    # It stopped in a preflight play: no later play started, no host changed.
    assert "PLAY [Preflight" in output
    for later in ("Synchronise the cluster's clocks", "Build llama.cpp", "Run the RPC server", "Run llama-server"):
        assert f"PLAY [{later}" not in output, output[-3000:]
    assert not re.search(r"changed=[1-9]", output)
    # The running cluster is untouched: same processes, still serving.
    assert main_pid(master, "llama-server.service") == before["master"]
    for name in WORKERS:
        assert main_pid(workers[name], "llama-rpc-server.service") == before[name]
    wait_health(master, SERVER_PORT, timeout=10)
