"""Unit tests of the pure-Python GGUF reader, against files written and read by the PyPI gguf package."""

import importlib.util
import json
import re
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest
from ansible.module_utils.testing import patch_module_args
from gguf import GGMLQuantizationType as Q

from ansible_collections.llamacpp.rpc_cluster.plugins.module_utils import llama_gguf
from ansible_collections.llamacpp.rpc_cluster.plugins.filter import llama_split
from ansible_collections.llamacpp.rpc_cluster.plugins.module_utils.llama_gguf import GGUFError, read_gguf, read_model_info

N_EMBD, N_HEAD, N_VOCAB, N_FF = 64, 4, 96, 128
HEAD_DIM = N_EMBD // N_HEAD
PLUGINS = "ansible_collections.llamacpp.rpc_cluster.plugins"
LIBRARY = Path(__file__).resolve().parents[2] / "plugins" / "modules"


def _add_tensor(writer, rng, name, shape, qtype):
    """Add a random tensor; `shape` is numpy order (rows, columns), the reverse of ggml's dims."""
    data = rng.standard_normal(shape).astype(np.float32)
    if qtype == Q.F16:
        writer.add_tensor(name, data.astype(np.float16))
    elif qtype == Q.F32:
        writer.add_tensor(name, data)
    else:
        writer.add_tensor(name, gguf.quants.quantize(data, qtype), raw_dtype=qtype)


def write_llama(path, n_layer=3, n_head_kv=2, tied=False, qtype=Q.F32, split_max_tensors=0, block_count=True,
                extra_keys=None):
    """Write a tiny random-weight llama GGUF (possibly split) and return the path of its first file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(str(path), "llama", split_max_tensors=split_max_tensors)
    if block_count:
        writer.add_block_count(n_layer)
    writer.add_context_length(2048)
    writer.add_embedding_length(N_EMBD)
    writer.add_feed_forward_length(N_FF)
    writer.add_head_count(N_HEAD)
    writer.add_head_count_kv(n_head_kv)
    for key, (value, add) in (extra_keys or {}).items():
        getattr(writer, add)(key, value)
    per_layer_kv = n_head_kv if isinstance(n_head_kv, list) else [n_head_kv] * n_layer
    rng = np.random.default_rng(0)
    _add_tensor(writer, rng, "token_embd.weight", (N_VOCAB, N_EMBD), qtype)
    for index, n_kv in enumerate(per_layer_kv):
        for name, shape, tensor_type in (
            ("attn_norm.weight", (N_EMBD,), Q.F32),
            ("attn_q.weight", (N_EMBD, N_EMBD), qtype),
            ("attn_k.weight", (n_kv * HEAD_DIM, N_EMBD), qtype),
            ("attn_v.weight", (n_kv * HEAD_DIM, N_EMBD), qtype),
            ("attn_output.weight", (N_EMBD, N_EMBD), qtype),
            ("ffn_norm.weight", (N_EMBD,), Q.F32),
            ("ffn_gate.weight", (N_FF, N_EMBD), qtype),
            ("ffn_up.weight", (N_FF, N_EMBD), qtype),
            ("ffn_down.weight", (N_EMBD, N_FF), qtype),
        ):
            _add_tensor(writer, rng, f"blk.{index}.{name}", shape, tensor_type)
    _add_tensor(writer, rng, "output_norm.weight", (N_EMBD,), Q.F32)
    if not tied:
        _add_tensor(writer, rng, "output.weight", (N_VOCAB, N_EMBD), qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return writer.format_shard_names(path)[0]


def reference_sizes(paths):
    """{tensor name: n_bytes} over all files, as the gguf package's GGUFReader computes them."""
    return {tensor.name: int(tensor.n_bytes) for path in paths for tensor in gguf.GGUFReader(path).tensors}


def test_ggml_type_table_matches_gguf():
    assert {type_id: (name, block, size) for type_id, (name, block, size) in llama_gguf.GGML_TYPES.items()} == {
        int(qtype): (qtype.name, *gguf.GGML_QUANT_SIZES[qtype]) for qtype in Q}


def test_module_util_needs_only_the_standard_library():
    source = Path(llama_gguf.__file__).read_text(encoding="utf-8")
    imports = {line.split()[1] for line in source.splitlines() if line.startswith(("import ", "from "))}
    assert imports <= set(sys.stdlib_module_names)


