"""tools/fixtures.py: the llama.cpp tree taken out of an sdist, on the Python that runs the suite (the distribution's
3.11.2 on Debian 12 has no tarfile extraction filters: `make fixtures` once failed there on a fresh machine)."""

import io
import subprocess
import tarfile

import pytest
from conftest import ROOT, load

fixtures = load("fixtures", ROOT / "tools" / "fixtures.py")
TOP = "llama_cpp_python-0.0.0"
MEMBERS = {
    f"{TOP}/pyproject.toml": b"[project]\n",
    f"{TOP}/vendor/llama.cpp/CMakeLists.txt": b"project(llama.cpp)\n",
    f"{TOP}/vendor/llama.cpp/.git": b"gitdir: ../../.git/modules/llama.cpp\n",
    f"{TOP}/vendor/llama.cpp/tools/rpc/CMakeLists.txt": b"set(TARGET rpc-server)\n",
}


@pytest.fixture
def sdist(tmp_path, monkeypatch):
    """Writes a small stand-in for a llama-cpp-python sdist, which fixtures.sdist() then returns."""
    path = tmp_path / f"{TOP}.tar.gz"

    def write(members):
        with tarfile.open(path, "w:gz") as archive:
            for name, data in members.items():
                member = tarfile.TarInfo(name)
                member.size = len(data)
                archive.addfile(member, io.BytesIO(data))

    monkeypatch.setattr(fixtures, "sdist", lambda version: path)
    return write


def test_the_vendored_tree_alone_is_extracted(sdist, tmp_path):
    sdist(MEMBERS)
    work = tmp_path / "work"
    tree = fixtures.vendored_tree("0.0.0", work)
    assert tree == work / TOP / "vendor" / "llama.cpp"
    assert (tree / "CMakeLists.txt").read_text() == "project(llama.cpp)\n"
    assert (tree / "tools" / "rpc" / "CMakeLists.txt").is_file()
    assert not (tree / ".git").exists()  # the submodule pointer points nowhere outside the sdist
    assert not (work / TOP / "pyproject.toml").exists()


def test_a_member_that_would_leave_the_directory_is_refused(sdist, tmp_path):
    sdist({**MEMBERS, f"{TOP}/vendor/llama.cpp/../../../../../escaped": b"outside\n"})
    with pytest.raises(subprocess.CalledProcessError):  # GNU tar: "Member name contains '..'"
        fixtures.vendored_tree("0.0.0", tmp_path / "deep" / "work")
    assert not (tmp_path / "escaped").exists()
