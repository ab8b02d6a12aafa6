"""CPU seconds used by a scenario's containers so far: the suite's summary (tests/test_molecule.py) and the verify
steps' per-test figures (suite_report.py) read the same cgroup counters."""

import os
import re
import subprocess


def container_ids(name):
    """The full ids of the scenario's containers (a restarted container keeps its id and cgroup)."""
    return subprocess.run(["docker", "ps", "-aq", "--no-trunc", "--filter", f"label=scenario={name}"],
                          capture_output=True, text=True, check=False).stdout.split()


def containers_cpu(name, ids=None):
    """CPU seconds used by the scenario's containers so far (their cgroups, v1 or v2), systemd and services included;
    `ids`: container_ids(name) read once by a caller that asks often."""
    seconds = 0.0
    for ident in container_ids(name) if ids is None else ids:
        for path, scale in ((f"/sys/fs/cgroup/cpuacct/docker/{ident}/cpuacct.usage", 1e9),
                            (f"/sys/fs/cgroup/cpu,cpuacct/docker/{ident}/cpuacct.usage", 1e9),
                            (f"/sys/fs/cgroup/system.slice/docker-{ident}.scope/cpu.stat", 1e6)):
            if os.path.exists(path):
                with open(path, encoding="ascii") as usage:
                    text = usage.read()
                seconds += int(re.search(r"(?:usage_usec )?(\d+)", text).group(1)) / scale
                break
    return seconds
