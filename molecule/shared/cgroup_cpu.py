"""CPU seconds used by a scenario's containers so far: the suite's summary (tests/test_molecule.py) and the verify
steps' per-test figures (cpu_per_test.py) read the same cgroup counters."""

import os
import re
import subprocess


def containers_cpu(name):
    """CPU seconds used by the scenario's containers so far (their cgroups, v1 or v2), systemd and services included."""
    ids = subprocess.run(["docker", "ps", "-aq", "--no-trunc", "--filter", f"label=scenario={name}"],
                         capture_output=True, text=True, check=False).stdout.split()
    seconds = 0.0
    for ident in ids:
        for path, scale in ((f"/sys/fs/cgroup/cpuacct/docker/{ident}/cpuacct.usage", 1e9),
                            (f"/sys/fs/cgroup/cpu,cpuacct/docker/{ident}/cpuacct.usage", 1e9),
                            (f"/sys/fs/cgroup/system.slice/docker-{ident}.scope/cpu.stat", 1e6)):
            if os.path.exists(path):
                with open(path, encoding="ascii") as usage:
                    text = usage.read()
                seconds += int(re.search(r"(?:usage_usec )?(\d+)", text).group(1)) / scale
                break
    return seconds
