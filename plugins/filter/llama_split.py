"""Ansible filter ``llama_split_plan``: place a model's layers on llama.cpp devices."""

import bisect
import itertools
import math
import re
import struct
from collections.abc import Mapping
from fractions import Fraction

from ansible.errors import AnsibleFilterError

# Each filter is documented in its sidecar file, plugins/filter/<name>.yml (ansible-doc -t filter <name>).

MIB = 1024 * 1024
GIB = 1024 * MIB
MAX_TENSOR_SPLIT_VALUES = 15  # llama.cpp rejects --tensor-split with llama_max_devices() (16) values or more
STRATEGIES = ("memory", "speed")
FIT_HINT = "add a device, lower {ctx_size} or {reserve_fraction}"
FIELDS = ("devices", "model", "ctx_size", "reserve_fraction", "strategy", "tensor_split")
_FIELD = re.compile(r"\{(" + "|".join(FIELDS) + r")\}")
FLT_MAX = float.fromhex("0x1.fffffep+127")


class SplitError(AnsibleFilterError):
    """An error whose message names the filter's arguments by {field} placeholders (FIELDS)."""

    def __init__(self, template):
        self.template = template
        super().__init__(f"llama_split_plan: {self.render({})}")

    def render(self, names):
        """The message without the filter's prefix, each {field} written as names.get(field, field)."""
        return _FIELD.sub(lambda match: names.get(match[1], match[1]), self.template)


def _is_int(value):
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _check_int(value, field, minimum):
    if not _is_int(value) or value < minimum:
        kind = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
        raise SplitError(f"{field} must be {kind}, got {value!r}")
    return value


def _check_devices(devices):
    """Return (names, memory_mib, speeds) of a validated device list."""
    if not isinstance(devices, (list, tuple)) or not devices:
        raise SplitError(f"{{devices}} must be a non-empty list of {{name, memory_mib, speed}} dicts, "
                         f"got {devices!r}")
    names, memory, speeds = [], [], []
    for index, device in enumerate(devices):
        field = f"{{devices}}[{index}]"
        if not isinstance(device, Mapping):
            raise SplitError(f"{field} must be a dict with name, memory_mib and optional speed, got {device!r}")
        name = device.get("name")
        if not isinstance(name, str) or not name:
            raise SplitError(f"{field}.name must be a non-empty string, got {name!r}")
        if name in names:
            raise SplitError(f"{field}.name {name!r} is a duplicate of {{devices}}[{names.index(name)}].name")
        speed = device.get("speed", 1.0)
        if not _is_number(speed) or speed <= 0:
            raise SplitError(f"{field}.speed must be a positive number, got {speed!r}")
        names.append(name)
        memory.append(_check_int(device.get("memory_mib"), f"{field}.memory_mib", 1))
        speeds.append(float(speed))
    return names, memory, speeds


def _per_layer(model, key, n_layer, minimum):
    """An int, or a list of n_layer ints, as a list of n_layer ints."""
    value = model.get(key)
    field = f"{{model}}.{key}"
    if isinstance(value, (list, tuple)):
        if len(value) != n_layer:
            raise SplitError(f"{field} has {len(value)} entries but {{model}}.n_layer is {n_layer}")
        return [_check_int(item, f"{field}[{index}]", minimum) for index, item in enumerate(value)]
    return [_check_int(value, field, minimum)] * n_layer


def _check_model(model):
    """Return (weights, kv_per_token) of the n_layer + 1 layers; the output layer has no KV cache."""
    if not isinstance(model, Mapping):
        raise SplitError(f"{{model}} must be a dict with n_layer, layer_bytes, output_bytes and "
                         f"kv_bytes_per_token, got {model!r}")
    n_layer = _check_int(model.get("n_layer"), "{model}.n_layer", 1)
    weights = _per_layer(model, "layer_bytes", n_layer, 1)
    weights.append(_check_int(model.get("output_bytes"), "{model}.output_bytes", 0))
    kv_per_token = _per_layer(model, "kv_bytes_per_token", n_layer, 0) + [0]
    return weights, kv_per_token


def _check_options(ctx_size, reserve_fraction, strategy):
    _check_int(ctx_size, "{ctx_size}", 1)
    if not _is_number(reserve_fraction) or not 0 <= reserve_fraction < 1:
        raise SplitError(f"{{reserve_fraction}} must be a number in [0, 1), got {reserve_fraction!r}")
    if strategy not in STRATEGIES:
        raise SplitError(f"{{strategy}} must be one of {', '.join(STRATEGIES)}, got {strategy!r}")


