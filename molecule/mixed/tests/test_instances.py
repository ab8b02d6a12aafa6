"""Several instances (llama_instances, docs/instances.md) on the mixed scenario's hosts:

- the cluster's own: SmolLM2 on the master (Debian 12) over worker1 (Debian 12) and worker2 (Debian 13, TLS);
- `b`: a replica of it (the same file name, so the same served name), its llama-server on worker2 over worker1;
- `tiny`: another model on the master, over worker1.

worker1's CPU is shared by three RPC servers, one per instance. The front lists both models, routes by the request's
`model` and balances the two replicas; each instance's ports admit its own master only; a second run changes
nothing; a replica's worker killed fails no request; upgrade.yml (both release groups in lockstep to 2cabdd3, and
a changed setting) restarts one replica at a time, with no outage. The instances stay for test_debian13_master.py,
whose run, on hosts that no longer declare them, removes their units and rules."""

import json
import re
import time

import pytest
from cluster_helpers import (SERVER_PORT, ApiClients, address, drain_log, http, http_json, monotonic, recap,
                             replica_rates, run_playbook, single_process_completion, tcp_connects, wait_health)
from mixed_helpers import ASK, B_RPC, CACHED_SHARE, COMMIT, NEW_COMMIT, NEW_VARS, build, ledger
from suite_report import figures

INSTANCES = json.dumps({"llama_instances": [
    {"name": "b", "model_path": "/srv/models/smollm2.gguf", "master": "worker2", "workers": ["worker1"]},
    {"name": "tiny", "model_path": "/srv/models/tiny.gguf", "workers": ["worker1"]}]})
# The same upgraded, with a setting every instance inherits changed too (test_upgrade_rolls_through_the_replicas):
# one run that restarts every instance, as a settings change alone would (role llama_server's instance_restart.yml).
UPGRADED = json.dumps(dict(json.loads(INSTANCES), llama_server_parallel=2, **json.loads(NEW_VARS)))
PROMPT = {"prompt": "The capital of France is", "n_predict": 16, "temperature": 0, "seed": 1234,
          "cache_prompt": False}
# The clients of the windows that last a playbook run (a normal answer, the upgrade): 4 asking
# every 2 s, a request every half second on average, which sees any wait of a second. The suite's usual clients (18
# requests a second) cost the cores about 0.6 of one for as long as a run lasts, minutes on a loaded machine.
ROLLING = (("4 clients", 4, 2.0),)
# The other instances' ports: llama_server_internal_port (8081) + 1 and + 2, llama_rpc_port (50052) + 1 (B_RPC) and + 2.
B_PORT, TINY_RPC = 8082, 50054
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
    """site.yml with the two instances. They stay for test_debian13_master.py, whose run, which declares none, removes
    them where it runs."""
    result = run_playbook("site.yml", "-e", INSTANCES)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    return result


@pytest.fixture(scope="module")
def normal(instances, master):
    """site.yml again, changing nothing, under the clients: (that run, how long a normal answer takes while a playbook
    runs). The upgrade's restarts, one replica at a time, must not make any request wait more than a second longer."""
    event = "site.yml, nothing to change"
    with ApiClients(master, groups=ROLLING) as clients:
        clients.event(event)
        again = run_playbook("site.yml", "-e", INSTANCES)
        clients.event("after")
        time.sleep(1)
    clients.report("through the front, a playbook that changes nothing (a normal answer):")
    clients.assert_none_failed()
    return again, clients.longest()[event]


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
    """8 clients asking back to back: both replicas take requests; then b drained (llama-front-drain --server), the
    cluster's own alone. Requests/s of each, and their ratio (2 shared cores: little gain is expected)."""
    before = sent_to(master)
    clients, (two, one) = replica_rates(master, "llama_server/b", 8)
    sent = {key: total - before.get(key, 0) for key, total in sent_to(master).items()}
    clients.assert_none_failed()
    assert sent[("llama_server", "llama-server")] >= 4 and sent[("llama_server", "b")] >= 4, sent
    assert one > 0 and two > 0, (two, one)
    figures("SmolLM2, 8 clients asking back to back through the front (requests/s)",
            [f"two replicas: {two:.2f}; one replica: {one:.2f}; ratio {two / one:.2f}"])


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


def test_a_second_run_changes_nothing(normal):
    again, _ = normal
    assert again.returncode == 0, (again.stdout + again.stderr)[-4000:]
    assert all(counts["changed"] == 0 for counts in recap(again.stdout).values()), again.stdout[-4000:]


