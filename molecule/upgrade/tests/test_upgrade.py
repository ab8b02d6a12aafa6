"""upgrade.yml on the cluster site.yml deployed at the older tree (rpc-server, protocol 4, --no-mmap): refusals
that change nothing, a staged build that fails the gate, a master and a worker that fail in the switch and are
rolled back, the lockstep upgrade to 0c1e570 (ggml-rpc-server, protocol 7, --load-mode), the drift check, a no-op
re-run, the cluster healing itself, a rollback on purpose, the rollback by hand of docs/upgrades.md, a worker-only
change, the builds' retention, a fresh worker joining and an upgrade under tls; the upgrade, the healing and the
rollback under clients' requests (one asking every 0.5 s, 8 concurrent ones).

The tests run in this file's order: each starts from the state the one before left."""

import json
import os
import re
import subprocess
import time

import pytest
from cluster_helpers import (PROJECT, SERVER_PORT, ApiClients, assert_refused_in_preflight, cmdline, connect,
                             container, drains, failure_messages, http_json, main_pid, monotonic, option, plays, recap,
                             run_playbook, wait_health, wait_restarted)

OLD = os.environ["LLAMA_GIT_0_3_30_COMMIT"]
NEW = os.environ["LLAMA_SRC_0_3_36_COMMIT"]
# The suite's 0c1e570 build settings (the cluster scenario's): the same build identity, so its artifact is reused.
NEW_VARS = json.dumps({"llamacpp_commit": NEW, "llamacpp_build_number": int(os.environ["LLAMA_SRC_0_3_36_BUILD"]),
                       "llamacpp_source": "archive", "llamacpp_archive": os.environ["LLAMA_SRC_0_3_36"],
                       "llamacpp_archive_sha256": os.environ["LLAMA_SRC_0_3_36_SHA256"]})
ASK = {"prompt": "The capital of France is", "n_predict": 8, "temperature": 0, "seed": 42, "cache_prompt": False}

@pytest.fixture(scope="module")
def builder():
    return connect("builder")


@pytest.fixture(scope="module")
def node():
    return connect("node")


@pytest.fixture(scope="module")
def before(builder):
    """The greedy answer and the build of each node before any upgrade."""
    return {"answer": ask(builder), "builds": {name: build(connect(name)) for name in ("builder", "node")}}


def ask(builder):
    return http_json(builder, 8080, "/completion", ASK, key=None)["content"]


def build(host):
    return json.loads(host.file("/opt/llama.cpp/current/BUILD-INFO.json").content_string)


def upgrade(*args, inventory_args=()):
    result = run_playbook("upgrade.yml", "-e", NEW_VARS, *inventory_args, *args, timeout=1800)
    return result, result.stdout + result.stderr


def unit_line(host, unit, prefix):
    return next(line for line in host.file(f"/etc/systemd/system/{unit}").content_string.splitlines()
                if line.startswith(prefix))


def assert_serving(builder, node, info, answer):
    """Both nodes run `info`'s build, their units name its binary, and the cluster answers `answer`."""
    for host in (builder, node):
        assert build(host)["build_id"] == info["build_id"]
        assert unit_line(host, "llama-rpc-server.service" if host is node else "llama-server.service",
                         "Environment=LLAMACPP_BUILD_ID=") == f"Environment=LLAMACPP_BUILD_ID={info['build_id']}"
    assert f"/{info['rpc_server_binary']} " in unit_line(node, "llama-rpc-server.service", "ExecStart=")
    assert ask(builder) == answer


def test_site_refuses_to_switch_the_running_cluster_to_another_commit(before):
    result = run_playbook("site.yml", "-e", NEW_VARS)
    assert_refused_in_preflight(
        result, rf"builder runs {OLD}, node runs {OLD}, not llamacpp_commit {NEW}: site.yml never switches a running "
                r"cluster to another commit\. Run `ansible-playbook upgrade.yml`")


