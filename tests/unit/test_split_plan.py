"""Unit tests of the llama_split_plan filter, against an independent model of llama.cpp's placement."""

import bisect
import copy
import itertools
import math
from pathlib import Path

import numpy
import pytest
import yaml
from ansible.errors import AnsibleFilterError
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from ansible_collections.llamacpp.rpc_cluster.plugins.filter import llama_split
from ansible_collections.llamacpp.rpc_cluster.plugins.filter.llama_split import SplitError, llama_split_given, llama_split_plan, llamacpp_layer_assignment

MIB = 1024 * 1024
GIB_MIB = 1024
F32 = numpy.float32


def assign(n_layer, ngl, ts):
    """LLAMACPP.md's transcription of llama-model.cpp's layer assignment, in numpy float32 like llama.cpp
    (kept independent of the plugin)."""
    c = numpy.cumsum(numpy.array(ts, dtype=F32), dtype=F32)
    c = c / c[-1]
    act = min(ngl, n_layer + 1)
    st_ = n_layer + 1 - act
    return [None if il < st_ else bisect.bisect_right(c, F32(il - st_) / F32(act)) for il in range(n_layer + 1)]


def ranges_from_assignment(assignment):
    """{device index: [first, last_exclusive]}, asserting every device's layers are contiguous."""
    ranges = {}
    for il, device in enumerate(assignment):
        if device in ranges:
            assert ranges[device][1] == il, f"device {device} has non-contiguous layers"
            ranges[device][1] = il + 1
        else:
            ranges[device] = [il, il + 1]
    return ranges


def layer_costs(model, ctx_size):
    n_layer = model["n_layer"]
    weights = _per_layer(model["layer_bytes"], n_layer) + [model["output_bytes"]]
    kv = _per_layer(model["kv_bytes_per_token"], n_layer) + [0]
    return weights, [w + k * ctx_size for w, k in zip(weights, kv)]


def _per_layer(value, n_layer):
    return list(value) if isinstance(value, list) else [value] * n_layer


def budgets_of(devices, reserve_fraction):
    return [int(d["memory_mib"] * MIB * (1 - reserve_fraction)) for d in devices]


def fits_somehow(costs, budgets):
    """Whether any contiguous in-order split fits: reachable layer boundaries, device by device."""
    reachable = {0}
    for budget in budgets:
        extended = set(reachable)
        for first in reachable:
            total = 0
            for end in range(first + 1, len(costs) + 1):
                total += costs[end - 1]
                if total > budget:
                    break
                extended.add(end)
        reachable = extended
    return len(costs) in reachable


def estimated_time(plan, weights, devices):
    speed = {d["name"]: d.get("speed", 1.0) for d in devices}
    return sum(sum(weights[first:end]) / speed[name] for name, (first, end) in zip(plan["devices"], plan["layers"]))


def check_plan(plan, devices, model, ctx_size, reserve_fraction):
    """Every promise of the contract, checked from first principles."""
    n_layer = model["n_layer"]
    _, costs = layer_costs(model, ctx_size)
    names = [d["name"] for d in devices]
    budget = dict(zip(names, budgets_of(devices, reserve_fraction)))
    assert plan["fits"] is True
    assert sum(plan["tensor_split"]) == n_layer + 1
    assert all(count > 0 for count in plan["tensor_split"])
    assert len(plan["devices"]) == len(plan["tensor_split"]) == len(plan["layers"]) == len(plan["bytes"])
    assert [names.index(name) for name in plan["devices"]] == sorted(names.index(name) for name in plan["devices"])
    assignment = assign(n_layer, n_layer + 1, plan["tensor_split"])
    assert assignment == llamacpp_layer_assignment(n_layer, n_layer + 1, plan["tensor_split"])
    ranges = ranges_from_assignment(assignment)
    assert [ranges[index] for index in range(len(plan["devices"]))] == plan["layers"]
    for name, (first, end), size, budget_bytes in zip(plan["devices"], plan["layers"], plan["bytes"],
                                                      plan["budget_bytes"]):
        assert end - first == plan["tensor_split"][plan["devices"].index(name)]
        assert size == sum(costs[first:end])
        assert budget_bytes == budget[name]
        assert size <= budget_bytes


