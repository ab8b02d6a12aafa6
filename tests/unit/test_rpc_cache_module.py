"""Unit tests of plugins/modules/llama_rpc_cache.py, run through its main() against real files."""

import importlib
import json
import os
from pathlib import Path

import pytest
from ansible.module_utils.testing import patch_module_args
from conftest import load

LIBRARY = Path(__file__).resolve().parents[2] / "plugins" / "modules"
MIB = 1024 * 1024
DAY = 86400
NOW = 1_700_000_000.0

llama_rpc_cache = importlib.import_module("ansible_collections.llamacpp.rpc_cluster.plugins.modules.llama_rpc_cache")


def _run_module(capsys, args):
    """Run the module's main() with `args`; return its JSON result."""
    with patch_module_args(args), pytest.raises(SystemExit):
        llama_rpc_cache.main()
    return json.loads(capsys.readouterr().out)


def _entry(rpc_dir, name, mib, mtime, atime=None):
    """A sparse cache entry of `mib` MiB last modified at `mtime` (and accessed at `atime`, default mtime)."""
    rpc_dir.mkdir(parents=True, exist_ok=True)
    path = rpc_dir / name
    with open(path, "wb") as handle:
        handle.truncate(mib * MIB)
    os.utime(path, (mtime if atime is None else atime, mtime))
    return path


def _names(rpc_dir):
    return sorted(item.name for item in rpc_dir.iterdir())


@pytest.fixture
def cache(tmp_path):
    """A cache of four 10 MiB entries; `b` was written long ago but read recently, `c` and `d` tie."""
    rpc_dir = tmp_path / "rpc"
    _entry(rpc_dir, "aaaaaaaaaaaaaaaa", 10, NOW - 40 * DAY)
    _entry(rpc_dir, "bbbbbbbbbbbbbbbb", 10, NOW - 50 * DAY, atime=NOW - 1 * DAY)
    _entry(rpc_dir, "dddddddddddddddd", 10, NOW - 20 * DAY)
    _entry(rpc_dir, "cccccccccccccccc", 10, NOW - 20 * DAY)
    return tmp_path


def test_cap_removes_oldest_last_use_first_ties_by_name(cache, capsys):
    result = _run_module(capsys, {"path": str(cache), "max_mib": 15})
    # last use = max(atime, mtime): a (40 days) < c = d (20 days, c first by name) < b (read a day ago)
    assert result["removed"] == ["aaaaaaaaaaaaaaaa", "cccccccccccccccc", "dddddddddddddddd"]
    assert result["changed"] is True
    assert result["removed_bytes"] == 30 * MIB
    assert (result["entries"], result["bytes"], result["max_bytes"]) == (1, 10 * MIB, 15 * MIB)
    assert _names(cache / "rpc") == ["bbbbbbbbbbbbbbbb"]
    assert result["summary"] == f"rpc cache {cache}: 1 entry, 10 MiB of 15 MiB cap; removed 3 (30 MiB)"


def test_cap_stops_as_soon_as_the_total_fits(cache, capsys):
    result = _run_module(capsys, {"path": str(cache), "max_mib": 30})
    assert result["removed"] == ["aaaaaaaaaaaaaaaa"]
    assert (result["entries"], result["bytes"]) == (3, 30 * MIB)
    assert "aaaaaaaaaaaaaaaa" not in _names(cache / "rpc")


def test_within_the_cap_nothing_changes(cache, capsys):
    result = _run_module(capsys, {"path": str(cache), "max_mib": 40})
    assert result["changed"] is False and result["removed"] == [] and result["removed_bytes"] == 0
    assert (result["entries"], result["bytes"]) == (4, 40 * MIB)
    assert len(_names(cache / "rpc")) == 4
    assert result["summary"] == f"rpc cache {cache}: 4 entries, 40 MiB of 40 MiB cap; nothing to remove"


def test_no_cap_keeps_everything(cache, capsys):
    result = _run_module(capsys, {"path": str(cache)})
    assert result["changed"] is False and result["max_bytes"] == 0
    assert (result["entries"], result["bytes"]) == (4, 40 * MIB)
    assert result["summary"] == f"rpc cache {cache}: 4 entries, 40 MiB, no cap; nothing to remove"


def test_unused_since_removes_entries_last_used_before_it(cache, capsys):
    result = _run_module(capsys, {"path": str(cache), "unused_since": NOW - 30 * DAY})
    # b was written 50 days ago but read a day ago: still in use
    assert result["removed"] == ["aaaaaaaaaaaaaaaa"]
    assert _names(cache / "rpc") == ["bbbbbbbbbbbbbbbb", "cccccccccccccccc", "dddddddddddddddd"]
    assert (result["entries"], result["bytes"], result["removed_bytes"]) == (3, 30 * MIB, 10 * MIB)


def test_unused_since_first_then_the_cap(cache, capsys):
    result = _run_module(capsys, {"path": str(cache), "unused_since": NOW - 30 * DAY, "max_mib": 25})
    assert result["removed"] == ["aaaaaaaaaaaaaaaa", "cccccccccccccccc"]
    assert _names(cache / "rpc") == ["bbbbbbbbbbbbbbbb", "dddddddddddddddd"]


