"""The bench report's arithmetic, files and plots (tools/bench.py measures; this module only computes and draws).

Every figure is a ratio measured in one run against its natural reference, with a goal (<= or >=). A run's record
is one JSON document: {"date", "commit", "inventory", "repeat", "figures": {id: figure}}; a figure holds its value,
the numerator and denominator (medians of the runs, with every sample), its goal and verdict, or why it was not
measured. bench/history.jsonl holds one record per line; the report plots each figure over that history.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Goal:
    op: str  # "<=" or ">="
    value: float

    def met(self, ratio: float) -> bool:
        return ratio <= self.value if self.op == "<=" else ratio >= self.value

    def __str__(self) -> str:
        return f"{self.op} {self.value:g}"


@dataclass(frozen=True)
class Spec:
    id: str
    title: str
    numerator: str
    denominator: str
    goal: Goal
    unit: str = "s"


# The figures, in the report's order: what each ratio divides, and its goal.
SPECS = {spec.id: spec for spec in (
    Spec("P1", "converge ÷ bare build", "fresh site.yml on fresh hosts", "bare cmake --build of the same tree",
         Goal("<=", 1.15)),
    Spec("P2b", "rebuild with the compiler cache", "compile of a changed flag, cache warm",
         "fresh compile of the same tree", Goal("<=", 0.5)),
    Spec("P3", "no-op re-run ÷ fresh converge", "second site.yml (changed=0)", "fresh site.yml on fresh hosts",
         Goal("<=", 0.05)),
    Spec("P5", "cluster decode ÷ by hand", "tok/s through the cluster's API", "tok/s of the same binaries by hand",
         Goal(">=", 0.98), unit="tok/s"),
    Spec("P6", "speed split ÷ memory split", "tok/s, llama_split_strategy speed", "tok/s, strategy memory",
         Goal(">=", 1.3), unit="tok/s"),
    Spec("P9", "converge time per added worker", "seconds per worker added (slope)", "1 worker",
         Goal("<=", 10), unit="s/worker"),
    Spec("UP", "upgrade outage ÷ model load", "upgrade.yml's outage (first node stopped -> /health 200)",
         "llama-server's model load (started -> /health 200)",
         Goal("<=", 1.5)),
    # Large models over a shaped link (tools/bench_large.py): a 4.3 GiB model, 200 Mbit/s into each worker.
    Spec("L1", "cold first load ÷ warm load (4.3 GiB, 200 Mbit/s)", "first load, nothing cached (every weight crosses)",
         "load with warm caches (llama-server restarted)", Goal(">=", 2)),
    Spec("L2", "switch outage with pre-fill ÷ warm load", "outage of a switch to another 4.3 GiB model, pre-filled",
         "load with warm caches", Goal("<=", 1.2)),
    Spec("L3", "bytes crossing inside the switch's outage ÷ model size", "bytes into the workers inside the outage",
         "the model's bytes", Goal("<=", 0.01), unit="bytes"),
    Spec("L4", "upgrade outage ÷ warm load (4.3 GiB)", "upgrade.yml's outage (first node stopped -> /health 200)",
         "load with warm caches", Goal("<=", 1.5)),
    Spec("L5", "failed requests through switch and upgrade", "requests that failed", "requests sent",
         Goal("<=", 0), unit="requests"),
    Spec("C1", "failed requests, 32 concurrent clients for 60 s", "requests not answered 200 with tokens",
         "requests sent", Goal("<=", 0), unit="requests"),
    Spec("R1", "two replicas ÷ one, 8 clients back to back", "requests/s with a replica of the model",
         "requests/s of the cluster's own alone", Goal(">=", 1.0), unit="requests/s"),
    Spec("M1", "master memory during a load ÷ model size", "llama-server's peak resident memory, default load mode",
         "the model's bytes", Goal("<=", 0.25), unit="bytes"),
)}


def median(samples):
    if not samples:
        raise ValueError("no samples")
    return statistics.median(samples)


def figure(spec_id, numerator, denominator, **details):
    """A measured figure: numerator and denominator are lists of samples (seconds, tok/s...), medians divided."""
    spec = SPECS[spec_id]
    top, bottom = median(numerator), median(denominator)
    if bottom <= 0:
        raise ValueError(f"{spec_id}: the reference {spec.denominator} measured {bottom}")
    ratio = top / bottom
    return {"id": spec_id, "title": spec.title, "value": round(ratio, 4), "goal": str(spec.goal),
            "met": spec.goal.met(ratio), "numerator": {"what": spec.numerator, "median": round(top, 4),
                                                      "samples": list(numerator)},
            "denominator": {"what": spec.denominator, "median": round(bottom, 4), "samples": list(denominator)},
            "unit": spec.unit, **details}


def slope(points):
    """The least-squares line through points = [(x, y)]: (slope, intercept)."""
    if len({x for x, _ in points}) < 2:
        raise ValueError(f"a slope needs two sizes at least, got {points}")
    xs, ys = [x for x, _ in points], [y for _, y in points]
    mean_x, mean_y = statistics.fmean(xs), statistics.fmean(ys)
    rise = sum((x - mean_x) * (y - mean_y) for x, y in points) / sum((x - mean_x) ** 2 for x in xs)
    return rise, mean_y - rise * mean_x


def slope_figure(spec_id, points, **details):
    """A figure that is a least-squares slope (P9: converge seconds against workers): points = [(x, y)]."""
    spec = SPECS[spec_id]
    try:
        value, intercept = slope(points)
    except ValueError as error:
        raise ValueError(f"{spec_id}: {error}") from None
    return {"id": spec_id, "title": spec.title, "value": round(value, 4), "goal": str(spec.goal),
            "met": spec.goal.met(value), "intercept": round(intercept, 4),
            "points": [list(point) for point in points], "unit": spec.unit, **details}


def skipped(spec_id, reason):
    spec = SPECS[spec_id]
    return {"id": spec_id, "title": spec.title, "value": None, "goal": str(spec.goal), "met": None,
            "skipped": reason}


def record(figures, *, date, commit, inventory, repeat):
    ordered = {spec_id: figures[spec_id] for spec_id in SPECS if spec_id in figures}
    return {"date": date, "commit": commit, "inventory": inventory, "repeat": repeat, "figures": ordered}


def stem(rec):
    return f"{rec['date'][:10]}-{rec['commit'][:7]}"


def write(rec, out_dir):
    """bench/<date>-<commit>.json, the record appended to bench/history.jsonl, the plots and the Markdown report.
    Returns the report's path."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    name = stem(rec)
    (out_dir / f"{name}.json").write_text(json.dumps(rec, indent=2) + "\n")
    with (out_dir / "history.jsonl").open("a") as history:
        history.write(json.dumps(rec, separators=(",", ":")) + "\n")
    plots = {"figures": plot_figures(rec, out_dir / f"{name}-figures.png"),
             "history": plot_history(read_history(out_dir / "history.jsonl"), out_dir / "history.png")}
    if "P9" in rec["figures"] and rec["figures"]["P9"].get("points"):
        plots["P9"] = plot_curve(rec["figures"]["P9"], out_dir / f"{name}-P9.png")
    report = out_dir / f"{name}.md"
    report.write_text(markdown(rec, {key: path.name for key, path in plots.items()}))
    return report


