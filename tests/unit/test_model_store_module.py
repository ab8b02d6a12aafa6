"""Unit tests of plugins/modules/llama_model_store.py (role llama_storage), run through its main() on real files."""

import hashlib
import importlib.util
import json
import os
import sys
from pathlib import Path

from ansible_collections.llamacpp.rpc_cluster.plugins.module_utils import llama_gguf
import pytest
from ansible.module_utils.testing import patch_module_args
from test_llama_gguf import write_llama

LIBRARY = Path(__file__).resolve().parents[2] / "plugins" / "modules"


@pytest.fixture()
def store(monkeypatch):
    return importlib.import_module("ansible_collections.llamacpp.rpc_cluster.plugins.modules.llama_model_store")


def run(store, capsys, **args):
    with patch_module_args(args), pytest.raises(SystemExit):
        store.main()
    return json.loads(capsys.readouterr().out)


def stage(store, capsys, src, stage_dir, sha256=""):
    """inspect -> copy each chunk -> finish, as the role does; the last result."""
    inspected = run(store, capsys, step="inspect", src=str(src), stage_dir=str(stage_dir), sha256=sha256,
                    chunk_mib=1)
    for chunk in inspected["chunks"]:
        assert run(store, capsys, step="copy", stage_dir=str(stage_dir), chunk=chunk)["changed"]
    if not inspected["chunks"]:
        return inspected
    return run(store, capsys, step="finish", src=str(src), stage_dir=str(stage_dir), sha256=sha256)


def digest(path):
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def test_stage_copies_verifies_and_records_then_does_nothing(store, capsys, tmp_path):
    src = tmp_path / "share" / "model.gguf"
    src.parent.mkdir()
    write_llama(src, n_layer=2)
    result = stage(store, capsys, src, tmp_path / "staged", sha256=digest(src))
    served = result["served"]
    assert served["ready"] and served["path"] == str(tmp_path / "staged" / digest(src)[:12] / "model.gguf")
    assert digest(served["path"]) == digest(src) and served["identity"] == digest(src)
    assert not (tmp_path / "staged" / ".incoming").exists()
    again = run(store, capsys, step="inspect", src=str(src), stage_dir=str(tmp_path / "staged"))
    assert again["chunks"] == [] and again["served"] == served


def test_new_content_at_the_same_path_is_staged_again(store, capsys, tmp_path):
    src = tmp_path / "model.gguf"
    write_llama(src, n_layer=2)
    first = stage(store, capsys, src, tmp_path / "staged")["served"]["path"]
    write_llama(src, n_layer=3)
    os.utime(src, ns=(1, 1))
    second = stage(store, capsys, src, tmp_path / "staged")["served"]["path"]
    assert second != first and digest(second) == digest(src)


def test_content_staged_under_another_name_is_reused_with_this_name(store, capsys, tmp_path):
    """Same content, another file name: the content's directory gets this name too (the bug: -m pointed at a
    file that did not exist there)."""
    one, two = tmp_path / "one.gguf", tmp_path / "two.gguf"
    write_llama(one, n_layer=2)
    two.write_bytes(one.read_bytes())
    stage(store, capsys, one, tmp_path / "staged")
    path = stage(store, capsys, two, tmp_path / "staged")["served"]["path"]
    assert Path(path).is_file() and Path(path).name == "two.gguf"
    assert Path(path).parent == tmp_path / "staged" / digest(one)[:12]


def test_a_wrong_checksum_leaves_nothing_staged(store, capsys, tmp_path):
    src = tmp_path / "model.gguf"
    write_llama(src, n_layer=2)
    result = stage(store, capsys, src, tmp_path / "staged", sha256="0" * 64)
    assert result["failed"] and f"has sha256 {digest(src)}, not llama_model_sha256 {'0' * 64}" in result["msg"]
    assert list((tmp_path / "staged").iterdir()) == []


def test_a_truncated_model_is_refused_before_any_copy(store, capsys, tmp_path):
    src = tmp_path / "model.gguf"
    write_llama(src, n_layer=2)
    with open(src, "r+b") as handle:
        handle.truncate(src.stat().st_size - 100)
    result = run(store, capsys, step="inspect", src=str(src), stage_dir=str(tmp_path / "staged"))
    assert result["failed"] and result["problem"] == "gguf" and "truncated GGUF" in result["msg"]


def test_direct_mode_hashes_once_per_change(store, capsys, tmp_path):
    src = tmp_path / "model.gguf"
    write_llama(src, n_layer=2)
    wrong = run(store, capsys, step="inspect", src=str(src), stage_dir=str(tmp_path / "s"), mode="direct",
                sha256="1" * 64)
    assert wrong["failed"] and wrong["problem"] == "store"
    good = run(store, capsys, step="inspect", src=str(src), stage_dir=str(tmp_path / "s"), mode="direct",
               sha256=digest(src))
    assert good["record_needed"] and good["served"]["path"] == str(src)
    run(store, capsys, step="record", src=str(src), stage_dir=str(tmp_path / "s"), mode="direct",
        sha256=digest(src))
    again = run(store, capsys, step="inspect", src=str(src), stage_dir=str(tmp_path / "s"), mode="direct",
                sha256=digest(src))
    assert not again["record_needed"]


def test_network_filesystems(store):
    for fstype in ("nfs", "nfs4", "cifs", "smb3", "fuse.sshfs", "fuse.rclone", "9p"):
        assert store.is_network(fstype), fstype
    for fstype in ("ext4", "xfs", "overlay", "tmpfs", "fuseblk", "fuse.lxcfs"):
        assert not store.is_network(fstype), fstype


def test_the_mount_holding_a_path(store, tmp_path):
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text(
        "22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n"
        "40 22 0:50 / /mnt/models ro,relatime shared:2 - fuse.sshfs nas:/srv rw\n"
        "41 22 0:51 / /mnt/models\\040old ro - nfs4 nas:/old rw\n")
    assert store.fstype_of("/mnt/models/x.gguf", mountinfo) == ("fuse.sshfs", "/mnt/models")
    assert store.fstype_of("/mnt/models old/x.gguf", mountinfo) == ("nfs4", "/mnt/models old")
    assert store.fstype_of("/mnt/modelsx/y", mountinfo) == ("ext4", "/")


def test_prune_keeps_the_newest_and_the_protected(store, capsys, tmp_path):
    staged = tmp_path / "staged"
    for age, name in enumerate(("newest", "middle", "oldest", "running")):
        (staged / name).mkdir(parents=True)
        (staged / name / "m.gguf").write_bytes(b"x")
        os.utime(staged / name, (1000 - age, 1000 - age))
    result = run(store, capsys, step="prune", stage_dir=str(staged), keep=2,
                 protect=[str(staged / "running/m.gguf")])
    assert sorted(Path(path).name for path in result["removed"]) == ["middle", "oldest"]
    assert sorted(path.name for path in staged.iterdir() if path.is_dir()) == ["newest", "running"]


def test_a_file_served_direct_is_still_copied_when_staged(store, capsys, tmp_path):
    """A direct record names no copy: staging the same file later copies it (the bug: the record's path, the
    source itself, was taken for a current copy)."""
    src = tmp_path / "model.gguf"
    write_llama(src, n_layer=2)
    run(store, capsys, step="record", src=str(src), stage_dir=str(tmp_path / "s"), mode="direct", sha256="")
    served = stage(store, capsys, src, tmp_path / "s")["served"]
    assert served["path"] == str(tmp_path / "s" / digest(src)[:12] / "model.gguf")
