"""Models (role llama_storage): a verified local copy by default; a network share (sshfs from the stranger: the
kernel here has no NFS client) staged or read in place without mmap; bad files refused with the old model
serving; new content at the same path restaged and restarted once; the real SmolLM2 model served; last, the master and
a worker decommissioned."""

import hashlib
import json
import os
import re
from pathlib import Path

import pytest
from cluster_helpers import (SERVER_PORT, ApiClients, assert_decommissioned, assert_refused_in_preflight, cmdline,
                             connect, drains, failure_messages, http_json, main_pid, measure_serving, monotonic, option,
                             recap, run_playbook, single_process_completion, wait_health)
from suite_report import figures

MODELS = Path(os.environ["LLAMA_CACHE_DIR"]) / "models"
SMOLLM2_SHA256 = os.environ["LLAMA_MODEL_SMOLLM2_SHA256"]
STAGE_DIR = "/var/lib/llama.cpp/models"
# The stranger's /srv/nas over sshfs (FUSE), read-only, readable by the llama user.
SHARE = {"llama_storage_mount_src": "stranger:/srv/nas", "llama_storage_mount_fstype": "fuse.sshfs",
         "llama_storage_mount_opts": "ro,allow_other,IdentityFile=/root/.ssh/llama-nas,"
                                    "StrictHostKeyChecking=accept-new,reconnect,_netdev"}
FRANCE = {"prompt": "The capital of France is", "n_predict": 8, "temperature": 0, "seed": 42, "cache_prompt": False}
PROMPT = {"prompt": "Once upon a time", "n_predict": 32, "temperature": 0, "seed": 1234, "cache_prompt": False}
LOADS = {}


@pytest.fixture(scope="module")
def nas():
    return connect("stranger")


def sha256(path):
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


# What a model change touches, as an operator applies it: the facts and every check always run; time sync, the
# build and the firewall are left out (test_tags.py tests that tags select their parts, the converge runs them all).
# The pre-fill fills the workers' caches with the new model's tensors before llama-server restarts onto it.
MODEL_PARTS = "models,workers,prefill,master,smoke"


def deploy(**extra):
    result = run_playbook("site.yml", "--tags", MODEL_PARTS, "-e", json.dumps(dict(SHARE, **extra)), timeout=900)
    return result, result.stdout + result.stderr


def server_args(master):
    return cmdline(master, main_pid(master, "llama-server.service"))


def restarts(output):
    return output.count("RUNNING HANDLER [llamacpp.rpc_cluster.llama_server : Restart llama-server]")


def test_the_converged_model_is_a_verified_local_copy(master):
    args = server_args(master)
    digest = sha256(MODELS / "cluster.gguf")
    assert option(args, "-m") == f"{STAGE_DIR}/{digest[:12]}/cluster.gguf"
    assert master.file(option(args, "-m")).sha256sum == digest
    manifest = json.loads(master.file(f"{STAGE_DIR}/manifest.json").content_string)
    assert manifest["sources"]["/srv/models/cluster.gguf"]["sha256"] == digest
    # Local disk, but the workers hold layers: no mmap (llama_server_mmap auto), or the master's resident memory would
    # hold the whole model while it streams them the weights.
    assert option(args, "--load-mode") == "none"


def test_a_model_on_the_share_is_staged_and_the_real_model_answers(master, nas):
    nas.check_output("cp /srv/nas/smollm2.gguf /srv/nas/current.gguf")
    before = main_pid(master, "llama-server.service")
    result, output = deploy(llama_model_path="/mnt/models/current.gguf")
    assert result.returncode == 0, output[-4000:]
    assert master.check_output("findmnt -n -o FSTYPE /mnt/models") == "fuse.sshfs"
    fstab = master.file("/etc/fstab").content_string
    assert re.search(r"^stranger:/srv/nas /mnt/models fuse.sshfs ro,allow_other,.*_netdev", fstab, re.M), fstab
    # The copy shows its progress; llama-server restarted once, onto the copy.
    assert re.search(r"current\.gguf: 94 MiB of 94 MiB \(100%\)", output), output[-4000:]
    assert restarts(output) == 1 and main_pid(master, "llama-server.service") != before
    args = server_args(master)
    assert option(args, "-m") == f"{STAGE_DIR}/{SMOLLM2_SHA256[:12]}/current.gguf"
    assert option(args, "--load-mode") == "none"  # the workers hold layers (llama_server_mmap auto)
    wait_health(master, SERVER_PORT)
    answer = http_json(master, SERVER_PORT, "/completion", FRANCE)
    assert "Paris" in answer["content"], answer["content"]
    # The real model through both workers answers as one process does.
    cluster = http_json(master, SERVER_PORT, "/completion", PROMPT)
    alone = single_process_completion(master, option(args, "-m"), PROMPT)
    assert cluster["tokens_predicted"] == alone["tokens_predicted"] == 32
    assert cluster["content"] == alone["content"]
    LOADS["stage"] = measure_serving(master, runs=3)["load_s"]


