"""The link measurement's filters: iperf3's JSON and the round-trip probe as rows, verdicts and a table."""

import json

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.llamacpp.rpc_cluster.plugins.filter import llama_link
from ansible_collections.llamacpp.rpc_cluster.plugins.filter.llama_link import llama_link_rows, llama_link_table

# Trimmed from `iperf3 --client … --json -t 2` (iperf 3.12) between two containers.
IPERF3 = json.dumps({
    "start": {"version": "iperf 3.12", "connecting_to": {"host": "172.19.0.3", "port": 5201}},
    "intervals": [],
    "end": {
        "streams": [{"sender": {"bits_per_second": 16474212524.6, "min_rtt": 50, "mean_rtt": 58, "sender": True}}],
        "sum_sent": {"seconds": 2.000314, "bytes": 4119199744, "bits_per_second": 16474212524.6, "retransmits": 461},
        "sum_received": {"seconds": 2.000401, "bytes": 4119199744, "bits_per_second": 16473496040.0},
    },
})
REFUSED = json.dumps({"start": {"connected": []}, "intervals": [], "end": {},
                      "error": "unable to connect to server: Connection refused"})


def gbit(value):
    """iperf3's JSON with `value` Gbit/s received."""
    result = json.loads(IPERF3)
    result["end"]["sum_received"]["bits_per_second"] = value * 1e9
    return json.dumps(result)


def rtt(ms):
    return json.dumps({"rtt_ms": ms, "error": None})


def measured(worker="worker1", iperf3=IPERF3, probe=rtt(0.05), server_error=""):
    return {"worker": worker, "address": "172.19.0.3", "port": 5201, "server_error": server_error,
            "iperf3": iperf3, "rtt": probe}


def test_a_fast_link_is_ok():
    assert llama_link_rows([measured()], 10, 1.0) == [
        {"worker": "worker1", "address": "172.19.0.3", "rtt_ms": 0.05, "gbits": pytest.approx(16.4735),
         "verdict": "ok", "warnings": []}]


def test_a_slow_link_warns_with_its_load_time_cost():
    [row] = llama_link_rows([measured(iperf3=gbit(1.0))], 10, 1.0)
    assert row["verdict"] == "below 10 Gbit/s"
    [warning] = row["warnings"]
    assert warning.startswith("worker1 (172.19.0.3): 1.00 Gbit/s from the master, below llama_link_min_gbits 10.")
    # 10 GiB at 1 Gbit/s: 86 s (LLAMACPP.md: 100 GiB take >= 14 min at 1 Gb/s).
    assert "every 10 GiB of weights this worker holds take at least 86 s" in warning


def test_a_long_round_trip_warns_with_its_decode_cost():
    [row] = llama_link_rows([measured(probe=rtt(2.5))], 10, 1.0)
    assert row["verdict"] == "RTT above 1 ms"
    assert row["warnings"][0].startswith("worker1 (172.19.0.3): round trip 2.500 ms, above llama_link_max_rtt_ms 1.")
    assert "decode speed" in row["warnings"][0]


def test_both_thresholds_missed():
    [row] = llama_link_rows([measured(iperf3=gbit(0.5), probe=rtt(3))], 100000, 0.5)
    assert row["verdict"] == "below 100000 Gbit/s, RTT above 0.5 ms"
    assert len(row["warnings"]) == 2


def test_thresholds_may_come_as_strings():
    """-e llama_link_min_gbits=100000 arrives as a string."""
    assert llama_link_rows([measured()], "100000", "1.0")[0]["verdict"] == "below 100000 Gbit/s"


def test_an_iperf3_error_is_not_measured():
    [row] = llama_link_rows([measured(iperf3=REFUSED)], 10, 1.0)
    assert (row["gbits"], row["rtt_ms"], row["verdict"]) == (None, 0.05, "not measured")
    assert "throughput not measured: iperf3: unable to connect to server: Connection refused." in row["warnings"][0]
    assert "172.19.0.3:5201/tcp" in row["warnings"][0]


def test_a_server_that_did_not_start_is_not_measured():
    [row] = llama_link_rows([measured(iperf3="", probe="", server_error="port 5201 is in use by sshd")], 10, 1.0)
    assert (row["gbits"], row["rtt_ms"], row["verdict"]) == (None, None, "not measured")
    assert row["warnings"] == ["worker1 (172.19.0.3): not measured: the iperf3 server did not start on port 5201: "
                               "port 5201 is in use by sshd. Set llama_link_port to a free port."]


@pytest.mark.parametrize(("output", "message"), [
    ("", "iperf3 printed nothing"),
    ("iperf3: error - boom", "iperf3 printed no JSON: 'iperf3: error - boom'"),
    ("[1]", "iperf3 printed list, not a JSON object"),
    ('{"end": {}}', "iperf3's JSON has no end.sum_received.bits_per_second"),
    (gbit(0), "iperf3: no data reached the worker"),
])
def test_unreadable_iperf3_output_is_not_measured(output, message):
    [row] = llama_link_rows([measured(iperf3=output)], 10, 1.0)
    assert row["verdict"] == "not measured"
    assert f"throughput not measured: {message}." in row["warnings"][0]


@pytest.mark.parametrize(("probe", "message"), [
    ("", "the round-trip probe printed nothing"),
    (json.dumps({"rtt_ms": None, "error": "no answer from 172.19.0.3:5201 within 1 s"}),
     "no answer from 172.19.0.3:5201 within 1 s"),
    ("{}", "the round-trip probe's JSON has no rtt_ms"),
])
def test_a_failed_round_trip_probe_is_reported(probe, message):
    [row] = llama_link_rows([measured(probe=probe)], 10, 1.0)
    assert (row["rtt_ms"], row["verdict"]) == (None, "RTT not measured")
    assert row["warnings"] == [f"worker1 (172.19.0.3): round trip not measured: {message}."]


@pytest.mark.parametrize(("arguments", "message"), [
    (("nope", 10, 1), r"llama_link_rows needs a list of measurements, got 'nope'"),
    (([{"worker": "w"}], 10, 1), r"measurements\[0\] must be a dict with worker, address, port"),
    (([], "fast", 1), r"min_gbits must be a number >= 0, got 'fast'"),
    (([], 10, -1), r"max_rtt_ms must be a number >= 0, got -1"),
])
def test_bad_arguments_are_named(arguments, message):
    with pytest.raises(AnsibleFilterError, match=message):
        llama_link_rows(*arguments)


def test_table():
    rows = llama_link_rows([measured(), measured("worker-long-name", iperf3=REFUSED, probe="")], 10, 1.0)
    assert llama_link_table(rows) == [
        "worker            address            RTT ms    Gbit/s  verdict",
        "worker1           172.19.0.3          0.050     16.47  ok",
        "worker-long-name  172.19.0.3              -         -  not measured, RTT not measured",
    ]
    assert llama_link_table([]) == ["worker  address            RTT ms    Gbit/s  verdict"]
    with pytest.raises(AnsibleFilterError, match="needs the rows of llama_link_rows"):
        llama_link_table(None)


def test_filters_are_registered():  # their documentation: test_filter_docs.py
    filters = llama_link.FilterModule().filters()
    assert filters == {"llama_link_rows": llama_link_rows, "llama_link_table": llama_link_table}
