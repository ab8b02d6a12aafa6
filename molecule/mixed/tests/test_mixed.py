"""A cluster across Debian releases: a Debian 12 master and worker1, a Debian 13 worker2 behind mutual TLS. One
commit and one RPC protocol in two build groups, each compiled once per suite on its release (Debian 12's 0c1e570 is
the cluster scenario's artifact: only trixie compiles it in full here); the split planned over both
workers answers as one process does; the firewall admits only the master on both releases; bad input named before
any change (a host without iproute2, a builder outside its release's group, a Vulkan SDK that trixie does not need);
then upgrade.yml moves all three nodes in lockstep to the same sources from git under clients' requests, showing the
compilation's progress, each group's compilation answered by the compiler cache. Last,
worker2 becomes the master of worker1: the master's roles (the model, llama-server, the front, the exporters, the
monitor, the link check) run on Debian 13.

The tests run in this file's order: each starts from the state the one before left."""

import json
import os
import re
import shutil
import time
from pathlib import Path
from shlex import quote

import yaml

from cluster_helpers import (RPC_PORT, SERVER_PORT, WORKERS, ApiClients, address, assert_refused_in_preflight,
                             http_json, link_rows, placement, prometheus_query, run_playbook,
                             single_process_completion, tcp_connects, wait_health)
from suite_report import figures

# The commit the converge deploys (0c1e570 from its archive, with the cluster scenario's build settings: the same build
# identity, so that its Debian 12 artifact is reused), and the one upgrade.yml moves to: 2cabdd3, the same sources
# from the git fixture (the upgrade scenario moves across RPC protocols; this one across releases).
COMMIT = os.environ["LLAMA_SRC_0_3_36_COMMIT"]
NEW_COMMIT = os.environ["LLAMA_GIT_0_3_36_COMMIT"]
NEW_VARS = json.dumps({"llamacpp_commit": NEW_COMMIT, "llamacpp_source": "git"})
# The share of a group's compilations the compiler cache answers for the same sources at another commit (the path of
# the source tree is the same for every commit): all but build-info, which carries the commit.
CACHED_SHARE = 0.9
ASK = {"prompt": "The capital of France is", "n_predict": 8, "temperature": 0, "seed": 42, "cache_prompt": False}
HOSTS = ("master", "worker1", "worker2")


GCC = ("import glob, re; data = open(glob.glob('/opt/llama.cpp/current/lib/libggml-base.so*')[0], 'rb').read(); "
       "print(re.search(rb'GCC: [(][^)]*[)] ([0-9.]+)', data).group(1).decode())")


def build(host):
    return json.loads(host.file("/opt/llama.cpp/current/BUILD-INFO.json").content_string)


def ledger():
    return (Path(os.environ["LLAMA_ARTIFACT_CACHE"]) / "builds.log").read_text().splitlines()


def release(host):
    return host.check_output(". /etc/os-release && echo $ID $VERSION_ID")


def test_two_build_groups_one_commit_one_protocol(master, workers):
    nodes = {"master": master, **workers}
    assert {name: release(host) for name, host in nodes.items()} == {
        "master": "debian 12", "worker1": "debian 12", "worker2": "debian 13"}
    builds = {name: build(host) for name, host in nodes.items()}
    assert {info["commit"] for info in builds.values()} == {COMMIT}
    assert {info["rpc_proto"] for info in builds.values()} == {"7.0.0"}
    assert builds["master"]["build_id"] == builds["worker1"]["build_id"] != builds["worker2"]["build_id"]
    assert "-debian13" in builds["worker2"]["build_id"] and "-debian12" in builds["master"]["build_id"]
    # Compiled once for Debian 13, on the trixie host, with its GCC 14; Debian 12's build is the cluster scenario's
    # artifact (or compiled once here when this scenario runs alone).
    compiled = [line for line in ledger() if line.split()[1] == builds["worker2"]["build_id"]]
    assert len(compiled) == 1 and " compiled on worker2 " in compiled[0], compiled
    assert len([line for line in ledger() if line.split()[1] == builds["master"]["build_id"]]) <= 1
    # The compiler that built each group, from the binaries' .comment section: Debian 13's GCC 14, Debian 12's GCC 12.
    for name, major in (("master", "12"), ("worker2", "14")):
        assert nodes[name].check_output(f"python3 -c {quote(GCC)}").split(".")[0] == major
    assert workers["worker2"].check_output("python3 -c 'import sys; print(sys.version_info[1])'") == "13"


def test_the_split_over_both_releases_answers_as_one_process(master, workers):
    planned, actual, log = placement(master)
    assert actual == planned, log[-3000:]
    assert sorted(set(planned.values())) == ["RPC0", "RPC1"]  # layers on the Debian 12 and the Debian 13 worker
    answer = http_json(master, SERVER_PORT, "/completion", ASK)
    single = single_process_completion(master, "/srv/models/smollm2.gguf", ASK)
    assert answer["content"] == single["content"], (answer["content"], single["content"])


