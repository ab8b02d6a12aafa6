"""Who can reach what: the RPC port admits the master only, the API wants its key everywhere but /health,
the key shows nowhere, and both units are sandboxed."""

import json
import re
from shlex import quote

import pytest
from cluster_helpers import (API_KEY, RPC_PORT, SERVER_PORT, WORKERS, address, cmdline, connect, http, http_json,
                             main_pid, option, recap, run_playbook, service_pids, tcp_connects, text, wait_health)
from suite_report import figures

# Every endpoint family llama-server has, by method; only /health (and its /v1 alias) is public.
PROTECTED = [("GET", "/v1/models"), ("GET", "/models"), ("GET", "/props"), ("GET", "/metrics"), ("GET", "/slots"),
             ("POST", "/completion"), ("POST", "/v1/completions"), ("POST", "/v1/chat/completions"),
             ("POST", "/tokenize"), ("POST", "/embedding")]
REQUEST = {"prompt": "Hello", "messages": [{"role": "user", "content": "Hello"}], "content": "Hello",
           "n_predict": 1, "max_tokens": 1}


@pytest.fixture(scope="module")
def stranger():
    """A container on the cluster's network that is not in the inventory."""
    return connect("stranger")


def test_a_stranger_cannot_reach_a_worker_but_the_master_does(stranger, master, workers):
    for name, worker in workers.items():
        ip = address(worker)
        assert not tcp_connects(stranger, ip, RPC_PORT), f"{name}: a host outside the inventory reached the RPC port"
        # The master's llama-server holds its connection to the worker (and so serves through it).
        held = master.check_output(f"ss -Htne state established dst {ip}:{RPC_PORT}")
        assert "/llama-server.service" in held, held
    # Nothing was queued on the workers' RPC ports by the attempts (the one client slot stays the master's).
    for name, worker in workers.items():
        assert worker.check_output(f"ss -Hltn sport = :{RPC_PORT}").split()[1] == "0", name
    assert http_json(master, SERVER_PORT, "/completion", {"prompt": "Hello", "n_predict": 4})["tokens_predicted"] > 0


def test_the_api_is_open_to_its_allowed_sources(stranger, master):
    """llama_server_allowed_sources is [] here (the default): anyone on the network reaches the API port."""
    assert tcp_connects(stranger, address(master), SERVER_PORT)


# GET /health from where it runs: the status, or how the connection failed.
ASK = """
import sys, urllib.error, urllib.request
try:
    print(urllib.request.urlopen(sys.argv[1], timeout=10).status)
except urllib.error.HTTPError as error:
    print(error.code)
except Exception as error:
    print(type(error).__name__)
"""


def test_the_front_enforces_the_allowed_sources_whatever_the_firewall_does(stranger, master, workers):
    """llama_server_allowed_sources given to the front alone (--tags llama_front: the firewall, not run, still admits
    anyone to the API port): the front itself refuses a stranger's connection; an allowed source and the master
    are answered. Then back to [] (anyone)."""
    allowed = address(workers[WORKERS[0]])
    url = f"http://{address(master)}:{SERVER_PORT}/health"
    ask = f"python3 -c {quote(ASK)} {url}"
    try:
        result = run_playbook("site.yml", "--tags", "llama_front", "-e",
                              json.dumps({"llama_server_allowed_sources": [f"{allowed}/32"]}))
        assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
        assert tcp_connects(stranger, address(master), SERVER_PORT)  # the firewall lets it through
        assert stranger.check_output(ask) in ("RemoteDisconnected", "ConnectionResetError", "URLError"), \
            "the front answered a source llama_server_allowed_sources does not name"
        assert workers[WORKERS[0]].check_output(ask) == "200"
        assert master.check_output(f"python3 -c {quote(ASK)} http://127.0.0.1:{SERVER_PORT}/health") == "200"
    finally:
        result = run_playbook("site.yml", "--tags", "llama_front")
        assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    assert stranger.check_output(ask) == "200"


@pytest.mark.parametrize("method, path", PROTECTED)
def test_every_endpoint_but_health_wants_the_key(method, path, master):
    body = REQUEST if method == "POST" else None
    assert http(master, SERVER_PORT, path, body, timeout=60, key=None)[0] == 401
    assert http(master, SERVER_PORT, path, body, timeout=60, key="not-the-key")[0] == 401
    assert http(master, SERVER_PORT, path, body, timeout=120)[0] != 401


def test_health_is_public(master):
    assert http(master, SERVER_PORT, "/health", key=None)[0] == 200