class _Layers:
    """Prefix sums over the n_layer + 1 layers, so the bytes of any range cost O(1)."""

    def __init__(self, weights, costs):
        self.count = len(costs)
        self.cost_prefix = [0, *itertools.accumulate(costs)]
        self._weight_prefix = [0, *itertools.accumulate(weights)]
        self.largest = max(costs)

    @property
    def total(self):
        return self.cost_prefix[-1]

    def cost(self, first, end):
        return self.cost_prefix[end] - self.cost_prefix[first]

    def weight(self, first, end):
        return self._weight_prefix[end] - self._weight_prefix[first]

    def max_end(self, first, budget):
        """The furthest end of a range starting at `first` that fits `budget`."""
        return max(first, bisect.bisect_right(self.cost_prefix, self.cost_prefix[first] + budget) - 1)

    def min_first(self, end, budget):
        """The earliest first layer of a range ending at `end` that fits `budget`."""
        return min(end, bisect.bisect_left(self.cost_prefix, self.cost_prefix[end] - budget))

    def nearest_end(self, target):
        """The layer boundary whose cumulative bytes are nearest `target` (ties go up)."""
        upper = bisect.bisect_left(self.cost_prefix, target)
        if upper and target - self.cost_prefix[upper - 1] < self.cost_prefix[upper] - target:
            return upper - 1
        return upper


def _min_firsts(layers, budgets):
    """min_firsts[k]: the earliest layer from which all later layers fit on devices k.. (greedy from the end).

    Filling each device backwards as far as its budget allows is optimal, so the layers fit at all exactly
    when min_firsts[0] == 0, and a device k starting at or after min_firsts[k] can always leave a
    fitting remainder.
    """
    firsts = [layers.count]
    for budget in reversed(budgets):
        firsts.append(layers.min_first(firsts[-1], budget))
    return firsts[::-1]


def _counts(ends):
    return [end - first for first, end in zip([0, *ends], ends)]


def _memory_split(layers, budgets):
    """Layer counts proportional to the budgets, moved only as far as needed to fit; None if nothing fits.

    Each device's end is the byte-proportional target clamped to [the earliest end that leaves a
    fitting remainder, the furthest end its own budget allows]; that interval is never empty while
    a fitting split exists, so this never rejects a model that some contiguous split fits.
    """
    min_firsts = _min_firsts(layers, budgets)
    if min_firsts[0] != 0:
        return None
    total_budget = sum(budgets)
    ends, first, budget_so_far = [], 0, 0
    for index, budget in enumerate(budgets):
        budget_so_far += budget
        target = layers.nearest_end(Fraction(layers.total * budget_so_far, total_budget))
        lowest = max(first, min_firsts[index + 1])
        end = min(max(target, lowest), layers.max_end(first, budget))
        ends.append(end)
        first = end
    return _counts(ends)


def _speed_split(layers, budgets, speeds):
    """Layer counts with the least estimated time per token (DP over (device, layer boundary))."""
    best = [0.0] + [math.inf] * layers.count  # best[j]: least time placing layers [0, j) on devices so far
    choices = []
    for budget, speed in zip(budgets, speeds):
        time, choice = list(best), list(range(layers.count + 1))  # an empty range keeps the time
        for end in range(1, layers.count + 1):
            for first in range(layers.min_first(end, budget), end):
                candidate = best[first] + layers.weight(first, end) / speed
                if candidate < time[end]:
                    time[end], choice[end] = candidate, first
        best = time
        choices.append(choice)
    if best[-1] == math.inf:
        return None
    ends = [layers.count]
    for choice in reversed(choices[1:]):
        ends.append(choice[ends[-1]])
    return _counts(ends[::-1])


def _estimated_time(layers, counts, speeds):
    ends = list(itertools.accumulate(counts))
    return sum(layers.weight(end - count, end) / speed for end, count, speed in zip(ends, counts, speeds))


def _least_overflow(layers, budgets):
    """The least total bytes by which any contiguous in-order split exceeds the budgets."""
    best = [0] + [math.inf] * layers.count
    for budget in budgets:
        best = [min(best[first] + max(0, layers.cost(first, end) - budget) for first in range(end + 1))
                for end in range(layers.count + 1)]
    return best[-1]


def _mib(size, rounding=math.ceil):
    return rounding(size / MIB)


def _not_fitting(layers, budgets, ctx_size):
    """The error for a model no split fits; needs round up and budgets down, so the shortfall is never low."""
    need, have = _mib(layers.total), _mib(sum(budgets), math.floor)
    needs = f"model needs {need} MiB (weights + KV at {{ctx_size}}={ctx_size})"
    if layers.total > sum(budgets):
        return SplitError(f"{needs} but the devices' budgets total {have} MiB: short by {need - have} MiB; "
                          f"{FIT_HINT}")
    return SplitError(f"{needs} and the devices' budgets total {have} MiB, but no contiguous "
                      f"in-order split of its layers fits (largest layer {_mib(layers.largest)} MiB, largest budget "
                      f"{_mib(max(budgets), math.floor)} MiB): the best split is short by "
                      f"{_mib(_least_overflow(layers, budgets))} MiB; {FIT_HINT}")