def test_the_firewall_admits_only_the_master_on_both_releases(master, workers):
    for name, host in workers.items():
        assert "table inet llama_cluster" in host.check_output("nft list table inet llama_cluster")
        other = workers[next(worker for worker in WORKERS if worker != name)]
        assert not tcp_connects(other, address(host), RPC_PORT), f"{name}'s RPC port admits another worker"
    # worker2's RPC port is its TLS terminator (stunnel 5.74 on trixie); the master dials it through its TLS client.
    assert workers["worker2"].service("llama-rpc-tls.service").is_running
    assert master.service("llama-rpc-tls-clients.service").is_running
    assert tcp_connects(master, address(workers["worker2"]), RPC_PORT)


def test_a_host_without_iproute2_is_named_before_any_change(master, workers):
    """A minimal install (debootstrap's minbase, some cloud images) may lack iproute2: Ansible then reads no
    address, and the message names the package instead of saying the cluster address is not the host's."""
    worker = workers["worker2"]
    worker.check_output("DEBIAN_FRONTEND=noninteractive apt-get purge -y -qq iproute2")
    try:
        result = run_playbook("site.yml", timeout=600)
    finally:
        worker.check_output("DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends iproute2")
    assert_refused_in_preflight(result, r"worker2: Ansible reads a host's network addresses with the command `ip`, "
                                        r"which is missing here \(a minimal install without the package iproute2\)\.")


def test_a_builder_outside_its_release_s_build_group_is_named(master, workers):
    result = run_playbook("site.yml", "-e", "llamacpp_builder=master", timeout=600)
    assert_refused_in_preflight(result, r"worker2: llamacpp_builder is 'master', which is not a cluster host with the "
                                        r"same build \(llama\.cpp-\w+-cpu-debian13[^)]*\); worker2 would build it\.")


def test_a_vulkan_sdk_trixie_does_not_need_is_a_warning(master, workers, tmp_path):
    """worker2 as a Vulkan worker given an SDK (/usr, with the distribution's own headers installed): Debian 13's
    libvulkan-dev is new enough, so preflight warns that the SDK is not needed, and passes."""
    worker = workers["worker2"]
    worker.check_output("DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends libvulkan-dev")
    extra = tmp_path / "vulkan-worker2.yml"
    extra.write_text("all:\n  hosts:\n    worker2:\n      llamacpp_backend: vulkan\n      llamacpp_vulkan_sdk: /usr\n"
                     "      llama_devices: [{name: Vulkan0, memory_mib: 1024}]\n")
    try:
        result = run_playbook("playbooks/preflight.yml", "-i", str(extra), timeout=600)
    finally:
        worker.check_output("DEBIAN_FRONTEND=noninteractive apt-get purge -y -qq libvulkan-dev && "
                            "DEBIAN_FRONTEND=noninteractive apt-get autoremove -y -qq")
    output = " ".join((result.stdout + result.stderr).split())
    assert ("[WARNING]: worker2: llamacpp_vulkan_sdk is set (/usr), but this host's distribution (Debian 13") in output
    assert re.search(r"offers libvulkan-dev 1\.4\.\d+(\.\d+)?, new enough for llama\.cpp's Vulkan backend: the build "
                     r"uses the SDK's headers as set; remove llamacpp_vulkan_sdk for this host", output), output[-3000:]
    assert result.returncode == 0, output[-3000:]


def test_upgrade_moves_both_release_groups_in_lockstep(master, workers):
    before = {name: build(host) for name, host in {"master": master, **workers}.items()}
    answer = http_json(master, SERVER_PORT, "/completion", ASK)["content"]
    with ApiClients(master) as clients:
        clients.event(f"upgrade.yml {COMMIT[:7]} (archive) -> {NEW_COMMIT[:7]} (git), Debian 12 and 13")
        result = run_playbook("upgrade.yml", "-e", NEW_VARS, timeout=1800)
        time.sleep(3)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    after = {name: build(host) for name, host in {"master": master, **workers}.items()}
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
    trixie = re.escape(after["worker2"]["build_id"])
    assert re.search(rf"^worker2: compile {trixie}: \d+% after \d+", output, re.M), output[-4000:]
    assert re.search(rf"^worker2: compile {trixie}: done in ", output, re.M), output[-4000:]
    # The nodes stopped together, at the moment agreed on the master's clock (llama-switch --at), not one after the
    # other as Ansible reached each: the outage is one node's stop -> start.
    spread = re.search(r"the 3 node\(s\) stopped within ([\d.]+) s of each other", " ".join(output.split()))
    assert spread and float(spread.group(1)) < 0.5, output[-3000:]
    wait_health(master, SERVER_PORT)
    assert http_json(master, SERVER_PORT, "/completion", ASK)["content"] == answer
    clients.report("through the front, upgrading Debian 12 and 13 nodes together:")
    clients.assert_none_failed()