@pytest.mark.parametrize("qtype", [Q.F32, Q.F16, Q.Q8_0, Q.Q4_0])
@pytest.mark.parametrize("tied", [False, True])
def test_layer_and_output_bytes_match_gguf_reader(tmp_path, qtype, tied):
    path = write_llama(tmp_path / "model.gguf", qtype=qtype, tied=tied)
    sizes = reference_sizes([path])
    info = read_model_info(str(path))
    assert info["n_layer"] == 3
    assert info["layer_bytes"] == [sum(size for name, size in sizes.items() if name.startswith(f"blk.{index}."))
                                   for index in range(3)]
    output = sizes["output_norm.weight"] + sizes["token_embd.weight" if tied else "output.weight"]
    assert info["output_bytes"] == output
    assert info["tied_embeddings"] is tied
    assert info["other_bytes"] == sizes["token_embd.weight"]
    assert info["tensor_count"] == len(sizes)
    assert info["file_bytes"] == path.stat().st_size
    assert info["files"] == [str(path)]
    assert (info["architecture"], info["n_embd"], info["n_head"], info["n_head_kv"], info["context_length"]) == \
        ("llama", N_EMBD, N_HEAD, 2, 2048)


def test_tensor_infos_match_gguf_reader(tmp_path):
    path = write_llama(tmp_path / "model.gguf", qtype=Q.Q8_0)
    parsed = read_gguf(str(path))
    reference = gguf.GGUFReader(path)
    assert parsed["version"] == 3
    assert [(t["name"], t["dims"], t["type"], parsed["data_offset"] + t["offset"], t["n_bytes"])
            for t in parsed["tensors"]] == \
        [(t.name, [int(d) for d in t.shape], t.tensor_type.name, t.data_offset, int(t.n_bytes))
         for t in reference.tensors]


def test_every_value_type_is_read(tmp_path):
    extra = {
        "test.u8": (250, "add_uint8"), "test.i8": (-5, "add_int8"), "test.u16": (65000, "add_uint16"),
        "test.i16": (-300, "add_int16"), "test.u32": (4_000_000_000, "add_uint32"), "test.i32": (-70000, "add_int32"),
        "test.f32": (0.5, "add_float32"), "test.u64": (2**40, "add_uint64"), "test.i64": (-(2**40), "add_int64"),
        "test.f64": (0.1, "add_float64"), "test.bool": (True, "add_bool"), "test.str": ("héllo", "add_string"),
        "test.ints": ([1, 2, 3], "add_array"), "test.floats": ([0.25, 1.5], "add_array"),
        "test.strs": (["a", "", "ünï"], "add_array"), "test.bools": ([True, False], "add_array"),
        "test.nested": ([[1, 2], [3]], "add_array"),
    }
    path = write_llama(tmp_path / "model.gguf", extra_keys=extra)
    metadata = read_gguf(str(path))["metadata"]
    reference = gguf.GGUFReader(path)
    for key, (value, _) in extra.items():
        assert metadata[key] == value, key
    for key, field in reference.fields.items():
        if not key.startswith("GGUF.") and key != "test.nested":
            assert metadata[key] == pytest.approx(field.contents()), key


