#!/usr/bin/env bash
# Make sure a Docker engine answers. On a machine without one (no systemd on the host), install the
# distribution's docker.io and start dockerd in the background. Idempotent: does nothing when
# `docker info` already succeeds.
set -euo pipefail

log=${DOCKERD_LOG:-/var/log/dockerd.log}

if docker info >/dev/null 2>&1; then
  exit 0
fi

"$(dirname "$0")/host-packages.sh" docker

if ! pgrep -x dockerd >/dev/null 2>&1; then
  echo "ensure-docker: starting dockerd (log: $log)" >&2
  setsid nohup dockerd >"$log" 2>&1 </dev/null &
fi

for _ in $(seq 1 60); do
  if docker info >/dev/null 2>&1; then
    exit 0
  fi
  sleep 1
done
echo "ensure-docker: dockerd did not answer within 60 s; see $log" >&2
tail -n 20 "$log" >&2 || true
exit 1