def test_a_debian_13_master_runs_the_master_s_roles(master, workers, tmp_path):
    """site.yml on an inventory where worker2 (Debian 13) is the master and the monitor, over worker1 (Debian 12): the
    model is staged, llama-server runs behind HAProxy 3.0, node-exporter 1.9 and the cluster's exporter feed
    Prometheus 2.53, and the link to worker1 is measured. The same build serves: nothing compiles."""
    answer = http_json(master, SERVER_PORT, "/completion", ASK)["content"]
    source = Path(os.environ["MOLECULE_INVENTORY_FILE"])
    hosts = yaml.safe_load(source.read_text())["all"]["hosts"]
    shutil.copytree(source.parent / "group_vars", tmp_path / "group_vars")
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(yaml.safe_dump({"all": {
        "hosts": {name: hosts[name] for name in ("worker1", "worker2")},
        "children": {"llama_master": {"hosts": {"worker2": None}}, "llama_workers": {"hosts": {"worker1": None}},
                     "llama_monitor": {"hosts": {"worker2": None}}}}}))
    compiled = len(ledger())
    settings = json.loads(NEW_VARS) | {"llama_metrics": True, "llama_metrics_interval": 10, "llama_link_check": True,
                                       "llama_monitor_scrape_interval": 5}
    new_master = workers["worker2"]
    # The worker's state directory lets others in (a worker's first upgrade used to create it 0750, which kept a
    # master's llama-server from its staged model: it restarted for the 10 minutes of the play's health wait).
    assert new_master.check_output("stat -c %a /var/lib/llama.cpp") == "755"
    new_master.check_output("chmod 0750 /var/lib/llama.cpp")  # as a worker upgraded by 1.1.0 has it
    try:
        result = run_playbook("site.yml", "-e", json.dumps(settings), inventory=inventory, timeout=600)
    finally:
        new_master.check_output("chmod 0755 /var/lib/llama.cpp")
    assert_refused_in_preflight(result, r"worker2: llama-server, which does not run as root, could not read the "
                                        r"models staged in llama_storage_stage_dir \(/var/lib/llama\.cpp/models\): "
                                        r"/var/lib/llama\.cpp \(mode 750, root:root\) lets only its owner and group "
                                        r"in\. Fix: chmod o\+x /var/lib/llama\.cpp, or set llama_storage_stage_dir")
    # A llama-server that cannot start (here a flag it does not know) fails the play in seconds, with its error,
    # instead of after llama_server_health_timeout (600 s).
    bad = settings | {"llama_server_extra_args": ["--no-such-flag"]}
    began = time.monotonic()
    result = run_playbook("site.yml", "-e", json.dumps(bad), inventory=inventory, timeout=1200)
    output = " ".join((result.stdout + result.stderr).split())
    # At least 3 exits (the wait gives up at the third; a loaded host may see one more before it reads the count).
    exits = re.search(r"llama-server\.service exited (\d+) times in \d+ s since the wait for http://\S+/health began",
                      output)
    assert result.returncode != 0 and exits and int(exits.group(1)) >= 3, output[-4000:]
    assert "--no-such-flag" in output and time.monotonic() - began < 500, output[-4000:]
    result = run_playbook("site.yml", "-e", json.dumps(settings), inventory=inventory, timeout=1200)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    assert len(ledger()) == compiled, ledger()[compiled:]
    # The link check measured worker1 from the new master.
    link = link_rows(output)
    assert list(link) == ["worker1"] and link["worker1"]["address"] == address(workers["worker1"]), output[-4000:]
    assert float(link["worker1"]["gbits"]) > 0, link
    # llama-server behind the front (HAProxy 3.0), the model staged on local disk, every layer on worker1.
    assert new_master.check_output("haproxy -v | head -1").startswith("HAProxy version 3.0.")
    assert new_master.service("llama-server.service").is_running and new_master.service("llama-front.service").is_running
    served = new_master.check_output("systemctl show -p ExecStart --value llama-server.service")
    assert " -m /var/lib/llama.cpp/models/" in served and f"{address(workers['worker1'])}:{RPC_PORT}" in served, served
    wait_health(new_master, SERVER_PORT)
    assert http_json(new_master, SERVER_PORT, "/completion", ASK)["content"] == answer
    # Prometheus 2.53 scrapes both nodes' node-exporter (1.9 on Debian 13), llama-server and the front; the
    # cluster's exporter on the master sees worker1 connected.
    wanted = {'up{job="llama-node"}': {"worker1": 1, "worker2": 1}, 'up{job="llama-server"}': {"worker2": 1},
              'up{job="llama-front"}': {"worker2": 1}, "llama_cluster_worker_connected": {"worker1": 1}}
    deadline = time.monotonic() + 60
    while (seen := {expr: prometheus_query(new_master, expr) for expr in wanted}) != wanted:
        assert time.monotonic() < deadline, seen
        time.sleep(1)
    assert new_master.check_output("prometheus --version 2>&1 | head -1").startswith("prometheus, version 2.53.")