def test_a_node_that_does_not_answer_stops_the_upgrade_before_anything(builder, node, before):
    """A paused container: its SSH server never answers (unreachable)."""
    subprocess.run(["docker", "pause", container("node")], check=True)
    try:
        result, output = upgrade()
    finally:
        subprocess.run(["docker", "unpause", container("node")], check=True)
    assert result.returncode != 0 and re.search(r"^fatal: \[node\]: UNREACHABLE!", output, re.M), output[-3000:]
    assert next(iter(plays(output))) == "Upgrade - every node answers", output[-3000:]
    # Ansible still prints the later plays' headers (and runs the inventory checks on localhost), but no task ran on
    # a node after the first play: the unreachable node ended the run for every node.
    end = output.find("\nPLAY [", output.index("PLAY [Upgrade - every node answers]"))
    later = output[end:] if end >= 0 else ""
    assert not re.search(r"^(ok|changed|fatal|failed|skipping): \[(builder|node)\]", later, re.M), later[-3000:]
    assert not re.search(r"changed=[1-9]", output)
    assert_serving(builder, node, before["builds"]["node"], before["answer"])


def test_a_build_that_fails_on_one_node_stops_before_any_switch(builder, node, before, tmp_path):
    """An impossible CMake flag for the worker only (its own build group, so it compiles): the stage fails there,
    every node stops, nothing is switched and the old build serves."""
    extra = tmp_path / "node-cannot-build.yml"
    extra.write_text("all:\n  hosts:\n    node:\n      llamacpp_cmake_extra_args: [-DCMAKE_C_COMPILER=/nonexistent/cc]\n")
    result, output = upgrade(inventory_args=("-i", str(extra)))
    assert result.returncode != 0, output[-3000:]
    assert re.search(r"^fatal: \[node\]", output, re.M) and "/nonexistent/cc" in output, output[-3000:]
    # It stopped in the stage (role llama_upgrade's flow): no gate, no rollback point, no rollback.
    assert "Build once per build group and unpack beside the active build (role llamacpp)]" in output
    assert "Check the staged build on every node]" not in output and "Save the rollback point]" not in output
    assert "Restore the saved build and units]" not in output
    assert_serving(builder, node, before["builds"]["node"], before["answer"])


def test_verify_passes_on_the_deployed_cluster():
    result = run_playbook("playbooks/verify.yml")
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    assert f"Every node runs {before_build_id()} (commit {OLD}, RPC protocol 4.0.1)" in output


def before_build_id():
    return build(connect("node"))["build_id"]


def test_a_master_that_never_serves_is_rolled_back(builder, node, before):
    """The new llama-server gets a flag it refuses (injected for the test): it never answers /health, so every
    node goes back to the saved build and units, and the old cluster serves again."""
    result, output = upgrade("-e", '{"llama_server_extra_args": ["--no-such-flag"], "llama_server_health_timeout": 20}')
    assert result.returncode != 0, output[-3000:]
    old = before["builds"]["node"]
    assert any(message.startswith(f"The upgrade to {NEW} failed - builder: ") and
               f"Every node is back on {old['build_id']} ({OLD}) and the cluster serves" in message
               for message in failure_messages(output)), failure_messages(output)
    # Every node went to the one rescue together and was switched back.
    assert re.search(r"^TASK \[llamacpp\.rpc_cluster\.llama_upgrade : Restore the saved build and units\]", output, re.M), output[-3000:]
    assert_serving(builder, node, old, before["answer"])
    # The new build stays staged beside the old one for the next try.
    assert len(builder.check_output("ls -d /opt/llama.cpp/llama.cpp-*").split()) == 2


def staged_dir(host, active):
    """The build directory beside the active build `active` (BUILD-INFO): the one a try before staged."""
    return next(path for path in host.check_output("ls -d /opt/llama.cpp/llama.cpp-*").split()
                if not path.endswith(active["build_id"]))


