"""Ansible module llama_model_store: keep the served GGUF off mmap-over-the-network (role llama_storage)."""

DOCUMENTATION = r"""
module: llama_model_store
short_description: Inspect, stage (copy + verify) and prune the models a llama.cpp master serves
description:
  - C(inspect) (read-only) reads the model's GGUF header (magic, version, tensor data inside the file, every
    shard of a split model), the filesystem type of the directory the file lives in, and what is recorded
    about it; it says whether a staged copy is current and, when not, checks the free space and returns the
    chunks to copy. In C(direct) mode with a given C(sha256) it hashes the source once per change.
  - C(copy) copies one chunk of one file into C(STAGE_DIR/.incoming/) (a loop over C(inspect)'s chunks shows
    progress in the play output).
  - C(finish) hashes the copy, checks it against C(sha256) and the GGUF checks, and moves the directory to
    C(STAGE_DIR/SHA12/) with one rename; it records source size, mtime and checksum in C(STAGE_DIR/manifest.json),
    so later runs know the copy is current without reading the file again.
  - C(record) records a C(direct) model's size, mtime and checksum.
  - C(prune) removes staged copies beyond C(keep), newest kept first, never one in C(protect).
options:
  step:
    description: What to do.
    type: str
    required: true
    choices: [inspect, copy, finish, record, prune]
  src:
    description: The model's path (the first shard of a split model); not for C(prune).
    type: path
  stage_dir:
    description: Where staged copies and the manifest live.
    type: path
    required: true
  mode:
    description: C(stage) (copy to C(stage_dir)) or C(direct) (serve C(src) where it is).
    type: str
    default: stage
    choices: [stage, direct]
  sha256:
    description: The checksum C(src) must have (64 hex digits); empty = computed once and recorded.
    type: str
    default: ""
  chunk_mib:
    description: Size of one C(copy) step.
    type: int
    default: 1024
  chunk:
    description: For C(copy), one item of C(inspect)'s C(chunks).
    type: dict
  keep:
    description: For C(prune), how many staged copies to keep (newest first; C(protect) always kept).
    type: int
    default: 2
  protect:
    description: For C(prune), staged paths never removed (the served model, models staged ahead).
    type: list
    elements: path
    default: []
attributes:
  check_mode:
    description: Can run in check_mode and return changed status prediction without modifying target.
    support: full
  diff_mode:
    description: Returns what changed (or would change, in check mode) in diff mode.
    support: none
author: llamacpp-rpc-cluster maintainers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Inspect the model
  llamacpp.rpc_cluster.llama_model_store:
    step: inspect
    src: /mnt/models/Qwen3-32B-Q4_K_M.gguf
    stage_dir: /var/lib/llama.cpp/models
  register: __model

- name: Stage it
  llamacpp.rpc_cluster.llama_model_store:
    step: copy
    src: /mnt/models/Qwen3-32B-Q4_K_M.gguf
    stage_dir: /var/lib/llama.cpp/models
    chunk: "{{ item }}"
  loop: "{{ __model.chunks }}"
  loop_control:
    label: "{{ item.label }}"
"""

RETURN = r"""
served:
  description: What llama-server reads (C(inspect), C(finish), C(record)).
  returned: inspect, finish, record
  type: dict
  contains:
    source: {description: "C(src).", type: str}
    path: {description: "The file llama-server opens (the staged copy, or C(src) in direct mode).", type: str}
    ready: {description: "Whether C(path) holds this content now.", type: bool}
    sha256: {description: "The checksum when known (given, or recorded at staging).", type: str}
    identity: {description: "C(sha256), else C(SIZE-MTIME_NS) of the source; changes with the content.", type: str}
    fstype: {description: "Filesystem type of the directory of C(path).", type: str}
    network: {description: "Whether C(path) is on a network filesystem (mmap is then never used).", type: bool}
    mode: {description: "C(stage) or C(direct).", type: str}
    bytes: {description: "Size of the model (all shards).", type: int}
source_fstype:
  description: Filesystem type of C(src)'s directory, and whether it is a network one.
  returned: inspect
  type: str
chunks:
  description: The copy steps still to do (C(file), C(offset), C(length), C(label)); empty when current.
  returned: inspect
  type: list
removed:
  description: Staged directories C(prune) removed.
  returned: prune
  type: list
"""

