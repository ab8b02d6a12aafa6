#!/usr/bin/python
"""Ansible module llama_rpc_fill: write a worker's RPC tensor cache entries ahead of a model load."""

from __future__ import annotations

DOCUMENTATION = r"""
module: llama_rpc_fill
short_description: Fill a llama.cpp RPC server's tensor cache with the tensors it is planned to hold
description:
  - An RPC server started with C(-c) loads a weight tensor from C(CACHE_DIR/rpc/HASH) when the master announces its
    hash, instead of receiving it over the network. This module writes those entries before llama-server (re)starts,
    while the old model still serves, so that the load moves hashes only (role llama_prefill).
  - Each entry missing from C(CACHE_DIR/rpc/) (or of another size) is read from its C(location) - an URL answering
    HTTP range requests (the master's pre-fill source) or a file on this host (the model share, a local copy) - from
    its offset, written under C(CACHE_DIR/rpc-fill/), checked (the FNV-1a recomputed over the bytes written is its
    name, the sha256 is the index's, the size whole), synced to disk, handed to O(owner) and only then renamed into
    C(rpc/). The RPC server never sees a partial entry; an interrupted fill leaves only a temporary file, removed by
    the next run.
  - Up to O(threads) entries at once, all together under O(rate_mbit).
options:
  cache_dir:
    description: The RPC server's C(LLAMA_CACHE); entries live in its C(rpc/) subdirectory.
    type: path
    required: true
  entries:
    description:
      - The entries this worker needs, each C({hash, sha256, size, location, offset, name}).
      - C(location) is an C(http://) URL or an absolute path on this host; C(offset) is where the tensor starts there.
    type: list
    elements: dict
    required: true
  owner:
    description: The user that owns the entries (the RPC server's).
    type: str
    required: true
  library:
    description: The compiled FNV-1a (libllama-rpc-fnv.so of the llama.cpp build); "" = Python (tests only).
    type: path
    default: ""
  rate_mbit:
    description: Cap on what this worker reads, in Mbit/s; 0 = none (the master's source caps its own total).
    type: float
    default: 0
  threads:
    description: Entries read at once.
    type: int
    default: 2
  log:
    description: A file the module appends its progress to (the llama_job_wait action shows it); "" = none.
    type: path
    default: ""
  timeout:
    description: Seconds a read from an URL may stall.
    type: int
    default: 60
attributes:
  check_mode:
    description: Writes nothing; says which entries are missing.
    support: full
author: llamacpp-rpc-cluster maintainers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Fill the tensor cache from the master's staged copy
  llamacpp.rpc_cluster.llama_rpc_fill:
    cache_dir: /var/cache/llama.cpp
    owner: llama
    entries:
      - {name: blk.3.ffn_up.weight, hash: 1f0e2d3c4b5a6978, sha256: "...", size: 90177536,
         location: "http://10.0.0.10:50053/0", offset: 123456789}
    library: /opt/llama.cpp/current/lib/libllama-rpc-fnv.so
"""

RETURN = r"""
present:
  description: Entries already in the cache (count and bytes).
  returned: success
  type: dict
missing:
  description: Entries that were (check mode - would be) written, C({count, bytes, names}).
  returned: success
  type: dict
seconds:
  description: How long the writing took.
  returned: success
  type: float
summary:
  description: One line for people.
  returned: success
  type: str
"""

import os
import pwd
import shutil
import time
from concurrent.futures import ThreadPoolExecutor

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.llamacpp.rpc_cluster.plugins.module_utils.llama_tensor_hash import (
    Fnv1a, Progress, RateLimit, entry_name, file_reader, hash_stream, human_bytes)
from ansible.module_utils.urls import open_url

MBIT = 1e6 / 8


class FillError(Exception):
    pass


def present(rpc_dir, entry):
    try:
        return os.stat(os.path.join(rpc_dir, entry["hash"])).st_size == entry["size"]
    except OSError:
        return False


def open_source(entry, timeout):
    """(read(view), close) over the entry's bytes at its location."""
    location, offset, size = entry["location"], entry["offset"], entry["size"]
    if location.startswith(("http://", "https://")):
        response = open_url(location, headers={"Range": f"bytes={offset}-{offset + size - 1}"}, timeout=timeout,
                            use_proxy=False)  # the master's source, on the cluster's network
        if response.status != 206:
            response.close()
            raise FillError(f"{location} answered {response.status} to a range request, not 206")
        return response.readinto, response.close
    handle = open(location, "rb")  # noqa: SIM115 - closed by the caller
    return file_reader(handle, offset), handle.close


