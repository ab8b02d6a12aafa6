"""The verify steps' report plugin (molecule/shared/suite_report.py) and the suite's reading of it
(tests/test_molecule.py): figures a test records reach the suite's summary, whether the test passes or fails."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))

from test_molecule import measured  # noqa: E402  (after the path)

TESTS = '''
from suite_report import figures


def test_passes():
    figures("load times", ["staged 0.56 s", "direct 1.10 s"])


def test_fails():
    figures("clients through a restart", ["1 client: 0 failed"])
    assert False
'''


def test_recorded_figures_reach_the_summary(tmp_path):
    (tmp_path / "test_sample.py").write_text(TESTS)
    env = dict(os.environ, PYTHONPATH=str(ROOT / "molecule" / "shared"), MOLECULE_SCENARIO_NAME="")
    env.pop("LLAMA_CPU_REPORT", None)  # a report the suite collects is the scenarios', not this sample's
    run = subprocess.run([sys.executable, "-m", "pytest", "-p", "suite_report", "-p", "no:cacheprovider",
                          str(tmp_path / "test_sample.py")], capture_output=True, text=True, cwd=tmp_path, env=env)
    assert run.returncode == 1, run.stdout  # one test failed, and its figures are kept all the same
    assert measured(run.stdout) == ["load times (test_sample.py::test_passes)", "  staged 0.56 s",
                                    "  direct 1.10 s", "clients through a restart (test_sample.py::test_fails)",
                                    "  1 client: 0 failed"]