def _f32(value):
    """`value` rounded to float32 as C casts it (inf past the range): exactly C's float +, -, / of floats when
    computed in double."""
    return struct.unpack("f", struct.pack("f", value))[0]


def _stof(value, field):
    """What std::stof makes of str(value): the decimal rounded to the nearest float32, ties to even."""
    exact = Fraction(str(value))
    if not exact:
        return 0.0
    exponent = exact.numerator.bit_length() - exact.denominator.bit_length()
    if exact < Fraction(2) ** exponent:
        exponent -= 1  # now 2**exponent <= exact < 2**(exponent + 1)
    ulp = Fraction(2) ** (exponent - 23)
    rounded = round(exact / ulp) * ulp
    if exponent < -126 or rounded > FLT_MAX:
        raise SplitError(f"{field} is {value!r}, outside float32's range: llama.cpp's std::stof refuses it "
                         "(use 0 or a value from 1.2e-38 to 3.4e38)")
    return float(rounded)


def _float32_split(tensor_split):
    """The tensor_split values as llama.cpp holds them (float32), refused where llama.cpp refuses them
    or would split by free memory instead (all zeros)."""
    if not isinstance(tensor_split, (list, tuple)) or not tensor_split:
        raise SplitError(f"{{tensor_split}} must be a non-empty list of non-negative numbers, got {tensor_split!r}")
    if len(tensor_split) > MAX_TENSOR_SPLIT_VALUES:
        raise SplitError(f"{{tensor_split}} has {len(tensor_split)} values but llama.cpp accepts at most "
                         f"{MAX_TENSOR_SPLIT_VALUES}")
    values = []
    for index, value in enumerate(tensor_split):
        if not _is_number(value) or value < 0:
            raise SplitError(f"{{tensor_split}}[{index}] must be a non-negative number, got {value!r}")
        values.append(_stof(value, f"{{tensor_split}}[{index}]"))
    if not any(values):
        raise SplitError(f"{{tensor_split}} must give a device a positive value, got {list(tensor_split)!r} "
                         "(with all zeros llama.cpp splits by free memory instead)")
    return values


def llamacpp_layer_assignment(n_layer, ngl, tensor_split):
    """The device index llama.cpp gives each of the n_layer + 1 layers (None: stays on the CPU).

    Emulates llama_model::load_tensors (src/llama-model.cpp) in float32, as llama.cpp computes it: the split
    points are the float32 prefix sums of the values divided by their total, and layer il goes to the first
    device whose split point exceeds (il - i_gpu_start) / act_gpu_layers. Index n_layer is the output layer.
    """
    prefix = list(itertools.accumulate(_float32_split(tensor_split), lambda total, value: _f32(total + value)))
    total = prefix[-1]
    if total > FLT_MAX:
        raise SplitError(f"{{tensor_split}} sums past float32's largest value (3.4e38), got {list(tensor_split)!r}: "
                         "scale the values down")
    split_points = [_f32(value / total) for value in prefix]
    active = min(ngl, n_layer + 1)
    start = n_layer + 1 - active
    return [None if il < start else bisect.bisect_right(split_points, _f32((il - start) / active))
            for il in range(n_layer + 1)]


def _verify(plan, n_layer):
    """Refuse to return a plan llama.cpp would place differently, or one that breaks a budget."""
    assignment = llamacpp_layer_assignment(n_layer, n_layer + 1, plan["tensor_split"])
    for index, (first, end) in enumerate(plan["layers"]):
        if assignment[first:end] != [index] * (end - first) or assignment.count(index) != end - first:
            raise SplitError(f"internal error: llama.cpp would not place layers {first}..{end - 1} on "
                             f"{plan['devices'][index]} from --tensor-split {plan['tensor_split']}")
    if any(size > budget for size, budget in zip(plan["bytes"], plan["budget_bytes"])):
        raise SplitError(f"internal error: a device exceeds its budget in {plan!r}")


def _plan(names, counts, layers, budgets, strategy):
    used = [index for index, count in enumerate(counts) if count]
    if len(used) > MAX_TENSOR_SPLIT_VALUES:
        raise SplitError(f"the plan gives layers to {len(used)} devices but llama.cpp accepts at most "
                         f"{MAX_TENSOR_SPLIT_VALUES} --tensor-split values: pass at most "
                         f"{MAX_TENSOR_SPLIT_VALUES} devices")
    ends = list(itertools.accumulate(counts))
    ranges = [[ends[index] - counts[index], ends[index]] for index in used]
    return {
        "devices": [names[index] for index in used],
        "tensor_split": [counts[index] for index in used],
        "layers": ranges,
        "bytes": [layers.cost(first, end) for first, end in ranges],
        "budget_bytes": [budgets[index] for index in used],
        "strategy": strategy,
        "fits": True,
    }


