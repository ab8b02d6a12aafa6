"""Several instances (llama_instances, docs/instances.md) on the mixed scenario's hosts:

- the cluster's own: SmolLM2 on the master (Debian 12) over worker1 (Debian 12) and worker2 (Debian 13, TLS);
- `b`: a replica of it (the same file name, so the same served name), its llama-server on worker2 over worker1;
- `tiny`: another model on the master, over worker1.

worker1's CPU is shared by three RPC servers, one per instance. The front lists both models, routes by the request's
`model` and balances the two replicas; each instance's ports admit its own master only; a second run changes
nothing; a replica's worker killed fails no request; and a run without llama_instances removes their units and
rules, leaving the converged cluster for test_mixed.py."""

import json
import time

import pytest
from cluster_helpers import (SERVER_PORT, ApiClients, address, http, http_json, recap, run_playbook,
                             single_process_completion, tcp_connects)

INSTANCES = json.dumps({"llama_instances": [
    {"name": "b", "model_path": "/srv/models/smollm2.gguf", "master": "worker2", "workers": ["worker1"]},
    {"name": "tiny", "model_path": "/srv/models/tiny.gguf", "workers": ["worker1"]}]})
PROMPT = {"prompt": "The capital of France is", "n_predict": 16, "temperature": 0, "seed": 1234,
          "cache_prompt": False}
# The other instances' ports: llama_server_internal_port (8081) + 1 and + 2, llama_rpc_port (50052) + 1 and + 2.
B_PORT, B_RPC, TINY_RPC = 8082, 50053, 50054
STATS = """
import socket
sock = socket.socket(socket.AF_UNIX)
sock.connect("/run/llama-front/admin.sock")
sock.sendall(b"show stat\\n")
data = b""
while chunk := sock.recv(65536):
    data += chunk
for line in data.decode().splitlines():
    fields = line.split(",")
    if fields[0].startswith("llama_server") and fields[1] != "BACKEND":
        print(fields[0], fields[1], fields[7])
"""


def sent_to(master):
    """{(backend, server): requests the front sent it} (HAProxy's stot), read from its admin socket."""
    lines = master.check_output(f"python3 -c '{STATS}'").splitlines()
    return {(backend, server): int(total) for backend, server, total in (line.split() for line in lines)}


@pytest.fixture(scope="module")
def instances(master, workers):
    """site.yml with the two instances; the tests; then site.yml without them, which removes what they had."""
    result = run_playbook("site.yml", "-e", INSTANCES)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    yield result
    removed = run_playbook("site.yml")
    assert removed.returncode == 0, (removed.stdout + removed.stderr)[-4000:]
    for name, host in {"master": master, "worker2": workers["worker2"]}.items():
        assert not host.run("ls /etc/systemd/system/llama-server-*.service | grep -v watch").stdout, name
    assert not workers["worker1"].run("ls /etc/systemd/system/llama-rpc-server-*.service").stdout
    assert not tcp_connects(workers["worker2"], address(workers["worker1"]), B_RPC)
    listed = http_json(master, SERVER_PORT, "/v1/models")["data"]  # llama-server's own list again
    assert len(listed) == 1 and listed[0]["id"].endswith("smollm2.gguf"), listed


def test_every_model_is_listed(instances, master):
    listed = http_json(master, SERVER_PORT, "/v1/models")
    assert [model["id"] for model in listed["data"]] == ["smollm2", "tiny"], listed


@pytest.mark.parametrize("model", ["smollm2", "tiny"])
def test_each_model_answers_by_name_as_it_does_alone(instances, master, model):
    answer = http_json(master, SERVER_PORT, "/completion", dict(PROMPT, model=model))
    assert answer["tokens_predicted"] == 16 and answer["model"] == model, answer
    alone = single_process_completion(master, f"/srv/models/{model}.gguf", PROMPT)
    assert answer["content"] == alone["content"]


def test_a_request_without_a_model_goes_to_the_cluster_s_own(instances, master):
    assert http_json(master, SERVER_PORT, "/completion", PROMPT)["model"] == "smollm2"


