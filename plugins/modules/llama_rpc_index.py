#!/usr/bin/python
"""Ansible module llama_rpc_index: the RPC cache names (FNV-1a) and checksums of a model's large tensors."""

from __future__ import annotations

DOCUMENTATION = r"""
module: llama_rpc_index
short_description: Hash the tensors of a model that RPC workers keep in their tensor cache
description:
  - An RPC server started with C(-c) names each cached tensor by the 64-bit FNV-1a hash of its bytes. To fill a
    worker's cache before llama-server loads a model (role llama_prefill), the names must be known first; this
    module reads the given tensors of the model on the host that holds it and returns, per tensor, that hash (the
    cache entry's name), the sha256 of its bytes (what the worker checks its copy against) and its size.
  - The result is kept in O(index_dir)/IDENTITY.json, so a model is read once; later runs hash only tensors the
    file does not list yet (a changed split asks for others).
  - Tensors are hashed in O(threads) threads with the compiled FNV-1a of O(library) (built with llama.cpp).
options:
  identity:
    description: The model's identity (its sha256, else size and mtime); names the index file.
    type: str
    required: true
  tensors:
    description: The tensors to know, each C({name, file, offset, size}) (offset absolute in the file).
    type: list
    elements: dict
    required: true
  index_dir:
    description: Where the index files live.
    type: path
    required: true
  library:
    description: The compiled FNV-1a (libllama-rpc-fnv.so of the llama.cpp build); "" = Python (tests only).
    type: path
    default: ""
  threads:
    description: Tensors hashed at once; 0 = the host's CPUs.
    type: int
    default: 0
  log:
    description: A file the module appends its progress to (the llama_job_wait action shows it); "" = none.
    type: path
    default: ""
  probe:
    description:
      - Also measure, for the load estimate, how fast this host reads the model (up to 128 MiB of the first tensor's
        file, with direct I/O so that the page cache does not answer) and hashes (32 MiB in memory, one core).
      - Reads only; runs in check mode too.
    type: bool
    default: false
attributes:
  check_mode:
    description: Hashes nothing; returns what the index already has.
    support: full
author: llamacpp-rpc-cluster maintainers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Hash the model's cached tensors
  llamacpp.rpc_cluster.llama_rpc_index:
    identity: "{{ llama_storage_served.identity }}"
    tensors: "{{ llama_server_model.cache_tensors }}"
    index_dir: /var/lib/llama.cpp/rpc-index
    library: "{{ llamacpp_build_info.dir }}/lib/libllama-rpc-fnv.so"
"""

RETURN = r"""
entries:
  description: Per tensor name, C({hash, sha256, size}); in check mode only those already known.
  returned: success
  type: dict
missing:
  description: Names not hashed (check mode) - none otherwise.
  returned: success
  type: list
  elements: str
hashed_bytes:
  description: Bytes read and hashed by this run.
  returned: success
  type: int
seconds:
  description: How long the hashing took.
  returned: success
  type: float
disk_mbps:
  description: With O(probe), MB/s read from the model's file; null when it could not be measured.
  returned: success
  type: float
hash_mbps:
  description: With O(probe), MB/s of FNV-1a on one core; null without O(library).
  returned: success
  type: float
"""

import json
import mmap
import os
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.llamacpp.rpc_cluster.plugins.module_utils.llama_tensor_hash import Fnv1a, Progress, entry_name, file_reader, hash_stream


def read_index(path, identity):
    """The entries of the index file at `path` when it is the index of `identity`; {} otherwise."""
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except (OSError, ValueError):
        return {}
    return data.get("entries", {}) if data.get("identity") == identity else {}


def write_index(path, identity, entries):
    directory = os.path.dirname(path)
    os.makedirs(directory, mode=0o755, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=directory, prefix=".index-")
    with os.fdopen(handle, "w", encoding="utf-8") as out:
        json.dump({"identity": identity, "entries": entries}, out, indent=1, sort_keys=True)
        out.write("\n")
        out.flush()
        os.fsync(out.fileno())
    os.chmod(temporary, 0o644)
    os.replace(temporary, path)


PROBE_READ = 128 * 1024 * 1024
PROBE_HASH = 32 * 1024 * 1024


