"""Filters of role llama_prefill: which cached tensors each worker holds under a plan, where its fill reads them,
and how long a model load is expected to take."""

from __future__ import annotations

import math
import os

from ansible.errors import AnsibleFilterError

# What llama-server does besides reading, hashing and sending the weights (context, compute buffers, warm-up),
# seconds; and the share of the estimate a wait adds for what it cannot know (another load on the disk, the link).
LOAD_FIXED_SECONDS = 15
WAIT_FACTOR = 1.5


def llama_prefill_tensors(tensors, plan, devices):
    """{host: [tensor, ...]}: the cached tensors (llama_gguf_info's cache_tensors, each with its layer) that each RPC
    worker holds under `plan` (llama_split_plan's result: devices and layers [first, end) in that order), the
    workers found through `devices` (llama_server_devices: name, host, endpoint; the master's own devices have no
    endpoint and are left out). A worker with no layers gets an empty list."""
    if not isinstance(plan, dict) or len(plan.get("devices", [])) != len(plan.get("layers", [])):
        raise AnsibleFilterError(f"llama_prefill_tensors: plan must have devices and layers of one length, got {plan!r}")
    hosts = {device["name"]: device["host"] for device in devices if device.get("endpoint")}
    held = {host: [] for host in hosts.values()}
    for name, (first, end) in zip(plan["devices"], plan["layers"]):
        host = hosts.get(name)
        if host is not None:
            held[host] += [tensor for tensor in tensors if first <= tensor["layer"] < end]
    return held


def llama_prefill_read_from(tensors, served):
    """The tensors, each `file` in the directory of the file llama-server reads (`served`: llama_storage_served, whose
    staged copy holds the same files under the same names once it is ready; the source until then)."""
    directory = os.path.dirname(served["path"] if served.get("ready") else served["source"])
    return [dict(tensor, file=os.path.join(directory, os.path.basename(tensor["file"]))) for tensor in tensors]


def llama_prefill_ahead_models(results):
    """The models of llama_storage_ahead, from the results of llama_plan looped over llama_gguf_info's (the ahead
    models that fit): each {source, bytes, tensors: {worker: [tensor, ...]}}; path and identity "" until staged."""
    models = []
    for result in results:
        read = result["item"]
        models.append({"source": read["item"]["path"], "path": "", "identity": "", "bytes": read["gguf"]["file_bytes"],
                       "tensors": llama_prefill_tensors(read["gguf"]["cache_tensors"], result["plan"],
                                                        result["devices"])})
    return models


def llama_prefill_entries(tensors, index, source):
    """The llama_rpc_fill module's entries for `tensors`: each with its hash and sha256 from `index` (llama_rpc_index's
    entries) and its location under `source`: {kind: url, base, files: {file name: id}} (the master's pre-fill
    source) or {kind: path, dir} (the model share, or a copy on the worker)."""
    entries = []
    for tensor in tensors:
        known = index.get(tensor["name"])
        if known is None:
            raise AnsibleFilterError(f"llama_prefill_entries: the index has no entry for {tensor['name']}")
        name = os.path.basename(tensor["file"])
        if source["kind"] == "url":
            location = f"{source['base']}/{source['files'][name]}"
        else:
            location = os.path.join(source["dir"], name)
        entries.append({"name": tensor["name"], "hash": known["hash"], "sha256": known["sha256"],
                        "size": tensor["size"], "location": location, "offset": tensor["offset"]})
    return entries


def _listing(lines):
    """(free bytes where a worker's cache lives, {entry name: size}) from tasks/preflight.yml's listing: the free
    bytes on the first line, then `name size` per entry."""
    free = int(lines[0]) if lines and str(lines[0]).strip().isdigit() else 0
    present = {}
    for line in lines[1:]:
        name, _sep, size = str(line).partition(" ")
        if len(name) == 16 and size.isdigit():
            present[name] = int(size)
    return free, present