def test_upgrade_rolls_through_the_replicas(instances, normal, master, workers):
    """upgrade.yml to 2cabdd3, the same sources from git, with llama_server_parallel 2 (a setting every instance
    inherits): both release groups move in lockstep, each group's build compiled once and almost all of it answered
    by the compiler cache. The cluster's own llama-server switches with its workers, drained alone while b serves;
    then b, drained at the front first, its RPC server's restart deferred to its own (role llama_rpc); tiny, alone
    with its model, as with one instance. Clients of the model see no outage: none fails, and from the switch on none
    waits a second longer than a normal answer (the fixture `normal`). A settings change alone restarts the same
    way (role llama_server's instance_restart.yml; the cluster's own llama-server's ExecStop drains it alone:
    tests/unit/test_front_replicas.py)."""
    nodes = {"master": master, **workers}
    before = {name: build(host) for name, host in nodes.items()}
    answer = http_json(master, SERVER_PORT, "/completion", ASK)["content"]
    since, started = monotonic(master), master.check_output("date +%s")
    stage = f"upgrade.yml {COMMIT[:7]} (archive) -> {NEW_COMMIT[:7]} (git): staging"
    with ApiClients(master, groups=ROLLING) as clients:
        clients.event(stage)
        result = run_playbook("upgrade.yml", "-e", UPGRADED, timeout=1800)
        clients.event("after")
        time.sleep(2)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    after = {name: build(host) for name, host in nodes.items()}
    assert {info["commit"] for info in after.values()} == {NEW_COMMIT}
    assert {info["rpc_proto"] for info in after.values()} == {"7.0.0"}
    assert after["master"]["build_id"] == after["worker1"]["build_id"] != after["worker2"]["build_id"]
    assert all(after[name]["build_id"] != before[name]["build_id"] for name in after)
    # Each group's build compiled once, on its own release's builder, and almost all of it from the compiler cache:
    # the sources are those of the build before.
    cached = {}
    for name in ("master", "worker2"):
        compiled = [line for line in ledger() if line.split()[1] == after[name]["build_id"]]
        assert len(compiled) == 1 and f" compiled on {name} " in compiled[0], compiled
        cached[name] = tuple(map(int, re.search(r"ccache answered (\d+) of (\d+) compilations", compiled[0]).groups()))
    figures("upgrade.yml to the same sources from another commit: the compiler cache",
            [f"{name}: answered {hits} of {total} compilations" for name, (hits, total) in cached.items()])
    assert all(hits >= CACHED_SHARE * total for hits, total in cached.values()), cached
    # The play showed the compilation's progress every 10 s while it lasted (alone on a quiet host it may not).
    trixie = re.escape(after["worker2"]["build_id"])
    done = re.search(rf"^worker2: compile {trixie}: done in (?:(\d+) min )?(\d+) s", output, re.M)
    assert done, output[-4000:]
    if int(done.group(1) or 0) * 60 + int(done.group(2)) >= 20:
        assert re.search(rf"^worker2: compile {trixie}: \d+% after \d+", output, re.M), output[-4000:]
    # The cluster's own nodes stopped together, at the moment agreed on the master's clock (llama-switch --at), not
    # one after the other as Ansible reached each: its outage is one node's stop -> start.
    spread = re.search(r"the 3 node\(s\) stopped within ([\d.]+) s of each other", " ".join(output.split()))
    assert spread and float(spread.group(1)) < 0.5, output[-3000:]
    # From the switch on (the cluster's own drained alone, before the moment every node switches at).
    switch = "upgrade.yml: the switch, then b and tiny one at a time"
    logged = drain_log(master, since)
    switched = next((at for at, message in logged if "another replica of the model serves (b)" in message), None)
    assert switched is not None, logged
    # Every instance's units are set up for the new build, each group's own, and their processes started after the
    # switch (on the build `current` points at then; the containers share one monotonic clock).
    for host, unit, name in ((master, "llama-server.service", "master"),
                             (master, "llama-server-tiny.service", "master"),
                             (workers["worker2"], "llama-server-b.service", "worker2"),
                             (workers["worker1"], "llama-rpc-server-b.service", "worker1"),
                             (workers["worker1"], "llama-rpc-server-tiny.service", "worker1")):
        assert f"LLAMACPP_BUILD_ID={after[name]['build_id']}" in host.check_output(
            f"systemctl show -p Environment --value {unit}"), unit
        if "rpc" not in unit:
            assert " -np 2 " in host.check_output(f"systemctl show -p ExecStart --value {unit}"), unit
        began = int(host.check_output(f"systemctl show -p ExecMainStartTimestampMonotonic --value {unit}")) / 1e6
        assert began > switched, (unit, began, switched)
    # One at a time: the cluster's own drained alone while b served, then b drained before its restart, which made
    # its RPC server's (deferred, nothing left over); b never failed on a worker restarted under it.
    drains = master.check_output(f"journalctl -o cat -t llama-front-drain --since @{started}")
    assert "another replica of the model serves (b)" in drains and "llama_server/b drained in" in drains, drains
    deferred = r"Defer the restarts to their llama-server's\] \**\nchanged: \[worker1\] => \(item=llama-rpc-server-b"
    assert re.search(deferred, output), output[-4000:]
    assert not workers["worker1"].run("ls /run/llama-rpc-deferred-*").stdout
    failures = workers["worker2"].run(f"journalctl -o cat -u llama-server-b.service --since @{started} "
                                      "| grep -E 'Failed with result|Main process exited, code=(killed|dumped)'")
    assert not failures.stdout, failures.stdout
    wait_health(master, SERVER_PORT)
    assert http_json(master, SERVER_PORT, "/completion", ASK)["content"] == answer
    clients.events.insert(1, (switch, switched))
    clients.report("through the front, upgrade.yml with two replicas, Debian 12 and 13 nodes together:")
    clients.assert_none_failed()
    _, usual = normal
    assert clients.longest()[switch] < usual + 1.0, (usual, clients.windows())