def test_new_content_at_the_same_path_is_staged_and_served_once(master, nas):
    nas.check_output("cp /srv/nas/cluster.gguf /srv/nas/current.gguf.part && mv /srv/nas/current.gguf.part "
                     "/srv/nas/current.gguf")
    # The front holds their requests through the restart; the stream in flight when it drains ends whole.
    with ApiClients(master, groups=(*ApiClients.GROUPS, ApiClients.STREAMS)) as clients:
        since = monotonic(master)
        clients.event("site.yml: a new model at the same path")
        result, output = deploy(llama_model_path="/mnt/models/current.gguf")
    clients.report("clients through the front, a new model at the same path:")
    assert result.returncode == 0, output[-4000:]
    clients.assert_none_failed()
    drained = drains(master, since)
    clients.assert_streamed_through(drained)
    figures("a model switch drains first", [f"  the drain took {drained[0][1] - drained[0][0]:.1f} s "
                                           f"({drained[0][3]}), before the outage" if drained else "  no drain"])
    # Held, not hung: the restarts' work (stop within TimeoutStopSec, workers, model load) takes seconds here; a
    # request held as long as systemd's 90 s stop timeout (llama-server under load never ends on SIGTERM) fails this.
    assert max(clients.longest().values()) < 30, clients.longest()
    assert "changed: [master] => (item=current.gguf: " in output
    assert restarts(output) == 1
    digest = sha256(MODELS / "cluster.gguf")
    assert option(server_args(master), "-m") == f"{STAGE_DIR}/{digest[:12]}/current.gguf"
    pid = main_pid(master, "llama-server.service")
    # Again: nothing copied (size + mtime + the recorded checksum), nothing restarted, nothing changed.
    result, output = deploy(llama_model_path="/mnt/models/current.gguf")
    assert result.returncode == 0, output[-4000:]
    assert "item=current.gguf: " not in output and restarts(output) == 0
    assert all(counts["changed"] == 0 for counts in recap(output).values()), output[-4000:]
    assert main_pid(master, "llama-server.service") == pid
    # Pruned to llama_storage_keep (2) copies: the served one and the newest other.
    staged = master.check_output(f"find {STAGE_DIR} -mindepth 1 -maxdepth 1 -type d -not -name '.*'").split()
    assert len(staged) == 2, staged


def test_direct_mode_reads_the_share_without_mmap(master, workers):
    # A cap below the planned tensors: the pre-fill (which checks that the cap holds them) is off here.
    result, output = deploy(llama_model_path="/mnt/models/smollm2.gguf", llama_model_mode="direct",
                            llama_model_sha256=SMOLLM2_SHA256, llama_rpc_cache_max_mib=1, llama_prefill_enabled=False,
                            llama_storage_ahead=[{"path": "/mnt/models/smollm2.gguf", "sha256": SMOLLM2_SHA256}])
    assert result.returncode == 0, output[-4000:]
    # Staged ahead (same content as current.gguf's first copy: that directory gets this name too).
    assert master.file(f"{STAGE_DIR}/{SMOLLM2_SHA256[:12]}/smollm2.gguf").sha256sum == SMOLLM2_SHA256
    assert "on fuse.sshfs, a network filesystem: read without mmap (--load-mode none)" in output
    args = server_args(master)
    assert option(args, "-m") == "/mnt/models/smollm2.gguf"
    assert option(args, "--load-mode") == "none"
    wait_health(master, SERVER_PORT)
    assert "Paris" in http_json(master, SERVER_PORT, "/completion", FRANCE)["content"]
    # The workers' tensor cache was held under its 1 MiB cap, and the play said so.
    assert re.search(r"worker\d: rpc cache /var/cache/llama.cpp: \d+ entr(y|ies), .* of 1\.0 MiB cap; removed", output)
    LOADS["direct"] = measure_serving(master, runs=3)["load_s"]
    figures("SmolLM2-135M Q4_1 load (restart -> /health 200, median of 3)",
            [f"staged on local disk: {LOADS.get('stage', float('nan')):.2f} s; direct from sshfs without mmap: "
             f"{LOADS['direct']:.2f} s"])


