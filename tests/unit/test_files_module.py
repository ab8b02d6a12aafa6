"""Unit tests of plugins/modules/llama_files.py, run through its main() on real files (owner: the user running them)."""

import importlib
import grp
import json
import os
import pwd
import stat
from pathlib import Path

import pytest
from ansible.module_utils.testing import patch_module_args
from conftest import load

LIBRARY = Path(__file__).resolve().parents[2] / "plugins" / "modules"
OWNER = pwd.getpwuid(os.getuid()).pw_name
GROUP = grp.getgrgid(os.getgid()).gr_name

llama_files = importlib.import_module("ansible_collections.llamacpp.rpc_cluster.plugins.modules.llama_files")


def run(capsys, files, check=False, diff=False):
    args = {"files": [dict({"owner": OWNER, "group": GROUP, "mode": "0644"}, **item) for item in files],
            "_ansible_check_mode": check, "_ansible_diff": diff}
    with patch_module_args(args), pytest.raises(SystemExit):
        llama_files.main()
    return json.loads(capsys.readouterr().out)


def mode(path):
    return stat.S_IMODE(os.stat(path).st_mode)


def test_new_files_are_written_and_a_second_run_changes_nothing(tmp_path, capsys):
    files = [{"path": str(tmp_path / "a.conf"), "content": "a = 1\n"},
             {"path": str(tmp_path / "b.sh"), "content": "#!/bin/sh\n", "mode": "0755"}]
    result = run(capsys, files)
    assert result["changed"] and result["changed_files"] == [item["path"] for item in files]
    assert (tmp_path / "a.conf").read_text() == "a = 1\n" and mode(tmp_path / "a.conf") == 0o644
    assert mode(tmp_path / "b.sh") == 0o755
    again = run(capsys, files)
    assert not again["changed"] and again["changed_files"] == []
    # No temporary file left behind.
    assert sorted(os.listdir(tmp_path)) == ["a.conf", "b.sh"]


def test_only_the_file_that_differs_is_rewritten(tmp_path, capsys):
    same, other = tmp_path / "same", tmp_path / "other"
    same.write_text("x\n")
    other.write_text("old\n")
    os.chmod(same, 0o644)
    os.chmod(other, 0o644)
    inode = same.stat().st_ino
    result = run(capsys, [{"path": str(same), "content": "x\n"}, {"path": str(other), "content": "new\n"}])
    assert result["changed_files"] == [str(other)]
    assert other.read_text() == "new\n" and same.stat().st_ino == inode


def test_a_wrong_mode_alone_is_set_in_place(tmp_path, capsys):
    path = tmp_path / "unit"
    path.write_text("u\n")
    os.chmod(path, 0o600)
    inode = path.stat().st_ino
    result = run(capsys, [{"path": str(path), "content": "u\n"}], diff=True)
    assert result["changed_files"] == [str(path)] and mode(path) == 0o644
    assert path.stat().st_ino == inode  # not rewritten
    assert "mode 0644" in result["diff"][0]["before_header"]


def test_check_mode_says_what_would_change_and_writes_nothing(tmp_path, capsys):
    path = tmp_path / "c.conf"
    path.write_text("old\n")
    result = run(capsys, [{"path": str(path), "content": "new\n"}, {"path": str(tmp_path / "n"), "content": "n\n"}],
                 check=True, diff=True)
    assert result["changed"] and result["changed_files"] == [str(path), str(tmp_path / "n")]
    assert path.read_text() == "old\n" and not (tmp_path / "n").exists()
    assert [(item["before"], item["after"]) for item in result["diff"]] == [("old\n", "new\n"), ("", "n\n")]


def test_a_symlink_is_replaced_by_a_file_and_its_target_left_alone(tmp_path, capsys):
    target, link = tmp_path / "target", tmp_path / "link"
    target.write_text("t\n")
    link.symlink_to(target)
    run(capsys, [{"path": str(link), "content": "t\n"}])
    assert not link.is_symlink() and link.read_text() == "t\n" and target.read_text() == "t\n"


@pytest.mark.parametrize("bad, message", [
    ({"owner": "no-such-user-llama"}, "no user 'no-such-user-llama'"),
    ({"group": "no-such-group-llama"}, "no group 'no-such-group-llama'"),
    ({"path": "/nonexistent-dir-llama/x"}, "its directory does not exist"),
])
def test_a_missing_owner_or_directory_fails_before_anything_is_written(tmp_path, capsys, bad, message):
    first = tmp_path / "first"
    result = run(capsys, [{"path": str(first), "content": "1\n"},
                          dict({"path": str(tmp_path / "second"), "content": "2\n"}, **bad)])
    assert result["failed"] and message in result["msg"]
    assert not first.exists()


def test_check_mode_reports_a_file_whose_directory_or_group_a_real_run_makes_first(tmp_path, capsys):
    """On a fresh host in check mode, the directory task and the package that makes the group did not run."""
    files = [{"path": str(tmp_path / "new-dir" / "unit"), "content": "u\n"},
             {"path": str(tmp_path / "gate.lua"), "content": "g\n", "group": "no-such-group-llama"}]
    result = run(capsys, files, check=True)
    assert not result.get("failed") and result["changed_files"] == [item["path"] for item in files]
    assert not (tmp_path / "gate.lua").exists()
