"""The pre-fill's pieces (role llama_prefill), on real files: the compiled FNV-1a against the reference, the tensors a
GGUF's workers cache, the index module, the fill module reading from a file and from the master's real pre-fill source
over loopback (atomic, checked entries), and the plan and estimate filters.

Whether the names agree with llama.cpp's own is checked in the prefill scenario, against a real RPC server."""

import importlib
import hashlib
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from ansible.errors import AnsibleFilterError
from ansible.module_utils.testing import patch_module_args
from conftest import ROOT, load

from ansible_collections.llamacpp.rpc_cluster.plugins.filter import llama_prefill as prefill
from ansible_collections.llamacpp.rpc_cluster.plugins.module_utils import llama_gguf
from ansible_collections.llamacpp.rpc_cluster.plugins.module_utils import llama_tensor_hash as tensor_hash
from ansible_collections.llamacpp.rpc_cluster.plugins.modules import llama_rpc_fill, llama_rpc_index
SOURCE = ROOT / "roles" / "llama_prefill" / "files" / "llama-prefill-source"
GENERATOR = ROOT / "tools" / "make_tiny_model.py"
MIB = 1024 * 1024


def run_module(module, capsys, args, check_mode=False):
    if check_mode:
        args = dict(args, _ansible_check_mode=True)
    with patch_module_args(args), pytest.raises(SystemExit):
        module.main()
    return json.loads(capsys.readouterr().out)


@pytest.fixture(scope="module")
def library(tmp_path_factory):
    """The library as role llamacpp builds it (cc -O2 -shared) from files/llama-rpc-fnv.c."""
    out = tmp_path_factory.mktemp("fnv") / "libllama-rpc-fnv.so"
    subprocess.run(["cc", "-O2", "-shared", "-fPIC", "-o", str(out),
                    str(ROOT / "roles" / "llamacpp" / "files" / "llama-rpc-fnv.c")], check=True)
    return str(out)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    """A tied llama model whose ffn matrices (12 MiB) and token embeddings (62.5 MiB) are over the threshold and
    whose attention matrices (1 MiB) are not."""
    vocab = os.environ.get("LLAMA_VOCAB_GGUF")
    if not vocab or not Path(vocab).is_file():
        pytest.skip("LLAMA_VOCAB_GGUF is not set (make fixtures)")
    out = tmp_path_factory.mktemp("model") / "tied.gguf"
    subprocess.run([sys.executable, str(GENERATOR), "--vocab", vocab, "--out", str(out), "--n-layer", "2",
                    "--n-embd", "512", "--n-ff", "6144", "--n-head", "8", "--tied"], check=True,
                   stdout=subprocess.DEVNULL)
    return out


# --- the hash ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("size", [0, 1, 7, 4096, 3 * 1024 * 1024 + 5])
def test_the_compiled_hash_is_the_reference_one(library, size):
    data = bytearray(os.urandom(size))
    assert tensor_hash.Fnv1a(library).update(tensor_hash.FNV_OFFSET, data, size) == tensor_hash.fnv1a_python(data)


def test_the_reference_hash_is_fnv1a():
    """Published FNV-1a 64 test vectors."""
    assert tensor_hash.fnv1a_python(b"") == 0xCBF29CE484222325
    assert tensor_hash.fnv1a_python(b"a") == 0xAF63DC4C8601EC8C
    assert tensor_hash.fnv1a_python(b"foobar") == 0x85944171F73967E8
    assert tensor_hash.entry_name(0xAF63DC4C8601EC8C) == "af63dc4c8601ec8c"


def test_hashing_in_chunks_equals_hashing_at_once(library, tmp_path):
    """hash_stream reads in 8 MiB chunks: a tensor across several gives the hash of its bytes, and its sha256."""
    data = os.urandom(2 * tensor_hash.CHUNK + 123)
    path = tmp_path / "blob"
    path.write_bytes(b"x" * 100 + data)
    with open(path, "rb") as handle:
        value, sha256, done = tensor_hash.hash_stream(tensor_hash.file_reader(handle, 100), len(data),
                                                      tensor_hash.Fnv1a(library))
    whole = bytearray(data)
    assert (value, sha256, done) == (tensor_hash.Fnv1a(library).update(tensor_hash.FNV_OFFSET, whole, len(whole)),
                                     hashlib.sha256(data).hexdigest(), len(data))