@st.composite
def clusters(draw, max_devices=8, max_layers=120):
    """Random devices and a model sized between well within and well beyond their memory."""
    devices = [
        {"name": f"RPC{index}", "memory_mib": draw(st.integers(GIB_MIB, 96 * GIB_MIB)),
         "speed": draw(st.floats(0.2, 5.0))}
        for index in range(draw(st.integers(1, max_devices)))
    ]
    n_layer = draw(st.integers(1, max_layers))
    uniform = draw(st.booleans())
    shape = [draw(st.integers(1, 1000))] * (n_layer + 1) if uniform else \
        draw(st.lists(st.integers(1, 1000), min_size=n_layer + 1, max_size=n_layer + 1))
    ctx_size = draw(st.sampled_from([1, 512, 4096, 32768]))
    reserve_fraction = draw(st.sampled_from([0.0, 0.15, 0.5]))
    fill = draw(st.floats(0.3, 1.3))
    kv_share = draw(st.sampled_from([0.0, 0.1, 0.4]))
    scale = fill * sum(budgets_of(devices, reserve_fraction)) / sum(shape)
    weights = [max(1, int(s * scale * (1 - kv_share))) for s in shape]
    kv = [int(s * scale * kv_share / ctx_size) for s in shape[:-1]]
    model = {
        "n_layer": n_layer,
        "layer_bytes": weights[0] if uniform else weights[:-1],
        "output_bytes": draw(st.sampled_from([weights[-1], 0])),
        "kv_bytes_per_token": kv[0] if uniform and n_layer else kv,
    }
    return devices, model, ctx_size, reserve_fraction


def _plan_or_error(devices, model, ctx_size, reserve_fraction, strategy):
    try:
        return llama_split_plan(devices, model, ctx_size=ctx_size, reserve_fraction=reserve_fraction,
                                strategy=strategy)
    except AnsibleFilterError as err:
        return err


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(clusters())
def test_plans_keep_every_promise(cluster):
    devices, model, ctx_size, reserve_fraction = cluster
    weights, costs = layer_costs(model, ctx_size)
    feasible = fits_somehow(costs, budgets_of(devices, reserve_fraction))
    memory = _plan_or_error(devices, model, ctx_size, reserve_fraction, "memory")
    speed = _plan_or_error(devices, model, ctx_size, reserve_fraction, "speed")
    event("fits" if feasible else "does not fit")
    if not feasible:
        assert isinstance(memory, AnsibleFilterError) and isinstance(speed, AnsibleFilterError)
        assert "short by" in str(memory)
        return
    assert isinstance(memory, dict), f"memory raised on a model that fits: {memory}"
    assert isinstance(speed, dict), f"speed raised on a model that fits: {speed}"
    for plan in (memory, speed):
        check_plan(plan, devices, model, ctx_size, reserve_fraction)
    assert estimated_time(speed, weights, devices) <= estimated_time(memory, weights, devices) * (1 + 1e-9)


def _compositions(total, parts):
    """All ways to give `parts` devices non-negative layer counts summing to `total`."""
    for cuts in itertools.combinations_with_replacement(range(total + 1), parts - 1):
        bounds = (0, *cuts, total)
        yield [b - a for a, b in zip(bounds, bounds[1:])]


@settings(max_examples=100, deadline=None)
@given(clusters(max_devices=3, max_layers=7))
def test_speed_is_optimal_on_small_clusters(cluster):
    """Against every contiguous in-order split, the speed plan has the least estimated time."""
    devices, model, ctx_size, reserve_fraction = cluster
    weights, costs = layer_costs(model, ctx_size)
    budgets = budgets_of(devices, reserve_fraction)
    best = math.inf
    for counts in _compositions(len(costs), len(devices)):
        ends = list(itertools.accumulate(counts))
        spans = [(end - count, end) for end, count in zip(ends, counts)]
        if all(sum(costs[a:b]) <= budget for (a, b), budget in zip(spans, budgets)):
            best = min(best, sum(sum(weights[a:b]) / d["speed"] for (a, b), d in zip(spans, devices)))
    plan = _plan_or_error(devices, model, ctx_size, reserve_fraction, "speed")
    if best == math.inf:
        assert isinstance(plan, AnsibleFilterError)
    else:
        assert estimated_time(plan, weights, devices) <= best * (1 + 1e-9)


def _equal_layers(n_layer, layer_mib, kv_bytes_per_token=0):
    return {"n_layer": n_layer, "layer_bytes": layer_mib * MIB, "output_bytes": layer_mib * MIB,
            "kv_bytes_per_token": kv_bytes_per_token}


def _devices(*memory_gib, speeds=None):
    speeds = speeds or [1.0] * len(memory_gib)
    return [{"name": f"RPC{index}", "memory_mib": gib * GIB_MIB, "speed": speed}
            for index, (gib, speed) in enumerate(zip(memory_gib, speeds))]