def read_history(path):
    path = Path(path)
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def verdict(fig):
    if fig.get("skipped"):
        return f"not measured: {fig['skipped']}"
    return "met" if fig["met"] else "missed"


def shown(fig):
    if fig.get("value") is None:
        return "–"
    return f"{fig['value']:.2f}" if fig["id"] != "P9" else f"{fig['value']:.1f} s"


def table(rec):
    lines = ["| figure | ratio | goal | verdict | measured |", "|---|---|---|---|---|"]
    for fig in rec["figures"].values():
        if fig.get("skipped"):
            measured = ""
        elif "points" in fig:
            measured = ", ".join(f"{int(x)} workers {y:.0f} s" for x, y in fig["points"])
        else:
            num, den = fig["numerator"], fig["denominator"]
            measured = (f"{num['median']:g} {fig['unit']} ({num['what']}) ÷ {den['median']:g} {fig['unit']} "
                        f"({den['what']})")
        lines.append(f"| {fig['id']} {fig['title']} | {shown(fig)} | {fig['goal']} | {verdict(fig)} | {measured} |")
    return "\n".join(lines)


def markdown(rec, plots):
    parts = [f"# Bench {rec['date']} at {rec['commit'][:12]}", "",
             f"Inventory `{rec['inventory']}`, {rec['repeat']} repetition(s) of each measurement; every figure is a "
             "ratio of two medians measured in this run.", "", table(rec), ""]
    for fig in rec["figures"].values():
        for note in fig.get("notes", []):
            parts.append(f"- {fig['id']}: {note}")
    parts += ["", f"![figures against their goals]({plots['figures']})", "",
              f"![each figure over the history]({plots['history']})", ""]
    if "P9" in plots:
        parts += [f"![converge time against workers]({plots['P9']})", ""]
    return "\n".join(parts)


