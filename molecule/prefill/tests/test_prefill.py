"""Large models over a slow link (role llama_prefill): every load that would stream the weights through the master's
link inside the outage is pre-filled instead, while the old model serves.

The link into each worker is shaped to 100 Mbit/s (prepare.yml); what crosses it is counted on this machine's end of
each container's link interface (molecule/shared/link_bed.py), independently of any log. The model: 586 MiB, 444 MiB
of it in tensors over the cache's threshold (tools/fixtures.py MODELS["prefill"])."""

import json
import os
import re
import time

import pytest
from cluster_helpers import (ApiClients, SERVER_PORT, assert_refused_in_preflight, container, inventory_addresses,
                             main_pid, run_playbook, wait_health)
from link_bed import Link, host_end, shaped
from ansible_collections.llamacpp.rpc_cluster.plugins.module_utils.llama_gguf import read_model_info
from ansible_collections.llamacpp.rpc_cluster.plugins.filter.llama_prefill import llama_prefill_tensors
from suite_report import figures

CACHE = "/var/cache/llama.cpp/rpc"
INDEX = "/var/lib/llama.cpp/rpc-index"
MODEL_B = "/srv/models/prefill-b.gguf"
MIB = 1024 * 1024


@pytest.fixture(scope="module")
def link(workers):
    address = {name: cluster for name, (_, cluster) in inventory_addresses().items()}
    link = Link(host_end(container("master"), address["master"]),
                {name: host_end(container(name), address[name]) for name in workers})
    for name, end in link.worker_ends.items():
        assert shaped(end) == "100Mbit", f"the link into {name} ({end}) is not shaped: {shaped(end)}"
    return link


def entries(host):
    """{entry name: sha256 of its bytes} of a worker's RPC cache."""
    out = host.check_output(f"cd {CACHE} && find . -maxdepth 1 -type f -printf '%f\\n' | sort | xargs -r sha256sum")
    return {name: digest for digest, name in (line.split() for line in out.splitlines())}


def served(master):
    """(the model llama-server serves on the master, the record of its unit: plan, hosts)."""
    unit = master.file("/etc/systemd/system/llama-server.service").content_string
    record = json.loads(re.search(r"^# llama-cluster-plan: (.*)$", unit, re.M).group(1))
    return record["model"]["source"], record


def planned(master):
    """{worker: the entry names it must hold}, from the model's GGUF (this machine's copy of the fixture) and the plan
    and index on the master."""
    source, record = served(master)
    local = os.path.join(os.environ["LLAMA_CACHE_DIR"], "models", os.path.basename(source))
    tensors = read_model_info(local)["cache_tensors"]
    devices = [{"name": name, "host": host, "endpoint": "rpc" if name.startswith("RPC") else None}
               for name, host in record["hosts"].items()]
    held = llama_prefill_tensors(tensors, record["plan"], devices)
    identity = master.check_output(f"grep -h -o 'LLAMA_MODEL_ID=.*' /etc/systemd/system/llama-server.service")
    index = json.loads(master.file(f"{INDEX}/{identity.split('=', 1)[1]}.json").content_string)["entries"]
    return {worker: {index[tensor["name"]]["hash"] for tensor in tensors_} for worker, tensors_ in held.items()}


def journal_window(master, since):
    """(drain, stop, loaded) on the monotonic clock, in llama-server's journal since `since` (monotonic s): systemd
    stopping llama-server (the front's drain begins: it still serves what runs), the drain's end (the outage begins),
    then llama-server's "model loaded" (it ends)."""
    out = master.check_output("journalctl -u llama-server.service -o json --no-pager --since -15min")
    drain = stop = loaded = None
    for line in out.splitlines():
        entry = json.loads(line)
        at = int(entry["__MONOTONIC_TIMESTAMP"]) / 1e6
        message = entry.get("MESSAGE")
        if at < since or not isinstance(message, str):
            continue
        if drain is None and message.startswith("Stopping llama-server"):
            drain = stop = at
        elif drain is not None and message.startswith("llama-front-drain: ") and "holding new" not in message:
            stop = at
        elif drain is not None and "model loaded" in message:
            loaded = at
    assert drain and loaded, f"no stop and load of llama-server since {since} in its journal"
    return drain, stop, loaded