def test_24_12_12_gib_split_about_2_1_1():
    devices = _devices(24, 12, 12)
    model = _equal_layers(32, 1100)  # 33 × 1100 MiB ≈ 35.4 GiB of 40.8 GiB of budgets
    plan = llama_split_plan(devices, model)
    check_plan(plan, devices, model, 4096, 0.15)
    assert plan["devices"] == ["RPC0", "RPC1", "RPC2"]
    assert plan["tensor_split"] == [17, 8, 8]
    assert plan["layers"] == [[0, 17], [17, 25], [25, 33]]
    assert plan["strategy"] == "memory"


@pytest.mark.parametrize("n_layer, expected", [(31, [16, 16]), (32, [17, 16]), (79, [40, 40])])
def test_two_equal_devices_split_evenly(n_layer, expected):
    devices = _devices(16, 16)
    plan = llama_split_plan(devices, _equal_layers(n_layer, 100))
    assert plan["tensor_split"] == expected


def test_small_model_is_still_spread_in_proportion():
    plan = llama_split_plan(_devices(24, 12, 12), _equal_layers(32, 10))
    assert plan["tensor_split"] == [17, 8, 8]


def test_proportional_split_is_moved_only_as_far_as_budgets_require():
    # In proportion RPC0 would end after layer 1 (2200 MiB > its 2048 MiB): one layer moves to RPC1.
    model = {"n_layer": 6, "layer_bytes": [mib * MIB for mib in (1000, 1200, 1000, 1000, 1200, 1200)],
             "output_bytes": 2000 * MIB, "kv_bytes_per_token": 0}
    devices = [{"name": "RPC0", "memory_mib": 2048}, {"name": "RPC1", "memory_mib": 7680}]
    plan = llama_split_plan(devices, model, reserve_fraction=0)
    assert plan["tensor_split"] == [1, 6]
    assert plan["bytes"] == [1000 * MIB, 7600 * MIB]


def test_heavy_output_layer_counts_in_bytes():
    model = {"n_layer": 8, "layer_bytes": 100 * MIB, "output_bytes": 800 * MIB, "kv_bytes_per_token": 0}
    plan = llama_split_plan(_devices(8, 8), model)
    assert plan["bytes"][0] == plan["bytes"][1] == 800 * MIB
    assert plan["tensor_split"] == [8, 1]


def test_kv_cache_counts_per_layer_and_not_for_the_output():
    model = {"n_layer": 2, "layer_bytes": [MIB, 2 * MIB], "output_bytes": 3 * MIB, "kv_bytes_per_token": [256, 512]}
    plan = llama_split_plan(_devices(1), model, ctx_size=4096, reserve_fraction=0)
    assert plan["bytes"] == [MIB + 2 * MIB + 3 * MIB + (256 + 512) * 4096]
    assert plan["budget_bytes"] == [1024 * MIB]


def test_device_too_small_for_any_layer_is_left_out():
    devices = [{"name": "CUDA0", "memory_mib": 8192}, {"name": "RPC0", "memory_mib": 100},
               {"name": "RPC1", "memory_mib": 8192}]
    plan = llama_split_plan(devices, _equal_layers(10, 500))
    check_plan(plan, devices, _equal_layers(10, 500), 4096, 0.15)
    assert plan["devices"] == ["CUDA0", "RPC1"]


def test_speed_puts_layers_on_the_fast_device():
    devices = _devices(24, 24, speeds=[1.0, 4.0])
    model = _equal_layers(32, 500)
    memory = llama_split_plan(devices, model)
    speed = llama_split_plan(devices, model, strategy="speed")
    assert memory["tensor_split"] == [17, 16]
    assert speed["devices"] == ["RPC1"] and speed["tensor_split"] == [33]
    assert speed["strategy"] == "speed"


def test_speed_with_equal_speeds_keeps_the_memory_split():
    devices = _devices(24, 12, 12)
    model = _equal_layers(32, 300)
    assert llama_split_plan(devices, model, strategy="speed")["tensor_split"] == \
        llama_split_plan(devices, model)["tensor_split"]


def test_ansible_style_floats_and_missing_speed_are_accepted():
    devices = [{"name": "RPC0", "memory_mib": 4096}, {"name": "RPC1", "memory_mib": 4096, "speed": 2}]
    plan = llama_split_plan(devices, _equal_layers(3, 10), ctx_size=128, reserve_fraction=0, strategy="speed")
    assert sum(plan["tensor_split"]) == 4


