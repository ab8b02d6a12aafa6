"""Read a GGUF model's metadata and tensor table with nothing but the Python standard library.

This runs on cluster hosts that have only python3 (no numpy, no gguf package). It reads the header,
every key/value pair and every tensor info, but never the tensor data, and sums what the
``llama_split_plan`` filter needs: weight bytes per layer, of the output layer, and KV bytes per token.
"""

import os
import re
import struct

GGUF_MAGIC = b"GGUF"
GGUF_VERSIONS = (2, 3)
GGUF_DEFAULT_ALIGNMENT = 32
GGML_MAX_DIMS = 4
QK_K = 256

# ggml type id: (name, elements per block, bytes per block); ids and sizes as gguf's GGML_QUANT_SIZES.
GGML_TYPES = {
    0: ("F32", 1, 4),
    1: ("F16", 1, 2),
    2: ("Q4_0", 32, 2 + 16),
    3: ("Q4_1", 32, 2 + 2 + 16),
    6: ("Q5_0", 32, 2 + 4 + 16),
    7: ("Q5_1", 32, 2 + 2 + 4 + 16),
    8: ("Q8_0", 32, 2 + 32),
    9: ("Q8_1", 32, 4 + 4 + 32),
    10: ("Q2_K", 256, 2 + 2 + QK_K // 16 + QK_K // 4),
    11: ("Q3_K", 256, 2 + QK_K // 4 + QK_K // 8 + 12),
    12: ("Q4_K", 256, 2 + 2 + QK_K // 2 + 12),
    13: ("Q5_K", 256, 2 + 2 + QK_K // 2 + QK_K // 8 + 12),
    14: ("Q6_K", 256, 2 + QK_K // 2 + QK_K // 4 + QK_K // 16),
    15: ("Q8_K", 256, 4 + QK_K + QK_K // 8),
    16: ("IQ2_XXS", 256, 2 + QK_K // 4),
    17: ("IQ2_XS", 256, 2 + QK_K // 4 + QK_K // 32),
    18: ("IQ3_XXS", 256, 2 + QK_K // 4 + QK_K // 8),
    19: ("IQ1_S", 256, 2 + QK_K // 8 + QK_K // 16),
    20: ("IQ4_NL", 32, 2 + 16),
    21: ("IQ3_S", 256, 2 + QK_K // 4 + QK_K // 8 + QK_K // 32 + 4),
    22: ("IQ2_S", 256, 2 + QK_K // 4 + QK_K // 16),
    23: ("IQ4_XS", 256, 2 + 2 + QK_K // 2 + QK_K // 64),
    24: ("I8", 1, 1),
    25: ("I16", 1, 2),
    26: ("I32", 1, 4),
    27: ("I64", 1, 8),
    28: ("F64", 1, 8),
    29: ("IQ1_M", 256, QK_K // 8 + QK_K // 16 + QK_K // 32),
    30: ("BF16", 1, 2),
    34: ("TQ1_0", 256, 2 + 4 * 13),
    35: ("TQ2_0", 256, 2 + 64),
    39: ("MXFP4", 32, 1 + 16),
    40: ("NVFP4", 64, 4 + 32),
    41: ("Q1_0", 128, 2 + 16),
}

# KV cache types llama.cpp accepts for --cache-type-k/-v: (elements per block, bytes per block).
CACHE_TYPE_SIZES = {
    "f32": (1, 4),
    "f16": (1, 2),
    "bf16": (1, 2),
    "q8_0": (32, 34),
    "q4_0": (32, 18),
    "q4_1": (32, 20),
    "q5_0": (32, 22),
    "q5_1": (32, 24),
    "iq4_nl": (32, 18),
}

# An RPC server with -c caches the weight tensors larger than this (ggml-rpc.cpp HASH_THRESHOLD, strictly more).
HASH_THRESHOLD = 10 * 1024 * 1024
# Keys of read_model_info's result that form the llama_split_plan filter's model dict.
MODEL_KEYS = ("n_layer", "layer_bytes", "output_bytes", "kv_bytes_per_token")

# GGUF value type id: struct format of one scalar. 8 is a string, 9 an array.
_SCALAR_FORMATS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9

_SHARD_NAME = re.compile(r"^(?P<stem>.+)-(?P<number>\d{5})-of-(?P<count>\d{5})\.gguf$")
_BLOCK_TENSOR = re.compile(r"^blk\.(\d+)\.")


class GGUFError(Exception):
    """A GGUF file that cannot be read or lacks what the planner needs; the message names the file."""


class _Reader:
    """Little-endian reads from the start of a GGUF file that turn a short file into GGUFError.

    Every length is checked against the file size before reading, so a corrupt length can neither
    allocate gigabytes nor surface as another exception type.
    """

    def __init__(self, handle, path, size):
        self._handle = handle
        self.path = path
        self.size = size
        self.position = 0

    def take(self, count, what):
        if self.position + count > self.size:
            raise GGUFError(f"{self.path}: truncated GGUF: the file ({self.size} bytes) ends inside {what}")
        self.position += count
        return self._handle.read(count)

    def unpack(self, fmt, what, count=1):
        data = self.take(count * struct.calcsize(f"<{fmt}"), what)
        return struct.unpack(f"<{count}{fmt}", data)

    def scalar(self, fmt, what):
        return self.unpack(fmt, what)[0]

    def string(self, what):
        length = self.scalar("Q", what)
        return self.take(length, what).decode("utf-8", errors="replace")

    def value(self, value_type, what):
        if value_type == _STRING:
            return self.string(what)
        if value_type == _ARRAY:
            item_type, count = self.unpack("IQ", what)
            if item_type in _SCALAR_FORMATS:
                return list(self.unpack(_SCALAR_FORMATS[item_type], what, count))
            return [self.value(item_type, what) for _index in range(count)]
        if value_type in _SCALAR_FORMATS:
            return self.scalar(_SCALAR_FORMATS[value_type], what)
        raise GGUFError(f"{self.path}: {what} has unknown GGUF value type {value_type}")


def _tensor_bytes(path, name, dims, type_id):
    if type_id not in GGML_TYPES:
        raise GGUFError(f"{path}: tensor {name!r} has unknown ggml type {type_id}")
    type_name, block_size, type_size = GGML_TYPES[type_id]
    if dims and dims[0] % block_size:
        raise GGUFError(f"{path}: tensor {name!r} of type {type_name} has a first dimension of {dims[0]}, "
                        f"not a multiple of its block size {block_size}")
    elements = 1
    for dim in dims:
        elements *= dim
    return elements // block_size * type_size


def _read_tensor_info(reader, index):
    what = f"tensor info {index}"
    name = reader.string(what)
    n_dims = reader.scalar("I", what)
    if n_dims > GGML_MAX_DIMS:
        raise GGUFError(f"{reader.path}: tensor {name!r} has {n_dims} dimensions (at most {GGML_MAX_DIMS})")
    dims = list(reader.unpack("Q", what, n_dims))
    type_id, offset = reader.unpack("IQ", what)
    n_bytes = _tensor_bytes(reader.path, name, dims, type_id)
    return {"name": name, "dims": dims, "type": GGML_TYPES[type_id][0], "offset": offset, "n_bytes": n_bytes}


def _check_tensor_data(reader, tensors, metadata):
    """Tensor data starts at the next alignment boundary; it must lie inside the file."""
    alignment = metadata.get("general.alignment", GGUF_DEFAULT_ALIGNMENT)
    if not isinstance(alignment, int) or isinstance(alignment, bool) or alignment < 1:
        raise GGUFError(f"{reader.path}: general.alignment must be a positive integer, got {alignment!r}")
    data_start = -(-reader.position // alignment) * alignment
    for tensor in tensors:
        end = data_start + tensor["offset"] + tensor["n_bytes"]
        if end > reader.size:
            raise GGUFError(f"{reader.path}: truncated GGUF: the data of tensor {tensor['name']!r} ends at byte "
                            f"{end} but the file has {reader.size} bytes")
    return data_start


def read_gguf(path):
    """Parse one GGUF file's header, key/value pairs and tensor infos (not the tensor data).

    Returns a dict: path, version, metadata ({key: value}; arrays are lists), tensors (list of
    {name, dims, type, offset, n_bytes}), data_offset and file_bytes.
    """
    try:
        with open(path, "rb") as handle:
            reader = _Reader(handle, path, os.fstat(handle.fileno()).st_size)
            return _read_gguf(reader)
    except OSError as err:
        raise GGUFError(f"{path}: cannot read the file: {err.strerror}") from err


def _read_gguf(reader):
    magic = reader.take(4, "the GGUF magic")
    if magic != GGUF_MAGIC:
        raise GGUFError(f"{reader.path}: not a GGUF file (starts with {magic!r}, expected {GGUF_MAGIC!r})")
    version = reader.scalar("I", "the GGUF header")
    if version not in GGUF_VERSIONS:
        raise GGUFError(f"{reader.path}: unsupported GGUF version {version} (this reader handles "
                        f"{' and '.join(map(str, GGUF_VERSIONS))}; big-endian files are not supported)")
    tensor_count, kv_count = reader.unpack("QQ", "the GGUF header")
    metadata = {}
    for index in range(kv_count):
        key = reader.string(f"key/value pair {index}")
        metadata[key] = reader.value(reader.scalar("I", f"key {key!r}"), f"the value of key {key!r}")
    tensors = [_read_tensor_info(reader, index) for index in range(tensor_count)]
    return {
        "path": reader.path,
        "version": version,
        "metadata": metadata,
        "tensors": tensors,
        "data_offset": _check_tensor_data(reader, tensors, metadata),
        "file_bytes": reader.size,
    }


def _shard_paths(path, count):
    """Paths of all shards of a split GGUF named NAME-0000i-of-0000n.gguf, from any one shard's path."""
    directory, base = os.path.split(path)
    match = _SHARD_NAME.match(base)
    if not match or int(match.group("count")) != count:
        raise GGUFError(f"{path}: split.count is {count} but the file name does not follow "
                        f"NAME-00001-of-{count:05d}.gguf, so the other shards cannot be found")
    return [os.path.join(directory, f"{match.group('stem')}-{number:05d}-of-{count:05d}.gguf")
            for number in range(1, count + 1)]


def read_gguf_shards(path):
    """read_gguf() of every shard of the model `path` belongs to, in order (one item if not split)."""
    given = read_gguf(path)
    count = _check_count(given["metadata"].get("split.count", 1), "split.count", path)
    if count <= 1:
        return [given]
    shards = []
    for number, shard_path in enumerate(_shard_paths(path, count)):
        if not os.path.exists(shard_path):
            raise GGUFError(f"{shard_path}: missing shard {number + 1} of {count} of the split model {path}")
        shard = given if os.path.samefile(shard_path, path) else read_gguf(shard_path)
        if shard["metadata"].get("split.no") != number:
            raise GGUFError(f"{shard_path}: split.no is {shard['metadata'].get('split.no')!r}, "
                            f"expected {number} from the file name")
        shards.append(shard)
    expected = given["metadata"].get("split.tensors.count")
    found = sum(len(shard["tensors"]) for shard in shards)
    if expected is not None and expected != found:
        raise GGUFError(f"{path}: split.tensors.count is {expected!r} but the {count} shards hold {found} tensors")
    return shards


def _require(metadata, key, path):
    if key not in metadata:
        raise GGUFError(f"{path}: missing GGUF key {key!r}")
    return metadata[key]


def _check_count(value, key, path, minimum=0):
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise GGUFError(f"{path}: GGUF key {key!r} must be an integer >= {minimum}, got {value!r}")
    return value


def _per_layer(value, key, n_layer, path):
    """A value that is one integer or an array of n_layer integers, as a list of n_layer integers."""
    if isinstance(value, list):
        if len(value) != n_layer:
            raise GGUFError(f"{path}: GGUF key {key!r} has {len(value)} entries but the model has {n_layer} layers")
        return [_check_count(item, key, path) for item in value]
    return [_check_count(value, key, path)] * n_layer


def _hparams(metadata, path):
    """Architecture hyperparameters, with llama.cpp's defaults for the optional attention keys."""
    arch = _require(metadata, "general.architecture", path)
    if not isinstance(arch, str):
        raise GGUFError(f"{path}: GGUF key 'general.architecture' must be a string, got {arch!r}")
    attention = f"{arch}.attention."
    n_layer = _check_count(_require(metadata, f"{arch}.block_count", path), f"{arch}.block_count", path, 1)
    n_embd = _check_count(_require(metadata, f"{arch}.embedding_length", path), f"{arch}.embedding_length", path)
    n_head = _require(metadata, attention + "head_count", path)
    n_head_kv = metadata.get(attention + "head_count_kv", n_head)
    first_n_head = _per_layer(n_head, attention + "head_count", n_layer, path)[0]
    head_dim = n_embd // first_n_head if first_n_head else 0  # llama.cpp: n_embd / n_head of layer 0
    return {
        "architecture": arch,
        "n_layer": n_layer,
        "n_embd": n_embd,
        "n_head": n_head,
        "n_head_kv": n_head_kv,
        "n_head_kv_per_layer": _per_layer(n_head_kv, attention + "head_count_kv", n_layer, path),
        "key_length": _check_count(metadata.get(attention + "key_length", head_dim), attention + "key_length", path),
        "value_length": _check_count(metadata.get(attention + "value_length", head_dim),
                                     attention + "value_length", path),
        "context_length": metadata.get(f"{arch}.context_length"),
    }


def _weight_bytes(tensors, n_layer, path):
    """(bytes per layer, output layer bytes, other bytes, tied) from the tensor infos of all shards.

    The output layer is output.* plus output_norm.*. A model with tied embeddings has no output.weight:
    llama.cpp then loads token_embd.weight a second time, as the output matrix, on the output layer's
    device (TENSOR_DUPLICATED), so its bytes count for the output layer too. Everything else (mostly
    token_embd.weight, which llama.cpp keeps on the CPU) is "other".
    """
    layer_bytes = [0] * n_layer
    output_bytes = other_bytes = 0
    by_name = {tensor["name"]: tensor["n_bytes"] for tensor in tensors}
    for name, size in by_name.items():
        block = _BLOCK_TENSOR.match(name)
        if block:
            index = int(block.group(1))
            if index >= n_layer:
                raise GGUFError(f"{path}: tensor {name!r} belongs to block {index} but the model has {n_layer} blocks")
            layer_bytes[index] += size
        elif name.startswith(("output.", "output_norm.")):
            output_bytes += size
        else:
            other_bytes += size
    empty = [index for index, size in enumerate(layer_bytes) if not size]
    if empty:
        raise GGUFError(f"{path}: {len(empty)} of the model's {n_layer} blocks have no tensors (none named "
                        f"blk.{empty[0]}.*): a vocab-only or incomplete GGUF cannot be planned")
    tied = "output.weight" not in by_name
    if tied:
        output_bytes += by_name.get("token_embd.weight", 0)
    return layer_bytes, output_bytes, other_bytes, tied


def _cache_tensors(shards, n_layer, tied):
    """The weights an RPC worker keeps in its tensor cache (more than HASH_THRESHOLD bytes), with the layer whose
    device holds each: blk.N.* is layer N, output.* the output layer (n_layer), and with tied embeddings
    token_embd.weight too (llama.cpp loads it again as the output matrix there). Each: name, file (its shard),
    offset (absolute, in that file), size and layer."""
    found = []
    for shard in shards:
        for tensor in shard["tensors"]:
            name = tensor["name"]
            block = _BLOCK_TENSOR.match(name)
            if block:
                layer = int(block.group(1))
            elif name.startswith(("output.", "output_norm.")) or (tied and name == "token_embd.weight"):
                layer = n_layer
            else:
                continue
            if tensor["n_bytes"] > HASH_THRESHOLD:
                found.append({"name": name, "file": shard["path"], "offset": shard["data_offset"] + tensor["offset"],
                              "size": tensor["n_bytes"], "layer": layer})
    return found


def _row_bytes(elements, cache_type):
    block_size, type_size = CACHE_TYPE_SIZES[cache_type]
    return -(-elements * type_size // block_size)


def _check_cache_type(value, option):
    if value not in CACHE_TYPE_SIZES:
        raise ValueError(f"{option} must be one of {', '.join(CACHE_TYPE_SIZES)}, got {value!r}")


def read_model_info(path, cache_type_k="f16", cache_type_v="f16"):
    """Planner inputs and facts about the GGUF model at `path` (any shard of a split model).

    Returns one dict: the llama_split_plan model keys (MODEL_KEYS: n_layer, layer_bytes,
    output_bytes, kv_bytes_per_token) plus architecture, n_embd, n_head, n_head_kv (an int or a
    per-layer list, as in the file), key_length, value_length, context_length (None if absent),
    tied_embeddings, other_bytes, file_bytes, files (shard paths), tensor_count and cache_tensors (the weights an RPC
    worker caches, each with the layer whose device holds it).
    KV bytes per token of a layer: n_head_kv × (key_length × size(K type) + value_length × size(V type)).
    Raises GGUFError naming the file; ValueError for an unknown cache type.
    """
    _check_cache_type(cache_type_k, "cache_type_k")
    _check_cache_type(cache_type_v, "cache_type_v")
    shards = read_gguf_shards(path)
    first_path = shards[0]["path"]
    hparams = _hparams(shards[0]["metadata"], first_path)
    tensors = [tensor for shard in shards for tensor in shard["tensors"]]
    layer_bytes, output_bytes, other_bytes, tied = _weight_bytes(tensors, hparams["n_layer"], first_path)
    kv_bytes_per_token = [_row_bytes(n_kv * hparams["key_length"], cache_type_k)
                          + _row_bytes(n_kv * hparams["value_length"], cache_type_v)
                          for n_kv in hparams.pop("n_head_kv_per_layer")]
    return dict(
        hparams,
        layer_bytes=layer_bytes,
        output_bytes=output_bytes,
        kv_bytes_per_token=kv_bytes_per_token,
        tied_embeddings=tied,
        other_bytes=other_bytes,
        file_bytes=sum(shard["file_bytes"] for shard in shards),
        files=[shard["path"] for shard in shards],
        tensor_count=len(tensors),
        cache_tensors=_cache_tensors(shards, hparams["n_layer"], tied),
    )