def test_the_key_shows_nowhere_on_any_host(master, workers):
    pid = main_pid(master, "llama-server.service")
    places = {
        "the process list": master.check_output("ps -eo args"),
        "llama-server's environment": master.check_output(f"tr '\\0' '\\n' < /proc/{pid}/environ"),
        "the unit files": master.check_output("cat /etc/systemd/system/llama*.service"),
        "systemd's view of the unit": master.check_output("systemctl show llama-server.service"),
        "the front's configuration": master.check_output("cat /etc/llama-front/*"),
        # Every unit's and the kernel's lines, since the host booted: Ansible's module runs too.
        # Bytes: llama-server's --verbose log has token pieces that are not whole UTF-8 characters.
        **{f"{name}'s whole journal":
           text(host.run("journalctl --no-pager -o cat"))
           for name, host in {"master": master, **workers}.items()},
    }
    for place, content in places.items():
        assert API_KEY not in content, f"the API key is in {place}"
    key_file = master.file("/etc/llama.cpp/api-key")
    assert (key_file.user, key_file.group, key_file.mode) == ("root", "llama", 0o640)


def test_a_new_key_replaces_the_old_and_never_shows_in_the_play_output(master, workers):
    """Rotating the key (what a vault edit does), with another master-only setting, applied with --tags
    master,smoke: llama-server restarts once, onto both, and nothing else restarts; neither key is printed, even
    with --diff -vvv."""
    new_key = "rotated-key-3e8a51"
    before = service_pids(master, workers)
    try:
        result = run_playbook("site.yml", "--tags", "master,smoke", "--diff", "-vvv", "-e", f"llama_api_key={new_key}",
                              "-e", "llama_server_alias=tagged-run")
        output = result.stdout + result.stderr
        assert result.returncode == 0, output[-3000:]
        assert new_key not in output and API_KEY not in output
        stats = recap(output)
        assert stats["master"]["changed"] >= 1 and all(stats[name]["changed"] == 0 for name in WORKERS)
        assert output.count("RUNNING HANDLER [llamacpp.rpc_cluster.llama_server : Restart llama-server]") == 1
        assert http(master, SERVER_PORT, "/v1/models", key=API_KEY)[0] == 401
        assert http(master, SERVER_PORT, "/v1/models", key=new_key)[0] == 200
        after = service_pids(master, workers)
        assert after["master"] != before["master"]
        assert all(after[name] == before[name] for name in WORKERS)
        assert option(cmdline(master, after["master"]), "--alias") == "tagged-run"
    finally:
        result = run_playbook("site.yml", "--tags", "master,smoke", "--diff", "-v")
        output = result.stdout + result.stderr
        assert result.returncode == 0, output[-3000:]
        assert new_key not in output and API_KEY not in output
    wait_health(master, SERVER_PORT, timeout=60)
    assert http(master, SERVER_PORT, "/v1/models")[0] == 200
    assert "--alias" not in cmdline(master, main_pid(master, "llama-server.service"))


def exposure(host, unit):
    """systemd-analyze security's overall exposure (0 = locked down, 10 = unprotected) and its word."""
    text = host.check_output(f"systemd-analyze security --no-pager {unit}")
    match = re.search(r"Overall exposure level for \S+: ([\d.]+) (\w+)", text)
    assert match, text[-2000:]
    return float(match.group(1)), match.group(2)


def test_units_are_sandboxed(master, workers, record_property):
    """Figures for docs/security.md; the worker, which faces the network with no authentication, must be "OK" or
    better (exposure < 2)."""
    exposures = {"llama-server.service": exposure(master, "llama-server.service")}
    for name in WORKERS:
        exposures[f"llama-rpc-server.service ({name})"] = exposure(workers[name], "llama-rpc-server.service")
    figures("systemd-analyze security (exposure, lower is better)",
                [f"{unit}: {value} {word}" for unit, (value, word) in exposures.items()])
    for unit, (value, word) in exposures.items():
        record_property(unit, value)
        assert word in ("OK", "SAFE") and value < 2.0, (unit, value, word)


def test_worker_units_admit_only_the_master_as_a_peer(master, workers):
    """IPAddressDeny=any + IPAddressAllow=<master>: a second layer under the firewall, in the kernel (BPF)."""
    for name, worker in workers.items():
        allowed = worker.check_output("systemctl show -p IPAddressAllow --value llama-rpc-server.service").split()
        denied = worker.check_output("systemctl show -p IPAddressDeny --value llama-rpc-server.service").split()
        assert f"{address(master)}/32" in allowed, (name, allowed)
        assert sorted(denied) == ["0.0.0.0/0", "::/0"], (name, denied)
    # From the other worker (inside the inventory, so the firewall may not be what stops it): nothing gets in.
    first, second = (workers[name] for name in WORKERS)
    assert not tcp_connects(second, address(first), RPC_PORT)