def llama_prefill_need(models, host, known, listing):
    """What `host`'s cache needs for `models` (llama_prefill_plan.models), given its `listing` (tasks/preflight.yml:
    the free bytes where the cache lives, then `name size` per entry): planned_bytes (every tensor it holds, each
    content once), missing_bytes (those not present, by the hashes `known` from the served model's index; a tensor
    whose hash is not known yet counts as missing), free (bytes) and files ({the model file's path on the master: the
    bytes a copy of it must have at least}, for the check of a share or local copy)."""
    free, present = _listing(listing)
    planned, missing, files = {}, 0, {}
    for number, model in enumerate(models):
        for tensor in model["tensors"].get(host, []):
            entry = known.get(tensor["name"]) if number == 0 else None
            key = entry["hash"] if entry else f"{model['source']}:{tensor['name']}"
            if key in planned:
                continue
            planned[key] = tensor["size"]
            if not entry or present.get(entry["hash"]) != tensor["size"]:
                missing += tensor["size"]
            files[tensor["file"]] = max(files.get(tensor["file"], 0), tensor["offset"] + tensor["size"])
    return {"planned_bytes": sum(planned.values()), "missing_bytes": missing, "free": free, "files": files}


def llama_prefill_worker_entries(models, index, host, source, local_dir, base):
    """{entries, unknown}: the llama_rpc_fill entries of `host` for every model (llama_prefill_plan.models, and
    llama_prefill_index in the same order), read from `source`: master (the URL `base`, a path per model file
    MODEL/FILE, as llama_prefill_source_files serves them), share (the model's own path) or local (`local_dir`, the
    file's name); and the names of the tensors the index does not know (check mode hashes nothing)."""
    entries, unknown = [], []
    for number, (model, indexed) in enumerate(zip(models, index)):
        tensors = model["tensors"].get(host, [])
        known = [tensor for tensor in tensors if tensor["name"] in indexed["entries"]]
        unknown += [tensor["name"] for tensor in tensors if tensor["name"] not in indexed["entries"]]
        if source == "master":
            files = {os.path.basename(tensor["file"]): f"{number}/{os.path.basename(tensor['file'])}"
                     for tensor in known}
            where = {"kind": "url", "base": base, "files": files}
        elif source == "share":
            where = {"kind": "path", "dir": os.path.dirname(model["source"])}
        else:
            where = {"kind": "path", "dir": local_dir}
        entries += llama_prefill_entries(known, indexed["entries"], where)
    return {"entries": entries, "unknown": unknown}


def llama_prefill_source_files(models, index):
    """The master's pre-fill source's files, `MODEL/FILE=PATH` (MODEL the model's number in llama_prefill_plan.models,
    FILE a file name of it, PATH that file in the copy the master reads, llama_prefill_index's path)."""
    served = {}
    for number, (model, indexed) in enumerate(zip(models, index)):
        directory = os.path.dirname(indexed["path"])
        for tensor in [tensor for tensors in model["tensors"].values() for tensor in tensors]:
            name = os.path.basename(tensor["file"])
            served[f"{number}/{name}"] = os.path.join(directory, name)
    return [f"{key}={path}" for key, path in sorted(served.items())]


def llama_prefill_timeout(count, mbit):
    """Seconds a pre-fill of `count` bytes may take at `mbit` Mbit/s: three times the transfer and 5 minutes, 10 at
    least."""
    return max(600, math.ceil(3 * int(count) * 8 / (_positive(mbit, "mbit") * 1e6)) + 300)


def llama_prefill_bad_copies(results):
    """The paths of a worker's model copies that are missing or shorter than the tensors read from them, from a stat
    loop over llama_prefill_need's files (item: {key: the master's path, value: the bytes needed})."""
    bad = []
    for result in results:
        if result.get("skipped"):
            continue
        stat = result.get("stat", {})
        if not stat.get("exists") or stat.get("size", 0) < result["item"]["value"]:
            bad.append(result["invocation"]["module_args"]["path"])
    return bad


def _positive(value, what):
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = float("nan")
    if math.isnan(number) or number <= 0:
        raise AnsibleFilterError(f"llama_load_estimate: {what} must be a positive number, got {value!r}")
    return number