def timed_load(master, link, verb):
    """`systemctl VERB llama-server` and its load: (seconds to /health 200, bytes the master sent, {worker: bytes it
    received})."""
    with link.sampling() as sampled:
        started = time.monotonic()
        master.check_output(f"systemctl {verb} llama-server.service")
        wait_health(master, SERVER_PORT, timeout=600)
        seconds = time.monotonic() - started
    return (seconds, *sampled.crossed(started, time.monotonic()))


def test_the_first_deploy_filled_each_worker_with_its_planned_tensors(master, workers):
    """site.yml (converge) filled the caches before it first started llama-server: every worker holds exactly the
    entries of its planned layers, whole, owned by the RPC server's user, and no RPC server wrote one itself."""
    expected = planned(master)
    for name, host in workers.items():
        assert set(entries(host)) == expected[name], name
        assert host.check_output(f"stat -c '%U %a' {CACHE}/* | sort -u") == "llama 644"
        assert host.check_output(f"ls -A {os.path.dirname(CACHE)}/rpc-fill") == ""
        written = host.run("journalctl -u llama-rpc-server.service --no-pager -o cat | grep -c 'saved to'").stdout
        assert written.strip() == "0", f"{name}'s RPC server wrote cache entries itself: the load streamed them"


@pytest.fixture(scope="module")
def prefilled(workers):
    """What the pre-fill wrote, before the next test empties the caches."""
    return {name: entries(host) for name, host in workers.items()}


def test_the_names_agree_with_llama_cpps_own(master, workers, link, prefilled):
    """With the caches emptied, a cold load streams the tensors and the RPC servers write their own entries: the same
    names with the same bytes as the pre-fill's. It also measures the cold load over the shaped link."""
    master.check_output("systemctl stop llama-server.service")
    for host in workers.values():
        host.check_output(f"find {CACHE} -maxdepth 1 -type f -delete")
    assert all(entries(host) == {} for host in workers.values())
    seconds, sent, received = timed_load(master, link, "start")
    written = {name: entries(host) for name, host in workers.items()}
    assert written == prefilled
    total = sum(int(host.check_output(f"du -sb {CACHE} | cut -f1")) for host in workers.values())
    assert sum(received.values()) >= total, (received, total)
    figures("prefill: cold load over 100 Mbit/s links", [
        f"  {seconds:.1f} s; {sent / MIB:.0f} MiB left the master, {received} bytes reached the workers; "
        f"{len(written['worker1']) + len(written['worker2'])} entries, {total / MIB:.0f} MiB, as the pre-fill's"])
    pytest.cold_load = seconds


def test_a_warm_load_sends_almost_nothing(master, workers, link):
    seconds, sent, received = timed_load(master, link, "restart")
    model = int(master.check_output("stat -L -c %s /srv/models/prefill.gguf"))
    assert sum(received.values()) < model / 100, received
    cold = getattr(pytest, "cold_load", None)
    figures("prefill: warm load", [
        f"  {seconds:.1f} s; {sent / MIB:.2f} MiB left the master ({100 * sent / model:.2f} % of the model); "
        f"cold ÷ warm {cold / seconds:.1f}" if cold else f"  {seconds:.1f} s, {sent / MIB:.2f} MiB sent"])


@pytest.fixture
def small_disk(workers):
    """A 32 MiB file system on worker1 at /srv/small."""
    workers["worker1"].check_output("mkdir -p /srv/small && mount -t tmpfs -o size=32m tmpfs /srv/small")
    yield
    workers["worker1"].run("umount /srv/small")