# --- what the workers cache ------------------------------------------------------------------------


def test_cached_tensors_are_those_over_the_threshold_with_their_layers(model):
    info = llama_gguf.read_model_info(str(model))
    cached = {tensor["name"]: tensor for tensor in info["cache_tensors"]}
    assert sorted(cached) == sorted([f"blk.{layer}.ffn_{kind}.weight" for layer in (0, 1)
                                     for kind in ("gate", "up", "down")] + ["token_embd.weight"])
    # Tied embeddings: llama.cpp loads token_embd.weight again as the output matrix, on the output layer's device.
    assert cached["token_embd.weight"]["layer"] == 2
    assert cached["blk.1.ffn_up.weight"]["layer"] == 1
    assert all(tensor["size"] > llama_gguf.HASH_THRESHOLD for tensor in cached.values())
    # The offset is absolute: the bytes there are the tensor's.
    tensor = cached["blk.0.ffn_down.weight"]
    reader = pytest.importorskip("gguf").GGUFReader(str(model))
    expected = next(item for item in reader.tensors if item.name == tensor["name"])
    assert tensor["offset"] == expected.data_offset and tensor["size"] == expected.n_bytes


def test_a_tensor_of_exactly_the_threshold_is_not_cached():
    """ggml-rpc: size > HASH_THRESHOLD, strictly."""
    shard = {"path": "m.gguf", "data_offset": 0,
             "tensors": [{"name": "blk.0.a.weight", "n_bytes": llama_gguf.HASH_THRESHOLD, "offset": 0},
                         {"name": "blk.0.b.weight", "n_bytes": llama_gguf.HASH_THRESHOLD + 1, "offset": 0}]}
    assert [tensor["name"] for tensor in llama_gguf._cache_tensors([shard], 1, False)] == ["blk.0.b.weight"]


PLAN = {"devices": ["RPC0", "RPC1"], "layers": [[0, 1], [1, 3]], "tensor_split": [1, 2]}
DEVICES = [{"name": "RPC0", "host": "worker1", "endpoint": "10.0.0.1:50052"},
           {"name": "RPC1", "host": "worker2", "endpoint": "10.0.0.2:50052"}]


def test_each_worker_gets_the_tensors_of_its_layers(model):
    held = prefill.llama_prefill_tensors(llama_gguf.read_model_info(str(model))["cache_tensors"], PLAN, DEVICES)
    assert sorted(tensor["name"] for tensor in held["worker1"]) == [f"blk.0.ffn_{kind}.weight"
                                                                  for kind in ("down", "gate", "up")]
    assert sorted(tensor["name"] for tensor in held["worker2"]) == sorted(
        [f"blk.1.ffn_{kind}.weight" for kind in ("down", "gate", "up")] + ["token_embd.weight"])


def test_the_masters_own_devices_get_no_entries():
    devices = DEVICES[:1] + [{"name": "CUDA0", "host": "master", "endpoint": None}]
    plan = {"devices": ["RPC0", "CUDA0"], "layers": [[0, 1], [1, 3]]}
    held = prefill.llama_prefill_tensors([{"name": "blk.2.x", "layer": 2, "size": 1}], plan, devices)
    assert held == {"worker1": []}


# --- the index ----------------------------------------------------------------------------------------