def test_an_unknown_model_is_a_404_naming_the_served_ones(instances, master):
    status, text = http(master, SERVER_PORT, "/v1/completions", dict(PROMPT, model="gpt-4"))
    assert status == 404, text
    error = json.loads(text)["error"]
    assert error["code"] == 404 and error["param"] == "model" and "smollm2, tiny" in error["message"], error


def test_the_replicas_share_the_load(instances, master):
    before = sent_to(master)
    with ApiClients(master, groups=(("8 clients", 8, 0.5),)) as clients:
        time.sleep(5)
    clients.assert_none_failed()
    sent = {key: total - before.get(key, 0) for key, total in sent_to(master).items()}
    assert sent[("llama_server", "llama-server")] >= 4 and sent[("llama_server", "b")] >= 4, sent


def test_each_instance_s_ports_admit_its_master_only(instances, master, workers):
    worker1, worker2 = address(workers["worker1"]), address(workers["worker2"])
    # b's RPC server on worker1: its master, worker2, only; not the front's host.
    assert tcp_connects(workers["worker2"], worker1, B_RPC) and not tcp_connects(master, worker1, B_RPC)
    # b's llama-server on worker2: the front's host only.
    assert tcp_connects(master, worker2, B_PORT) and not tcp_connects(workers["worker1"], worker2, B_PORT)
    # tiny's RPC server on worker1: the master only.
    assert tcp_connects(master, worker1, TINY_RPC) and not tcp_connects(workers["worker2"], worker1, TINY_RPC)


def test_status_checks_each_instance_s_units(instances, master, workers):
    """status.yml reads the other instances' units where they run: the replica's llama-server stopped is named, with
    its host; the other replica serves meanwhile."""
    healthy = run_playbook("playbooks/status.yml", "-e", INSTANCES, "-e", "status_format=json")
    assert healthy.returncode == 0, (healthy.stdout + healthy.stderr)[-4000:]
    assert "llama-server-b.service" in healthy.stdout and "llama-rpc-server-tiny.service" in healthy.stdout, \
        healthy.stdout[-4000:]
    workers["worker2"].check_output("systemctl stop llama-server-b.service")
    try:
        stopped = run_playbook("playbooks/status.yml", "-e", INSTANCES)
        assert http_json(master, SERVER_PORT, "/completion", PROMPT)["model"] == "smollm2"
    finally:
        workers["worker2"].check_output("systemctl start llama-server-b.service")
    output = " ".join((stopped.stdout + stopped.stderr).split())
    assert stopped.returncode != 0 and "worker2: llama-server-b.service is inactive, not active" in output, \
        output[-4000:]
    # b serves again, as the front's host sees it.
    health = f"http://{address(workers['worker2'])}:{B_PORT}/health"
    assert master.run(f"for i in $(seq 120); do python3 -c \"import urllib.request; urllib.request.urlopen('{health}', "
                      f"timeout=2)\" 2>/dev/null && exit 0; sleep 1; done; exit 1").rc == 0, "b did not serve again"


def test_a_replica_s_worker_killed_fails_no_request(instances, master, workers):
    event = "b's RPC server on worker1 killed"
    with ApiClients(master, groups=(("8 clients", 8, 0.5),)) as clients:
        clients.event(event)
        workers["worker1"].check_output("systemctl kill -s KILL llama-rpc-server-b.service")
        time.sleep(8)
    clients.report("through the front, a replica's worker killed:")
    clients.assert_none_failed()
    # Nothing waited for b to come back: the other replica took its requests.
    assert clients.longest()[event] < 5, clients.windows()


def test_a_second_run_changes_nothing(instances):
    again = run_playbook("site.yml", "-e", INSTANCES)
    assert again.returncode == 0, (again.stdout + again.stderr)[-4000:]
    assert all(counts["changed"] == 0 for counts in recap(again.stdout).values()), again.stdout[-4000:]