def test_a_staged_build_that_fails_the_gate_stops_before_any_switch(builder, node, before):
    """The worker's staged RPC server binary damaged (not executable) after the try before staged it: the stage
    keeps it (its BUILD-INFO is right), the gate names the node, the binary and the fix; nothing is switched."""
    binary = f"{staged_dir(node, before['builds']['node'])}/bin/ggml-rpc-server"
    node.check_output(f"chmod a-x {binary}")
    try:
        result, output = upgrade()
    finally:
        node.check_output(f"chmod a+x {binary}")
    assert result.returncode != 0, output[-3000:]
    messages = failure_messages(output)
    assert any(message.startswith(f"node: the staged build has no executable {binary}. Nothing was switched; the "
                                  f"old build serves. Remove {binary.rsplit('/bin/', 1)[0]} and run upgrade.yml")
               for message in messages), messages
    assert "Check the staged build on every node]" in output and "Save the rollback point]" not in output
    assert_serving(builder, node, before["builds"]["node"], before["answer"])


def test_a_worker_that_fails_in_the_switch_sends_every_node_back(builder, node, before):
    """The new RPC server refuses a flag (injected for the test) and never listens: the worker's switch waits for
    its port (llama_rpc_ready_timeout) and fails naming its unit; every node goes back to the saved build."""
    result, output = upgrade("-e", json.dumps({"llama_rpc_extra_args": ["--no-such-flag"],
                                               "llama_rpc_ready_timeout": 10, "llama_server_health_timeout": 30}))
    assert result.returncode != 0, output[-3000:]
    old = before["builds"]["node"]
    (message,) = [text for text in failure_messages(output) if text.startswith(f"The upgrade to {NEW} failed - ")]
    assert re.search(r"node: (?:\S+ : )?Switch this node in one step: .*llama-switch: wait for \S+ to listen failed: "
                     r"nothing listens within 10 s \(llama-rpc-server\.service ", message, re.S), message
    assert f"Every node is back on {old['build_id']} ({OLD}) and the cluster serves" in message
    assert_serving(builder, node, old, before["answer"])


def clients(builder):
    """The continuity tests' clients (one asking every 0.5 s, 8 concurrent ones) through the front; no API key."""
    return ApiClients(builder, key=None)


def test_the_upgrade_switches_every_node_in_one_short_outage(builder, node, before):
    """...under clients' requests and 400-token streams back to back; the drain before the switch is reported beside
    the outage. The switch installs the units the roles render for the new build, so the roles restart nothing after
    it (they once named the build's own directory instead of current: every node restarted again 7 s after the
    switch, and a stream running then was cut)."""
    with ApiClients(builder, groups=(*ApiClients.GROUPS, ApiClients.STREAMS), key=None) as asking:
        since = monotonic(builder)
        asking.event(f"upgrade.yml {OLD[:7]} -> {NEW[:7]}")
        result, output = upgrade()
        time.sleep(3)
    assert result.returncode == 0, output[-4000:]
    new = build(node)
    assert (new["commit"], new["rpc_proto"], new["rpc_server_binary"]) == (NEW, "7.0.0", "ggml-rpc-server")
    assert_serving(builder, node, new, before["answer"])
    outage, load = map(float, re.search(r"Outage \(first node stopped -> /health 200\): ([\d.]+) s, of which the "
                                        r"model load \(llama-server started -> /health 200\) ([\d.]+) s",
                                        output).groups())
    drain = float(re.search(r"Before it, the drain \(requests in progress ended, new ones held\) took ([\d.]+) s",
                            output).group(1))
    # Every client's requests were answered: the front held those sent during the switch; every stream ended whole.
    asking.report(f"through the front (drain {drain} s, then outage reported by the play {outage} s, of which the "
                  f"model load {load} s):")
    asking.assert_none_failed()
    asking.assert_streamed_through(drains(builder, since))
    assert "RUNNING HANDLER [llamacpp.rpc_cluster.llama_rpc : Restart llama-rpc-server]" not in output, output[-4000:]
    assert "RUNNING HANDLER [llamacpp.rpc_cluster.llama_server : Restart llama-server]" not in output, output[-4000:]


