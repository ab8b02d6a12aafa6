"""A cluster link at the speed users have, on one machine (the prefill scenario, tools/bench.py's load figures).

The containers of a scenario with `link_address`es also sit on a network of their own (molecule/shared/tasks/
containers.yml): the cluster's link, which the nodes' cluster addresses are on, apart from the network Ansible and the
tests reach them over. Each container's interface on it is one end of a veth pair whose other end is on this machine:
- shaping: a `tbf` qdisc on a worker's host end limits what reaches the worker (netem does not exist in this kernel);
- counting: the host end's counters are the bytes that crossed, whatever a log says. A worker's host end transmits
  what the worker receives; the master's host end receives what the master sends (to every worker together).
"""

import re
import subprocess
import threading
import time
from pathlib import Path

NET = Path("/sys/class/net")


def docker(container, *command):
    return subprocess.run(["docker", "exec", container, *command], capture_output=True, text=True,
                          check=True).stdout


def interface(container, address):
    """The name of `container`'s interface that holds `address`."""
    for line in docker(container, "ip", "-o", "-4", "addr", "show").splitlines():
        match = re.match(r"^\d+:\s+(\S+)\s+inet\s+([\d.]+)/", line)
        if match and match.group(2) == address:
            return match.group(1).split("@")[0]
    raise AssertionError(f"{container} has no interface with {address}")


def host_end(container, address):
    """The host's end of the veth pair whose container end holds `address`."""
    peer = int(docker(container, "cat", f"/sys/class/net/{interface(container, address)}/iflink").strip())
    for device in NET.iterdir():
        try:
            if int((device / "ifindex").read_text()) == peer:
                return device.name
        except (OSError, ValueError):
            continue
    raise AssertionError(f"no interface of this machine has index {peer} ({container}'s end holds {address})")


def shape(device, mbit):
    """At most `mbit` Mbit/s out of `device` (into the container at its other end): tbf, with a bucket that holds a
    64 KiB segment (veth passes segmentation-offloaded packets whole) and 10 ms of traffic."""
    burst = max(128 * 1024, int(mbit * 1e6 / 8 / 100))
    subprocess.run(["tc", "qdisc", "replace", "dev", device, "root", "tbf", "rate", f"{mbit}mbit",
                    "burst", str(burst), "latency", "100ms"], check=True)


def unshape(device):
    subprocess.run(["tc", "qdisc", "del", "dev", device, "root"], capture_output=True, check=False)


def shaped(device):
    """The rate of the tbf on `device`, as tc says it ('100Mbit'), or None."""
    out = subprocess.run(["tc", "qdisc", "show", "dev", device], capture_output=True, text=True).stdout
    match = re.search(r"\btbf\b.*\brate (\S+)", out)
    return match.group(1) if match else None


def counter(device, which):
    """`device`'s statistics counter `which` (tx_bytes, rx_bytes)."""
    return int((NET / device / "statistics" / which).read_text())


class Link:
    """The master's and the workers' host ends: `received(worker)` what crossed into a worker, `sent()` what left the
    master, since the start; a sampler thread (`with link.sampling():`) keeps (time, sent, {worker: received}) every
    `interval` s on this machine's monotonic clock, which is the containers' too (no time namespace)."""

    def __init__(self, master_end, worker_ends):
        self.master_end, self.worker_ends = master_end, dict(worker_ends)
        self.samples = []
        self._stop = threading.Event()

    def now(self):
        return (time.monotonic(), counter(self.master_end, "rx_bytes"),
                {worker: counter(end, "tx_bytes") for worker, end in self.worker_ends.items()})

    def sampling(self, interval=0.2):
        link = self

        class Sampling:
            def __enter__(self):
                link.samples, link._stop = [link.now()], threading.Event()
                self.thread = threading.Thread(target=self.run, daemon=True)
                self.thread.start()
                return link

            def run(self):
                while not link._stop.wait(interval):
                    link.samples.append(link.now())

            def __exit__(self, *failure):
                link._stop.set()
                self.thread.join()
                link.samples.append(link.now())
                return False

        return Sampling()

    def crossed(self, since, until):
        """(sent by the master, {worker: received}) in [since, until] on the monotonic clock: from the last sample at
        or before `since` to the first at or after `until` (the window, and at most one interval more each side)."""
        before = [sample for sample in self.samples if sample[0] <= since] or self.samples[:1]
        after = [sample for sample in self.samples if sample[0] >= until] or self.samples[-1:]
        first, last = before[-1], after[0]
        return last[1] - first[1], {worker: last[2][worker] - first[2][worker] for worker in self.worker_ends}


def main(argv=None):
    """link_bed.py MBIT CONTAINER=ADDRESS...: shape the host end of each container's interface holding ADDRESS."""
    import sys

    args = sys.argv[1:] if argv is None else argv
    mbit = float(args[0])
    for item in args[1:]:
        container, address = item.split("=", 1)
        device = host_end(container, address)
        shape(device, mbit)
        print(f"{container} ({address}): {device} shaped to {shaped(device)}")


if __name__ == "__main__":
    main()