@pytest.mark.parametrize("cache_type_k, cache_type_v, per_head", [
    ("f16", "f16", 2 * HEAD_DIM + 2 * HEAD_DIM),
    ("f32", "q8_0", 4 * HEAD_DIM + HEAD_DIM * 34 // 32),
    ("q4_0", "iq4_nl", HEAD_DIM * 18 // 32 * 2),
    ("bf16", "q5_1", 2 * HEAD_DIM + HEAD_DIM * 24 // 32),
])
def test_kv_bytes_per_token_with_per_layer_kv_heads(tmp_path, cache_type_k, cache_type_v, per_head):
    path = write_llama(tmp_path / "model.gguf", n_head_kv=[4, 1, 2])
    info = read_model_info(str(path), cache_type_k, cache_type_v)
    assert info["n_head_kv"] == [4, 1, 2]
    assert info["key_length"] == info["value_length"] == HEAD_DIM
    assert info["kv_bytes_per_token"] == [4 * per_head, 1 * per_head, 2 * per_head]


def test_explicit_key_and_value_lengths_override_the_default(tmp_path):
    extra = {"llama.attention.key_length": (32, "add_uint32"), "llama.attention.value_length": (8, "add_uint32")}
    info = read_model_info(str(write_llama(tmp_path / "model.gguf", extra_keys=extra)))
    assert info["kv_bytes_per_token"] == [2 * (32 * 2 + 8 * 2)] * 3


def test_unknown_cache_type_is_refused(tmp_path):
    with pytest.raises(ValueError, match="cache_type_v must be one of"):
        read_model_info(str(tmp_path / "any.gguf"), "f16", "q3_k")


def test_the_result_feeds_the_planner(tmp_path):
    info = read_model_info(str(write_llama(tmp_path / "model.gguf")))
    plan = llama_split.llama_split_plan([{"name": "RPC0", "memory_mib": 64}, {"name": "RPC1", "memory_mib": 64}], info)
    assert sum(plan["tensor_split"]) == 4


@pytest.mark.parametrize("given", [0, 1, 2])
def test_split_model_is_read_from_any_shard(tmp_path, given):
    whole = read_model_info(str(write_llama(tmp_path / "whole" / "model.gguf", qtype=Q.Q8_0)))
    first = write_llama(tmp_path / "split" / "model.gguf", qtype=Q.Q8_0, split_max_tensors=12)
    shards = sorted((tmp_path / "split").iterdir())
    assert [shard.name for shard in shards] == [f"model-0000{i}-of-00003.gguf" for i in (1, 2, 3)]
    assert first == shards[0]
    info = read_model_info(str(shards[given]))
    assert info["files"] == [str(shard) for shard in shards]
    assert info["file_bytes"] == sum(shard.stat().st_size for shard in shards)
    for key in ("n_layer", "layer_bytes", "output_bytes", "kv_bytes_per_token", "other_bytes", "tensor_count"):
        assert info[key] == whole[key], key
    sizes = reference_sizes(shards)
    assert info["layer_bytes"][2] == sum(size for name, size in sizes.items() if name.startswith("blk.2."))


def test_missing_shard_is_named(tmp_path):
    write_llama(tmp_path / "model.gguf", split_max_tensors=12)
    (tmp_path / "model-00002-of-00003.gguf").unlink()
    with pytest.raises(GGUFError, match=r"model-00002-of-00003\.gguf: missing shard 2 of 3"):
        read_model_info(str(tmp_path / "model-00003-of-00003.gguf"))


def test_renamed_shard_is_refused(tmp_path):
    write_llama(tmp_path / "model.gguf", split_max_tensors=12)
    renamed = tmp_path / "renamed.gguf"
    (tmp_path / "model-00001-of-00003.gguf").rename(renamed)
    with pytest.raises(GGUFError, match=r"renamed\.gguf: split\.count is 3 but the file name does not follow"):
        read_model_info(str(renamed))


def test_bad_magic(tmp_path):
    path = tmp_path / "model.bin"
    path.write_bytes(b"PK\x03\x04" + bytes(60))
    with pytest.raises(GGUFError, match=f"^{re.escape(str(path))}: not a GGUF file"):
        read_model_info(str(path))


def test_unsupported_version(tmp_path):
    path = tmp_path / "model.gguf"
    path.write_bytes(b"GGUF" + (1).to_bytes(4, "little") + bytes(16))
    with pytest.raises(GGUFError, match="unsupported GGUF version 1"):
        read_gguf(str(path))


def test_unreadable_path(tmp_path):
    with pytest.raises(GGUFError, match=f"^{re.escape(str(tmp_path / 'absent.gguf'))}: cannot read the file"):
        read_model_info(str(tmp_path / "absent.gguf"))
    with pytest.raises(GGUFError, match=f"^{re.escape(str(tmp_path))}: cannot read the file"):
        read_model_info(str(tmp_path))


def _cut_offsets(path):
    """Offsets across the header, key/values, tensor infos and tensor data (not the final padding)."""
    reference = gguf.GGUFReader(path)
    data_end = max(t.data_offset + int(t.n_bytes) for t in reference.tensors)
    data_start = min(t.data_offset for t in reference.tensors)
    header = sorted(set(range(0, data_start, max(1, data_start // 60))) | {1, 4, 7, 8, 15, 16, 23, 24, 31})
    return header + [data_start - 1, data_start, (data_start + data_end) // 2, data_end - 1]


def test_truncated_file_raises_gguf_error_naming_the_file(tmp_path):
    path = write_llama(tmp_path / "model.gguf", n_head_kv=[2, 1, 2], extra_keys={
        "test.strs": (["a", "bb", "ccc"], "add_array"), "test.ints": (list(range(40)), "add_array")})
    content = path.read_bytes()
    for offset in _cut_offsets(path):
        cut = tmp_path / f"cut-{offset}.gguf"
        cut.write_bytes(content[:offset])
        with pytest.raises(GGUFError) as err:
            read_model_info(str(cut))
        message = str(err.value)
        assert message.startswith(f"{cut}: "), message
        assert "truncated" in message or "not a GGUF" in message, message


@pytest.mark.parametrize("key", ["test.ints", "test.strs", "test.str"])
def test_corrupt_lengths_raise_gguf_error(tmp_path, key):
    """A huge string length or array count is refused before anything is allocated."""
    path = write_llama(tmp_path / "model.gguf", extra_keys={
        "test.ints": ([1, 2], "add_array"), "test.strs": (["a"], "add_array"), "test.str": ("abc", "add_string")})
    content = bytearray(path.read_bytes())
    key_record = len(key).to_bytes(8, "little") + key.encode()
    key_end = content.index(key_record) + len(key_record)
    length_at = key_end + 4 if key == "test.str" else key_end + 8  # after the value type (and item type)
    content[length_at:length_at + 8] = (2**62).to_bytes(8, "little")
    path.write_bytes(content)
    with pytest.raises(GGUFError, match=f"truncated GGUF: .* ends inside the value of key '{key}'"):
        read_gguf(str(path))


def test_missing_block_count(tmp_path):
    path = write_llama(tmp_path / "model.gguf", block_count=False)
    with pytest.raises(GGUFError, match=f"^{re.escape(str(path))}: missing GGUF key 'llama.block_count'"):
        read_model_info(str(path))


def test_blocks_without_tensors_are_refused(tmp_path):
    path = write_llama(tmp_path / "model.gguf", extra_keys={"llama.block_count": (5, "add_uint32")})
    with pytest.raises(GGUFError, match=r"2 of the model's 5 blocks have no tensors \(none named blk\.3\.\*\)"):
        read_model_info(str(path))


def test_per_layer_array_of_the_wrong_length(tmp_path):
    path = write_llama(tmp_path / "model.gguf", n_head_kv=[2, 2, 2],
                       extra_keys={"llama.block_count": (2, "add_uint32")})
    with pytest.raises(GGUFError, match="'llama.attention.head_count_kv' has 3 entries but the model has 2 layers"):
        read_model_info(str(path))


def _run_module(monkeypatch, capsys, args):
    """Run plugins/modules/llama_gguf_info.py's main() with `args`; return its JSON result."""
    module = importlib.import_module(f"{PLUGINS}.modules.llama_gguf_info")
    with patch_module_args(args), pytest.raises(SystemExit):
        module.main()
    return json.loads(capsys.readouterr().out)


def test_module_returns_model_and_gguf_facts(tmp_path, monkeypatch, capsys):
    path = write_llama(tmp_path / "model.gguf", tied=True)
    result = _run_module(monkeypatch, capsys, {"path": str(path), "cache_type_k": "q8_0", "_ansible_check_mode": True})
    assert result["changed"] is False
    assert set(result["model"]) == set(llama_gguf.MODEL_KEYS)
    assert result["model"] == {key: value for key, value in read_model_info(str(path), "q8_0").items()
                               if key in llama_gguf.MODEL_KEYS}
    assert result["gguf"]["architecture"] == "llama" and result["gguf"]["tied_embeddings"] is True


def test_module_fails_with_the_reader_message(tmp_path, monkeypatch, capsys):
    path = tmp_path / "model.gguf"
    path.write_bytes(b"nope")
    result = _run_module(monkeypatch, capsys, {"path": str(path)})
    assert result["failed"] is True
    assert result["msg"].startswith(f"{path}: not a GGUF file")
