#!/usr/bin/env bash
# The Debian packages this machine needs for the make targets (it is the controller of the demo and the suite),
# installed only where missing. One table for all of them:
#   host-packages.sh NEED...         install the packages of these needs that are missing (apt-get, as root)
#   host-packages.sh --list NEED...  print the packages of these needs, one a line (tests/unit/test_host_packages.py
#                                    compares them with what .ci/run installs)
#   host-packages.sh --missing NEED...  print those of them that are missing, installing nothing
# The needs are the make targets' reasons, named in the table's last column. `make` itself is the one thing make
# cannot bring: the README names it (and git, to clone).
set -euo pipefail

# package          probe (true when present)                          need
table=$(cat <<'TABLE'
python3          test -x /usr/bin/python3                            venv
python3-venv     /usr/bin/python3 -c 'import venv, ensurepip'        venv
git              command -v git                                      fixtures
openssh-client   command -v ssh && command -v ssh-keygen             ssh
docker.io        command -v dockerd                                  docker
debootstrap      command -v debootstrap                              image
shellcheck       command -v shellcheck                               sanity
iproute2         command -v tc && command -v ip                      shaping
TABLE
)

mode=install
case "${1:-}" in
  --list) mode=list; shift ;;
  --missing) mode=missing; shift ;;
esac
[ $# -gt 0 ] || { echo "usage: $0 [--list|--missing] NEED..." >&2; exit 2; }

known=$(awk '{print $NF}' <<<"$table" | sort -u)
for need in "$@"; do
  grep -qx -- "$need" <<<"$known" || { echo "host-packages: no need '$need' (one of: $(echo $known))" >&2; exit 2; }
done

missing=()
while read -r package rest; do
  need=${rest##* }
  probe=${rest% *}
  [[ " $* " == *" $need "* ]] || continue
  if [ "$mode" = list ]; then
    echo "$package"
  elif ! bash -c "$probe" >/dev/null 2>&1; then
    missing+=("$package")
  fi
done <<<"$table"

if [ "$mode" = missing ]; then
  [ ${#missing[@]} -eq 0 ] || printf "%s\n" "${missing[@]}"
elif [ ${#missing[@]} -gt 0 ]; then
  echo "host-packages: installing ${missing[*]} from the distribution's packages" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${missing[@]}" >/dev/null
fi
