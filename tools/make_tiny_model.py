#!/usr/bin/env python3
"""Generate a tiny llama-architecture GGUF with deterministic random weights.

The tokenizer (every ``tokenizer.*`` key) is copied unchanged from a vocab-only
GGUF shipped in the llama.cpp tree (e.g. ``models/ggml-vocab-llama-spm.gguf``),
so llama.cpp loads the result as a real model and generates (meaningless)
text. The same arguments always give a byte-identical file.

Tensor names and shapes follow llama.cpp's LLM_ARCH_LLAMA loader
(``src/models/llama.cpp``, ``load_arch_tensors``). Shapes below are numpy
shapes, i.e. the reverse of ggml's ``ne``.

Needs the ``gguf`` and ``numpy`` Python packages.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import gguf

ARCH = "llama"
RMS_NORM_EPS = 1e-5
ROPE_FREQ_BASE = 10000.0
DTYPES = {"f32": np.float32, "f16": np.float16}
FILE_TYPES = {"f32": gguf.LlamaFileType.ALL_F32, "f16": gguf.LlamaFileType.MOSTLY_F16}


@dataclass(frozen=True)
class MetadataField:
    """One GGUF key/value pair, with its GGUF value types."""

    key: str
    value: Any
    vtype: gguf.GGUFValueType
    sub_type: gguf.GGUFValueType | None = None


@dataclass(frozen=True)
class TensorSpec:
    """A tensor to write: numpy shape and dtype; norms are ones, others random."""

    name: str
    shape: tuple[int, ...]
    dtype: type
    is_norm: bool = False

    @property
    def n_elements(self) -> int:
        return int(np.prod(self.shape))

    @property
    def n_bytes(self) -> int:
        return self.n_elements * np.dtype(self.dtype).itemsize


def positive_int(text: str) -> int:
    """argparse type: an integer > 0."""
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {value}")
    return value


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse and cross-check the command line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vocab", type=Path, required=True,
                        help="vocab-only GGUF to copy the tokenizer from (llama.cpp models/ggml-vocab-*.gguf)")
    parser.add_argument("--out", type=Path, required=True, help="output GGUF path")
    parser.add_argument("--n-layer", type=positive_int, default=4, help="number of blocks (default 4)")
    parser.add_argument("--n-embd", type=positive_int, default=64, help="embedding length (default 64)")
    parser.add_argument("--n-ff", type=positive_int, help="feed-forward length (default 4 * n_embd)")
    parser.add_argument("--n-head", type=positive_int, default=4, help="attention heads (default 4)")
    parser.add_argument("--n-head-kv", type=positive_int, help="KV heads, must divide n_head (default n_head)")
    parser.add_argument("--ctx", type=positive_int, default=2048, help="training context length (default 2048)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    parser.add_argument("--type", choices=sorted(DTYPES), default="f32",
                        help="type of the weight matrices; norms are always f32 (default f32)")
    parser.add_argument("--tied", action="store_true",
                        help="tie output to token embeddings (no output.weight)")
    parser.add_argument("--name", help="general.name (default derived from the shape)")
    args = parser.parse_args(argv)

    if args.n_ff is None:
        args.n_ff = 4 * args.n_embd
    if args.n_head_kv is None:
        args.n_head_kv = args.n_head
    if args.n_embd % args.n_head:
        parser.error(f"--n-embd {args.n_embd} is not a multiple of --n-head {args.n_head}")
    if (args.n_embd // args.n_head) % 2:
        parser.error(f"head size {args.n_embd // args.n_head} must be even (RoPE rotates pairs)")
    if args.n_head % args.n_head_kv:
        parser.error(f"--n-head-kv {args.n_head_kv} does not divide --n-head {args.n_head}")
    if args.name is None:
        args.name = f"tiny-llama-{args.n_layer}L-{args.n_embd}d-{args.type}-s{args.seed}"
    return args


def field_value(field: gguf.ReaderField) -> Any:
    """Value of a reader field; strings stay raw bytes so they are copied exactly."""
    main_type = field.types[0]
    if main_type == gguf.GGUFValueType.STRING:
        return bytes(field.parts[field.data[0]])
    if main_type == gguf.GGUFValueType.ARRAY and field.types[-1] == gguf.GGUFValueType.STRING:
        return [bytes(field.parts[idx]) for idx in field.data]
    return field.contents()


def read_tokenizer(vocab_path: Path) -> tuple[list[MetadataField], int]:
    """Every ``tokenizer.*`` field of the vocab GGUF, and the vocabulary size."""
    reader = gguf.GGUFReader(vocab_path)
    fields = []
    for field in reader.fields.values():
        if not field.name.startswith("tokenizer."):
            continue
        sub_type = field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
        fields.append(MetadataField(field.name, field_value(field), field.types[0], sub_type))
    tokens = reader.get_field(gguf.Keys.Tokenizer.LIST)
    if tokens is None:
        raise SystemExit(f"{vocab_path}: no {gguf.Keys.Tokenizer.LIST} array")
    return fields, len(tokens.data)


def model_metadata(args: argparse.Namespace, n_vocab: int) -> list[MetadataField]:
    """general.* and llama.* keys for the requested shape."""
    u32, f32, string = gguf.GGUFValueType.UINT32, gguf.GGUFValueType.FLOAT32, gguf.GGUFValueType.STRING
    return [
        MetadataField("general.name", args.name, string),
        MetadataField("general.file_type", int(FILE_TYPES[args.type]), u32),
        MetadataField(f"{ARCH}.vocab_size", n_vocab, u32),
        MetadataField(f"{ARCH}.context_length", args.ctx, u32),
        MetadataField(f"{ARCH}.embedding_length", args.n_embd, u32),
        MetadataField(f"{ARCH}.block_count", args.n_layer, u32),
        MetadataField(f"{ARCH}.feed_forward_length", args.n_ff, u32),
        MetadataField(f"{ARCH}.attention.head_count", args.n_head, u32),
        MetadataField(f"{ARCH}.attention.head_count_kv", args.n_head_kv, u32),
        MetadataField(f"{ARCH}.attention.layer_norm_rms_epsilon", RMS_NORM_EPS, f32),
        MetadataField(f"{ARCH}.rope.dimension_count", args.n_embd // args.n_head, u32),
        MetadataField(f"{ARCH}.rope.freq_base", ROPE_FREQ_BASE, f32),
    ]


def tensor_specs(args: argparse.Namespace, n_vocab: int) -> list[TensorSpec]:
    """All tensors in file order, with llama.cpp's names and (numpy) shapes."""
    dtype = DTYPES[args.type]
    n_embd, n_ff = args.n_embd, args.n_ff
    n_embd_kv = args.n_head_kv * (n_embd // args.n_head)

    specs = [TensorSpec("token_embd.weight", (n_vocab, n_embd), dtype)]
    for i in range(args.n_layer):
        blk = f"blk.{i}"
        specs += [
            TensorSpec(f"{blk}.attn_norm.weight", (n_embd,), np.float32, is_norm=True),
            TensorSpec(f"{blk}.attn_q.weight", (n_embd, n_embd), dtype),
            TensorSpec(f"{blk}.attn_k.weight", (n_embd_kv, n_embd), dtype),
            TensorSpec(f"{blk}.attn_v.weight", (n_embd_kv, n_embd), dtype),
            TensorSpec(f"{blk}.attn_output.weight", (n_embd, n_embd), dtype),
            TensorSpec(f"{blk}.ffn_norm.weight", (n_embd,), np.float32, is_norm=True),
            TensorSpec(f"{blk}.ffn_gate.weight", (n_ff, n_embd), dtype),
            TensorSpec(f"{blk}.ffn_up.weight", (n_ff, n_embd), dtype),
            TensorSpec(f"{blk}.ffn_down.weight", (n_embd, n_ff), dtype),
        ]
    specs.append(TensorSpec("output_norm.weight", (n_embd,), np.float32, is_norm=True))
    if not args.tied:
        specs.append(TensorSpec("output.weight", (n_vocab, n_embd), dtype))
    return specs


def make_tensor(spec: TensorSpec, rng: np.random.Generator) -> np.ndarray:
    """Ones for norms; otherwise normal noise with std 1/sqrt(fan_in)."""
    if spec.is_norm:
        return np.ones(spec.shape, dtype=spec.dtype)
    fan_in = spec.shape[-1]
    data = rng.standard_normal(spec.shape, dtype=np.float32) / np.float32(np.sqrt(fan_in))
    return data.astype(spec.dtype)


def write_gguf(path: Path, metadata: list[MetadataField], specs: list[TensorSpec], seed: int) -> None:
    """Write the file, generating one tensor at a time to keep memory low."""
    writer = gguf.GGUFWriter(path, ARCH)
    for field in metadata:
        writer.add_key_value(field.key, field.value, field.vtype, sub_type=field.sub_type)
    for spec in specs:
        writer.add_tensor_info(spec.name, spec.shape, np.dtype(spec.dtype), spec.n_bytes)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    rng = np.random.default_rng(seed)
    for spec in specs:
        writer.write_tensor_data(make_tensor(spec, rng))
    writer.close()


def summary(path: Path, args: argparse.Namespace, specs: list[TensorSpec]) -> str:
    """One line: path, size, layers, parameter count, bytes of one block."""
    size_mib = path.stat().st_size / 2**20
    params = sum(spec.n_elements for spec in specs)
    per_layer = sum(spec.n_bytes for spec in specs if spec.name.startswith("blk.0."))
    return (f"{path}: {size_mib:.2f} MiB, n_layer={args.n_layer}, n_embd={args.n_embd}, "
            f"type={args.type}, params={params}, per_layer_bytes={per_layer}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    tokenizer, n_vocab = read_tokenizer(args.vocab)
    specs = tensor_specs(args, n_vocab)
    # Write beside the target and rename, so an interrupted run leaves no partial model.
    tmp = args.out.with_name(f".{args.out.name}.tmp")
    try:
        write_gguf(tmp, model_metadata(args, n_vocab) + tokenizer, specs, args.seed)
        os.replace(tmp, args.out)
    finally:
        tmp.unlink(missing_ok=True)
    print(summary(args.out, args, specs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
