"""A git-sourced build of an older tree: verified commit, names and flags read from the tree, built once."""

import json
import os
from pathlib import Path

import pytest
import testinfra

COMMIT = os.environ["LLAMA_GIT_0_3_30_COMMIT"]
NODES = ("builder", "node")


@pytest.fixture(scope="module", params=NODES)
def node(request):
    return testinfra.get_host(f"docker://molecule-build_git-{request.param}")


def build_info(host):
    return json.loads(host.file("/opt/llama.cpp/current/BUILD-INFO.json").content_string)


def test_build_info_describes_the_tree(node):
    info = build_info(node)
    assert info["commit"] == COMMIT
    assert info["source"] == "git"
    assert len(info["source_sha256"]) == 64
    assert info["backend"] == "cpu"
    assert "-DGGML_RPC=ON" in info["cmake_args"]
    # Read from this older tree, not assumed: the worker binary's old name, protocol 4, the old mmap flag.
    assert info["rpc_server_binary"] == "rpc-server"
    assert info["rpc_proto"] == "4.0.1"
    assert info["no_mmap_args"] == ["--no-mmap"]


def test_binaries_run_and_report_the_commit(node):
    bindir = f"/opt/llama.cpp/{COMMIT}/bin"
    assert node.file(f"{bindir}/rpc-server").is_file
    version = node.run(f"{bindir}/llama-server --version")
    assert COMMIT in version.stdout + version.stderr
    # The libraries come with the build (RPATH $ORIGIN/../lib): nothing is missing.
    assert "not found" not in node.check_output(f"ldd {bindir}/llama-server {bindir}/rpc-server")


def test_only_the_builder_has_a_toolchain(node):
    has_compiler = node.exists("cmake")
    assert has_compiler == (node.check_output("hostname") == "builder")


def test_compiled_once_for_both_nodes():
    ids = {build_info(testinfra.get_host(f"docker://molecule-build_git-{name}"))["build_id"] for name in NODES}
    assert len(ids) == 1
    ledger = Path(os.environ["LLAMA_ARTIFACT_CACHE"]) / "builds.log"
    compiled = [line for line in ledger.read_text().splitlines() if line.split()[1] in ids]
    assert len(compiled) == 1 and " compiled on builder " in compiled[0], compiled
