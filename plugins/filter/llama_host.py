"""Filters of a host: its listening ports (as `ss` prints them), its cluster address, its addresses as networks."""

from __future__ import annotations

import ipaddress
import re

from ansible.errors import AnsibleFilterError

_PROCESS = re.compile(r'\("([^"]+)",pid=\d+')
_CGROUP = re.compile(r"\bcgroup:(\S+)")


def listeners(text):
    """(local address, port, [process names], unit or None) per line of `ss -Hltnpe`."""
    result = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 5:
            continue
        address, _colon, port = fields[3].rpartition(":")
        if not port.isdigit():
            raise AnsibleFilterError(f"llama_port_conflicts: cannot read the local address of {line!r}")
        rest = " ".join(fields[5:])
        processes = list(dict.fromkeys(_PROCESS.findall(rest)))
        cgroup = _CGROUP.search(rest)
        unit = cgroup.group(1).rstrip("/").rpartition("/")[2] if cgroup else ""
        result.append((address.strip("[]"), int(port), processes, unit if unit.endswith(".service") else None))
    return result


def llama_port_conflicts(text, wanted):
    conflicts = []
    for address, port, processes, unit in listeners(text):
        for want in wanted:
            allowed = [want["unit"]] if isinstance(want["unit"], str) else list(want["unit"])
            if int(want["port"]) == port and unit not in allowed:
                holder = ", ".join(processes) or unit or "another program"
                conflicts.append({"variable": want["variable"], "port": port, "address": address, "holder": holder})
    return conflicts


def _ipv4(text):
    try:
        return str(ipaddress.IPv4Address(str(text).strip()))
    except ValueError:
        return None


def llama_cluster_address(facts, configured="", ansible_host=""):
    """The host's cluster address and where it came from: the inventory's llama_cluster_address, else the
    default route's address, else ansible_host when it is an IPv4 address, else the only non-loopback IPv4
    address. `address` is "" when none of them decides (`candidates` then lists the host's addresses)."""
    if not isinstance(facts, dict):
        raise AnsibleFilterError(f"llama_cluster_address: expected the host's ansible_facts, got {type(facts).__name__}")
    candidates = [a for a in facts.get("all_ipv4_addresses") or [] if not ipaddress.IPv4Address(a).is_loopback]
    if configured:
        return {"address": str(configured), "source": "llama_cluster_address", "candidates": candidates}
    default = (facts.get("default_ipv4") or {}).get("address")
    if default:
        return {"address": default, "source": "the default route", "candidates": candidates}
    if _ipv4(ansible_host):
        return {"address": _ipv4(ansible_host), "source": "ansible_host", "candidates": candidates}
    if len(candidates) == 1:
        return {"address": candidates[0], "source": "its only IPv4 address", "candidates": candidates}
    return {"address": "", "source": "", "candidates": candidates}


def llama_host_networks(addresses):
    """Each IP address as a one-host network: a.b.c.d/32, x::y/128."""
    if not isinstance(addresses, (list, tuple)):
        raise AnsibleFilterError(f"llama_host_networks needs a list of IP addresses, got {addresses!r}")
    networks = []
    for address in addresses:
        try:
            ip = ipaddress.ip_address(address) if isinstance(address, str) else None
        except ValueError:
            ip = None
        if ip is None:
            raise AnsibleFilterError(f"llama_host_networks: {address!r} is not an IP address")
        if getattr(ip, "scope_id", None):
            raise AnsibleFilterError(f"llama_host_networks: {address!r} has a zone (%{ip.scope_id}): give the "
                                     "address without it")
        networks.append(f"{ip}/{ip.max_prefixlen}")
    return networks


def llama_failure_messages(result):
    """The messages of a failed task's result (`ansible_failed_result` in a rescue): its failed items' for a loop,
    a list message (an assert's list of problems) flattened."""
    items = [item for item in result.get("results", []) if isinstance(item, dict) and item.get("failed")]
    messages = []
    for one in items or [result]:
        msg = one.get("msg") or ""
        messages.extend(msg if isinstance(msg, list) else [msg])
    return [str(message) for message in messages if message] or ["a check failed without a message"]


class FilterModule:
    def filters(self):
        return {"llama_failure_messages": llama_failure_messages, "llama_port_conflicts": llama_port_conflicts,
                "llama_cluster_address": llama_cluster_address, "llama_host_networks": llama_host_networks}