def _pyplot():
    import matplotlib  # pylint: disable=import-outside-toplevel
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
    return plt


def _save(plt, fig, path):
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return Path(path)


def goal_share(fig):
    """How far a figure is from its goal, as value ÷ goal for <= goals and goal ÷ value for >= goals: below 1 met."""
    spec = SPECS[fig["id"]]
    if spec.goal.op == "<=" and spec.goal.value == 0:
        return 0.0 if fig["value"] <= 0 else float("inf")
    if spec.goal.op == "<=":
        return fig["value"] / spec.goal.value
    return spec.goal.value / fig["value"] if fig["value"] else float("inf")


def plot_figures(rec, path):
    """One bar per measured figure: its distance to the goal (1 = the goal; below is met)."""
    plt = _pyplot()
    measured = [fig for fig in rec["figures"].values() if fig.get("value") is not None]
    fig, axes = plt.subplots(figsize=(7, 3.5))
    names = [item["id"] for item in measured]
    shares = [min(goal_share(item), 10.0) for item in measured]  # a miss of a zero goal is infinitely far: drawn at 10
    axes.bar(names, shares, color=["tab:green" if item["met"] else "tab:red" for item in measured])
    axes.axhline(1.0, color="black", linewidth=1, linestyle="--", label="goal")
    for index, item in enumerate(measured):
        axes.annotate(shown(item), (index, shares[index]), ha="center", va="bottom", fontsize=8)
    axes.set_ylabel("share of the goal (≤ 1 met)")
    axes.set_title(f"{rec['date'][:10]} at {rec['commit'][:7]}")
    axes.legend()
    return _save(plt, fig, path)


def plot_history(history, path):
    """Each figure's value over the history's runs, one panel per figure, its goal as a line."""
    plt = _pyplot()
    ids = [spec_id for spec_id in SPECS if any(rec["figures"].get(spec_id, {}).get("value") is not None
                                               for rec in history)]
    fig, panels = plt.subplots(max(len(ids), 1), 1, figsize=(7, 1.8 * max(len(ids), 1)), squeeze=False)
    for panel, spec_id in zip(panels[:, 0], ids):
        runs = [(index, rec["figures"][spec_id]["value"]) for index, rec in enumerate(history)
                if rec["figures"].get(spec_id, {}).get("value") is not None]
        panel.plot([index for index, _ in runs], [value for _, value in runs], marker="o")
        panel.axhline(SPECS[spec_id].goal.value, color="black", linewidth=1, linestyle="--")
        panel.set_ylabel(spec_id)
        panel.set_xticks(range(len(history)))
        panel.set_xticklabels([f"{rec['date'][5:10]}\n{rec['commit'][:7]}" for rec in history], fontsize=7)
    if not ids:
        panels[0, 0].text(0.5, 0.5, "nothing measured yet", ha="center")
    return _save(plt, fig, path)


def plot_curve(fig_p9, path):
    """P9: converge seconds against the number of workers, with the fitted line."""
    plt = _pyplot()
    points = fig_p9["points"]
    fig, axes = plt.subplots(figsize=(5, 3.5))
    axes.plot([x for x, _ in points], [y for _, y in points], marker="o", label="converge")
    xs = [x for x, _ in points]
    axes.plot(xs, [fig_p9["intercept"] + fig_p9["value"] * x for x in xs], linestyle="--",
              label=f"{fig_p9['value']:.1f} s per worker")
    axes.set_xlabel("workers")
    axes.set_ylabel("fresh converge (s)")
    axes.legend()
    return _save(plt, fig, path)
