"""The CUDA backend built by the llamacpp role, installed on a second host, and what a CUDA host needs to run it."""

import json
import os
import re
from pathlib import Path

from cluster_helpers import failure_messages, run_playbook

CUDA_LIBRARIES = ("libcudart.so.13", "libcublas.so.13", "libcublasLt.so.13")


def build_info(host):
    return json.loads(host.file("/opt/llama.cpp/current/BUILD-INFO.json").content_string)


def test_the_cuda_build_is_compiled_once_for_both_hosts(builder, node):
    built, installed = build_info(builder), build_info(node)
    assert built == installed
    assert built["backend"] == "cuda"
    for arg in ("-DGGML_CUDA=ON", "-DCMAKE_CUDA_ARCHITECTURES=90", "-DCMAKE_CUDA_COMPILER=/opt/cuda/bin/nvcc",
                "-DCUDAToolkit_ROOT=/opt/cuda",
                "-DGGML_CUDA_NO_VMM=ON", "-DGGML_RPC=ON"):
        assert arg in built["cmake_args"], arg
    ledger = (Path(os.environ["LLAMA_ARTIFACT_CACHE"]) / "builds.log").read_text().splitlines()
    compilations = [line for line in ledger if line.split()[1] == built["build_id"]]
    assert len(compilations) == 1 and compilations[0].split()[4] == "builder", ledger
    print(f"\nCUDA build: {compilations[0]}")  # "... compiled on builder in H:MM:SS"


def test_the_artifact_carries_the_cuda_backend(node):
    libraries = node.check_output("ls /opt/llama.cpp/current/lib")
    assert "libggml-cuda.so" in libraries
    binaries = node.check_output("ls /opt/llama.cpp/current/bin").split()
    assert {"ggml-rpc-server", "llama-server"} <= set(binaries)


def test_what_a_cuda_host_needs_at_run_time(node):
    """The build links NVIDIA's runtime libraries (not carried by the artifact) and nothing else the host lacks:
    ldd resolves every binary and library, the CUDA ones from the host's runtime directory."""
    needed = node.check_output("ldd /opt/llama.cpp/current/lib/libggml-cuda.so")
    for library in CUDA_LIBRARIES:
        assert f"{library} => " in needed, needed
    assert "libcuda.so" not in needed, "GGML_CUDA_NO_VMM: no direct link to the driver"
    ldd = node.check_output("ldd /opt/llama.cpp/current/bin/* /opt/llama.cpp/current/lib/*.so 2>&1")
    assert "not found" not in ldd
    for library in CUDA_LIBRARIES:
        assert re.search(rf"{re.escape(library)} => /opt/nvidia-runtime/lib/{re.escape(library)}", ldd), library


def test_the_build_runs_without_a_gpu_and_says_why_it_has_no_cuda_device(node, builder):
    version = node.run("/opt/llama.cpp/current/bin/llama-server --version")
    assert version.rc == 0 and build_info(node)["commit"][:7] in version.stdout + version.stderr
    listed = node.run("/opt/llama.cpp/current/bin/llama-server --list-devices")
    assert listed.rc == 0
    assert "ggml_cuda_init: failed to initialize CUDA" in listed.stdout + listed.stderr
    assert "CUDA0" not in listed.stdout


def test_preflight_names_what_a_cuda_host_lacks(node):
    """With the runtime check on (the default), each CUDA host without the driver - and, once the runtime
    libraries are gone from the linker's path, without them - is refused, named, before any change."""
    result = run_playbook("playbooks/preflight.yml", "-e", "llamacpp_cuda_runtime_check=true", timeout=600)
    assert result.returncode != 0
    messages = failure_messages(result.stdout)
    assert any(message.startswith("node: llamacpp_backend is cuda, but this host lacks the NVIDIA driver "
                                  "(nvidia-smi). Install") for message in messages), messages
    node.check_output("mv /etc/ld.so.conf.d/cuda.conf /root/cuda.conf && ldconfig")
    try:
        result = run_playbook("playbooks/preflight.yml", "-e", "llamacpp_cuda_runtime_check=true", timeout=600)
    finally:
        node.check_output("mv /root/cuda.conf /etc/ld.so.conf.d/cuda.conf && ldconfig")
    messages = failure_messages(result.stdout)
    assert any(message.startswith("node: llamacpp_backend is cuda, but this host lacks the NVIDIA driver "
                                  "(nvidia-smi), libcudart, libcublas, libcublasLt.") for message in messages), messages
