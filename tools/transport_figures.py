#!/usr/bin/env python3
"""Plain vs TLS on the running demo cluster (`make demo`): model load time and decode speed, side by side.

Switches the demo's workers to llama_rpc_transport=tls with site.yml, measures, switches back to plain and
measures again (medians of 5, molecule/shared/cluster_helpers.measure_serving), then prints one table.
Usage: .venv/bin/python tools/transport_figures.py   (after `make demo`)
"""

import sys
from pathlib import Path

import testinfra

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "molecule" / "shared"))
from cluster_helpers import measure_serving, run_playbook  # noqa: E402

INVENTORY = str(ROOT / "inventory" / "demo")


def converge(transport):
    result = run_playbook("site.yml", "-e", f"llama_rpc_transport={transport}", inventory=INVENTORY, timeout=1800)
    if result.returncode != 0:
        sys.exit(f"site.yml with llama_rpc_transport={transport} failed:\n{(result.stdout + result.stderr)[-4000:]}")


def main():
    master = testinfra.get_host("docker://llama-demo-master")
    figures = {}
    for transport in ("tls", "plain"):  # the demo is left as its inventory says: plain
        converge(transport)
        figures[transport] = measure_serving(master)
    print(f"{'transport':<10} {'model load (s)':>15} {'decode (tokens/s)':>18}")
    for transport in ("plain", "tls"):
        found = figures[transport]
        print(f"{transport:<10} {found['load_s']:>15.2f} {found['decode_tps']:>18.1f}")
    print(f"tls/plain: load {figures['tls']['load_s'] / figures['plain']['load_s']:.2f}x, "
          f"decode {figures['tls']['decode_tps'] / figures['plain']['decode_tps']:.2f}x")


if __name__ == "__main__":
    main()