def llama_split_plan(devices, model, ctx_size=4096, reserve_fraction=0.15, strategy="memory"):
    """Plan llama.cpp's --device and --tensor-split for `model` on `devices` (see plugins/filter/llama_split_plan.yml)."""
    names, memory_mib, speeds = _check_devices(devices)
    weights, kv_per_token = _check_model(model)
    _check_options(ctx_size, reserve_fraction, strategy)
    layers = _Layers(weights, [weight + kv * ctx_size for weight, kv in zip(weights, kv_per_token)])
    budgets = [int(memory * MIB * (1 - reserve_fraction)) for memory in memory_mib]
    counts = _memory_split(layers, budgets)
    if counts is None:
        raise _not_fitting(layers, budgets, ctx_size)
    if strategy == "speed":
        fastest = _speed_split(layers, budgets, speeds)
        # Keep the balanced memory split unless the DP is faster by more than rounding noise.
        if _estimated_time(layers, fastest, speeds) < _estimated_time(layers, counts, speeds) * (1 - 1e-9):
            counts = fastest
    plan = _plan(names, counts, layers, budgets, strategy)
    _verify(plan, len(weights) - 1)
    return plan


def llama_split_given(devices, model, tensor_split, ctx_size=4096, reserve_fraction=0.15):
    """The plan for an explicit --tensor-split (llama_tensor_split, one value per device), checked.

    The layers are where llama.cpp puts them from those values (in float32); the returned tensor_split is
    each device's layer count, the same placement without the devices given no layers (leaving such a
    device out of the user's values could move layers). Every device's estimate must stay within its
    budget like a planned split's.
    """
    names, memory_mib = _check_devices(devices)[:2]
    weights, kv_per_token = _check_model(model)
    _check_options(ctx_size, reserve_fraction, "memory")
    if isinstance(tensor_split, (list, tuple)) and len(tensor_split) != len(names):
        raise SplitError(f"{{tensor_split}} has {len(tensor_split)} values but the cluster has {len(names)} "
                         f"devices ({', '.join(names)}): give one value per device, in that order")
    n_layer = len(weights) - 1
    assignment = llamacpp_layer_assignment(n_layer, n_layer + 1, tensor_split)
    counts = [assignment.count(index) for index in range(len(names))]
    layers = _Layers(weights, [weight + kv * ctx_size for weight, kv in zip(weights, kv_per_token)])
    budgets = [int(memory * MIB * (1 - reserve_fraction)) for memory in memory_mib]
    plan = _plan(names, counts, layers, budgets, "given")
    for name, size, budget in zip(plan["devices"], plan["bytes"], plan["budget_bytes"]):
        if size > budget:
            raise SplitError(f"{{tensor_split}} puts {_mib(size)} MiB on {name}, over its budget of "
                             f"{_mib(budget, math.floor)} MiB: short by {_mib(size - budget)} MiB; give {name} "
                             f"a smaller share, {FIT_HINT}")
    _verify(plan, n_layer)
    return plan


def llama_split_table(plan, devices, model=None):
    """The plan as table lines: device, host (local name), layers, estimated GiB / budget GiB."""
    by_name = {device["name"]: device for device in devices}
    n_layer = (model or {}).get("n_layer")
    rows = [("device", "host", "layers", "est. GiB / budget GiB")]
    for name, (first, end), size, budget in zip(plan["devices"], plan["layers"], plan["bytes"],
                                                plan["budget_bytes"]):
        device = by_name.get(name, {})
        host = device.get("host", "?")
        if device.get("local_name") not in (None, name):
            host = f"{host} ({device['local_name']})"
        last = end - 1
        span = f"{first}-{last}" if last > first else f"{first}"
        if n_layer is not None and last == n_layer:
            span += " +output"
        rows.append((name, host, span, f"{size / GIB:.2f} / {budget / GIB:.2f}"))
    widths = [max(len(row[column]) for row in rows) for column in range(4)]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows]
    lines.append(f"strategy {plan['strategy']}: --device {','.join(plan['devices'])} "
                 f"--tensor-split {','.join(str(value) for value in plan['tensor_split'])}")
    return lines


class FilterModule:
    """llama.cpp split planning filters."""

    def filters(self):
        return {
            "llama_split_plan": llama_split_plan,
            "llama_split_given": llama_split_given,
            "llama_split_table": llama_split_table,
        }
