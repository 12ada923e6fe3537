#!/usr/bin/env bash
# Installs the HeraldLab coordinator, and the air (the simulated radio agents with --radio sim
# attach to), on one Debian 12/13 host from the herald-lab package (`make deb` builds it):
#
#   sudo agents/install-coordinator.sh --deb herald-lab_*.deb --host coord.lab \
#        [--port 8700] [--air-port 8702] [--no-air]
#
# --host NAME is the name (or address) agents and the operator reach this host at; repeat it for
# each (a name and an address). The first time, it makes the lab's CA and this host's credentials
# in /etc/herald-lab/coordinator (`herald-lab ca init`; kept on later runs), then writes
# /etc/herald-lab/coordinator.env and air.env, and starts herald-lab-air and
# herald-lab-coordinator (units from the package). The coordinator is given the air's address.
# It prints what the operator's machine needs: ca.pem (to trust the lab) and operator.token
# (the operator's credential), and how to enrol agents. --stage DIR writes the settings under DIR
# instead, touching nothing else (no package, CA or systemd): for tests and for review.
set -euo pipefail

deb="" hosts=() port="8700" air_port="8702" air="yes" stage="" binary=""
fail() { echo "install-coordinator.sh: $*" >&2; exit 2; }
while [ $# -gt 0 ]; do
  case "$1" in -h|--help|--no-air) ;; -*) [ $# -ge 2 ] || fail "$1 needs a value (see --help)" ;; esac
  case "$1" in
    --deb) deb=$2; shift 2 ;;
    --host) hosts+=("$2"); shift 2 ;;
    --port) port=$2; shift 2 ;;
    --air-port) air_port=$2; shift 2 ;;
    --no-air) air=""; shift ;;
    --stage) stage=$2; shift 2 ;;
    --binary) binary=$2; shift 2 ;; # with --stage: the herald-lab that makes the CA (tests)
    -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
    *) echo "install-coordinator.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
[ -n "$stage" ] || [ "$(id -u)" = 0 ] || fail "run as root (sudo), or give --stage DIR"
[ ${#hosts[@]} -gt 0 ] || fail "--host NAME is required: the name or address agents and the operator reach this host at"
for h in "${hosts[@]}"; do
  [[ "$h" =~ ^[A-Za-z0-9.:-]{1,253}$ ]] && [[ "$h" != -* ]] || fail "--host \"$h\": a host name or an IP address"
done
for p in "$port" "$air_port"; do
  case "$p" in ''|*[!0-9]*) fail "--port and --air-port must be numbers from 1 to 65535, not \"$p\"" ;; esac
  [ "$p" -ge 1 ] && [ "$p" -le 65535 ] || fail "--port and --air-port must be numbers from 1 to 65535, not $p"
done
[ "$port" != "$air_port" ] || [ -z "$air" ] || fail "--port and --air-port must differ"
if [ -n "$stage" ]; then
  [ -z "$deb" ] || fail "--stage writes files only; it cannot install a package"
  [ -n "$binary" ] && [ -x "$binary" ] || fail "--stage needs --binary PATH (the herald-lab that makes the CA)"
else
  [ -n "$deb" ] || fail "--deb FILE (the herald-lab package, from make deb) is required"
  [ -f "$deb" ] || fail "package $deb is missing (make deb builds dist/herald-lab_VERSION_ARCH.deb)"
  case "$deb" in *.deb) ;; *) fail "--deb $deb: expected a .deb file" ;; esac
  case "$deb" in /*) ;; *) deb=$PWD/$deb ;; esac
  binary=/usr/bin/herald-lab
fi

root=${stage%/}
etc=$root/etc/herald-lab
cred=$etc/coordinator
if [ -z "$stage" ]; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$deb"
fi
mkdir -p "$etc"
if [ -f "$cred/ca.pem" ]; then
  echo "install-coordinator.sh: keeping the lab CA and credentials in $cred"
else
  args=()
  for h in "${hosts[@]}"; do args+=(--host "$h"); done
  "$binary" ca init --dir "$cred" "${args[@]}" >/dev/null
fi
air_address=${hosts[0]}:$air_port
case "${hosts[0]}" in *:*) air_address="[${hosts[0]}]:$air_port" ;; esac
cat > "$etc/coordinator.env" <<ENV
# HeraldLab coordinator (herald-lab-coordinator.service), written by install-coordinator.sh
COORDINATOR_HOST=0.0.0.0
COORDINATOR_PORT=$port
COORDINATOR_AIR=$air_address
COORDINATOR_ARGS=
ENV
if [ -n "$air" ]; then
  cat > "$etc/air.env" <<ENV
# HeraldLab air (herald-lab-air.service), written by install-coordinator.sh
AIR_HOST=0.0.0.0
AIR_PORT=$air_port
AIR_ARGS=
ENV
fi
url="https://${hosts[0]}:$port"
case "${hosts[0]}" in *:*) url="https://[${hosts[0]}]:$port" ;; esac

if [ -z "$stage" ]; then
  # The coordinator (user heraldlab) signs enrolments with the CA key and keeps the enrolled
  # agents' store (agents.sqlite) in this folder: it owns it, nobody else reads it.
  chown -R heraldlab:heraldlab "$cred"
  chmod 0700 "$cred"
  chmod 0600 "$cred"/*
  chgrp heraldlab "$etc/coordinator.env"
  [ -z "$air" ] || { chgrp heraldlab "$etc/air.env"; chmod 0640 "$etc/air.env"; }
  chmod 0640 "$etc/coordinator.env"
  if [ ! -d /run/systemd/system ]; then
    echo "install-coordinator.sh: systemd is not running here: herald-lab-air and herald-lab-coordinator were installed, not started"
  else
  systemctl daemon-reload
  if [ -n "$air" ]; then systemctl enable herald-lab-air; systemctl restart herald-lab-air; fi
  systemctl enable herald-lab-coordinator
  systemctl restart herald-lab-coordinator
  fi
fi
echo "install-coordinator.sh: coordinator at $url${air:+, air at $air_address}"
echo "install-coordinator.sh: the operator's machine needs a folder holding copies of $cred/ca.pem and $cred/operator.token:"
echo "  herald-lab run PLAN --coordinator $url --credentials FOLDER   (or export HERALDLAB_CREDENTIALS=FOLDER)"
echo "install-coordinator.sh: enrol each agent here, then copy NAME.enrol to its node:"
echo "  sudo herald-lab agents enrol NAME --host NODE-ADDRESS --out NAME.enrol --coordinator $url --credentials $cred"