import hashlib
import json
import os
import shutil
import time

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.llamacpp.rpc_cluster.plugins.module_utils.llama_gguf import GGUFError, read_gguf_shards

MANIFEST = "manifest.json"
INCOMING = ".incoming"
# Space left free on the staging filesystem besides the copy.
HEADROOM = 256 << 20
# Filesystems whose pages come over the network: mmap there makes every page fault a round trip.
NETWORK_FSTYPES = {"nfs", "nfs4", "cifs", "smb3", "smbfs", "ncpfs", "ceph", "glusterfs", "9p", "afs", "lustre",
                   "gpfs", "beegfs", "ocfs2", "gfs2", "davfs", "orangefs", "virtiofs"}
# FUSE filesystems that are local (everything else FUSE is treated as network: sshfs, s3fs, rclone, ...).
LOCAL_FUSE = {"fuseblk", "fuse.lxcfs", "fuse-overlayfs", "fuse.fuse-overlayfs", "fuse.portal", "fuse.gvfsd-fuse",
              "fusectl"}


def is_network(fstype):
    return fstype in NETWORK_FSTYPES or (fstype.startswith("fuse") and fstype not in LOCAL_FUSE)


def _unescape(field):
    """Mount points in mountinfo escape space, tab, newline and backslash as octal."""
    out, index = [], 0
    while index < len(field):
        if field[index] == "\\" and field[index + 1:index + 4].isdigit():
            out.append(chr(int(field[index + 1:index + 4], 8)))
            index += 4
        else:
            out.append(field[index])
            index += 1
    return "".join(out)


def fstype_of(path, mountinfo="/proc/self/mountinfo"):
    """(filesystem type, mount point) of the mount holding path: the longest mount point prefixing it."""
    real = os.path.realpath(path)
    best = ("", "/")
    with open(mountinfo, encoding="utf-8") as handle:
        for line in handle:
            fields = line.split()
            separator = fields.index("-")
            mount_point, fstype = _unescape(fields[4]), fields[separator + 1]
            inside = real == mount_point or real.startswith(mount_point.rstrip("/") + "/")
            if inside and len(mount_point) >= len(best[1]):
                best = (fstype, mount_point)
    return best