def probe_disk(path):
    """MB/s of reading up to PROBE_READ bytes of `path` from its middle, with O_DIRECT where the filesystem has it
    (else buffered, after asking the kernel to drop the file's cached pages); None when it cannot be read."""
    try:
        size = os.path.getsize(path)
        count = min(PROBE_READ, size) // 4096 * 4096
        start = max(0, (size - count) // 2) // 4096 * 4096
        if count == 0:
            return None
        try:
            handle = os.open(path, os.O_RDONLY | os.O_DIRECT)
        except OSError:
            handle = os.open(path, os.O_RDONLY)
            os.posix_fadvise(handle, start, count, os.POSIX_FADV_DONTNEED)
        try:
            buffer = mmap.mmap(-1, 4 * 1024 * 1024)  # page-aligned, as O_DIRECT wants
            began, done = time.monotonic(), 0
            while done < count:
                got = os.preadv(handle, [buffer], start + done)
                if not got:
                    break
                done += got
            seconds = time.monotonic() - began
        finally:
            os.close(handle)
    except OSError:
        return None
    return round(done / max(seconds, 1e-6) / 1e6, 1) if done else None


def probe_hash(fnv):
    """MB/s of FNV-1a on one core over PROBE_HASH bytes in memory; None with the Python one."""
    if not fnv.library:
        return None
    buffer = bytearray(os.urandom(1024 * 1024)) * (PROBE_HASH // (1024 * 1024))
    began = time.monotonic()
    fnv.update(0, buffer, len(buffer))
    return round(len(buffer) / max(time.monotonic() - began, 1e-6) / 1e6, 1)


def hash_tensor(tensor, fnv, progress):
    with open(tensor["file"], "rb") as handle:
        value, sha256, done = hash_stream(file_reader(handle, tensor["offset"]), tensor["size"], fnv,
                                          progress=progress.add)
    if done != tensor["size"]:
        raise OSError(f"{tensor['file']} ends inside tensor {tensor['name']} ({done} of {tensor['size']} bytes "
                      f"from offset {tensor['offset']})")
    return tensor["name"], {"hash": entry_name(value), "sha256": sha256, "size": tensor["size"]}


def main():
    module = AnsibleModule(
        argument_spec={
            "identity": {"type": "str", "required": True},
            "tensors": {"type": "list", "elements": "dict", "required": True},
            "index_dir": {"type": "path", "required": True},
            "library": {"type": "path", "default": ""},
            "threads": {"type": "int", "default": 0},
            "log": {"type": "path", "default": ""},
            "probe": {"type": "bool", "default": False},
        },
        supports_check_mode=True,
    )
    params = module.params
    path = os.path.join(params["index_dir"], f"{params['identity']}.json")
    known = read_index(path, params["identity"])
    wanted = {tensor["name"]: tensor for tensor in params["tensors"]}
    todo = [tensor for name, tensor in wanted.items()
            if known.get(name, {}).get("size") != tensor["size"]]
    library = params["library"]
    if library and not os.path.exists(library):
        if not module.check_mode:
            module.fail_json(msg=f"{library} is missing: the llama.cpp build lacks the pre-fill's hash library "
                                 "(builds made before it had none). Run site.yml, whose build play makes one.")
        library = ""
    fnv = Fnv1a(library)
    measured = {}
    if params["probe"]:
        files = [tensor["file"] for tensor in params["tensors"]]
        measured = {"disk_mbps": probe_disk(files[0]) if files else None, "hash_mbps": probe_hash(fnv)}
    if params["log"] and not module.check_mode:
        Progress(params["log"], 0, "hashed")  # a log of this job only
    if module.check_mode or not todo:
        module.exit_json(changed=False, entries={name: known[name] for name in wanted if name in known},
                         missing=[tensor["name"] for tensor in todo], hashed_bytes=0, seconds=0.0, index=path,
                         **measured)

    total = sum(tensor["size"] for tensor in todo)
    progress = Progress(params["log"], total, "hashed")
    started = time.monotonic()
    threads = params["threads"] or os.cpu_count() or 1
    try:
        with ThreadPoolExecutor(max_workers=min(threads, len(todo))) as pool:
            hashed = dict(pool.map(lambda tensor: hash_tensor(tensor, fnv, progress), todo))
    except OSError as err:
        module.fail_json(msg=f"cannot hash the model's tensors: {err}")
    progress.finish()
    seconds = time.monotonic() - started
    entries = dict(known, **hashed)
    write_index(path, params["identity"], entries)
    module.exit_json(changed=True, entries={name: entries[name] for name in wanted}, missing=[],
                     hashed_bytes=total, seconds=round(seconds, 3), index=path, **measured)


if __name__ == "__main__":
    main()
