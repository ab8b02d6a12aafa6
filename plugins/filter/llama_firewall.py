"""Filters that turn the cluster's firewall rules into each backend's terms: nftables statements, firewalld
rich rules, ufw rules.

A rule is `{name, proto, port, sources}`: `proto` tcp or udp, `port` 1-65535, `sources` IP addresses or
networks admitted to that port. Non-empty `sources`: the port is admitted from them and dropped for everyone
else; empty: admitted from anywhere.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping

from ansible.errors import AnsibleFilterError

# Each filter is documented in its sidecar file, plugins/filter/<name>.yml (ansible-doc -t filter <name>).

# Who made a rule, on every rule the role makes where the backend keeps a comment (nftables, ufw).
COMMENT = "llama.cpp cluster"
# firewalld rich rules with a negative priority run before the zone's other rules (services, ports, rich
# rules of priority 0): the cluster's ports are decided here, admit before drop, whatever else is open.
PRIORITY_ADMIT = -2
PRIORITY_DROP = -1
PROTOCOLS = ("tcp", "udp")


def _network(source):
    """`source` as an address (a single host) or a network in CIDR, or None when it is neither."""
    if not isinstance(source, str) or "%" in source:
        return None
    try:
        network = ipaddress.ip_network(source.strip(), strict=False)
    except ValueError:
        return None
    return network


def _source(network):
    return str(network.network_address) if network.prefixlen == network.max_prefixlen else str(network)


def _rules(rules, filter_name):
    """The rules checked, their sources parsed: [(rule, [IPv4 sources], [IPv6 sources])]."""
    if not isinstance(rules, (list, tuple)):
        raise AnsibleFilterError(f"{filter_name}: expected a list of {{name, proto, port, sources}}, got {rules!r}")
    checked = []
    for index, rule in enumerate(rules):
        where = f"{filter_name}: rules[{index}]"
        if not isinstance(rule, Mapping):
            raise AnsibleFilterError(f"{where} must be a dict {{name, proto, port, sources}}, got {rule!r}")
        if not isinstance(rule.get("name"), str) or not rule["name"] or '"' in rule["name"] or "'" in rule["name"]:
            raise AnsibleFilterError(f"{where}.name must be a non-empty text without quotes, got {rule.get('name')!r}")
        if rule.get("proto") not in PROTOCOLS:
            raise AnsibleFilterError(f"{where}.proto must be one of {', '.join(PROTOCOLS)}, got {rule.get('proto')!r}")
        try:
            port = int(rule.get("port"))
        except (TypeError, ValueError):
            port = 0
        if not 1 <= port <= 65535 or isinstance(rule.get("port"), bool):
            raise AnsibleFilterError(f"{where}.port must be a port number 1-65535, got {rule.get('port')!r}")
        sources = rule.get("sources")
        if not isinstance(sources, (list, tuple)):
            raise AnsibleFilterError(f"{where}.sources must be a list of addresses or networks, got {sources!r}")
        bad = llama_firewall_invalid_sources(sources)
        if bad:
            raise AnsibleFilterError(f"{where}.sources: {', '.join(map(repr, bad))} is not an IP address or network")
        networks = [_network(source) for source in sources]
        ipv4 = list(dict.fromkeys(_source(n) for n in networks if n.version == 4))
        ipv6 = list(dict.fromkeys(_source(n) for n in networks if n.version == 6))
        checked.append(({"name": rule["name"], "proto": rule["proto"], "port": port}, ipv4, ipv6))
    return checked


def llama_firewall_invalid_sources(sources):
    """The entries of `sources` that are not an IP address or network (CIDR), in order."""
    if not isinstance(sources, (list, tuple)):
        raise AnsibleFilterError(f"llama_firewall_invalid_sources: expected a list, got {sources!r}")
    return [source for source in sources if _network(source) is None]


def llama_firewall_nft(rules):
    """nftables statements for the cluster's input chain, in order: admit from the sources, then drop."""
    statements = []
    for rule, ipv4, ipv6 in _rules(rules, "llama_firewall_nft"):
        match = f"{rule['proto']} dport {rule['port']}"
        note = f'comment "{COMMENT}: {rule["name"]}'
        if not ipv4 and not ipv6:
            statements.append(f'{match} accept {note}"')
            continue
        for family, sources in (("ip", ipv4), ("ip6", ipv6)):
            if sources:
                allowed = sources[0] if len(sources) == 1 else "{ " + ", ".join(sources) + " }"
                statements.append(f'{family} saddr {allowed} {match} accept {note} from its sources"')
        statements.append(f'{match} drop {note} from anyone else"')
    return statements


def llama_firewall_rich_rules(rules):
    """firewalld rich rules, in firewalld's own normalised spelling (what `--list-rich-rules` prints)."""
    rich = []
    for rule, ipv4, ipv6 in _rules(rules, "llama_firewall_rich_rules"):
        port = f'port port="{rule["port"]}" protocol="{rule["proto"]}"'
        admit = f'rule priority="{PRIORITY_ADMIT}"'
        if not ipv4 and not ipv6:
            rich.append(f"{admit} {port} accept")
            continue
        for family, sources in (("ipv4", ipv4), ("ipv6", ipv6)):
            rich.extend(f'{admit} family="{family}" source address="{source}" {port} accept' for source in sources)
        rich.append(f'rule priority="{PRIORITY_DROP}" {port} drop')
    return rich


def llama_firewall_ufw(rules):
    """community.general.ufw arguments, in the order to add them: allow from each source, then deny the rest."""
    result = []
    for rule, ipv4, ipv6 in _rules(rules, "llama_firewall_ufw"):
        common = {"proto": rule["proto"], "to_port": str(rule["port"]), "comment": f"{COMMENT}: {rule['name']}"}
        sources = ipv4 + ipv6
        if not sources:
            result.append({"rule": "allow", **common})
            continue
        result.extend({"rule": "allow", "from_ip": source, **common} for source in sources)
        result.append({"rule": "deny", **common})
    return result


class FilterModule:
    def filters(self):
        return {
            "llama_firewall_invalid_sources": llama_firewall_invalid_sources,
            "llama_firewall_nft": llama_firewall_nft,
            "llama_firewall_rich_rules": llama_firewall_rich_rules,
            "llama_firewall_ufw": llama_firewall_ufw,
        }
