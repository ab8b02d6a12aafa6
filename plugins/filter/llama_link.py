"""Filters of the link measurement (role llama_link): iperf3's JSON and a TCP round-trip probe as table rows."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping

from ansible.errors import AnsibleFilterError

# Each filter is documented in its sidecar file, plugins/filter/<name>.yml (ansible-doc -t filter <name>).

# A warning about throughput says how long this much of a worker's weights takes to cross the link.
LOAD_GIB = 10
FIELDS = ("worker", "address", "port", "server_error", "iperf3", "rtt")


def _number(value, name):
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = math.nan
    if not math.isfinite(number) or number < 0:
        raise AnsibleFilterError(f"llama_link_rows: {name} must be a number >= 0, got {value!r}")
    return number


def _json(text, what):
    """The JSON object a tool printed, or an error text."""
    try:
        parsed = json.loads(text)
    except ValueError:
        return None, f"{what} printed no JSON: {' '.join(str(text).split())[:200]!r}"
    if not isinstance(parsed, Mapping):
        return None, f"{what} printed {type(parsed).__name__}, not a JSON object"
    return parsed, ""


def _throughput(text):
    """(Gbit/s received by the worker, error) from the output of `iperf3 --client … --json`."""
    if not text:
        return None, "iperf3 printed nothing"
    result, error = _json(text, "iperf3")
    if error:
        return None, error
    if result.get("error"):
        return None, f"iperf3: {result['error']}"
    received = (result.get("end") or {}).get("sum_received") or {}
    if not isinstance(received.get("bits_per_second"), (int, float)):
        return None, "iperf3's JSON has no end.sum_received.bits_per_second"
    if received["bits_per_second"] <= 0:
        return None, "iperf3: no data reached the worker"
    return received["bits_per_second"] / 1e9, ""


def _round_trip(text):
    """(RTT in ms, error) from the TCP handshake probe's JSON, {rtt_ms, error}."""
    if not text:
        return None, "the round-trip probe printed nothing"
    result, error = _json(text, "the round-trip probe")
    if error:
        return None, error
    if result.get("error"):
        return None, str(result["error"])
    if not isinstance(result.get("rtt_ms"), (int, float)):
        return None, "the round-trip probe's JSON has no rtt_ms"
    return float(result["rtt_ms"]), ""


def _limit(value):
    return f"{value:g}"


def _row(measurement, min_gbits, max_rtt_ms):
    worker, address, port = measurement["worker"], measurement["address"], measurement["port"]
    label = f"{worker} ({address})"
    problems, warnings = [], []
    gbits = rtt_ms = None
    if measurement["server_error"]:
        problems.append("not measured")
        warnings.append(f"{label}: not measured: the iperf3 server did not start on port {port}: "
                        f"{measurement['server_error']}. Set llama_link_port to a free port.")
    else:
        gbits, error = _throughput(measurement["iperf3"])
        rtt_ms, rtt_error = _round_trip(measurement["rtt"])
        if error:
            problems.append("not measured")
            warnings.append(f"{label}: throughput not measured: {error}. The master must reach {address}:{port}/tcp "
                            "during the measurement (a firewall other than ufw or firewalld drops it?).")
        elif gbits < min_gbits:
            problems.append(f"below {_limit(min_gbits)} Gbit/s")
            seconds = LOAD_GIB * 2**30 * 8 / (gbits * 1e9)
            warnings.append(
                f"{label}: {gbits:.2f} Gbit/s from the master, below llama_link_min_gbits {_limit(min_gbits)}. "
                f"It costs model load time: every {LOAD_GIB} GiB of weights this worker holds take at least "
                f"{seconds:.0f} s to cross the link when llama-server starts (the RPC cache spares later loads only "
                "what it holds). 10 GbE or faster is advised; decode speed depends on the round trip, not on this.")
        if rtt_error:
            problems.append("RTT not measured")
            warnings.append(f"{label}: round trip not measured: {rtt_error}.")
        elif rtt_ms > max_rtt_ms:
            problems.append(f"RTT above {_limit(max_rtt_ms)} ms")
            warnings.append(
                f"{label}: round trip {rtt_ms:.3f} ms, above llama_link_max_rtt_ms {_limit(max_rtt_ms)}. It costs "
                "decode speed: every generated token waits for round trips to each worker, so tokens/s falls as "
                "the round trip grows. Put the nodes on one switch, without routers or VPNs between them.")
    return {"worker": worker, "address": address, "rtt_ms": rtt_ms, "gbits": gbits,
            "verdict": ", ".join(dict.fromkeys(problems)) or "ok", "warnings": warnings}


def llama_link_rows(measurements, min_gbits, max_rtt_ms):
    """One row per measured worker: its RTT and throughput, a verdict against the thresholds, warnings."""
    if not isinstance(measurements, (list, tuple)):
        raise AnsibleFilterError(f"llama_link_rows needs a list of measurements, got {measurements!r}")
    min_gbits, max_rtt_ms = _number(min_gbits, "min_gbits"), _number(max_rtt_ms, "max_rtt_ms")
    rows = []
    for index, measurement in enumerate(measurements):
        if not isinstance(measurement, Mapping) or any(field not in measurement for field in FIELDS):
            raise AnsibleFilterError(f"llama_link_rows: measurements[{index}] must be a dict with "
                                     f"{', '.join(FIELDS)}, got {measurement!r}")
        rows.append(_row(measurement, min_gbits, max_rtt_ms))
    return rows


def llama_link_table(rows):
    """The rows as text lines: worker, address, RTT ms, Gbit/s, verdict ("-" where not measured)."""
    if not isinstance(rows, (list, tuple)):
        raise AnsibleFilterError(f"llama_link_table needs the rows of llama_link_rows, got {rows!r}")
    width = max([len("worker")] + [len(str(row["worker"])) for row in rows])
    line = f"%-{width}s  %-15s  %8s  %8s  %s"
    lines = [line % ("worker", "address", "RTT ms", "Gbit/s", "verdict")]
    for row in rows:
        lines.append(line % (row["worker"], row["address"],
                             "-" if row["rtt_ms"] is None else f"{row['rtt_ms']:.3f}",
                             "-" if row["gbits"] is None else f"{row['gbits']:.2f}", row["verdict"]))
    return lines


class FilterModule:
    """Link measurement filters."""

    def filters(self):
        return {"llama_link_rows": llama_link_rows, "llama_link_table": llama_link_table}