def test_a_model_staged_ahead_is_switched_to_without_copying(master):
    result, output = deploy(llama_model_path="/mnt/models/smollm2.gguf", llama_model_sha256=SMOLLM2_SHA256)
    assert result.returncode == 0, output[-4000:]
    assert "item=smollm2.gguf: " not in output and restarts(output) == 1
    assert option(server_args(master), "-m") == f"{STAGE_DIR}/{SMOLLM2_SHA256[:12]}/smollm2.gguf"
    wait_health(master, SERVER_PORT)
    assert "Paris" in http_json(master, SERVER_PORT, "/completion", FRANCE)["content"]


BAD = {
    "truncated": ("head -c 60000000 /srv/nas/smollm2.gguf > /srv/nas/bad.gguf", {},
                  r"master: llama_model_path '/mnt/models/bad\.gguf' cannot be read as a GGUF model on master: "
                  r".*truncated GGUF"),
    "wrong magic": ("(printf GGML; tail -c +5 /srv/nas/smollm2.gguf) > /srv/nas/bad.gguf", {},
                    r"master: llama_model_path '/mnt/models/bad\.gguf' cannot be read as a GGUF model on master: "
                    r".*not a GGUF file"),
}


@pytest.mark.parametrize("case", BAD)
def test_a_bad_file_is_refused_in_preflight(case, master, nas):
    make, extra, message = BAD[case]
    nas.check_output(make)
    before = main_pid(master, "llama-server.service")
    result, _ = deploy(llama_model_path="/mnt/models/bad.gguf", **extra)
    assert_refused_in_preflight(result, message)
    assert main_pid(master, "llama-server.service") == before
    wait_health(master, SERVER_PORT, timeout=10)


def test_a_copy_with_the_wrong_checksum_is_never_served(master):
    before = main_pid(master, "llama-server.service")
    result, output = deploy(llama_model_path="/mnt/models/smollm2.gguf", llama_model_sha256="0" * 64)
    assert result.returncode != 0
    messages = failure_messages(output)
    assert any(re.match(rf"master: /mnt/models/smollm2\.gguf has sha256 {SMOLLM2_SHA256}, not llama_model_sha256 "
                        r"0{64}: .*the running model is untouched", text) for text in messages), messages
    assert "PLAY [Run llama-server" not in output
    assert not master.file(f"{STAGE_DIR}/.incoming").exists
    assert main_pid(master, "llama-server.service") == before
    wait_health(master, SERVER_PORT, timeout=10)


def test_an_nfs_share_as_far_as_this_kernel_allows(master):
    """The kernel here has no NFS client: the role installs nfs-common and tries the mount with options for
    large sequential reads; mount.nfs4 fails, the run stops in its first plays with a message naming the
    share, fstab is put back and the cluster keeps serving. The line it tried is one systemd takes: a mount
    unit (remote, after the network) and its automount."""
    before = main_pid(master, "llama-server.service")
    result = run_playbook("site.yml", "-e", json.dumps({
        "llama_storage_mount_src": "stranger:/srv/nas", "llama_storage_mount_path": "/mnt/nfs",
        "llama_storage_mount_fstype": "nfs4", "llama_storage_mount_automount": True,
        "llama_model_path": "/mnt/nfs/smollm2.gguf"}), timeout=600)
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert master.package("nfs-common").is_installed
    messages = failure_messages(output)
    tried = [re.match(r"master: could not mount llama_storage_mount_src 'stranger:/srv/nas' on /mnt/nfs \(nfs4, "
                      r"(?P<opts>[^)]+)\): mount\.nfs4: .*Check the share is exported", text) for text in messages]
    tried = [match for match in tried if match]
    assert tried, messages
    opts = tried[0].group("opts")
    assert opts == ("ro,vers=4.2,proto=tcp,hard,rsize=1048576,nconnect=4,noatime,_netdev,x-systemd.automount")
    assert "PLAY [Facts]" not in output and "/mnt/nfs" not in master.file("/etc/fstab").content_string
    assert main_pid(master, "llama-server.service") == before
    # systemd's own fstab generator on that line.
    generated = master.check_output(
        f"echo 'stranger:/srv/nas /mnt/nfs nfs4 {opts} 0 0' > /tmp/fstab.nfs && rm -rf /tmp/gen && mkdir /tmp/gen && "
        "SYSTEMD_FSTAB=/tmp/fstab.nfs /lib/systemd/system-generators/systemd-fstab-generator /tmp/gen /tmp/gen "
        "/tmp/gen && cat /tmp/gen/mnt-nfs.mount && ls /tmp/gen /tmp/gen/remote-fs.target.requires")
    assert "What=stranger:/srv/nas" in generated and "Type=nfs4" in generated
    assert f"Options={opts.replace(',x-systemd.automount', '')}" in generated or f"Options={opts}" in generated
    assert "mnt-nfs.automount" in generated


