"""A cluster across Debian releases: a Debian 12 master and worker1, a Debian 13 worker2 behind mutual TLS. One
commit and one RPC protocol in two build groups, each compiled once per suite on its release (Debian 12's 0c1e570 is
the cluster scenario's artifact: only trixie compiles it in full here); the split planned over both
workers answers as one process does; the firewall admits only the master on both releases; bad input named before
any change (a host without iproute2, a builder outside its release's group, a Vulkan SDK that trixie does not need);
then (test_instances.py) several instances, and upgrade.yml moving all three nodes in lockstep to the same sources
from git; last (test_debian13_master.py) worker2 as the master of worker1.

The tests run in this file's order: each starts from the state the one before left."""

import re
from shlex import quote

from cluster_helpers import (RPC_PORT, SERVER_PORT, WORKERS, address, assert_refused_in_preflight, http_json,
                             placement, run_playbook, single_process_completion, tcp_connects)
from mixed_helpers import ASK, COMMIT, build, ledger

HOSTS = ("master", "worker1", "worker2")
GCC = ("import glob, re; data = open(glob.glob('/opt/llama.cpp/current/lib/libggml-base.so*')[0], 'rb').read(); "
       "print(re.search(rb'GCC: [(][^)]*[)] ([0-9.]+)', data).group(1).decode())")


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
