#!/usr/bin/env bash
# Installs a HeraldLab agent on a Debian 12 or Raspberry Pi OS (bookworm) node.
#
#   sudo agents/install.sh --binary .build/release/herald-lab --name node1 \
#        --enrolment node1.enrol [--coordinator https://coord.lab:8700] [--adapter hci0] [--tags pi4,usb] [--port 8701]
#
# --enrolment is the file `herald-lab agents enrol node1 --host NODE-ADDRESS --out node1.enrol`
# made on the coordinator host: the agent's own credential (bound to its name), the lab CA and
# a certificate for the node, so the agent serves TLS and checks the coordinator's. A lab
# without enrolment can still give the shared --token-file lab.token instead (plain HTTP).
#
# Installs the runtime packages (BlueZ, D-Bus, libbluetooth, libssl), the binary, the config in
# /etc/herald-lab, the credentials (keys mode 0640, group heraldlab) and the systemd unit, then
# starts the agent.
# Build the binary on the node or on a machine of the same architecture (make release).
set -euo pipefail

binary="" name="" coordinator="" token_file="" enrolment="" adapter="hci0" tags="" port="8701" host="0.0.0.0" radio="bluez"
while [ $# -gt 0 ]; do
  case "$1" in
    --binary) binary=$2; shift 2 ;;
    --name) name=$2; shift 2 ;;
    --coordinator) coordinator=$2; shift 2 ;;
    --token-file) token_file=$2; shift 2 ;;
    --enrolment) enrolment=$2; shift 2 ;;
    --adapter) adapter=$2; shift 2 ;;
    --tags) tags=$2; shift 2 ;;
    --port) port=$2; shift 2 ;;
    --host) host=$2; shift 2 ;;
    --radio) radio=$2; shift 2 ;;
    -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
    *) echo "install.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
[ "$(id -u)" = 0 ] || { echo "install.sh: run as root (sudo)" >&2; exit 2; }
for v in binary name; do
  [ -n "${!v}" ] || { echo "install.sh: --${v//_/-} is required (see --help)" >&2; exit 2; }
done
[ -x "$binary" ] || { echo "install.sh: $binary is not an executable; build it with make release" >&2; exit 2; }
if [ -n "$enrolment" ]; then
  [ -z "$token_file" ] || { echo "install.sh: give --enrolment or --token-file, not both" >&2; exit 2; }
  [ -f "$enrolment" ] && [ -s "$enrolment" ] || { echo "install.sh: enrolment file $enrolment is empty or missing" >&2; exit 2; }
  if [ -z "$coordinator" ]; then
    # The enrolment names the coordinator it came from (JSON, "/" written as "\/").
    coordinator=$(sed -n 's/.*"coordinator":"\([^"]*\)".*/\1/p' "$enrolment" | sed 's#\\/#/#g')
  fi
elif [ -n "$token_file" ]; then
  [ -s "$token_file" ] || { echo "install.sh: token file $token_file is empty or missing" >&2; exit 2; }
else
  echo "install.sh: --enrolment FILE (from herald-lab agents enrol) or --token-file FILE is required" >&2; exit 2
fi
[ -n "$coordinator" ] || { echo "install.sh: --coordinator is required (the enrolment names none)" >&2; exit 2; }
case "$name" in *[!A-Za-z0-9._-]*|.*|"") echo "install.sh: --name may hold only letters, digits, '-', '_' and '.'" >&2; exit 2 ;; esac

here=$(cd "$(dirname "$0")" && pwd)
. /etc/os-release
case "${ID:-}" in debian|raspbian) ;; *) echo "install.sh: warning: tested on Debian and Raspberry Pi OS, this is ${ID:-unknown}" >&2 ;; esac

apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bluez dbus libbluetooth3 libcurl4 libsqlite3-0 libssl3 ca-certificates

id heraldlab >/dev/null 2>&1 || useradd --system --home /var/lib/herald-lab --shell /usr/sbin/nologin heraldlab
getent group bluetooth >/dev/null && usermod -aG bluetooth heraldlab

install -m 0755 "$binary" /usr/local/bin/herald-lab
install -d -m 0750 -o root -g heraldlab /etc/herald-lab
if [ -n "$enrolment" ]; then
  # The agent's own credential, the lab CA, its certificate and key, readable by the agent only.
  /usr/local/bin/herald-lab enrol "$enrolment" --dir /etc/herald-lab
  enrolled=$(sed -n 's/.*"name":"\([^"]*\)".*/\1/p' /etc/herald-lab/agent.json)
  [ "$enrolled" = "$name" ] || { echo "install.sh: the enrolment is for agent $enrolled, not $name" >&2; exit 2; }
  chgrp heraldlab /etc/herald-lab/agent.json /etc/herald-lab/key.pem /etc/herald-lab/cert.pem /etc/herald-lab/ca.pem
  chmod 0640 /etc/herald-lab/agent.json /etc/herald-lab/key.pem
  rm -f /etc/herald-lab/token
  auth="--credentials /etc/herald-lab"
else
  install -m 0640 -o root -g heraldlab "$token_file" /etc/herald-lab/token
  auth="--token-file /etc/herald-lab/token"
fi
cat > /etc/herald-lab/agent.env <<ENV
AGENT_NAME=$name
AGENT_HOST=$host
AGENT_PORT=$port
AGENT_RADIO=$radio
AGENT_ADAPTER=$adapter
AGENT_TAGS=${tags:-none}
COORDINATOR_URL=$coordinator
AGENT_AUTH=$auth
ENV
install -d -m 0750 -o heraldlab -g heraldlab /var/lib/herald-lab

# Advertising interval and TX power need bluetoothd's experimental interfaces on BlueZ 5.66.
if ! grep -q -- "-E" /lib/systemd/system/bluetooth.service 2>/dev/null; then
  install -d /etc/systemd/system/bluetooth.service.d
  cat > /etc/systemd/system/bluetooth.service.d/heraldlab.conf <<'DROPIN'
[Service]
ExecStart=
ExecStart=/usr/libexec/bluetooth/bluetoothd -E
DROPIN
fi

install -m 0644 "$here/herald-lab-agent.service" /etc/systemd/system/herald-lab-agent.service
systemctl daemon-reload
systemctl restart bluetooth
systemctl enable --now herald-lab-agent
echo "install.sh: agent $name installed; status: systemctl status herald-lab-agent; logs: journalctl -u herald-lab-agent -f"