def test_a_prune_on_request_drops_the_tensors_no_load_used(master, workers):
    """llama_rpc_cache_prune: an entry of a worker's tensor cache that no load used since the RPC server started (a
    stale one, planted) stays in a run without it and goes in a run with it, alone: the served model's tensors stay
    (worker2's: worker1's layers have no tensor large enough to cache), and the cluster serves."""
    worker = workers["worker2"]
    stale = "/var/cache/llama.cpp/rpc/" + "ab" * 8
    worker.check_output(f"head -c 65536 /dev/zero > {stale} && touch -a -m -d 2020-01-01 {stale}")
    served = {"llama_model_path": "/mnt/models/smollm2.gguf", "llama_model_sha256": SMOLLM2_SHA256}
    summary = r"worker2: rpc cache /var/cache/llama\.cpp: (\d+) entr(?:y|ies), .*; "
    result, output = deploy(**served)
    assert result.returncode == 0, output[-4000:]
    assert worker.file(stale).exists
    before = re.search(summary + "nothing to remove", output)
    assert before and int(before.group(1)) >= 2, output[-4000:]  # the stale entry and the served model's
    result, output = deploy(llama_rpc_cache_prune=True, **served)
    assert result.returncode == 0, output[-4000:]
    assert not worker.file(stale).exists
    after = re.search(summary + r"removed 1 \(64 KiB\)", output)
    assert after and int(after.group(1)) == int(before.group(1)) - 1, output[-4000:]
    wait_health(master, SERVER_PORT)
    assert "Paris" in http_json(master, SERVER_PORT, "/completion", FRANCE)["content"]


def test_decommission_removes_the_project_from_the_master_and_a_worker(master, workers):
    """Last of the scenario: playbooks/decommission.yml on the deployed master and worker2 (nftables) removes the
    project there - units, files, the service user, the firewall table, the share's mount and fstab line, the staged
    copies - and touches nothing else: worker1 keeps serving its RPC port, behind its table; chrony, node-exporter and
    the packages stay; a second run changes nothing."""
    assert master.run("findmnt /mnt/models").rc == 0
    gone, kept = (master, workers["worker2"]), workers["worker1"]
    limit = ("--limit", "master,worker2", "-e", json.dumps(SHARE))
    result = run_playbook("playbooks/decommission.yml", *limit, timeout=600)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    for host in gone:
        assert_decommissioned(host)
        assert "llama_cluster" not in host.check_output("nft list tables")
        assert host.service("chrony.service").is_running and host.service("prometheus-node-exporter.service").is_running
        assert host.run("dpkg-query -W -f '${db:Status-Status}' nftables chrony").stdout == "installedinstalled"
    assert master.run("findmnt /mnt/models").rc != 0
    assert "stranger:/srv/nas" not in master.file("/etc/fstab").content_string
    assert not master.file(STAGE_DIR).exists
    assert master.package("haproxy").is_installed and master.service("prometheus.service").is_running
    # The worker not named: its units, user and table as they were.
    assert kept.service("llama-rpc-server.service").is_running and kept.run("getent passwd llama").rc == 0
    assert "llama.cpp cluster: RPC" in kept.check_output("nft list table inet llama_cluster")
    again = run_playbook("playbooks/decommission.yml", *limit, timeout=600)
    assert again.returncode == 0, (again.stdout + again.stderr)[-4000:]
    assert all(recap(again.stdout)[name]["changed"] == 0 for name in ("master", "worker2")), again.stdout[-3000:]
