"""The scenarios' test order (molecule/shared/cluster_helpers.py): every test file has its place in ORDER, and a
chain of tests that each start from the state the one before left stops at its first broken link."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CONFTEST = '''
from cluster_helpers import Chain, order_tests

ORDER = {order!r}
CHAIN = Chain()


def pytest_collection_modifyitems(items):
    order_tests(items, ORDER)


def pytest_runtest_setup(item):
    CHAIN.setup(item)


def pytest_runtest_makereport(item, call):
    CHAIN.report(item, call)
'''


def run(tmp_path, order, files):
    (tmp_path / "conftest.py").write_text(CONFTEST.format(order=order))
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    env = dict(os.environ, PYTHONPATH=str(ROOT / "molecule" / "shared"), MOLECULE_INVENTORY_FILE="/nonexistent")
    return subprocess.run([sys.executable, "-m", "pytest", "-v", "-rs", "-p", "no:cacheprovider", str(tmp_path)],
                          capture_output=True, text=True, cwd=tmp_path, env=env)


def test_the_chain_stops_at_its_first_broken_link(tmp_path):
    result = run(tmp_path, ["test_b.py", "test_a.py"], {
        "test_a.py": "def test_third():\n    pass\n",
        "test_b.py": "def test_first():\n    pass\n\n\ndef test_second():\n    assert False\n",
    })
    lines = [line for line in result.stdout.splitlines() if "::test_" in line and line.startswith("test_")]
    assert [line.split()[0].split("::")[1] + " " + line.split()[1] for line in lines] == [
        "test_first PASSED", "test_second FAILED", "test_third SKIPPED"], result.stdout
    assert "the chain broke at test_b.py::test_second" in result.stdout


def test_a_test_file_without_a_place_is_an_error(tmp_path):
    result = run(tmp_path, ["test_a.py"], {"test_a.py": "def test_one():\n    pass\n",
                                           "test_new.py": "def test_two():\n    pass\n"})
    assert result.returncode != 0
    assert "test files without a place in the scenario's ORDER (tests/conftest.py): ['test_new.py']" in (
        result.stdout + result.stderr)