def test_verify_names_a_node_switched_by_hand(node):
    new, old_dir = build(node), node.check_output("ls -d /opt/llama.cpp/llama.cpp-*").split()
    old_dir = next(path for path in old_dir if not path.endswith(new["build_id"]))
    switched = node.check_output("stat -c %Y /opt/llama.cpp/current")
    node.check_output(f"ln -sfn {old_dir} /opt/llama.cpp/current")
    try:
        result = run_playbook("playbooks/verify.yml", "-e", f"llamacpp_commit={NEW}")
    finally:
        # Back as it was, its time included (a link switched after the service started means a stale binary).
        node.check_output(f"ln -sfn /opt/llama.cpp/{new['build_id']} /opt/llama.cpp/current && "
                          f"touch -h -d @{switched} /opt/llama.cpp/current")
    output = result.stdout + result.stderr
    assert result.returncode != 0
    (message,) = failure_messages(output)
    assert message.startswith(f"Drift: node: runs commit {OLD}, not llamacpp_commit {NEW}; speaks RPC protocol "
                              f"4.0.1, other nodes 7.0.0; llama-rpc-server.service is set up for {new['build_id']}, "
                              f"not the active build "), message
    assert "builder" not in message.split("|")[0].replace("Drift: node", "")
    assert run_playbook("playbooks/verify.yml", "-e", f"llamacpp_commit={NEW}").returncode == 0


def test_the_upgrade_again_does_nothing(builder):
    pid = main_pid(builder, "llama-server.service")
    result, output = upgrade()
    assert result.returncode == 0, output[-3000:]
    assert f"Every node already runs its planned build ({NEW[:12]}): nothing to do." in output
    assert all(counts["changed"] == 0 for counts in recap(output).values()), output[-3000:]
    assert main_pid(builder, "llama-server.service") == pid


def test_the_cluster_heals_itself(builder, node, before):
    """A worker killed while no request runs, then under the clients' requests: a worker killed, a worker host
    restarted, the master killed. Each time the cluster answers again with no human action."""
    # Idle: llama-server-watch sees the worker's end of the connection closed and restarts the master before a
    # client comes; the next request is answered.
    master_pid, since = main_pid(builder, "llama-server.service"), time.monotonic()
    node.check_output(f"kill -KILL {main_pid(node, 'llama-rpc-server.service')}")
    wait_restarted(builder, master_pid)
    restarted = time.monotonic() - since
    wait_health(builder, SERVER_PORT)
    serving = time.monotonic() - since
    assert ask(builder) == before["answer"]
    with clients(builder) as asking:
        for event in ("worker killed (SIGKILL)", "worker host restarted", "master killed (SIGKILL)"):
            master_pid = main_pid(builder, "llama-server.service")
            asking.event(event)
            if event.startswith("worker killed"):
                node.check_output(f"kill -KILL {main_pid(node, 'llama-rpc-server.service')}")
            elif event.startswith("worker host"):
                subprocess.run(["docker", "restart", "-t", "10", container("node")], check=True)
            else:
                builder.check_output(f"kill -KILL {master_pid}")
            # Every event ends in a new llama-server (the watch, or systemd), which then serves.
            wait_restarted(builder, master_pid)
            wait_health(builder, SERVER_PORT)
            time.sleep(5)  # the window of this event: the held requests are answered, then some more
    asking.report(f"self-healing (SmolLM2 over one worker), through the front; idle before: a worker killed, the "
                  f"master restarted by the watch {restarted:.1f} s after and serving {serving:.1f} s after:")
    asking.assert_none_failed()
    watch = builder.check_output("journalctl -u llama-server-watch.service -o cat --no-pager")
    assert "worker connection(s) closed by the worker" in watch