@pytest.mark.parametrize("reserve_fraction", [0.0, 0.15])
def test_model_larger_than_all_budgets_states_the_shortfall(reserve_fraction):
    devices = _devices(8, 8)
    model = _equal_layers(32, 1024, kv_bytes_per_token=1024)
    need = 33 * 1024 * MIB + 32 * 1024 * 4096
    have = sum(budgets_of(devices, reserve_fraction))
    with pytest.raises(AnsibleFilterError) as err:
        llama_split_plan(devices, model, reserve_fraction=reserve_fraction)
    message = str(err.value)
    assert "model needs 33920 MiB (weights + KV at ctx_size=4096)" in message
    assert f"budgets total {have // MIB} MiB: short by {33920 - have // MIB} MiB" in message
    assert 0 <= 33920 - have // MIB - (need - have) / MIB < 1


def test_shortfall_arithmetic_reads_consistently():
    model = {"n_layer": 1, "layer_bytes": 50 * MIB + 1, "output_bytes": 37 * MIB, "kv_bytes_per_token": 0}
    with pytest.raises(AnsibleFilterError, match=r"needs 88 MiB .* total 0 MiB: short by 88 MiB"):
        llama_split_plan([{"name": "A", "memory_mib": 1}], model)


def test_layers_that_cannot_be_split_state_the_best_shortfall():
    # 1 GiB + 700 MiB output on two 1000 MiB devices: 1724 MiB ≤ 2000 MiB, but the 1 GiB layer fits nowhere.
    model = {"n_layer": 1, "layer_bytes": 1024 * MIB, "output_bytes": 700 * MIB, "kv_bytes_per_token": 0}
    with pytest.raises(AnsibleFilterError, match=r"no contiguous in-order split.*short by 24 MiB"):
        llama_split_plan([{"name": "A", "memory_mib": 1000}, {"name": "B", "memory_mib": 1000}], model,
                         reserve_fraction=0)


def test_more_than_15_devices_with_layers_is_refused():
    devices = [{"name": f"RPC{index}", "memory_mib": 1024} for index in range(16)]
    with pytest.raises(AnsibleFilterError, match="at most 15 --tensor-split values"):
        llama_split_plan(devices, _equal_layers(15, 800), reserve_fraction=0)


def test_16_devices_are_fine_when_15_hold_the_model():
    devices = [{"name": f"RPC{index}", "memory_mib": 1024} for index in range(16)]
    plan = llama_split_plan(devices, _equal_layers(14, 800), reserve_fraction=0)
    assert len(plan["devices"]) == 15


GOOD_DEVICES = [{"name": "RPC0", "memory_mib": 8192}, {"name": "RPC1", "memory_mib": 8192}]
GOOD_MODEL = {"n_layer": 6, "layer_bytes": MIB, "output_bytes": MIB, "kv_bytes_per_token": 1024}


def _with(base, path, value):
    """A deep copy of `base` with base[path...] = value (or the key removed when value is ...)."""
    changed = copy.deepcopy(base)
    target = changed
    for key in path[:-1]:
        target = target[key]
    if value is ...:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return changed