def test_the_index_hashes_once_then_reads_its_file(model, library, tmp_path, capsys):
    tensors = llama_gguf.read_model_info(str(model))["cache_tensors"]
    args = {"identity": "abc", "tensors": tensors, "index_dir": str(tmp_path / "index"), "library": library,
            "log": str(tmp_path / "log")}
    first = run_module(llama_rpc_index, capsys, args)
    assert first["changed"] and first["hashed_bytes"] == sum(tensor["size"] for tensor in tensors)
    data = model.read_bytes()
    for tensor in tensors:
        entry = first["entries"][tensor["name"]]
        raw = data[tensor["offset"]:tensor["offset"] + tensor["size"]]
        assert entry["sha256"] == hashlib.sha256(raw).hexdigest()
        assert entry["hash"] == tensor_hash.entry_name(tensor_hash.Fnv1a(library).update(
            tensor_hash.FNV_OFFSET, bytearray(raw), len(raw)))
    assert "progress: hashed" in (tmp_path / "log").read_text()
    second = run_module(llama_rpc_index, capsys, args)
    assert not second["changed"] and second["hashed_bytes"] == 0 and second["entries"] == first["entries"]
    other = run_module(llama_rpc_index, capsys, dict(args, identity="def"), check_mode=True)
    assert other["entries"] == {} and sorted(other["missing"]) == sorted(tensor["name"] for tensor in tensors)


def test_the_probe_measures_the_disk_and_the_hash(model, library, tmp_path, capsys):
    tensors = llama_gguf.read_model_info(str(model))["cache_tensors"]
    result = run_module(llama_rpc_index, capsys, {"identity": "abc", "tensors": tensors, "index_dir": str(tmp_path),
                                                  "library": library, "probe": True}, check_mode=True)
    assert result["disk_mbps"] > 0 and result["hash_mbps"] > 0 and not result["changed"]


# --- the fill -------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def indexed(model, library, tmp_path_factory):
    tensors = llama_gguf.read_model_info(str(model))["cache_tensors"]
    index_dir = tmp_path_factory.mktemp("index")
    entries = {}
    for tensor in tensors:
        _name, entries[tensor["name"]] = llama_rpc_index.hash_tensor(tensor, tensor_hash.Fnv1a(library),
                                                                     tensor_hash.Progress("", 0, ""))
    return tensors, entries, index_dir


def owner():
    import pwd

    return pwd.getpwuid(os.getuid()).pw_name


def test_the_fill_writes_each_missing_entry_whole_and_named_by_its_bytes(indexed, library, model, tmp_path, capsys):
    tensors, index, _ = indexed
    entries = prefill.llama_prefill_entries(tensors, index, {"kind": "path", "dir": str(model.parent)})
    args = {"cache_dir": str(tmp_path / "cache"), "entries": entries, "owner": owner(), "library": library}
    planned = run_module(llama_rpc_fill, capsys, args, check_mode=True)
    assert planned["missing"]["count"] == len(tensors) and not (tmp_path / "cache").exists()
    done = run_module(llama_rpc_fill, capsys, args)
    assert done["changed"] and done["missing"]["count"] == len(tensors)
    data = model.read_bytes()
    for tensor in tensors:
        written = (tmp_path / "cache" / "rpc" / index[tensor["name"]]["hash"]).read_bytes()
        assert written == data[tensor["offset"]:tensor["offset"] + tensor["size"]]
    assert os.listdir(tmp_path / "cache" / "rpc-fill") == []
    again = run_module(llama_rpc_fill, capsys, args)
    assert not again["changed"] and again["present"]["count"] == len(tensors)


def test_a_short_entry_is_written_again(indexed, library, model, tmp_path, capsys):
    """An entry of the wrong size (an RPC server killed while writing it) is replaced."""
    tensors, index, _ = indexed
    entries = prefill.llama_prefill_entries(tensors[:1], index, {"kind": "path", "dir": str(model.parent)})
    rpc = tmp_path / "rpc"
    rpc.mkdir()
    (rpc / entries[0]["hash"]).write_bytes(b"short")
    result = run_module(llama_rpc_fill, capsys, {"cache_dir": str(tmp_path), "entries": entries, "owner": owner(),
                                                 "library": library})
    assert result["missing"]["count"] == 1
    assert (rpc / entries[0]["hash"]).stat().st_size == entries[0]["size"]