def write_entry(entry, directories, owner, fnv, limit, progress, timeout):
    rpc_dir, fill_dir = directories
    temporary = os.path.join(fill_dir, f"{entry['hash']}.part")
    try:
        read, close = open_source(entry, timeout)
    except (OSError, ValueError) as err:
        raise FillError(f"cannot read {entry['name']} from {entry['location']}: {err}") from err
    try:
        with open(temporary, "wb") as sink:
            value, sha256, done = hash_stream(read, entry["size"], fnv, sink, limit, progress.add)
            sink.flush()
            os.fsync(sink.fileno())
    except OSError as err:
        raise FillError(f"cannot copy {entry['name']} from {entry['location']}: {err}") from err
    finally:
        close()
    problem = None
    if done != entry["size"]:
        problem = f"got {done} of its {entry['size']} bytes"
    elif entry_name(value) != entry["hash"]:
        problem = f"its bytes hash to {entry_name(value)}, not {entry['hash']}"
    elif sha256 != entry["sha256"]:
        problem = f"its sha256 is {sha256}, not the index's {entry['sha256']}"
    if problem:
        os.unlink(temporary)
        raise FillError(f"{entry['name']} from {entry['location']} (offset {entry['offset']}): {problem}; nothing "
                        "was put in the cache. Is the source the same model as the master's?")
    os.chown(temporary, owner.pw_uid, owner.pw_gid)
    os.chmod(temporary, 0o644)
    os.rename(temporary, os.path.join(rpc_dir, entry["hash"]))


def prepare_directories(cache_dir, owner):
    """rpc/ and rpc-fill/ under the cache directory, owned by the RPC server's user; stale temporary files gone."""
    made = []
    for name in ("rpc", "rpc-fill"):
        path = os.path.join(cache_dir, name)
        if not os.path.isdir(path):
            os.makedirs(path, mode=0o750)
            os.chown(path, owner.pw_uid, owner.pw_gid)
        made.append(path)
    for stale in os.listdir(made[1]):
        os.unlink(os.path.join(made[1], stale))
    return made


def main():
    module = AnsibleModule(
        argument_spec={
            "cache_dir": {"type": "path", "required": True},
            "entries": {"type": "list", "elements": "dict", "required": True},
            "owner": {"type": "str", "required": True},
            "library": {"type": "path", "default": ""},
            "rate_mbit": {"type": "float", "default": 0},
            "threads": {"type": "int", "default": 2},
            "log": {"type": "path", "default": ""},
            "timeout": {"type": "int", "default": 60},
        },
        supports_check_mode=True,
    )
    params = module.params
    rpc_dir = os.path.join(params["cache_dir"], "rpc")
    unique = list({entry["hash"]: entry for entry in params["entries"]}.values())
    missing = [entry for entry in unique if not present(rpc_dir, entry)]
    have = [entry for entry in unique if entry not in missing]
    needed = sum(entry["size"] for entry in missing)
    result = {
        "present": {"count": len(have), "bytes": sum(entry["size"] for entry in have)},
        "missing": {"count": len(missing), "bytes": needed, "names": [entry["name"] for entry in missing]},
        "seconds": 0.0,
    }
    where = f"rpc cache {params['cache_dir']}"
    if params["log"] and not module.check_mode:
        Progress(params["log"], 0, "written")  # a log of this job only
    if not missing or module.check_mode:
        verb = "would write" if missing else "nothing to write"
        detail = f" {len(missing)} entries ({human_bytes(needed)})" if missing else ""
        module.exit_json(changed=bool(missing), summary=f"{where}: {len(have)} of {len(unique)} planned entries "
                                                        f"present; {verb}{detail}", **result)

    try:
        owner = pwd.getpwnam(params["owner"])
    except KeyError:
        module.fail_json(msg=f"no user {params['owner']} here to own the cache entries", **result)
    if params["library"] and not os.path.exists(params["library"]):
        module.fail_json(msg=f"{params['library']} is missing: the llama.cpp build lacks the pre-fill's hash library "
                             "(builds made before it had none). Run site.yml, whose build play makes one.", **result)
    free = shutil.disk_usage(params["cache_dir"] if os.path.isdir(params["cache_dir"])
                             else os.path.dirname(params["cache_dir"])).free
    if needed > free:
        module.fail_json(msg=f"{where}: {human_bytes(needed)} to write, {human_bytes(free)} free", **result)
    directories = prepare_directories(params["cache_dir"], owner)
    fnv = Fnv1a(params["library"])
    limit = RateLimit(params["rate_mbit"] * MBIT)
    progress = Progress(params["log"], needed, "written")
    started = time.monotonic()
    try:
        with ThreadPoolExecutor(max_workers=max(1, min(params["threads"], len(missing)))) as pool:
            list(pool.map(lambda entry: write_entry(entry, directories, owner, fnv, limit, progress,
                                                    params["timeout"]), missing))
    except FillError as err:
        module.fail_json(msg=f"{where}: {err}", changed=True, **result)
    progress.finish()
    directory = os.open(rpc_dir, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)
    seconds = time.monotonic() - started
    result["seconds"] = round(seconds, 3)
    module.exit_json(changed=True, summary=f"{where}: {len(have)} of {len(unique)} planned entries were present; "
                                           f"wrote {len(missing)} ({human_bytes(needed)}) in {seconds:.1f} s, "
                                           f"{needed / max(seconds, 1e-9) / 1e6:.0f} MB/s", **result)


if __name__ == "__main__":
    main()
