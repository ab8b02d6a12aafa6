"""The cluster's firewall rules in each backend's terms (plugins/filter/llama_firewall.py)."""


from ansible_collections.llamacpp.rpc_cluster.plugins.filter import llama_firewall
import pytest
from ansible.errors import AnsibleFilterError
from ansible_collections.llamacpp.rpc_cluster.plugins.filter.llama_firewall import (
    llama_firewall_invalid_sources,
    llama_firewall_nft,
    llama_firewall_rich_rules,
    llama_firewall_ufw,
)

RPC = {"name": "RPC", "proto": "tcp", "port": 50052, "sources": ["10.0.0.1"]}
API = {"name": "API", "proto": "tcp", "port": "8080", "sources": []}
NTP = {"name": "NTP", "proto": "udp", "port": 123, "sources": ["10.0.0.2", "10.0.0.3", "fd00::7", "10.0.0.2"]}
RENDER = [llama_firewall_nft, llama_firewall_rich_rules, llama_firewall_ufw]


def test_nft_admits_the_sources_then_drops_the_port():
    assert llama_firewall_nft([RPC, API, NTP]) == [
        'ip saddr 10.0.0.1 tcp dport 50052 accept comment "llama.cpp cluster: RPC from its sources"',
        'tcp dport 50052 drop comment "llama.cpp cluster: RPC from anyone else"',
        'tcp dport 8080 accept comment "llama.cpp cluster: API"',
        'ip saddr { 10.0.0.2, 10.0.0.3 } udp dport 123 accept comment "llama.cpp cluster: NTP from its sources"',
        'ip6 saddr fd00::7 udp dport 123 accept comment "llama.cpp cluster: NTP from its sources"',
        'udp dport 123 drop comment "llama.cpp cluster: NTP from anyone else"',
    ]


def test_rich_rules_admit_before_they_drop_in_firewalld_spelling():
    assert llama_firewall_rich_rules([RPC, API, NTP]) == [
        'rule priority="-2" family="ipv4" source address="10.0.0.1" port port="50052" protocol="tcp" accept',
        'rule priority="-1" port port="50052" protocol="tcp" drop',
        'rule priority="-2" port port="8080" protocol="tcp" accept',
        'rule priority="-2" family="ipv4" source address="10.0.0.2" port port="123" protocol="udp" accept',
        'rule priority="-2" family="ipv4" source address="10.0.0.3" port port="123" protocol="udp" accept',
        'rule priority="-2" family="ipv6" source address="fd00::7" port port="123" protocol="udp" accept',
        'rule priority="-1" port port="123" protocol="udp" drop',
    ]


def test_ufw_allows_each_source_then_denies_the_port():
    comment = "llama.cpp cluster: RPC"
    assert llama_firewall_ufw([RPC, API]) == [
        {"rule": "allow", "from_ip": "10.0.0.1", "proto": "tcp", "to_port": "50052", "comment": comment},
        {"rule": "deny", "proto": "tcp", "to_port": "50052", "comment": comment},
        {"rule": "allow", "proto": "tcp", "to_port": "8080", "comment": "llama.cpp cluster: API"},
    ]


def test_networks_are_normalised():
    rule = dict(RPC, sources=["10.0.0.5/24", "10.0.1.7/32", "FD00::1/64"])
    assert llama_firewall_nft([rule])[:2] == [
        'ip saddr { 10.0.0.0/24, 10.0.1.7 } tcp dport 50052 accept comment "llama.cpp cluster: RPC from its sources"',
        'ip6 saddr fd00::/64 tcp dport 50052 accept comment "llama.cpp cluster: RPC from its sources"',
    ]


def test_no_rules_no_statements():
    assert [render([]) for render in RENDER] == [[], [], []]


def test_invalid_sources_are_listed_in_order():
    assert llama_firewall_invalid_sources(["10.0.0.1", "anywhere", "10.0.0.0/33", "fe80::1%eth0", 5, "::/0"]) == [
        "anywhere", "10.0.0.0/33", "fe80::1%eth0", 5]
    assert llama_firewall_invalid_sources([]) == []


@pytest.mark.parametrize(("rules", "message"), [
    ("RPC", r"expected a list of \{name, proto, port, sources\}, got 'RPC'"),
    (["RPC"], r"rules\[0\] must be a dict"),
    ([dict(RPC, name="")], r"rules\[0\]\.name must be a non-empty text without quotes, got ''"),
    ([dict(RPC, name='a "b"')], r"rules\[0\]\.name must be a non-empty text without quotes"),
    ([API, dict(RPC, proto="icmp")], r"rules\[1\]\.proto must be one of tcp, udp, got 'icmp'"),
    ([dict(RPC, port=0)], r"rules\[0\]\.port must be a port number 1-65535, got 0"),
    ([dict(RPC, port="http")], r"rules\[0\]\.port must be a port number 1-65535, got 'http'"),
    ([dict(RPC, port=True)], r"rules\[0\]\.port must be a port number 1-65535, got True"),
    ([dict(RPC, sources="10.0.0.1")], r"rules\[0\]\.sources must be a list of addresses or networks"),
    ([dict(RPC, sources=["10.0.0.1", "master"])], r"rules\[0\]\.sources: 'master' is not an IP address or network"),
])
@pytest.mark.parametrize("render", RENDER)
def test_bad_rules_name_the_field(render, rules, message):
    with pytest.raises(AnsibleFilterError, match=f"^{render.__name__}: {message}"):
        render(rules)


def test_filters_are_registered():  # their documentation: test_filter_docs.py
    filters = llama_firewall.FilterModule().filters()
    names = ["llama_firewall_invalid_sources", "llama_firewall_nft", "llama_firewall_rich_rules", "llama_firewall_ufw"]
    assert filters == {name: getattr(llama_firewall, name) for name in names}
