"""What this machine must have for the README's commands: `make test` installs every Debian package its tests need
(tools/host-packages.sh, called from the Makefile's recipes and the scripts they run), so `.ci/run` installs nothing
a user running `make test` would lack (issue 40: CI was green while the README's own command failed without
shellcheck)."""

import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HOST_PACKAGES = ROOT / "tools" / "host-packages.sh"
# What make needs to start: the one package .ci/run may install that make test cannot bring itself.
TO_START_MAKE = {"make"}


def installed_by_script(text):
    """The packages a shell script installs with apt-get: the words of its `apt-get install` commands, with the
    bash arrays they expand (`need+=(git)` … `apt-get install "${need[@]}"`) resolved."""
    arrays = {}
    for name, words in re.findall(r"^\s*(\w+)\+?=\(([^)]*)\)", text, re.M):
        arrays.setdefault(name, []).extend(shlex.split(words))
    packages = set()
    for line in text.splitlines():
        if line.lstrip().startswith("#") or not re.search(r"\bapt-get\b.*\binstall\b", line):
            continue
        lexer = shlex.shlex(line.split("apt-get", 1)[1], posix=True, punctuation_chars=";&|<>(){}")
        lexer.wordchars += "${}[]@-.+:"
        words = list(lexer)[1:]
        for word in words:
            if word in (";", "&&", "||", "|", ">", "<", ")", "}"):
                break
            expanded = re.fullmatch(r"\$\{(\w+)\[@\]\}", word)
            if expanded:
                packages.update(arrays.get(expanded.group(1), []))
            elif not word.startswith("-"):
                packages.add(word)
    return packages


def needs_in(commands, seen=None):
    """The needs passed to tools/host-packages.sh by these shell commands and by the project's scripts they run,
    followed into those scripts (ensure-docker.sh from base-image.sh, say)."""
    seen = set() if seen is None else seen
    needs = set()
    for command in commands:
        for args in re.findall(r"host-packages\.sh\"?((?:\s+[a-z][\w-]*)+)", command):
            needs.update(args.split())
        for script in re.findall(r"(?:tools/|\$here/|\"\$\(dirname \"\$0\"\)/)([\w-]+\.sh)", command):
            path = ROOT / "tools" / script
            if path.exists() and path not in seen:
                seen.add(path)
                needs |= needs_in(path.read_text().splitlines(), seen)
    return needs


def host_packages(*args):
    done = subprocess.run([str(HOST_PACKAGES), *args], capture_output=True, text=True, check=True)
    return set(done.stdout.split())


def make_test_packages():
    """Every package `make test` installs where it is missing: the needs in the recipes `make -n -B test` would run
    (all of them, as on a fresh machine), and in the scripts those run."""
    env = {key: value for key, value in os.environ.items() if key not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    done = subprocess.run(["make", "-n", "-B", "--no-print-directory", "test"], cwd=ROOT, env=env,
                          capture_output=True, text=True, check=True)
    needs = needs_in(done.stdout.splitlines())
    assert needs, f"make -n -B test names no host-packages.sh need:\n{done.stdout}"
    return host_packages("--list", *sorted(needs))


@pytest.fixture(scope="module")
def make_test():
    return make_test_packages()


def test_make_test_installs_every_package_the_suite_needs(make_test):
    """Among them, shellcheck (ansible-test sanity's test), git (the git fixture), python3-venv (the virtual
    environment), the SSH client (the scenarios' connection), Docker and debootstrap (the images), tc (the prefill
    scenario's shaped link)."""
    assert {"shellcheck", "git", "python3-venv", "openssh-client", "docker.io", "debootstrap", "iproute2"} <= make_test


def test_ci_installs_nothing_make_test_does_not(make_test):
    ci = installed_by_script((ROOT / ".ci" / "run").read_text())
    extra = ci - make_test - TO_START_MAKE
    assert not extra, (f".ci/run installs {sorted(extra)}, which `make test` does not: a user following the README "
                       "would lack them. Add them to tools/host-packages.sh under the need of the make target that "
                       "uses them, and remove them from .ci/run.")


def test_the_comparison_catches_a_package_added_to_ci_alone(make_test):
    """The check above, on .ci/run with one more package: in its own install command and in an array."""
    text = (ROOT / ".ci" / "run").read_text()
    alone = text.replace("apt-get install -y -qq make", "apt-get install -y -qq make jq")
    assert alone != text
    assert installed_by_script(alone) - make_test - TO_START_MAKE == {"jq"}
    as_array = 'need=()\nneed+=(shellcheck)\nneed+=(jq)\napt-get install -y -qq "${need[@]}" >/dev/null\n'
    assert installed_by_script(as_array) - make_test - TO_START_MAKE == {"jq"}


def test_the_readme_names_what_make_cannot_bring():
    """The prerequisites the README gives are those .ci/run installs to start make, and git (to clone)."""
    readme = (ROOT / "README.md").read_text()
    named = set()
    for line in readme.splitlines():
        if re.match(r"\s*apt-get install\b", line):
            named |= installed_by_script(line)
    ci = installed_by_script((ROOT / ".ci" / "run").read_text())
    assert ci <= named <= ci | {"git"}, f"the README names {sorted(named)}; .ci/run installs {sorted(ci)}"


def test_every_installed_package_passes_its_probe():
    """A package that is installed is not reported missing (or make would install it again at every run)."""
    every = host_packages("--list", "venv", "fixtures", "ssh", "docker", "image", "sanity", "shaping")
    installed = {package for package in every
                 if subprocess.run(["dpkg-query", "-W", "-f=${Status}", package], capture_output=True,
                                   text=True).stdout.endswith("installed")}
    assert installed, "none of the packages is installed: make test has not run here"
    wrongly_missing = installed & host_packages("--missing", "venv", "fixtures", "ssh", "docker", "image", "sanity",
                                                "shaping")
    assert not wrongly_missing, f"installed, yet reported missing: {sorted(wrongly_missing)}"


def test_an_unknown_need_is_refused():
    done = subprocess.run([str(HOST_PACKAGES), "sanitty"], capture_output=True, text=True)
    assert done.returncode == 2
    assert "no need 'sanitty'" in done.stderr and "sanity" in done.stderr
