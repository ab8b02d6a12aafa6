#!/bin/sh
# Worker side of the link measurement (role llama_link), run through Ansible's script module:
#   serve MASTER ADDRESS PORT LIFETIME
#       Admit MASTER -> ADDRESS:PORT/tcp in each active firewall (ufw; firewalld, runtime only, in every active
#       zone and the default one) that does not admit it yet, then start an iperf3 server for one test on
#       ADDRESS:PORT, as a transient unit that stops itself after LIFETIME seconds whatever happens.
#   stop
#       Stop that server and take back exactly the rules serve added, nothing else.
# What serve adds is recorded in STATE (on tmpfs) as it is added, so that stop, or the next serve after an
# interrupted run, removes it. Errors: one line on stderr, exit status > 0.
set -u
UNIT=llama-link-iperf3.service
STATE=/run/llama-link-firewall

ufw_active() {
  command -v ufw >/dev/null 2>&1 && ufw status 2>/dev/null | grep -q '^Status: active'
}

firewalld_active() {
  command -v firewall-cmd >/dev/null 2>&1 && firewall-cmd --state >/dev/null 2>&1
}

listening() {
  ss -Hltn "sport = :$1" | grep -q .
}

stop() {
  systemctl stop "$UNIT" 2>/dev/null
  systemctl reset-failed "$UNIT" 2>/dev/null
  [ -f "$STATE" ] || return 0
  status=0
  # One rule a line: `ufw - <ufw rule words>` or `firewalld <zone> <rich rule>`.
  while read -r kind zone rule; do
    # shellcheck disable=SC2086 # the rule is ufw's words, split on purpose
    case $kind in
      ufw) ufw delete $rule >/dev/null || status=1 ;;
      firewalld) firewall-cmd --zone="$zone" --remove-rich-rule="$rule" >/dev/null || status=1 ;;
    esac
  done <"$STATE"
  [ "$status" -eq 0 ] || { echo "could not remove every rule listed in $STATE" >&2; return 1; }
  rm -f "$STATE"
}

serve() {
  master=$1 address=$2 port=$3 lifetime=$4
  stop || exit 1
  if listening "$port"; then
    holder=$(ss -Hltnp "sport = :$port" | sed -n 's/.*users:(("\([^"]*\)".*/\1/p' | head -n 1)
    echo "port $port is in use on the worker by ${holder:-another program}" >&2
    exit 2
  fi
  : >"$STATE"
  if ufw_active; then
    rule="allow from $master to $address port $port proto tcp"
    # shellcheck disable=SC2086 # the rule is ufw's words, split on purpose
    out=$(ufw $rule 2>&1) || { echo "ufw $rule: $out" >&2; exit 3; }
    case $out in
      *Skipping*) ;;  # the user's own rule: not ours to remove
      *) echo "ufw - $rule" >>"$STATE" ;;
    esac
  fi
  if firewalld_active; then
    rich="rule family=\"ipv4\" source address=\"$master/32\" destination address=\"$address/32\""
    rich="$rich port port=\"$port\" protocol=\"tcp\" accept"
    zones=$({ firewall-cmd --get-active-zones | grep -v '^[[:space:]]'; firewall-cmd --get-default-zone; } | sort -u)
    for zone in $zones; do
      firewall-cmd --zone="$zone" --query-rich-rule="$rich" >/dev/null 2>&1 && continue
      out=$(firewall-cmd --zone="$zone" --add-rich-rule="$rich" 2>&1) || {
        echo "firewall-cmd --zone=$zone --add-rich-rule: $out" >&2; exit 3; }
      echo "firewalld $zone $rich" >>"$STATE"
    done
  fi
  systemd-run --quiet --collect --unit="$UNIT" --property=RuntimeMaxSec="$lifetime" \
    iperf3 --server --one-off --bind "$address" --port "$port" || exit 4
  tries=0
  until listening "$port"; do
    if [ "$tries" -ge 100 ] || ! systemctl --quiet is-active "$UNIT"; then
      why=$(journalctl --unit="$UNIT" --lines=1 --output=cat --no-pager 2>/dev/null)
      echo "iperf3 --server did not listen on $address:$port within 10 s: ${why:-no log}" >&2
      exit 4
    fi
    tries=$((tries + 1))
    sleep 0.1
  done
}

case ${1:-} in
  serve) shift; serve "$@" ;;
  stop) stop ;;
  *) echo "usage: $0 serve MASTER ADDRESS PORT LIFETIME | stop" >&2; exit 64 ;;
esac