def sha256_file(path):
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(4 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def human(count):
    return f"{count / (1 << 30):.1f} GiB" if count >= 1 << 30 else f"{count / (1 << 20):.0f} MiB"


def load_manifest(stage_dir):
    try:
        with open(os.path.join(stage_dir, MANIFEST), encoding="utf-8") as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return {"sources": {}}


def save_manifest(stage_dir, manifest):
    path = os.path.join(stage_dir, MANIFEST)
    with open(path + ".part", "w", encoding="utf-8") as handle:
        json.dump(manifest, handle, indent=1, sort_keys=True)
        handle.write("\n")
    os.chmod(path + ".part", 0o644)
    os.replace(path + ".part", path)


def source_files(src):
    """[(path, size, mtime_ns)] of the model's files (every shard), after the GGUF checks."""
    files = []
    for shard in read_gguf_shards(src):
        stat = os.stat(shard["path"])
        files.append((shard["path"], stat.st_size, stat.st_mtime_ns))
    return files


def fingerprint(files):
    return [[os.path.basename(path), size, mtime] for path, size, mtime in files]


def identity(sha256, files):
    return sha256 or "-".join(f"{size}-{mtime}" for _path, size, mtime in files)


class Failure(Exception):
    pass


def checksum_mismatch(src, actual, given):
    return Failure(f"{src} has sha256 {actual}, not llama_model_sha256 {given}: the file changed or the checksum "
                   f"is wrong. Fix llama_model_sha256 or the file; the running model is untouched")


def inspect(params):
    src, stage_dir, mode, given = params["src"], params["stage_dir"], params["mode"], params["sha256"]
    files = source_files(src)
    total = sum(size for _path, size, _mtime in files)
    source_fstype = fstype_of(os.path.dirname(src))[0]
    # Staged copies and direct files are recorded apart: a direct record names no copy.
    record = load_manifest(stage_dir).get("sources" if mode == "stage" else "direct", {}).get(src)
    unchanged = bool(record) and record.get("files") == fingerprint(files) and (
        not given or record.get("sha256") == given)
    result = {"changed": False, "source_fstype": source_fstype, "source_network": is_network(source_fstype),
              "chunks": []}
    if mode == "direct":
        known = record.get("sha256", "") if unchanged else ""
        if given and not known:
            actual = sha256_file(src)
            if actual != given:
                raise checksum_mismatch(src, actual, given)
            known = actual
        result["served"] = served(src, src, True, known, files, source_fstype, mode)
        result["record_needed"] = not unchanged
        return result
    staged = record.get("path") if unchanged else None
    inside = bool(staged) and os.path.dirname(os.path.dirname(staged)) == stage_dir.rstrip("/")
    if inside and os.path.isfile(staged) and os.path.getsize(staged) == files[0][1]:
        fstype = fstype_of(os.path.dirname(staged))[0]
        result["served"] = served(src, staged, True, record.get("sha256", ""), files, fstype, mode)
        return result
    # Not staged yet (or changed): the copy goes to STAGE_DIR/SHA12/ once hashed.
    target_parent = stage_dir  # or its nearest existing parent: where the copy's space comes from
    while not os.path.isdir(target_parent):
        target_parent = os.path.dirname(target_parent)
    usage = shutil.disk_usage(target_parent)
    if usage.free < total + HEADROOM:
        raise Failure(f"staging {src} ({human(total)}) needs {human(total + HEADROOM)} free in {stage_dir}, but "
                      f"its filesystem has {human(usage.free)} free: free space there, set llama_storage_stage_dir "
                      f"to a larger disk, or serve the file where it is with llama_model_mode: direct")
    pending = os.path.join(stage_dir, (given[:12] if given else "pending"), os.path.basename(src))
    fstype = fstype_of(target_parent)[0]
    result["served"] = served(src, pending, False, given, files, fstype, mode)
    step = params["chunk_mib"] << 20
    done = 0
    for index, (path, size, _mtime) in enumerate(files):
        for offset in range(0, max(size, 1), step):
            length = min(step, size - offset)
            done += length
            result["chunks"].append({
                "file": index, "path": path, "offset": offset, "length": length,
                "label": f"{os.path.basename(path)}: {human(done)} of {human(total)} ({100 * done // total}%)"})
    return result


def served(src, path, ready, sha256, files, fstype, mode):
    return {"source": src, "path": path, "ready": ready, "sha256": sha256, "identity": identity(sha256, files),
            "fstype": fstype, "network": is_network(fstype), "mode": mode,
            "bytes": sum(size for _path, size, _mtime in files)}


def copy_chunk(params):
    chunk, incoming = params["chunk"], os.path.join(params["stage_dir"], INCOMING)
    os.makedirs(incoming, mode=0o755, exist_ok=True)
    target = os.path.join(incoming, os.path.basename(chunk["path"]))
    flags = os.O_WRONLY | os.O_CREAT | (os.O_TRUNC if int(chunk["offset"]) == 0 else 0)
    fd = os.open(target, flags, 0o644)
    try:
        with open(chunk["path"], "rb") as source:
            source.seek(int(chunk["offset"]))
            os.lseek(fd, int(chunk["offset"]), os.SEEK_SET)
            left = int(chunk["length"])
            while left > 0:
                block = source.read(min(left, 8 << 20))
                if not block:
                    raise Failure(f"{chunk['path']} ended early while staging it: it changed during the copy; "
                                  f"run the play again once it is complete")
                os.write(fd, block)
                left -= len(block)
        os.fsync(fd)
    finally:
        os.close(fd)
    return {"changed": True}


def finish(params):
    src, stage_dir, given = params["src"], params["stage_dir"], params["sha256"]
    incoming = os.path.join(stage_dir, INCOMING)
    files = source_files(src)
    try:
        hashes = {}
        for path, size, _mtime in files:
            copy = os.path.join(incoming, os.path.basename(path))
            if not os.path.isfile(copy) or os.path.getsize(copy) != size:
                raise Failure(f"the staged copy of {path} is incomplete ({copy}): the source changed during the "
                              f"copy; run the play again")
            hashes[os.path.basename(path)] = sha256_file(copy)
        actual = hashes[os.path.basename(src)]
        if given and actual != given:
            raise checksum_mismatch(src, actual, given)
        if files != source_files(src):
            raise Failure(f"{src} changed while it was being staged; run the play again")
        read_gguf_shards(os.path.join(incoming, os.path.basename(src)))
    except (Failure, GGUFError):
        shutil.rmtree(incoming, ignore_errors=True)
        raise
    target = os.path.join(stage_dir, actual[:12])
    if os.path.isdir(target):
        # The same content is staged already (from another path, maybe under another name).
        for name in os.listdir(incoming):
            if not os.path.exists(os.path.join(target, name)):
                os.replace(os.path.join(incoming, name), os.path.join(target, name))
        shutil.rmtree(incoming)
    else:
        os.replace(incoming, target)
    os.utime(target)  # newest first when pruning
    directory = os.open(stage_dir, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)
    path = os.path.join(target, os.path.basename(src))
    manifest = load_manifest(stage_dir)
    manifest["sources"][src] = {"files": fingerprint(files), "sha256": actual, "shards": hashes, "path": path,
                                "staged": int(time.time())}
    save_manifest(stage_dir, manifest)
    fstype = fstype_of(target)[0]
    return {"changed": True, "served": served(src, path, True, actual, files, fstype, "stage")}


def record(params):
    src, stage_dir = params["src"], params["stage_dir"]
    files = source_files(src)
    os.makedirs(stage_dir, mode=0o755, exist_ok=True)
    manifest = load_manifest(stage_dir)
    manifest.setdefault("direct", {})[src] = {"files": fingerprint(files), "sha256": params["sha256"]}
    save_manifest(stage_dir, manifest)
    fstype = fstype_of(os.path.dirname(src))[0]
    return {"changed": True, "served": served(src, src, True, params["sha256"], files, fstype, "direct")}


def prune(params, check_mode):
    stage_dir, keep = params["stage_dir"], params["keep"]
    if not os.path.isdir(stage_dir):
        return {"changed": False, "removed": [], "kept": []}
    protected = {os.path.dirname(os.path.realpath(path)) for path in params["protect"]}
    staged = sorted((entry for entry in os.scandir(stage_dir) if entry.is_dir(follow_symlinks=False)
                     and not entry.name.startswith(".")), key=lambda entry: entry.stat().st_mtime, reverse=True)
    kept = [entry.path for entry in staged if entry.path in protected]
    removed = []
    for entry in staged:
        if entry.path in kept:
            continue
        if len(kept) < keep:
            kept.append(entry.path)
        else:
            removed.append(entry.path)
    if removed and not check_mode:
        for path in removed:
            shutil.rmtree(path)
        manifest = load_manifest(stage_dir)
        manifest["sources"] = {src: entry for src, entry in manifest["sources"].items()
                               if os.path.dirname(entry.get("path", "")) not in removed}
        save_manifest(stage_dir, manifest)
    return {"changed": bool(removed), "removed": removed, "kept": kept}


def main():
    module = AnsibleModule(
        argument_spec={
            "step": {"type": "str", "required": True, "choices": ["inspect", "copy", "finish", "record", "prune"]},
            "src": {"type": "path"},
            "stage_dir": {"type": "path", "required": True},
            "mode": {"type": "str", "default": "stage", "choices": ["stage", "direct"]},
            "sha256": {"type": "str", "default": ""},
            "chunk_mib": {"type": "int", "default": 1024},
            "chunk": {"type": "dict"},
            "keep": {"type": "int", "default": 2},
            "protect": {"type": "list", "elements": "path", "default": []},
        },
        required_if=[("step", "inspect", ["src"]), ("step", "copy", ["chunk"]), ("step", "finish", ["src"]),
                     ("step", "record", ["src"])],
        supports_check_mode=True,
    )
    params, step = module.params, module.params["step"]
    params["sha256"] = params["sha256"].lower()
    try:
        if step == "inspect":
            result = inspect(params)
        elif step == "prune":
            result = prune(params, module.check_mode)
        elif module.check_mode:
            result = {"changed": True}
        else:
            result = {"copy": copy_chunk, "finish": finish, "record": record}[step](params)
    except (Failure, GGUFError) as err:
        module.fail_json(msg=str(err), problem="gguf" if isinstance(err, GGUFError) else "store")
    except OSError as err:
        module.fail_json(msg=f"{err.filename or params['stage_dir']}: {err.strerror}")
    module.exit_json(**result)


if __name__ == "__main__":
    main()