@pytest.mark.parametrize("devices, model, options, message", [
    ([], GOOD_MODEL, {}, "devices must be a non-empty list"),
    ("RPC0", GOOD_MODEL, {}, "devices must be a non-empty list"),
    ({"name": "RPC0", "memory_mib": 1}, GOOD_MODEL, {}, "devices must be a non-empty list"),
    (["RPC0"], GOOD_MODEL, {}, r"devices\[0\] must be a dict"),
    (_with(GOOD_DEVICES, [1, "memory_mib"], -3), GOOD_MODEL, {},
     r"devices\[1\]\.memory_mib must be a positive integer, got -3"),
    (_with(GOOD_DEVICES, [1, "memory_mib"], 0), GOOD_MODEL, {}, r"devices\[1\]\.memory_mib must be a positive"),
    (_with(GOOD_DEVICES, [0, "memory_mib"], "8G"), GOOD_MODEL, {}, r"devices\[0\]\.memory_mib .* got '8G'"),
    (_with(GOOD_DEVICES, [0, "memory_mib"], 8192.5), GOOD_MODEL, {}, r"devices\[0\]\.memory_mib"),
    (_with(GOOD_DEVICES, [0, "memory_mib"], True), GOOD_MODEL, {}, r"devices\[0\]\.memory_mib"),
    (_with(GOOD_DEVICES, [0, "memory_mib"], ...), GOOD_MODEL, {}, r"devices\[0\]\.memory_mib .* got None"),
    (_with(GOOD_DEVICES, [0, "name"], ...), GOOD_MODEL, {}, r"devices\[0\]\.name must be a non-empty string"),
    (_with(GOOD_DEVICES, [0, "name"], ""), GOOD_MODEL, {}, r"devices\[0\]\.name must be a non-empty string"),
    (_with(GOOD_DEVICES, [1, "name"], "RPC0"), GOOD_MODEL, {}, r"devices\[1\]\.name 'RPC0' is a duplicate"),
    (_with(GOOD_DEVICES, [0, "speed"], 0), GOOD_MODEL, {}, r"devices\[0\]\.speed must be a positive number"),
    (_with(GOOD_DEVICES, [1, "speed"], -1.5), GOOD_MODEL, {}, r"devices\[1\]\.speed must be a positive number"),
    (_with(GOOD_DEVICES, [1, "speed"], float("nan")), GOOD_MODEL, {}, r"devices\[1\]\.speed"),
    (_with(GOOD_DEVICES, [1, "speed"], "fast"), GOOD_MODEL, {}, r"devices\[1\]\.speed"),
    (GOOD_DEVICES, None, {}, "model must be a dict"),
    (GOOD_DEVICES, _with(GOOD_MODEL, ["n_layer"], 0), {}, "model.n_layer must be a positive integer, got 0"),
    (GOOD_DEVICES, _with(GOOD_MODEL, ["n_layer"], ...), {}, "model.n_layer must be a positive integer, got None"),
    (GOOD_DEVICES, _with(GOOD_MODEL, ["layer_bytes"], [MIB] * 5), {},
     "model.layer_bytes has 5 entries but model.n_layer is 6"),
    (GOOD_DEVICES, _with(GOOD_MODEL, ["layer_bytes"], [MIB] * 5 + [-1]), {},
     r"model\.layer_bytes\[5\] must be a positive integer, got -1"),
    (GOOD_DEVICES, _with(GOOD_MODEL, ["layer_bytes"], 0), {}, "model.layer_bytes must be a positive integer"),
    (GOOD_DEVICES, _with(GOOD_MODEL, ["output_bytes"], -1), {}, "model.output_bytes must be an integer >= 0"),
    (GOOD_DEVICES, _with(GOOD_MODEL, ["output_bytes"], ...), {}, "model.output_bytes must be an integer >= 0"),
    (GOOD_DEVICES, _with(GOOD_MODEL, ["kv_bytes_per_token"], [1] * 7), {},
     "model.kv_bytes_per_token has 7 entries but model.n_layer is 6"),
    (GOOD_DEVICES, _with(GOOD_MODEL, ["kv_bytes_per_token"], 1.5), {}, "model.kv_bytes_per_token must be an integer"),
    (GOOD_DEVICES, GOOD_MODEL, {"ctx_size": 0}, "ctx_size must be a positive integer, got 0"),
    (GOOD_DEVICES, GOOD_MODEL, {"ctx_size": "4096"}, "ctx_size must be a positive integer, got '4096'"),
    (GOOD_DEVICES, GOOD_MODEL, {"reserve_fraction": 1}, r"reserve_fraction must be a number in \[0, 1\), got 1"),
    (GOOD_DEVICES, GOOD_MODEL, {"reserve_fraction": -0.1}, r"reserve_fraction must be a number in \[0, 1\)"),
    (GOOD_DEVICES, GOOD_MODEL, {"reserve_fraction": "0.1"}, r"reserve_fraction must be a number in \[0, 1\)"),
    (GOOD_DEVICES, GOOD_MODEL, {"strategy": "fastest"}, "strategy must be one of memory, speed, got 'fastest'"),
])
def test_invalid_input_names_the_field(devices, model, options, message):
    with pytest.raises(SplitError, match=f"^llama_split_plan: {message}") as err:
        llama_split_plan(devices, model, **options)
    assert str(err.value) == f"llama_split_plan: {err.value.render({})}"


@pytest.mark.parametrize("ts, expected", [
    ([2, 1], [0, 0, 1]),
    ([1, 0, 2], [0, 2, 2]),
    ([0.5, 0.5], [0, 0, 1]),
])
def test_llamacpp_layer_assignment_full_offload(ts, expected):
    assert llamacpp_layer_assignment(2, 99, ts) == expected == assign(2, 99, ts)


def test_llamacpp_layer_assignment_partial_offload_keeps_first_layers_on_cpu():
    assert llamacpp_layer_assignment(3, 2, [1, 1]) == [None, None, 0, 1] == assign(3, 2, [1, 1])


