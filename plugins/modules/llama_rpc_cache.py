#!/usr/bin/python
"""Ansible module llama_rpc_cache: keep the llama.cpp RPC server's tensor cache (LLAMA_CACHE/rpc) bounded."""

from __future__ import annotations

DOCUMENTATION = r"""
module: llama_rpc_cache
short_description: Prune the tensor cache of a llama.cpp RPC server
description:
  - An RPC server started with C(-c) keeps every weight tensor larger than 10 MiB as a file under
    C($LLAMA_CACHE/rpc/), named after the tensor's hash (16 hex digits), and never removes one. This module
    keeps that directory bounded.
  - An entry is a regular file directly in C(<path>/rpc/). Subdirectories, symbolic links and anything else
    are neither counted nor touched, and nothing outside C(<path>/rpc/) is ever removed.
  - The last use of an entry is the later of its access and modification times.
  - First every entry last used before O(unused_since) is removed, then, while the entries total more than
    O(max_mib), the entry used longest ago (ties by name).
  - A missing directory is an empty cache.
options:
  path:
    description: The cache directory (the RPC server's C(LLAMA_CACHE)); the entries live in C(<path>/rpc/).
    type: path
    required: true
  max_mib:
    description:
      - Cap on the total size of the entries, in MiB; C(0) means no cap.
      - Fed by the inventory variable C(llama_rpc_cache_max_mib).
    type: int
    default: 0
  unused_since:
    description:
      - A Unix time; every entry last used before it is removed (the tensors of models no longer served).
      - Unset, no entry is removed for its age alone.
    type: float
attributes:
  check_mode:
    description: Can run in check_mode and return changed status prediction without modifying target.
    support: full
    details: Nothing is removed; the result says what would be.
  diff_mode:
    description: Returns what changed (or would change, in check mode) in diff mode.
    support: none
notes:
  - The RPC server only reads an entry when a client loads that tensor again, so on a file system mounted
    C(noatime) the last use is the time the entry was written.
  - Removing an entry while a server is running is safe; the server writes it again the next time a client
    sends that tensor.
author: llamacpp-rpc-cluster maintainers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Keep the RPC tensor cache under 64 GiB
  llamacpp.rpc_cluster.llama_rpc_cache:
    path: /var/cache/llama.cpp
    max_mib: 65536

- name: Drop the tensors not used in the last 30 days, then keep the cache under the cap
  llamacpp.rpc_cluster.llama_rpc_cache:
    path: "{{ llama_rpc_cache_dir }}"
    max_mib: "{{ llama_rpc_cache_max_mib }}"
    unused_since: "{{ ansible_date_time.epoch | float - 30 * 86400 }}"
  register: __llama_rpc_cache
"""

RETURN = r"""
entries:
  description: Number of entries left (in check mode, that would be left).
  returned: success
  type: int
  sample: 12
bytes:
  description: Total size of the entries left, in bytes.
  returned: success
  type: int
  sample: 1288490188
max_bytes:
  description: The cap in bytes; C(0) means no cap.
  returned: success
  type: int
  sample: 4294967296
removed:
  description: File names of the entries removed (in check mode, that would be removed), in the order removed.
  returned: success
  type: list
  elements: str
  sample: ["0a1b2c3d4e5f6071", "8192a3b4c5d6e7f8"]
removed_bytes:
  description: Total size of the removed entries, in bytes.
  returned: success
  type: int
  sample: 536870912
summary:
  description: One line for people.
  returned: success
  type: str
  sample: "rpc cache /var/cache/llama.cpp: 12 entries, 1.2 GiB of 4.0 GiB cap; removed 3 (512 MiB)"
"""

import os

from ansible.module_utils.basic import AnsibleModule

MIB = 1024 * 1024
UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")