BAD = {
    "cap": (["-e", "llama_rpc_cache_max_mib=100"],
            r"worker\d: its planned layers hold \d+ MiB of cached tensors \(the served model\), more than "
            r"llama_rpc_cache_max_mib 100: .* Raise llama_rpc_cache_max_mib to at least \d+"),
    "source": (["-e", "llama_prefill_source=local", "-e", "llama_prefill_local_dir=/srv/copies"],
               r"worker\d: llama_prefill_source is local, but /srv/copies/prefill\.gguf is missing or shorter than "
               r"the master's copy here\. Copy the models into llama_prefill_local_dir"),
    # Without the pre-fill, a cold load over these links (0.1 Gbit/s) takes longer than a 20 s hold.
    "hold": (["-e", json.dumps({"llama_prefill_enabled": False, "llama_front_hold_seconds": 20})],
             r"master: loading prefill\.gguf is expected to take \d+ s \(read [\d.]+ s, hash [\d.]+ s, send "
             r"[\d.]+ s over the links\), longer than llama_front_hold_seconds 20: every request held while "
             r"llama-server restarts would fail\. Turn the pre-fill on \(llama_prefill_enabled: true\) where it is "
             r"off: the load then sends no cached weight and is expected to take \d+ s; or raise "
             r"llama_front_hold_seconds to \d+ or more\."),
    "disk": (["-e", "llama_rpc_cache_dir=/srv/small/cache"],
             r"worker1: the pre-fill would write \d+ MiB of tensors into /srv/small/cache \(llama_rpc_cache_dir\), "
             r"which has \d+ MiB free\."),
}


# A worker's copies, its cache's cap and its disk are checked together (roles/llama_prefill/tasks/preflight.yml): one
# run shows these three; "hold", the master's estimate after every host's own checks, needs a run of its own.
TOGETHER = ["cap", "source", "disk"]


@pytest.fixture(scope="module")
def refusals(master, workers):
    """{case: (the site.yml run that shows it, llama-server's PID before it)}: TOGETHER's cases in one run."""
    results = {}

    def refused(case, request):
        group = TOGETHER if case in TOGETHER else [case]
        if group[0] not in results:
            if "disk" in group:
                request.getfixturevalue("small_disk")
            before = main_pid(master, "llama-server.service")
            args = [arg for name in group for arg in BAD[name][0]]
            results[group[0]] = (run_playbook("site.yml", *args, timeout=600), before)
        return results[group[0]]
    return refused


@pytest.mark.parametrize("case", BAD)
def test_bad_input_changes_nothing(case, master, refusals, request):
    result, before = refusals(case, request)
    assert_refused_in_preflight(result, BAD[case][1])
    assert main_pid(master, "llama-server.service") == before


def test_a_switch_fills_while_serving_and_the_outage_moves_hashes_only(master, workers, link):
    """A new model: site.yml stages it, pre-fills both workers over the shaped links while the old model serves, then
    restarts llama-server onto it. Inside the outage almost nothing crosses the links, and no client's request fails.
    The old model, named in llama_storage_ahead (staged ahead for a switch back) and emptied from the caches first, is
    pre-filled too."""
    model = int(master.check_output(f"stat -L -c %s {MODEL_B}"))
    served_a = planned(master)
    for host in workers.values():
        host.check_output(f"find {CACHE} -maxdepth 1 -type f -delete")
    with link.sampling() as sampled, ApiClients(master) as clients:
        clients.event("site.yml switches to prefill-b")
        since = time.monotonic()
        result = run_playbook("site.yml", "-e", json.dumps({"llama_model_path": MODEL_B, "llama_storage_ahead": [
            {"path": "/srv/models/prefill.gguf"}]}), timeout=1800)
        clients.event("after the switch")
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    assert re.search(r"pre-fill from master: written [\d.]+ \w+ of", output), output[-4000:]
    drain, stop, loaded = journal_window(master, since)
    sent, received = sampled.crossed(stop, loaded)
    _, total = sampled.crossed(since, time.monotonic())
    assert served(master)[0] == MODEL_B
    expected = planned(master)
    for name, host in workers.items():
        assert expected[name] | served_a[name] == set(entries(host)), name
    assert sum(received.values()) < model / 100, (received, model)
    clients.assert_none_failed()
    clients.report("prefill: clients through the switch")
    figures("prefill: switch to another 586 MiB model", [
        f"  drain (requests in progress end, new ones held) {stop - drain:.1f} s, then outage (llama-server stopped ->"
        f" model loaded) {loaded - stop:.1f} s; inside it {sent / MIB:.2f} MiB left "
        f"the master ({100 * sent / model:.2f} % of the model), {sum(received.values()) / MIB:.2f} MiB reached the "
        f"workers; the whole run moved {sum(total.values()) / MIB:.0f} MiB into them"])
