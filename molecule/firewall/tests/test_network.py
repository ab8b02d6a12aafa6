"""playbooks/network.yml and the preflight's link check (role llama_link) through each firewall the workers may
run, as the converge left them: worker_nft the cluster's own nftables table, worker_fwd firewalld and worker_ufw
ufw, both denying incoming connections by default. A table with each worker's round trip and throughput,
warnings below the thresholds, nothing left behind, no change on a re-run, a switch to skip it.

Three runs at the same time (one measures, two do not): network.yml with thresholds above any link, while
worker_ufw's ufw already admits the master on the port by a rule of its own; preflight.yml with the check off
(this scenario's setting); network.yml in check mode. Then preflight.yml with the check on, which measures.
"""

import re
from concurrent.futures import ThreadPoolExecutor

import pytest
from cluster_helpers import address, link_rows as rows, plays, recap, run_playbook
from conftest import WORKERS

PORT = 5201
MEASURING = "Send iperf3 traffic to"


def run(playbook, *args):
    result = run_playbook(playbook, *args)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    return output


def tasks(output):
    return [task for play_tasks in plays(output).values() for task in play_tasks]


def firewall_rules(hosts):
    """Each worker's rules: the cluster's nftables table, firewalld's rich rules and ports (runtime), ufw's rules."""
    return (hosts["worker_nft"].check_output("nft list table inet llama_cluster"),
            hosts["worker_fwd"].check_output("firewall-cmd --list-rich-rules; firewall-cmd --list-ports"),
            hosts["worker_ufw"].check_output("ufw show added"))


def accepted(host, master):
    """How many tests the worker's iperf3 servers accepted from the master (their journal)."""
    log = host.check_output("journalctl --unit=llama-link-iperf3.service --output=cat --no-pager")
    return log.count(f"Accepted connection from {master},")


@pytest.fixture(scope="module")
def hosts(master, workers):
    """The master and the workers (conftest's fixtures), by name."""
    return {"master": master, **workers}


@pytest.fixture(scope="module")
def before(hosts):
    """The firewall rules and accepted tests as the converge left them, before the runs below."""
    master = address(hosts["master"])
    return {"rules": firewall_rules(hosts), "accepted": {name: accepted(hosts[name], master) for name in WORKERS}}


@pytest.fixture(scope="module")
def runs(hosts, before):
    master = address(hosts["master"])
    own_rule = f"allow from {master} to {address(hosts['worker_ufw'])} port {PORT} proto tcp"
    hosts["worker_ufw"].check_output(f"ufw {own_rule}")
    commands = {"raised": ("playbooks/network.yml",
                           "-e", "llama_link_min_gbits=100000", "-e", "llama_link_max_rtt_ms=0"),
                "off": ("playbooks/preflight.yml", "-e", "llama_link_check=false"),
                "check": ("playbooks/network.yml", "--check")}
    try:
        with ThreadPoolExecutor(len(commands)) as pool:
            futures = {name: pool.submit(run, *command) for name, command in commands.items()}
        outputs = {name: future.result() for name, future in futures.items()}
        outputs["rules"] = firewall_rules(hosts)
    finally:
        hosts["worker_ufw"].run(f"ufw delete {own_rule}")
    outputs["own rule"] = f"ufw {own_rule}"
    outputs["accepted"] = {name: accepted(hosts[name], master) for name in WORKERS}
    # The preflight's own link check (the last of its checks), once nothing else measures.
    outputs["on"] = run("playbooks/preflight.yml", "-e", "llama_link_check=true")
    return outputs


def test_each_measurement_went_through_the_workers_firewall(runs, before):
    """Each worker's iperf3 server accepted the master's test through its firewall, which admitted no such port
    before: the measurement admitted the master for its duration."""
    for name in WORKERS:
        assert runs["accepted"][name] > before["accepted"][name], (name, before["accepted"], runs["accepted"])
    assert str(PORT) not in "".join(before["rules"])


def test_each_worker_is_measured_from_the_master(runs, hosts):
    for run_name in ("raised", "on"):
        table = rows(runs[run_name])
        assert sorted(table) == sorted(WORKERS), (run_name, runs[run_name][-3000:])
        for name in WORKERS:
            row = table[name]
            assert row["address"] == address(hosts[name])
            assert float(row["rtt"]) > 0 and float(row["gbits"]) > 0, (run_name, row)


def test_links_below_the_thresholds_warn_without_failing(runs):
    table = rows(runs["raised"])
    for name in WORKERS:
        assert table[name]["verdict"] == "below 100000 Gbit/s, RTT above 0 ms", table[name]
    text = " ".join(runs["raised"].split())
    assert "WARNING: links below the thresholds (not fatal)" in text
    for name in WORKERS:
        assert re.search(rf"{name} \([\d.]+\): [\d.]+ Gbit/s from the master, below llama_link_min_gbits 100000\. "
                         r"It costs model load time: every 10 GiB of weights", text), text[-3000:]
        assert re.search(rf"{name} \([\d.]+\): round trip [\d.]+ ms, above llama_link_max_rtt_ms 0\. It costs "
                         "decode speed", text), text[-3000:]


def test_a_rerun_changes_nothing(runs):
    """The first measurement installed iperf3 where it was missing; the next one changes nothing."""
    assert all(counts["changed"] == 0 for counts in recap(runs["on"]).values()), runs["on"][-3000:]


def test_network_yml_measures_once(runs):
    """Its own preflight skips the link check: the next play measures."""
    assert tasks(runs["raised"]).count(f"llama_link : {MEASURING} {WORKERS[0]}") == 1


def test_a_rule_the_host_had_is_kept(runs):
    assert runs["rules"][2].count(runs["own rule"]) == 1


def test_nothing_is_left_behind(hosts, before, runs):
    """No iperf3 server, transient unit or firewall opening on any host; iperf3's own service never started."""
    for name, host in hosts.items():
        assert not host.process.filter(comm="iperf3"), name
        assert host.check_output("systemctl list-units --all --plain --no-legend 'llama-link*'") == "", name
        assert not host.file("/run/llama-link-firewall").exists, name
        assert not host.service("iperf3").is_enabled and not host.service("iperf3").is_running, name
    assert firewall_rules(hosts) == before["rules"]


def test_the_preflight_check_can_be_switched_off(runs):
    assert "Link check off (llama_link_check: false)" in runs["off"]
    assert not any(MEASURING in task for task in tasks(runs["off"]))
    assert not rows(runs["off"])


def test_check_mode_measures_nothing(runs):
    output = runs["check"]
    assert "Link check skipped in check mode" in " ".join(output.split())
    assert not any(MEASURING in task for task in tasks(output))
    assert all(counts["changed"] == 0 for counts in recap(output).values()), output[-3000:]
