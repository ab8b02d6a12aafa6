"""Tests for tools/make_tiny_model.py.

Needs a vocab-only GGUF from the llama.cpp tree (models/ggml-vocab-llama-spm.gguf)
named by the LLAMA_VOCAB_GGUF environment variable.
"""

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")

SCRIPT = Path(__file__).resolve().parents[2] / "tools" / "make_tiny_model.py"


@pytest.fixture(scope="module")
def vocab() -> Path:
    path = os.environ.get("LLAMA_VOCAB_GGUF")
    if not path:
        pytest.skip("LLAMA_VOCAB_GGUF is not set (path to llama.cpp models/ggml-vocab-llama-spm.gguf)")
    if not Path(path).is_file():
        pytest.skip(f"LLAMA_VOCAB_GGUF={path} does not exist")
    return Path(path)


@pytest.fixture
def make(vocab, tmp_path):
    """Run the generator; return the output path."""

    def run(name="model.gguf", *args):
        out = tmp_path / name
        subprocess.run([sys.executable, str(SCRIPT), "--vocab", str(vocab), "--out", str(out), *args],
                       check=True, capture_output=True, text=True)
        return out

    return run


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def value(reader, key):
    return reader.get_field(key).contents()


def tensors(reader):
    """name -> (ggml type name, numpy shape)."""
    return {t.name: (t.tensor_type.name, tuple(int(n) for n in reversed(t.shape))) for t in reader.tensors}


def test_tokenizer_copied_exactly(vocab, make):
    src = gguf.GGUFReader(vocab)
    dst = gguf.GGUFReader(make())
    src_keys = [k for k in src.fields if k.startswith("tokenizer.")]
    assert src_keys == [k for k in dst.fields if k.startswith("tokenizer.")]
    for key in src_keys:
        a, b = src.fields[key], dst.fields[key]
        assert a.types == b.types, key
        assert len(a.parts) == len(b.parts), key
        assert all(np.array_equal(x, y) for x, y in zip(a.parts, b.parts)), key
    n_vocab = len(src.fields["tokenizer.ggml.tokens"].data)
    assert value(dst, "llama.vocab_size") == n_vocab


def test_metadata_and_shapes(vocab, make):
    reader = gguf.GGUFReader(make("m.gguf", "--n-layer", "3", "--n-embd", "32", "--n-ff", "96",
                                  "--n-head", "2", "--ctx", "512", "--name", "probe"))
    n_vocab = len(gguf.GGUFReader(vocab).fields["tokenizer.ggml.tokens"].data)
    assert value(reader, "general.architecture") == "llama"
    assert value(reader, "general.name") == "probe"
    assert value(reader, "general.file_type") == gguf.LlamaFileType.ALL_F32
    assert value(reader, "llama.block_count") == 3
    assert value(reader, "llama.context_length") == 512
    assert value(reader, "llama.embedding_length") == 32
    assert value(reader, "llama.feed_forward_length") == 96
    assert value(reader, "llama.attention.head_count") == 2
    assert value(reader, "llama.attention.head_count_kv") == 2
    assert value(reader, "llama.rope.dimension_count") == 16

    got = tensors(reader)
    expected = {"token_embd.weight": ("F32", (n_vocab, 32)),
                "output_norm.weight": ("F32", (32,)),
                "output.weight": ("F32", (n_vocab, 32))}
    for i in range(3):
        expected.update({
            f"blk.{i}.attn_norm.weight": ("F32", (32,)),
            f"blk.{i}.attn_q.weight": ("F32", (32, 32)),
            f"blk.{i}.attn_k.weight": ("F32", (32, 32)),
            f"blk.{i}.attn_v.weight": ("F32", (32, 32)),
            f"blk.{i}.attn_output.weight": ("F32", (32, 32)),
            f"blk.{i}.ffn_norm.weight": ("F32", (32,)),
            f"blk.{i}.ffn_gate.weight": ("F32", (96, 32)),
            f"blk.{i}.ffn_up.weight": ("F32", (96, 32)),
            f"blk.{i}.ffn_down.weight": ("F32", (32, 96)),
        })
    assert got == expected
    norms = [t for t in reader.tensors if t.name.endswith("norm.weight")]
    assert all(np.all(t.data == 1.0) for t in norms)


def test_f16_keeps_norms_f32(make):
    reader = gguf.GGUFReader(make("h.gguf", "--type", "f16", "--n-layer", "1"))
    assert value(reader, "general.file_type") == gguf.LlamaFileType.MOSTLY_F16
    for name, (ggml_type, _) in tensors(reader).items():
        assert ggml_type == ("F32" if name.endswith("norm.weight") else "F16"), name


def test_tied_has_no_output(make):
    names = tensors(gguf.GGUFReader(make("t.gguf", "--tied"))).keys()
    assert "output.weight" not in names
    assert "token_embd.weight" in names and "output_norm.weight" in names


def test_deterministic(make):
    first = make("a.gguf", "--seed", "7")
    again = make("b.gguf", "--seed", "7")
    other = make("c.gguf", "--seed", "8", "--name", value(gguf.GGUFReader(first), "general.name"))
    assert sha256(first) == sha256(again)
    assert sha256(first) != sha256(other)


def test_n_head_kv(make):
    reader = gguf.GGUFReader(make("g.gguf", "--n-embd", "64", "--n-head", "8", "--n-head-kv", "2"))
    assert value(reader, "llama.attention.head_count") == 8
    assert value(reader, "llama.attention.head_count_kv") == 2
    got = tensors(reader)
    assert got["blk.0.attn_q.weight"][1] == (64, 64)
    assert got["blk.0.attn_k.weight"][1] == (16, 64)
    assert got["blk.0.attn_v.weight"][1] == (16, 64)


def test_rejects_n_head_kv_not_dividing(make):
    with pytest.raises(subprocess.CalledProcessError) as err:
        make("bad.gguf", "--n-head", "4", "--n-head-kv", "3")
    assert err.value.returncode == 2
    assert "does not divide" in err.value.stderr