def test_a_rollback_on_purpose_returns_to_the_replaced_build(builder, node, before):
    with clients(builder) as asking:
        asking.event(f"upgrade.yml -e llama_rollback=true ({NEW[:7]} -> {OLD[:7]})")
        result = run_playbook("upgrade.yml", "-e", "llama_rollback=true")
        time.sleep(3)
    output = result.stdout + result.stderr
    asking.report("through the front:")
    asking.assert_none_failed()
    assert result.returncode == 0, output[-3000:]
    old = before["builds"]["node"]
    assert f"Every node is back on {old['build_id']} and the cluster serves." in output
    assert_serving(builder, node, old, before["answer"])
    # The old build's units: its flag for reading without mmap (the workers hold layers), not the new build's.
    args = cmdline(builder, main_pid(builder, "llama-server.service"))
    assert "--no-mmap" in args and "--load-mode" not in args
    # The units are those site.yml rendered for this build: site.yml (inventory: the old commit) changes nothing.
    again = run_playbook("site.yml")
    assert again.returncode == 0 and all(c["changed"] == 0 for c in recap(again.stdout).values()), again.stdout[-3000:]


def readme_rollback_by_hand():
    """The commands of docs/upgrades.md's "Rolling back by hand", in its order, each with where its comment (or its
    unit) says it runs: (master|worker|every, command)."""
    text = (PROJECT / "docs" / "upgrades.md").read_text()
    block = re.search(r"^## Rolling back by hand\n.*?```sh\n(.*?)```", text, re.S | re.M).group(1).replace("\\\n", "")
    steps = []
    for line in block.splitlines():
        command = line.split("  #", 1)[0].strip()
        if command:
            where = ("master" if "llama-server.service" in command else
                     "worker" if "llama-rpc-server.service" in command else "every")
            steps.append((where, command))
    return steps


def test_the_readme_s_rollback_by_hand_returns_to_the_replaced_build(builder, node, before):
    """After an upgrade, the rollback by hand of docs/upgrades.md (for when Ansible cannot run), followed as written:
    the replaced build serves again, and the units are those site.yml renders for it."""
    # The units as the inventory sets them (the test before ended on a site.yml that changed nothing): the rollback
    # point holds them as they run.
    result, output = upgrade()
    assert result.returncode == 0, output[-3000:]
    assert build(node)["commit"] == NEW
    steps = readme_rollback_by_hand()
    assert [where for where, _ in steps] == ["master", "worker", "every", "every", "every", "worker", "master"], steps
    for where, command in steps:
        for host in {"master": (builder,), "worker": (node,), "every": (builder, node)}[where]:
            host.check_output(command)
    wait_health(builder, SERVER_PORT)
    assert_serving(builder, node, before["builds"]["node"], before["answer"])
    again = run_playbook("site.yml")
    assert again.returncode == 0 and all(c["changed"] == 0 for c in recap(again.stdout).values()), again.stdout[-3000:]


def test_verify_names_a_process_started_before_current_was_switched(node):
    """The worker's active build and unit agree, but current was pointed at it after the RPC server started (a switch
    by hand without a restart): the process runs the build before, and verify.yml says so, naming the unit."""
    switched = node.check_output("stat -c %Y /opt/llama.cpp/current")
    node.check_output(f"touch -h -d @{int(time.time()) + 60} /opt/llama.cpp/current")
    try:
        result = run_playbook("playbooks/verify.yml")
    finally:
        node.check_output(f"touch -h -d @{switched} /opt/llama.cpp/current")
    output = result.stdout + result.stderr
    assert result.returncode != 0, output[-3000:]
    (message,) = failure_messages(output)
    assert re.search(r"^Drift: node: llama-rpc-server\.service was started before current was switched to "
                     r"/opt/llama\.cpp/llama\.cpp-\S+: it still runs the build before \(restart it\)", message), message
    assert run_playbook("playbooks/verify.yml").returncode == 0


def test_a_worker_only_change_reconnects_the_master(builder, node):
    """A setting that restarts only the RPC server: llama-server's connection to it died with it, so the master is
    restarted after it, once, and the smoke request passes."""
    workers_before, master_before = main_pid(node, "llama-rpc-server.service"), main_pid(builder, "llama-server.service")
    result = run_playbook("site.yml", "-e", "llama_rpc_threads=2")
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    assert "restarting llama-server for the restarted RPC server(s) of node" in output
    assert main_pid(node, "llama-rpc-server.service") != workers_before
    assert main_pid(builder, "llama-server.service") != master_before
    assert "Completion served through RPC0" in output