def test_llamacpp_layer_assignment_is_float32_like_llama_cpp():
    """0.1f + 0.2f rounds to 0.3f, which equals 3f / 10f: layer 3 goes past that split point."""
    expected = [0, 1, 1, 2, 2, 2, 2, 2, 2, 2]
    assert llamacpp_layer_assignment(9, 10, [0.1, 0.2, 0.7]) == expected == assign(9, 10, [0.1, 0.2, 0.7])
    sums = list(itertools.accumulate([0.1, 0.2, 0.7]))
    assert bisect.bisect_right([value / sums[-1] for value in sums], 3 / 10) == 1  # float64 says device 1


SPLIT_VALUES = st.one_of(
    st.integers(0, 1000),
    st.builds(lambda units, decimals: units / 10 ** decimals, st.integers(0, 10 ** 4), st.integers(1, 3)),
)
TENSOR_SPLITS = st.lists(SPLIT_VALUES, min_size=1, max_size=15).filter(any)


@st.composite
def aligned_splits(draw):
    """(n_layer, decimal split) whose exact split points are multiples of 1 / (n_layer + 1): the ties where
    float32 and float64 disagree."""
    decimals = draw(st.integers(1, 3))
    bounds = [0, *sorted(draw(st.lists(st.integers(0, 10 ** decimals), max_size=14))), 10 ** decimals]
    scale = draw(st.sampled_from([1, 2, 3, 10]))
    n_layer = draw(st.sampled_from([10, 20, 40, 50, 100, 200])) - 1
    return n_layer, [(last - first) * scale / 10 ** decimals for first, last in zip(bounds, bounds[1:])]


SPLIT_CASES = st.one_of(st.tuples(st.integers(1, 200), TENSOR_SPLITS), aligned_splits())


def assign_in_doubles(n_layer, ts):
    sums = list(itertools.accumulate(ts))
    return [bisect.bisect_right([value / sums[-1] for value in sums], il / (n_layer + 1)) for il in range(n_layer + 1)]


@settings(max_examples=500, deadline=None)
@given(st.integers(1, 200), st.integers(0, 210), TENSOR_SPLITS)
def test_llamacpp_layer_assignment_matches_float32(n_layer, ngl, ts):
    assert llamacpp_layer_assignment(n_layer, ngl, ts) == assign(n_layer, ngl, ts)


@settings(max_examples=500, deadline=None)
@given(aligned_splits())
def test_llamacpp_layer_assignment_matches_float32_at_ties(case):
    n_layer, ts = case
    assignment = llamacpp_layer_assignment(n_layer, n_layer + 1, ts)
    event("float64 differs" if assignment != assign_in_doubles(n_layer, ts) else "float64 agrees")
    assert assignment == assign(n_layer, n_layer + 1, ts)


@pytest.mark.parametrize("value, expected", [
    (0.1, float(F32(0.1))),
    (3, 3.0),
    (2 ** 24 + 1, 2.0 ** 24),  # a tie: to even
    (2 ** 24 + 3, 2.0 ** 24 + 4),
    (2 ** 60 + 2 ** 36 + 1, 2.0 ** 60 + 2 ** 37),  # just above a tie
])
def test_values_are_read_like_std_stof(value, expected):
    assert llama_split._stof(value, "x") == expected


def test_values_are_rounded_once_not_through_a_double():
    value = 2 ** 60 + 2 ** 36 + 1  # the nearest double is the tie 2**60 + 2**36, which rounds down to even
    assert float(F32(float(value))) == 2.0 ** 60 != llama_split._stof(value, "x")


def test_fifteen_values_are_accepted():
    assert llamacpp_layer_assignment(14, 15, [1] * 15) == list(range(15))


@pytest.mark.parametrize("ts, message", [
    ([], r"tensor_split must be a non-empty list of non-negative numbers, got \[\]"),
    ("3,1", r"tensor_split must be a non-empty list of non-negative numbers, got '3,1'"),
    ([0, 0], r"tensor_split must give a device a positive value, got \[0, 0\] \(with all zeros llama\.cpp splits "
             r"by free memory instead\)"),
    ([1, -1], r"tensor_split\[1\] must be a non-negative number, got -1"),
    ([1, "2"], r"tensor_split\[1\] must be a non-negative number, got '2'"),
    ([True, 1], r"tensor_split\[0\] must be a non-negative number, got True"),
    ([1, math.inf], r"tensor_split\[1\] must be a non-negative number, got inf"),
    ([1] * 16, "tensor_split has 16 values but llama.cpp accepts at most 15$"),
    ([1, 1e-39], r"tensor_split\[1\] is 1e-39, outside float32's range: llama\.cpp's std::stof refuses it"),
    ([1, 10 ** 39], r"tensor_split\[1\] is 1000000000000000000000000000000000000000, outside float32's range"),
    ([3e38, 3e38], r"tensor_split sums past float32's largest value \(3\.4e38\), got \[3e\+38, 3e\+38\]"),
])
def test_llamacpp_layer_assignment_rejects_bad_splits(ts, message):
    with pytest.raises(SplitError, match=f"^llama_split_plan: {message}"):
        llamacpp_layer_assignment(4, 5, ts)


