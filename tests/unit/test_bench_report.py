"""tools/bench_report.py on fixed input: the ratios, verdicts and slope, the files a run writes, and the plots."""

import json
import sys
from pathlib import Path

import pytest
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
import bench_report  # noqa: E402  # pylint: disable=wrong-import-position

GREEN, RED = (44, 160, 44), (214, 39, 40)  # matplotlib's tab:green and tab:red


def run(date="2026-12-05T04:00:00Z", commit="0123456789abcdef", p5=(18.0, 20.0)):
    figures = {
        "P3": bench_report.figure("P3", [9.0, 10.0, 11.0], [240.0, 200.0, 260.0]),
        "P5": bench_report.figure("P5", [p5[0]], [p5[1]]),
        "P9": bench_report.slope_figure("P9", [(3, 100.0), (6, 130.0), (12, 190.0)]),
        "P1": bench_report.skipped("P1", "not measured by this version"),
    }
    return bench_report.record(figures, date=date, commit=commit, inventory="inventory/demo", repeat=3)


def test_a_figure_is_the_ratio_of_the_medians_with_its_verdict():
    p3 = bench_report.figure("P3", [9.0, 10.0, 11.0], [240.0, 200.0, 260.0])
    assert p3["value"] == pytest.approx(10 / 240, abs=1e-4) and p3["met"] is True
    assert p3["numerator"]["samples"] == [9.0, 10.0, 11.0] and p3["denominator"]["median"] == 240.0
    assert bench_report.figure("P3", [13.0], [200.0])["met"] is False  # 0.065 > 0.05
    # A ">=" goal: the cluster at 97 % of the hand-started binaries misses 0.98, at 99 % meets it.
    assert bench_report.figure("P5", [97.0], [100.0])["met"] is False
    assert bench_report.figure("P5", [99.0], [100.0])["met"] is True
    with pytest.raises(ValueError, match="P5: the reference"):
        bench_report.figure("P5", [1.0], [0.0])


def test_the_per_worker_figure_is_the_least_squares_slope():
    p9 = bench_report.slope_figure("P9", [(3, 100.0), (6, 130.0), (12, 190.0)])
    assert p9["value"] == pytest.approx(10.0) and p9["intercept"] == pytest.approx(70.0) and p9["met"] is True
    assert bench_report.slope_figure("P9", [(3, 100.0), (9, 196.0)])["met"] is False  # 16 s per worker
    with pytest.raises(ValueError, match="two sizes"):
        bench_report.slope_figure("P9", [(3, 100.0), (3, 110.0)])


def test_the_record_lists_the_figures_in_the_report_s_order():
    rec = run()
    assert list(rec["figures"]) == ["P1", "P3", "P5", "P9"]
    assert rec["figures"]["P1"]["value"] is None and rec["figures"]["P1"]["met"] is None


def test_the_table_shows_each_figure_its_goal_and_verdict():
    table = bench_report.table(run()).splitlines()
    assert table[0] == "| figure | ratio | goal | verdict | measured |"
    assert table[2] == "| P1 converge ÷ bare build | – | <= 1.15 | not measured: not measured by this version |  |"
    assert table[3].startswith("| P3 no-op re-run ÷ fresh converge | 0.04 | <= 0.05 | met | 10 s (")
    assert table[4].startswith("| P5 cluster decode ÷ by hand | 0.90 | >= 0.98 | missed | 18 tok/s (")
    assert table[5] == ("| P9 converge time per added worker | 10.0 s | <= 10 | met | 3 workers 100 s, 6 workers "
                        "130 s, 12 workers 190 s |")


def test_a_run_writes_its_record_report_and_plots_and_appends_the_history(tmp_path):
    first = bench_report.write(run(), tmp_path)
    second = bench_report.write(run(date="2026-12-06T04:00:00Z", commit="fedcba9876543210", p5=(19.8, 20.0)),
                                tmp_path)
    assert first.name == "2026-12-05-0123456.md" and second.name == "2026-12-06-fedcba9.md"
    assert json.loads((tmp_path / "2026-12-05-0123456.json").read_text())["figures"]["P5"]["value"] == 0.9
    history = bench_report.read_history(tmp_path / "history.jsonl")
    assert [rec["commit"][:7] for rec in history] == ["0123456", "fedcba9"]
    text = second.read_text()
    assert "| P5 cluster decode ÷ by hand | 0.99 | >= 0.98 | met |" in text
    for image in ("2026-12-06-fedcba9-figures.png", "history.png", "2026-12-06-fedcba9-P9.png"):
        assert f"]({image})" in text
        assert (tmp_path / image).stat().st_size > 0


def colours(path):
    with Image.open(path) as image:
        return image.size, {colour for _, colour in image.convert("RGB").getcolors(maxcolors=1 << 24)}


def test_the_figures_plot_draws_met_figures_green_and_missed_ones_red(tmp_path):
    size, seen = colours(bench_report.plot_figures(run(), tmp_path / "missed.png"))
    assert size == (700, 350) and GREEN in seen and RED in seen  # P3, P9 met; P5 missed
    _, seen = colours(bench_report.plot_figures(run(p5=(20.0, 20.0)), tmp_path / "met.png"))
    assert GREEN in seen and RED not in seen


def test_the_history_plot_has_a_panel_per_figure_measured_in_it(tmp_path):
    history = [run(), run(date="2026-12-06T04:00:00Z")]
    size, _ = colours(bench_report.plot_history(history, tmp_path / "history.png"))
    assert size == (700, 3 * 180)  # P3, P5 and P9; P1 was never measured
    size, _ = colours(bench_report.plot_history([], tmp_path / "empty.png"))
    assert size == (700, 180)


def test_goal_share_is_below_one_exactly_when_the_goal_is_met():
    for fig in run()["figures"].values():
        if fig["value"] is not None:
            assert (bench_report.goal_share(fig) <= 1) == fig["met"], fig["id"]


def test_a_goal_of_zero_is_met_by_zero_only():
    """L5 (failed requests ÷ requests, goal <= 0): its distance to the goal is 0 when met, infinite when not."""
    met = bench_report.figure("L5", [0], [120])
    missed = bench_report.figure("L5", [2], [120])
    assert met["met"] and not missed["met"]
    assert bench_report.goal_share(met) == 0.0 and bench_report.goal_share(missed) == float("inf")