def test_builds_beyond_llamacpp_keep_builds_are_removed(builder, node):
    """Retention: besides the active build, the one it replaced, then the newest others up to llamacpp_keep_builds;
    an older build (planted, of the same layout) goes in the next site.yml, the replaced one stays."""
    active = build(node)["build_id"]
    planted = "/opt/llama.cpp/llama.cpp-000000000000-planted"
    for host in (builder, node):
        host.check_output(f"mkdir -p {planted}/bin && touch -d 2020-01-01 {planted}")
    before = {host: sorted(host.check_output("ls -d /opt/llama.cpp/llama.cpp-*").split()) for host in (builder, node)}
    result = run_playbook("site.yml", "-e", "llamacpp_keep_builds=1")
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    for host in (builder, node):
        left = sorted(host.check_output("ls -d /opt/llama.cpp/llama.cpp-*").split())
        assert left == [path for path in before[host] if path != planted] and len(left) == 2, (before[host], left)
        assert any(path.endswith(active) for path in left)


def test_a_fresh_worker_joins_the_running_cluster_on_its_build(builder, node, before, tmp_path):
    """A fresh host added to llama_workers: site.yml installs the running build there from the artifact cache (no
    compilation), the master's plan and --rpc take it in and the cluster answers; then it is decommissioned and the
    cluster runs on its one worker again."""
    joiner = connect("joiner")
    extra = tmp_path / "joiner.yml"
    extra.write_text("all:\n  children:\n    llama_workers:\n      hosts:\n        joiner:\n")
    running = build(node)
    result = run_playbook("site.yml", "-i", str(extra))  # beside the scenario's inventory
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    assert build(joiner)["build_id"] == running["build_id"]
    assert "TASK [llamacpp.rpc_cluster.llamacpp : Compile the shipped targets]" not in output
    endpoints = option(cmdline(builder, main_pid(builder, "llama-server.service")), "--rpc").split(",")
    assert len(endpoints) == 2 and joiner.service("llama-rpc-server.service").is_running
    assert ask(builder) == before["answer"]
    assert joiner.check_output("ss -Htn state established '( sport = :50052 )'")  # the master holds it
    result = run_playbook("playbooks/decommission.yml", "--limit", "joiner", "-i", str(extra))
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    result = run_playbook("site.yml")
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    assert len(option(cmdline(builder, main_pid(builder, "llama-server.service")), "--rpc").split(",")) == 1
    assert ask(builder) == before["answer"]


def test_an_upgrade_under_tls_moves_every_node_behind_its_tls_layer(builder, node, before):
    """The cluster switched to llama_rpc_transport tls, then upgraded and rolled back on purpose under it: the
    worker's switch waits for its RPC server on 127.0.0.1 behind the terminator, llama-server dials its local TLS
    client, and the answer is the same. The last test: the cluster stays on tls (the switch back to plain is the
    prefill scenario's test_transport_switch.py)."""
    tls = json.dumps({"llama_rpc_transport": "tls"})
    result = run_playbook("site.yml", "-e", tls)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    result, output = upgrade("-e", tls)
    assert result.returncode == 0, output[-4000:]
    assert build(node)["commit"] == NEW and build(builder)["commit"] == NEW
    assert node.service("llama-rpc-tls.service").is_running
    assert builder.service("llama-rpc-tls-clients.service").is_running
    assert option(cmdline(builder, main_pid(builder, "llama-server.service")), "--rpc").startswith("127.0.0.1:")
    assert ask(builder) == before["answer"]
    result = run_playbook("upgrade.yml", "-e", "llama_rollback=true", "-e", tls)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    assert build(node)["commit"] == OLD and ask(builder) == before["answer"]
    assert node.service("llama-rpc-tls.service").is_running