NAMES = {"devices": "llama_devices", "model": "llama_model_path", "ctx_size": "llama_server_ctx_size",
         "reserve_fraction": "llama_split_reserve_fraction", "strategy": "llama_split_strategy",
         "tensor_split": "llama_tensor_split"}


def _error_of(call):
    with pytest.raises(SplitError) as err:
        call()
    return err.value


def test_error_renders_with_the_callers_names():
    err = _error_of(lambda: llama_split_plan(GOOD_DEVICES, GOOD_MODEL, reserve_fraction=1.5))
    assert str(err) == "llama_split_plan: reserve_fraction must be a number in [0, 1), got 1.5"
    names = {key: NAMES[key] for key in ("reserve_fraction", "ctx_size", "tensor_split", "strategy")}
    assert err.render(names) == "llama_split_reserve_fraction must be a number in [0, 1), got 1.5"
    assert err.render({}) == "reserve_fraction must be a number in [0, 1), got 1.5"
    assert isinstance(err, AnsibleFilterError)


@pytest.mark.parametrize("call, rendered", [
    (lambda: llama_split_plan(GOOD_DEVICES, GOOD_MODEL, strategy="fastest"),
     "llama_split_strategy must be one of memory, speed, got 'fastest'"),
    (lambda: llama_split_plan(GOOD_DEVICES, GOOD_MODEL, ctx_size=0),
     "llama_server_ctx_size must be a positive integer, got 0"),
    (lambda: llama_split_plan(_with(GOOD_DEVICES, [1, "memory_mib"], -3), GOOD_MODEL),
     "llama_devices[1].memory_mib must be a positive integer, got -3"),
    (lambda: llama_split_plan(_with(GOOD_DEVICES, [1, "name"], "RPC0"), GOOD_MODEL),
     "llama_devices[1].name 'RPC0' is a duplicate of llama_devices[0].name"),
    (lambda: llama_split_plan({"name": "RPC0", "memory_mib": 1}, GOOD_MODEL),
     "llama_devices must be a non-empty list of {name, memory_mib, speed} dicts, "
     "got {'name': 'RPC0', 'memory_mib': 1}"),
    (lambda: llama_split_plan(GOOD_DEVICES, _with(GOOD_MODEL, ["layer_bytes"], [MIB] * 5)),
     "llama_model_path.layer_bytes has 5 entries but llama_model_path.n_layer is 6"),
    (lambda: llama_split_given(GOOD_DEVICES, GOOD_MODEL, [1, 0.5, 1]),
     "llama_tensor_split has 3 values but the cluster has 2 devices (RPC0, RPC1): give one value per device, in that "
     "order"),
    (lambda: llama_split_given(GOOD_DEVICES, GOOD_MODEL, [1, -0.5]),
     "llama_tensor_split[1] must be a non-negative number, got -0.5"),
    (lambda: llama_split_given(GOOD_DEVICES, GOOD_MODEL, [0, 0.0]),
     "llama_tensor_split must give a device a positive value, got [0, 0.0] (with all zeros llama.cpp splits by free "
     "memory instead)"),
])
def test_errors_name_fields_with_the_callers_names(call, rendered):
    assert _error_of(call).render(NAMES) == rendered


def test_fit_hint_renders_with_the_callers_names():
    err = _error_of(lambda: llama_split_plan(_devices(8, 8), _equal_layers(32, 1024, kv_bytes_per_token=1024)))
    assert "model needs 33920 MiB (weights + KV at llama_server_ctx_size=4096)" in err.render(NAMES)
    assert err.render(NAMES).endswith("; add a device, lower llama_server_ctx_size or llama_split_reserve_fraction")
    assert str(err).endswith("; add a device, lower ctx_size or reserve_fraction")


def test_filter_is_registered_and_documented():  # every filter's sidecar: test_filter_docs.py
    assert llama_split.FilterModule().filters() == {
        "llama_split_plan": llama_split_plan,
        "llama_split_given": llama_split_given,
        "llama_split_table": llama_split.llama_split_table,
    }
    doc = yaml.safe_load((Path(llama_split.__file__).parent / "llama_split_plan.yml").read_text())
    assert set(doc["RETURN"]["_value"]["contains"]) == {
        "devices", "tensor_split", "layers", "bytes", "budget_bytes", "strategy", "fits"}


