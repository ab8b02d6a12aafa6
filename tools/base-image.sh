#!/usr/bin/env bash
# Build (once per machine) the minimal Debian image with systemd as PID 1 that the molecule scenarios and the
# demo run on: Debian 12 (bookworm) by default, or the release named as the first argument (trixie: Debian 13,
# for the mixed scenario). No registry is reachable, so the root filesystem comes from the
# Debian mirror through debootstrap and is turned into an image with `docker import`.
#
# The image is keyed on this script's content: a change to the script builds a new image, an
# unchanged script reuses the one already present. Prints the image reference on stdout.
#
# Minimal on purpose: systemd, python3 and iproute2 (Ansible itself and its network facts), procps
# (testinfra's process checks) and openssh-server: the scenarios reach their hosts over SSH, as an operator's
# controller does (it also costs a fifth of the CPU of `docker exec` per command here). Host keys are made at
# each container's first boot, so no two containers share them.
# Everything else a role needs, the role installs. One addition for speed: base-image/llama_test_pyzip_cache.py,
# which caches the code Python compiles for Ansible's zipped modules (see that file); nothing else differs from
# a Debian host.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
cache_dir=${LLAMA_CACHE_DIR:-/var/cache/llamacpp-rpc-cluster}
suite=${1:-bookworm}
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
packages=systemd,systemd-sysv,python3,iproute2,procps,ca-certificates,openssh-server
case "$suite" in
  bookworm) repo=llamacpp-rpc/debian12-systemd ;;
  trixie) repo=llamacpp-rpc/debian13-systemd ;;
  *) echo "base-image: no image for Debian release '$suite' (bookworm or trixie)" >&2; exit 2 ;;
esac

key=$( (cat "$0" "$here/base-image/llama_test_pyzip_cache.py"; [ "$suite" = bookworm ] || echo "$suite") \
  | sha256sum | cut -c1-12)
image="$repo:$key"

"$here/ensure-docker.sh"

if docker image inspect "$image" >/dev/null 2>&1; then
  echo "$image"
  exit 0
fi

"$here/host-packages.sh" image

mkdir -p "$cache_dir"
tarball="$cache_dir/base-$key.tar"
if [ ! -s "$tarball" ]; then
  rootfs=$(mktemp -d "$cache_dir/rootfs.XXXXXX")
  trap 'rm -rf "$rootfs"' EXIT
  echo "base-image: debootstrap $suite from $mirror (a few minutes, once per machine)" >&2
  debootstrap --variant=minbase --include="$packages" "$suite" "$rootfs" "$mirror" >&2

  cat >"$rootfs/etc/apt/sources.list" <<SOURCES
deb $mirror $suite main
deb $mirror $suite-updates main
deb http://deb.debian.org/debian-security $suite-security main
SOURCES
  # Units that make no sense in a container, or that wait for hardware that is not there.
  for unit in getty.target console-getty.service systemd-udevd.service systemd-udev-trigger.service \
      systemd-firstboot.service systemd-modules-load.service sys-kernel-config.mount \
      sys-kernel-debug.mount sys-fs-fuse-connections.mount systemd-remount-fs.service; do
    ln -sf /dev/null "$rootfs/etc/systemd/system/$unit"
  done
  : >"$rootfs/etc/machine-id"
  # SSH: host keys of its own for each container (made before sshd starts), and room for the sessions that
  # Ansible and testinfra open at once over one multiplexed connection (sshd's default is 10).
  rm -f "$rootfs"/etc/ssh/ssh_host_*
  cat >"$rootfs/etc/systemd/system/ssh-host-keys.service" <<'UNIT'
[Unit]
Description=Make this host's SSH host keys
Before=ssh.service
ConditionPathExists=!/etc/ssh/ssh_host_ed25519_key

[Service]
Type=oneshot
ExecStart=/usr/bin/ssh-keygen -A
UNIT
  mkdir -p "$rootfs/etc/systemd/system/ssh.service.wants"
  ln -sf ../ssh-host-keys.service "$rootfs/etc/systemd/system/ssh.service.wants/ssh-host-keys.service"
  echo "MaxSessions 64" >"$rootfs/etc/ssh/sshd_config.d/llama-test.conf"
  install -m 0644 "$here/base-image/llama_test_pyzip_cache.py" "$rootfs/usr/lib/python3/dist-packages/"
  echo "import llama_test_pyzip_cache" >"$rootfs/usr/lib/python3/dist-packages/llama-test-pyzip-cache.pth"
  rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/archives/*.deb
  tar -C "$rootfs" --numeric-owner -cf "$tarball.tmp" .
  mv "$tarball.tmp" "$tarball"
fi

docker import \
  --change 'ENV container=docker' \
  --change 'CMD ["/lib/systemd/systemd"]' \
  "$tarball" "$image" >&2
echo "$image"