def human_bytes(count):
    """`count` bytes as people read them: 512 B, 1.5 MiB, 512 MiB, 1.2 GiB, 4.0 GiB."""
    value = float(count)
    unit = 0
    while value >= 1024 and unit < len(UNITS) - 1:
        value /= 1024
        unit += 1
    if unit == 0:
        return f"{count} B"
    return f"{value:.1f} {UNITS[unit]}" if value < 10 else f"{value:.0f} {UNITS[unit]}"


def list_entries(rpc_dir):
    """(last use, name, size) of each regular file directly in `rpc_dir`, oldest last use first (ties by name).

    Symbolic links are not followed and neither they nor subdirectories are entries. A missing directory
    has no entries.
    """
    entries = []
    try:
        scan = os.scandir(rpc_dir)
    except FileNotFoundError:
        return entries
    with scan:
        for item in scan:
            try:
                if not item.is_file(follow_symlinks=False):
                    continue
                st = item.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue
            entries.append((max(st.st_atime, st.st_mtime), item.name, st.st_size))
    entries.sort()
    return entries


def plan_removals(entries, max_bytes, unused_since=None):
    """The entries to remove, in order: the ones last used before `unused_since`, then oldest first to the cap."""
    kept = list(entries)
    removals = []
    if unused_since is not None:
        removals = [entry for entry in kept if entry[0] < unused_since]
        kept = [entry for entry in kept if entry[0] >= unused_since]
    total = sum(entry[2] for entry in kept)
    if max_bytes:
        while kept and total > max_bytes:
            entry = kept.pop(0)
            removals.append(entry)
            total -= entry[2]
    return removals, kept


def summary_line(path, entries, total, max_bytes, removed, removed_bytes, check_mode):
    count = f"{entries} entr{'y' if entries == 1 else 'ies'}"
    cap = f"{human_bytes(total)} of {human_bytes(max_bytes)} cap" if max_bytes else f"{human_bytes(total)}, no cap"
    if removed:
        done = f"{'would remove' if check_mode else 'removed'} {removed} ({human_bytes(removed_bytes)})"
    else:
        done = "nothing to remove"
    return f"rpc cache {path}: {count}, {cap}; {done}"


def main():
    module = AnsibleModule(
        argument_spec={
            "path": {"type": "path", "required": True},
            "max_mib": {"type": "int", "default": 0},
            "unused_since": {"type": "float", "default": None},
        },
        supports_check_mode=True,
    )
    path = module.params["path"]
    max_mib = module.params["max_mib"]
    unused_since = module.params["unused_since"]
    if max_mib < 0:
        module.fail_json(msg=f"llama_rpc_cache_max_mib must be 0 or more (0 = no cap), got {max_mib}")
    max_bytes = max_mib * MIB
    rpc_dir = os.path.join(path, "rpc")

    try:
        entries = list_entries(rpc_dir)
    except NotADirectoryError:
        module.fail_json(msg=f"{rpc_dir} is not a directory")
    except OSError as err:
        module.fail_json(msg=f"cannot list {rpc_dir}: {err}")
    removals, kept = plan_removals(entries, max_bytes, unused_since)

    removed = []
    removed_bytes = 0
    for _used, name, size in removals:
        if not module.check_mode:
            try:
                os.unlink(os.path.join(rpc_dir, name))
            except FileNotFoundError:
                continue  # gone already: neither removed here nor left
            except OSError as err:
                module.fail_json(msg=f"cannot remove {os.path.join(rpc_dir, name)}: {err}",
                                 changed=bool(removed), removed=removed, removed_bytes=removed_bytes)
        removed.append(name)
        removed_bytes += size

    total = sum(entry[2] for entry in kept)
    module.exit_json(
        changed=bool(removed),
        entries=len(kept),
        bytes=total,
        max_bytes=max_bytes,
        removed=removed,
        removed_bytes=removed_bytes,
        summary=summary_line(path, len(kept), total, max_bytes, len(removed), removed_bytes, module.check_mode),
    )


if __name__ == "__main__":
    main()