def test_unused_since_keeps_an_entry_used_exactly_then(cache, capsys):
    result = _run_module(capsys, {"path": str(cache), "unused_since": NOW - 40 * DAY})
    assert result["changed"] is False and len(_names(cache / "rpc")) == 4


def test_check_mode_removes_nothing_but_reports(cache, capsys):
    args = {"path": str(cache), "max_mib": 15, "unused_since": NOW - 30 * DAY, "_ansible_check_mode": True}
    result = _run_module(capsys, args)
    assert result["changed"] is True
    assert result["removed"] == ["aaaaaaaaaaaaaaaa", "cccccccccccccccc", "dddddddddddddddd"]
    assert (result["entries"], result["bytes"], result["removed_bytes"]) == (1, 10 * MIB, 30 * MIB)
    assert len(_names(cache / "rpc")) == 4
    assert result["summary"].endswith("; would remove 3 (30 MiB)")


@pytest.mark.parametrize("where", ["no cache directory", "no rpc directory"])
def test_missing_directory_is_an_empty_cache(tmp_path, capsys, where):
    path = tmp_path / "missing" if where == "no cache directory" else tmp_path
    result = _run_module(capsys, {"path": str(path), "max_mib": 1, "unused_since": NOW})
    assert result["changed"] is False and "failed" not in result
    assert (result["entries"], result["bytes"], result["removed"]) == (0, 0, [])
    assert result["summary"] == f"rpc cache {path}: 0 entries, 0 B of 1.0 MiB cap; nothing to remove"
    assert not (path / "rpc").exists()


def test_subdirectories_and_symlinks_are_untouched(tmp_path, capsys):
    cache = tmp_path / "cache"
    rpc_dir = cache / "rpc"
    _entry(rpc_dir, "aaaaaaaaaaaaaaaa", 10, NOW - 10 * DAY)
    nested = _entry(rpc_dir / "sub", "bbbbbbbbbbbbbbbb", 10, NOW - 90 * DAY)
    outside = _entry(tmp_path / "elsewhere", "cccccccccccccccc", 10, NOW - 90 * DAY)
    (rpc_dir / "cccccccccccccccc").symlink_to(outside)
    (rpc_dir / "dir-link").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    os.utime(rpc_dir / "cccccccccccccccc", (NOW - 90 * DAY, NOW - 90 * DAY), follow_symlinks=False)

    result = _run_module(capsys, {"path": str(cache), "max_mib": 0, "unused_since": NOW})
    assert result["removed"] == ["aaaaaaaaaaaaaaaa"]
    assert (result["entries"], result["bytes"]) == (0, 0)
    assert _names(rpc_dir) == ["cccccccccccccccc", "dir-link", "sub"]
    assert (rpc_dir / "cccccccccccccccc").is_symlink() and outside.is_file() and nested.is_file()


def test_symlinks_and_subdirectories_are_not_counted_against_the_cap(tmp_path, capsys):
    cache = tmp_path / "cache"
    rpc_dir = cache / "rpc"
    _entry(rpc_dir, "aaaaaaaaaaaaaaaa", 10, NOW)
    _entry(rpc_dir / "sub", "bbbbbbbbbbbbbbbb", 10, NOW - DAY)
    (rpc_dir / "cccccccccccccccc").symlink_to(_entry(tmp_path, "big", 100, NOW - DAY))
    result = _run_module(capsys, {"path": str(cache), "max_mib": 10})
    assert result["changed"] is False
    assert (result["entries"], result["bytes"]) == (1, 10 * MIB)


def test_rpc_that_is_a_file_fails(tmp_path, capsys):
    (tmp_path / "rpc").write_text("not a directory")
    result = _run_module(capsys, {"path": str(tmp_path)})
    assert result["failed"] is True
    assert result["msg"] == f"{tmp_path / 'rpc'} is not a directory"


def test_negative_max_mib_fails_naming_the_inventory_variable(cache, capsys):
    result = _run_module(capsys, {"path": str(cache), "max_mib": -1})
    assert result["failed"] is True
    assert "llama_rpc_cache_max_mib" in result["msg"] and "must be 0 or more" in result["msg"]
    assert result["msg"].endswith("got -1")
    assert len(_names(cache / "rpc")) == 4


@pytest.mark.parametrize("count, text", [
    (0, "0 B"), (1023, "1023 B"), (1536, "1.5 KiB"), (512 * MIB, "512 MiB"),
    (1288490188, "1.2 GiB"), (4096 * MIB, "4.0 GiB"), (12 * 1024 * MIB, "12 GiB"),
])
def test_human_bytes(count, text):
    assert llama_rpc_cache.human_bytes(count) == text


def test_summary_line_as_documented():
    line = llama_rpc_cache.summary_line("/var/cache/llama.cpp", 12, 1288490188, 4096 * MIB, 3, 512 * MIB, False)
    assert line == "rpc cache /var/cache/llama.cpp: 12 entries, 1.2 GiB of 4.0 GiB cap; removed 3 (512 MiB)"