def test_a_source_with_other_bytes_puts_nothing_in_the_cache(indexed, library, model, tmp_path, capsys):
    tensors, index, _ = indexed
    other = tmp_path / "src" / model.name
    other.parent.mkdir()
    data = bytearray(model.read_bytes())
    tensor = tensors[0]
    data[tensor["offset"] + 1000] ^= 0xFF
    other.write_bytes(data)
    entries = prefill.llama_prefill_entries([tensor], index, {"kind": "path", "dir": str(other.parent)})
    result = run_module(llama_rpc_fill, capsys, {"cache_dir": str(tmp_path / "cache"), "entries": entries,
                                                 "owner": owner(), "library": library})
    assert result["failed"] and "hash to" in result["msg"] and tensor["name"] in result["msg"]
    assert os.listdir(tmp_path / "cache" / "rpc") == [] and os.listdir(tmp_path / "cache" / "rpc-fill") == []


def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture
def source(model):
    """The master's real pre-fill source on loopback, serving the model as 0/<its name>, capped at 400 Mbit/s."""
    port = free_port()
    process = subprocess.Popen([sys.executable, str(SOURCE), "--bind", "127.0.0.1", "--port", str(port), "--allow",
                                "127.0.0.1", "--rate-mbit", "400", f"0/{model.name}={model}"],
                               stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            time.sleep(0.1)
    yield f"http://127.0.0.1:{port}"
    process.terminate()
    process.wait(timeout=10)


def test_the_fill_reads_the_masters_source_under_its_cap(indexed, library, model, source, tmp_path, capsys):
    tensors, index, _ = indexed
    where = {"kind": "url", "base": source, "files": {model.name: f"0/{model.name}"}}
    entries = prefill.llama_prefill_entries(tensors, index, where)
    started = time.monotonic()
    result = run_module(llama_rpc_fill, capsys, {"cache_dir": str(tmp_path), "entries": entries, "owner": owner(),
                                                 "library": library, "threads": 2,
                                                 "log": str(tmp_path / "fill.log")})
    seconds = time.monotonic() - started
    assert result["changed"] and result["missing"]["count"] == len(tensors), result
    total = sum(tensor["size"] for tensor in tensors)
    assert seconds >= total * 8 / 400e6 * 0.9  # the source's cap held, for both connections together
    assert sorted(os.listdir(tmp_path / "rpc")) == sorted(index[tensor["name"]]["hash"] for tensor in tensors)
    assert "progress: written" in (tmp_path / "fill.log").read_text()


def test_the_source_refuses_what_it_does_not_serve(model, source):
    import urllib.error
    import urllib.request

    with pytest.raises(urllib.error.HTTPError) as missing:
        urllib.request.urlopen(urllib.request.Request(f"{source}/1/other.gguf", headers={"Range": "bytes=0-1"}))
    assert missing.value.code == 404
    with pytest.raises(urllib.error.HTTPError) as whole:
        urllib.request.urlopen(f"{source}/0/{model.name}")
    assert whole.value.code == 400


# --- the plan's arithmetic ------------------------------------------------------------------------------


def test_need_counts_each_content_once_and_what_is_present():
    tensors = {"worker1": [{"name": "a", "size": 100, "file": "/m/x.gguf", "offset": 0},
                           {"name": "b", "size": 50, "file": "/m/x.gguf", "offset": 100}]}
    known = {"a": {"hash": "0" * 16}, "b": {"hash": "1" * 16}}
    models = [{"source": "/m/x.gguf", "identity": "i", "tensors": tensors}]
    listing = ["123456", "0" * 16 + " 100", "2" * 16 + " 7", "not an entry"]
    need = prefill.llama_prefill_need(models, "worker1", known, listing)
    assert need == {"planned_bytes": 150, "missing_bytes": 50, "free": 123456, "files": {"/m/x.gguf": 150}}
    # An ahead model (no index yet): all of it counts as missing.
    ahead = {"source": "/m/y.gguf", "identity": "", "tensors": {"worker1": [{"name": "a", "size": 70,
                                                                              "file": "/m/y.gguf", "offset": 0}]}}
    assert prefill.llama_prefill_need(models + [ahead], "worker1", known, listing)["missing_bytes"] == 120


def test_the_estimate_adds_read_hash_and_what_crosses_the_links():
    weights = {"w1": {"cached": 4e9, "uncached": 1e9}, "w2": {"cached": 2e9, "uncached": 0}}
    estimate = prefill.llama_load_estimate(8e9, weights, {"w2": 10.0}, 1.0, ["w2"], disk_mbps=1000, hash_mbps=600)
    # w1 (assumed 1 Gbit/s, not pre-filled): 5 GB in 40 s; w2 (10 Gbit/s, pre-filled): nothing.
    assert (estimate["read"], estimate["hash"], estimate["send"]) == (8.0, 10.0, 40.0)
    assert estimate["seconds"] == 8 + 10 + 40 + prefill.LOAD_FIXED_SECONDS
    assert estimate["cold_bytes"] == 4e9 and not estimate["warm"] and estimate["links"] == {"w1": 1.0, "w2": 10.0}
    warm = prefill.llama_load_estimate(8e9, weights, {}, 1.0, ["w1", "w2"], 1000, 600)
    assert warm["warm"] and warm["send"] == 8.0 and warm["sent_bytes"] == 1e9
    assert prefill.llama_load_wait(estimate, 600) == 600
    assert prefill.llama_load_wait(dict(estimate, seconds=1000), 600) == 1500


def test_the_estimate_refuses_a_rate_that_is_not_positive():
    with pytest.raises(AnsibleFilterError, match="disk_mbps must be a positive number"):
        prefill.llama_load_estimate(1, {}, {}, 1.0, [], 0, 1)


def test_the_weights_of_each_worker_split_in_cached_and_not():
    model = {"n_layer": 2, "layer_bytes": [100, 200], "output_bytes": 50}
    held = {"worker1": [{"size": 80}], "worker2": [{"size": 150}, {"size": 40}]}
    assert prefill.llama_prefill_weights(model, PLAN, DEVICES, held) == {
        "worker1": {"weights": 100, "cached": 80, "uncached": 20},
        "worker2": {"weights": 250, "cached": 190, "uncached": 60}}


# --- the load's progress (llama_health_wait) ---------------------------------------------------------------


def test_the_load_progress_line_says_how_far_it_is():
    health = importlib.import_module("ansible_collections.llamacpp.rpc_cluster.plugins.modules.llama_health_wait")
    line = health.progress_line(42.4, 95, 503, (3 * 2**30, 2**29))
    assert line == ("progress: 42 s of ~95 s expected, /health 503; llama-server has read 3.0 GiB and sent "
                    "0.5 GiB")
    assert health.progress_line(3, 0, None, None) == "progress: 3 s, /health not answering"
    # As llama_job_wait shows it.
    wait = importlib.import_module("ansible_collections.llamacpp.rpc_cluster.plugins.action.llama_job_wait")
    assert wait.progress(line + "\n") == line[len("progress: "):]


def test_the_ahead_models_that_fit_are_planned(model):
    """llama_plan's loop results as Ansible registers them: a model that fits has failed false (failed_when), one that
    does not fit failed true; only the first is planned."""
    info = llama_gguf.read_model_info(str(model))
    read = {"item": {"path": "/srv/models/tied.gguf"}, "gguf": info, "model": {}}
    fits = {"item": read, "failed": False, "plan": PLAN, "devices": DEVICES}
    too_big = {"item": read, "failed": True, "msg": "does not fit"}
    results = [result for result in (fits, too_big) if not result["failed"]]
    [ahead] = prefill.llama_prefill_ahead_models(results)
    assert ahead["source"] == "/srv/models/tied.gguf" and ahead["bytes"] == info["file_bytes"]
    assert set(ahead["tensors"]) == {"worker1", "worker2"} and ahead["tensors"]["worker1"]