def llama_prefill_weights(model, plan, devices, held):
    """{worker: {weights, cached, uncached}}: the bytes of weights each RPC worker holds under `plan` (its layers'
    layer_bytes, and output_bytes with the output layer), those of its cached tensors (`held`: llama_prefill_tensors)
    and the rest, which llama.cpp never caches (tensors of 10 MiB or less) and sends at every load."""
    hosts = {device["name"]: device["host"] for device in devices if device.get("endpoint")}
    n_layer = int(model["n_layer"])
    layer_bytes = model["layer_bytes"]
    if not isinstance(layer_bytes, list):
        layer_bytes = [layer_bytes] * n_layer
    weights = {host: 0 for host in hosts.values()}
    for name, (first, end) in zip(plan["devices"], plan["layers"]):
        host = hosts.get(name)
        if host is None:
            continue
        weights[host] += sum(int(size) for size in layer_bytes[first:min(end, n_layer)])
        if end > n_layer:
            weights[host] += int(model["output_bytes"])
    result = {}
    for host, total in weights.items():
        cached = sum(tensor["size"] for tensor in held.get(host, []))
        result[host] = {"weights": total, "cached": cached, "uncached": max(total - cached, 0)}
    return result


def llama_load_estimate(model_bytes, weights, links, assumed_gbits, warm, disk_mbps, hash_mbps):
    """How long llama-server is expected to take to load the model, in seconds, and of what.

    llama.cpp's load, one tensor after the other: the master reads the whole file (model_bytes, from disk at
    disk_mbps MB/s), hashes every cached weight bound for an RPC worker (FNV-1a on one core at hash_mbps MB/s), and
    sends each worker over its link (links: {worker: Gbit/s} measured by the link check, else assumed_gbits) the
    weights it never caches (10 MiB or less) and the cached ones its cache lacks: none for the workers in `warm`
    (pre-filled), all for the others. `weights`: llama_prefill_weights.
    Returns {seconds, read, hash, send, start (seconds each), sent_bytes, cold_bytes, warm (no cached weight to send),
    links (the Gbit/s used), words (for people)}.
    """
    read = int(model_bytes) / (_positive(disk_mbps, "disk_mbps") * 1e6)
    cached = sum(int(worker["cached"]) for worker in weights.values())
    hashing = cached / (_positive(hash_mbps, "hash_mbps") * 1e6)
    used, send, cold, uncached = {}, 0.0, 0, 0
    for name, worker in weights.items():
        used[name] = _positive((links or {}).get(name) or assumed_gbits, f"the link to {name} (Gbit/s)")
        missing = 0 if name in warm else int(worker["cached"])
        send += (int(worker["uncached"]) + missing) * 8 / (used[name] * 1e9)
        cold += missing
        uncached += int(worker["uncached"])
    seconds = math.ceil(read + hashing + send + LOAD_FIXED_SECONDS)
    words = (f"{seconds} s (read {read:.1f} s, hash {hashing:.1f} s, send {send:.1f} s, start "
             f"{LOAD_FIXED_SECONDS} s)")
    return {"seconds": seconds, "read": round(read, 1), "hash": round(hashing, 1), "send": round(send, 1),
            "start": LOAD_FIXED_SECONDS, "sent_bytes": cold + uncached, "cold_bytes": cold, "warm": cold == 0,
            "links": used, "words": words}


def llama_load_wait(estimate, configured):
    """Seconds a wait for a load may take: the configured timeout, or more where the estimate asks for it."""
    return max(int(configured), math.ceil(estimate["seconds"] * WAIT_FACTOR))


class FilterModule:
    def filters(self):
        return {
            "llama_prefill_tensors": llama_prefill_tensors,
            "llama_prefill_read_from": llama_prefill_read_from,
            "llama_prefill_ahead_models": llama_prefill_ahead_models,
            "llama_prefill_need": llama_prefill_need,
            "llama_prefill_bad_copies": llama_prefill_bad_copies,
            "llama_prefill_worker_entries": llama_prefill_worker_entries,
            "llama_prefill_source_files": llama_prefill_source_files,
            "llama_prefill_timeout": llama_prefill_timeout,
            "llama_prefill_weights": llama_prefill_weights,
            "llama_load_estimate": llama_load_estimate,
            "llama_load_wait": llama_load_wait,
        }
