"""Filters of role llama_calibrate: llama-bench's results as the planner's relative speeds, and as a table."""

from __future__ import annotations

import json
from collections.abc import Mapping

from ansible.errors import AnsibleFilterError

# Each filter is documented in its sidecar file, plugins/filter/<name>.yml (ansible-doc -t filter <name>).

BENCH_HEADER = "%-7s %-24s %10s %8s %7s" % ("device", "host (device)", "tg t/s", "+/-", "speed")
BENCH_ROW = "%-7s %-24s %10.2f %8.2f %7.3f"
MIN_SPEED = 0.0001


def _is_list(value):
    return isinstance(value, (list, tuple))


def _label(device):
    return f"{device['name']} ({device['host']} {device['local_name']})"


def _generation(output, device):
    """(avg_ts, stddev_ts) of the token generation entry of one llama-bench -o json output."""
    if isinstance(output, str):
        try:
            output = json.loads(output)
        except ValueError as err:
            raise AnsibleFilterError(f"{_label(device)}: llama-bench output is not JSON ({err})") from None
    entries = [entry for entry in output if isinstance(entry, Mapping) and (entry.get("n_gen") or 0) > 0] \
        if _is_list(output) else []
    if not entries:
        raise AnsibleFilterError(f"{_label(device)}: llama-bench output has no token generation result "
                                 "(an entry with n_gen > 0)")
    tps = float(entries[0].get("avg_ts") or 0)
    if tps <= 0:
        raise AnsibleFilterError(f"{_label(device)}: llama-bench measured {tps:g} t/s")
    return tps, float(entries[0].get("stddev_ts") or 0)


def llama_calibrate_speeds(outputs, devices):
    """{host: {local_name: {speed, tg_tps, tg_tps_stddev, device}}} from one llama-bench output per device."""
    if not _is_list(outputs) or not _is_list(devices):
        raise AnsibleFilterError("llama_calibrate_speeds needs a list of llama-bench outputs and a list of devices, got "
                                 f"{type(outputs).__name__} and {type(devices).__name__}")
    if not devices or len(outputs) != len(devices):
        raise AnsibleFilterError("llama_calibrate_speeds needs one llama-bench output per device, in the devices' "
                                 f"order: got {len(outputs)} outputs for {len(devices)} devices")
    measured = [_generation(output, device) for output, device in zip(outputs, devices)]
    fastest = max(tps for tps, _device in measured)
    speeds = {}
    for device, (tps, stddev) in zip(devices, measured):
        speeds.setdefault(device["host"], {})[device["local_name"]] = {
            "speed": max(round(tps / fastest, 4), MIN_SPEED),
            "tg_tps": round(tps, 2),
            "tg_tps_stddev": round(stddev, 2),
            "device": device["name"],
        }
    return speeds


def llama_calibrate_table(speeds, devices, cluster=None):
    """The speeds as text lines: a header, a row per device, the cluster's t/s if measured."""
    lines = [BENCH_HEADER]
    for device in devices:
        measured = (speeds.get(device["host"]) or {}).get(device["local_name"])
        if not measured:
            raise AnsibleFilterError(f"{_label(device)} has no measured speed (the speeds have hosts "
                                     f"{', '.join(sorted(speeds)) or 'none'})")
        lines.append(BENCH_ROW % (device["name"], f"{device['host']} ({device['local_name']})",
                                  measured["tg_tps"], measured["tg_tps_stddev"], measured["speed"]))
    if cluster and cluster.get("tg_tps") is not None:
        lines.append(f"cluster {','.join(cluster['devices'])} --tensor-split "
                     f"{','.join(str(value) for value in cluster['tensor_split'])} ({cluster['strategy']}): "
                     f"{float(cluster['tg_tps']):.2f} t/s")
    return lines


class FilterModule:
    """Bench filters."""

    def filters(self):
        return {"llama_calibrate_speeds": llama_calibrate_speeds, "llama_calibrate_table": llama_calibrate_table}
