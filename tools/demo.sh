#!/usr/bin/env bash
# make demo / make demo-down: a local cluster of three systemd containers deployed by site.yml.
set -euo pipefail
cd "$(dirname "$0")/.."

case "${1:-up}" in
  up)
    ansible-playbook tools/demo-containers.yml
    ansible-playbook site.yml -i inventory/demo
    # The cluster at a glance (make status prints it again at any time).
    ansible-playbook playbooks/status.yml -i inventory/demo
    ;;
  down)
    if command -v ansible-playbook >/dev/null 2>&1 && docker info >/dev/null 2>&1; then
      ansible-playbook tools/demo-containers.yml -e demo_state=absent
    fi
    ;;
  *)
    echo "usage: $0 up|down" >&2
    exit 2
    ;;
esac