GIVEN_DEVICES = [{"name": "RPC0", "memory_mib": 1024}, {"name": "RPC1", "memory_mib": 1024}]
GIVEN_MODEL = {"n_layer": 7, "layer_bytes": 10 * 1024 * 1024, "output_bytes": 30 * 1024 * 1024,
               "kv_bytes_per_token": 0}


def _roomy(count):
    return [{"name": f"RPC{index}", "memory_mib": 1024} for index in range(count)]


def test_given_split_gives_llama_cpp_layers_as_counts():
    plan = llama_split_given(GIVEN_DEVICES, GIVEN_MODEL, [3, 1])
    assert plan["layers"] == [[0, 6], [6, 8]]
    assert plan["tensor_split"] == [6, 2]
    assert plan["strategy"] == "given"
    assert llamacpp_layer_assignment(7, 8, [3, 1]) == [0] * 6 + [1] * 2


def test_given_fractional_split_follows_float32():
    plan = llama_split_given(_roomy(3), _equal_layers(9, 1), [0.1, 0.2, 0.7])
    assert plan["layers"] == [[0, 1], [1, 3], [3, 10]]
    assert plan["tensor_split"] == [1, 2, 7]


def test_given_split_leaves_out_a_device_without_layers_without_moving_layers():
    """RPC2's 0.1 gets it no layer, but --tensor-split 0.8,0.7 alone would move layer 5 to RPC0."""
    plan = llama_split_given(_roomy(3), _equal_layers(9, 1), [0.8, 0.7, 0.1])
    assert plan["devices"] == ["RPC0", "RPC1"]
    assert plan["layers"] == [[0, 5], [5, 10]]
    assert plan["tensor_split"] == [5, 5]
    assert assign(9, 10, [0.8, 0.7]).count(0) == 6


@settings(max_examples=300, deadline=None)
@given(SPLIT_CASES)
def test_given_split_places_layers_like_llama_cpp(case):
    n_layer, ts = case
    devices, model = _roomy(len(ts)), _equal_layers(n_layer, 1)
    plan = llama_split_given(devices, model, ts)
    ranges = ranges_from_assignment(assign(n_layer, n_layer + 1, ts))
    assert plan["devices"] == [f"RPC{index}" for index in sorted(ranges)]
    assert plan["layers"] == [ranges[index] for index in sorted(ranges)]
    check_plan(plan, devices, model, 4096, 0.15)  # and its tensor_split gives llama.cpp the same layers


def test_given_split_must_match_the_device_count():
    with pytest.raises(SplitError, match=r"^llama_split_plan: tensor_split has 3 values but the cluster has 2 devices"):
        llama_split_given(GIVEN_DEVICES, GIVEN_MODEL, [1, 1, 1])


def test_given_split_of_more_than_15_values_is_refused():
    with pytest.raises(SplitError, match="^llama_split_plan: tensor_split has 16 values but llama.cpp accepts at most"):
        llama_split_given(_roomy(16), _equal_layers(15, 1), [1] * 16)


def test_given_split_must_fit():
    small = [{"name": "RPC0", "memory_mib": 1024}, {"name": "RPC1", "memory_mib": 40}]
    err = _error_of(lambda: llama_split_given(small, GIVEN_MODEL, [6, 2]))
    assert str(err) == ("llama_split_plan: tensor_split puts 40 MiB on RPC1, over its budget of 34 MiB: short by "
                        "6 MiB; give RPC1 a smaller share, add a device, lower ctx_size or reserve_fraction")
    assert err.render(NAMES).startswith("llama_tensor_split puts 40 MiB on RPC1")


def test_table_lists_devices_hosts_layers_and_budgets():
    devices = [dict(device, host=f"w{index}", local_name="CPU") for index, device in enumerate(GIVEN_DEVICES)]
    plan = llama_split_plan(devices, GIVEN_MODEL)
    lines = llama_split.llama_split_table(plan, devices, GIVEN_MODEL)
    assert lines[0].split() == ["device", "host", "layers", "est.", "GiB", "/", "budget", "GiB"]
    assert lines[1].split()[:4] == ["RPC0", "w0", "(CPU)", f"0-{plan['layers'][0][1] - 1}"]
    assert lines[2].split()[4] == "+output"
    assert lines[-1] == f"strategy memory: --device RPC0,RPC1 --tensor-split {','.join(map(str, plan['tensor_split']))}"
