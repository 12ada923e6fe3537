#!/usr/bin/env bash
# Installs HeraldLab agents on a Debian 12 or Raspberry Pi OS (bookworm) node: one agent per
# dongle, each an instance of the systemd template herald-lab-agent@.service with its own name,
# port, data folder and adapter (chosen by its address, which survives reboots and re-plugging).
#
# The software comes from the package (`make deb` builds it; it needs no Swift on the node):
# --deb herald-lab_VERSION_ARCH.deb installs it with apt (binary, units, udev rule, user), then this
# script writes each agent's settings and credentials and starts it. --binary PATH (or a name on
# PATH) installs a bare binary instead, for development machines that have the Swift runtime.
#
# A host with a hub of dongles (dongles.conf: one line "NAME ADDRESS [TAGS]" per dongle; make it
# with `herald-lab dongles --conf PREFIX` and edit the names to match the labels on the dongles):
#
#   sudo agents/install.sh --deb herald-lab_*.deb --dongles dongles.conf \
#        --enrolments enrol/ [--coordinator https://coord.lab:8700] [--port 8701] [--tags pi4]
#
# --enrolments is a folder holding NAME.enrol for every dongle's agent, each made on the
# coordinator host by `herald-lab agents enrol NAME --host NODE-ADDRESS --out NAME.enrol`. A lab
# without enrolment gives the shared --token-file lab.token instead (plain HTTP).
#
# One dongle, as before:
#
#   sudo agents/install.sh --deb herald-lab_*.deb --name node1 --enrolment node1.enrol \
#        [--adapter 00:1A:7D:DA:71:13] [--tags pi4] [--port 8701]
#
# --radio bluez (the default) drives a dongle through BlueZ; --radio sim attaches the agent to the
# lab's simulated air instead (no dongle; --name, and --adapter is ignored): a simulated lab's
# agents must be installed with --radio sim, or plans with radio sim will not get them.
# --host ADDRESS is where the agent listens (default 0.0.0.0: the coordinator calls it at the
# address its registration came from).
#
# Installs the runtime packages (BlueZ, D-Bus, libbluetooth, libcurl, libsqlite), the binary, one
# /etc/herald-lab/agents/NAME.env and credentials folder /etc/herald-lab/agents/NAME/ per agent
# (keys mode 0640, group heraldlab), the template unit, a udev rule letting the agents reset
# their USB dongles (sysfs authorized), then starts herald-lab-agent@NAME for every dongle and
# stops instances no longer listed. --stage DIR writes every file under DIR instead and touches
# nothing else (no packages, users, udev or systemd): for tests and for review.
# Each enrolment is checked before anything is installed: it must be for the agent's name and
# for this host (one of its certificate's hosts is this machine's name or address, or one given
# with --node-host HOST); otherwise nothing installed is touched.
set -euo pipefail

binary="" deb="" name="" coordinator="" token_file="" enrolment="" enrolments="" dongles="" adapter="" tags="" port="8701" host="0.0.0.0" radio="bluez" stage="" node_hosts=""
fail() { echo "install.sh: $*" >&2; exit 2; }
while [ $# -gt 0 ]; do
  case "$1" in -h|--help|--no-air) ;; -*) [ $# -ge 2 ] || fail "$1 needs a value (see --help)" ;; esac
  case "$1" in
    --binary) binary=$2; shift 2 ;;
    --deb) deb=$2; shift 2 ;;
    --name) name=$2; shift 2 ;;
    --coordinator) coordinator=$2; shift 2 ;;
    --token-file) token_file=$2; shift 2 ;;
    --enrolment) enrolment=$2; shift 2 ;;
    --enrolments) enrolments=$2; shift 2 ;;
    --dongles) dongles=$2; shift 2 ;;
    --adapter) adapter=$2; shift 2 ;;
    --tags) tags=$2; shift 2 ;;
    --port) port=$2; shift 2 ;;
    --host) host=$2; shift 2 ;;
    --radio) radio=$2; shift 2 ;;
    --stage) stage=$2; shift 2 ;;
    --node-host) node_hosts="$node_hosts $2"; shift 2 ;;
    -h|--help) sed -n '2,40p' "$0"; exit 0 ;;
    *) echo "install.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
[ -n "$stage" ] || [ "$(id -u)" = 0 ] || fail "run as root (sudo), or give --stage DIR"
if [ -n "$deb" ]; then
  [ -z "$binary" ] || fail "give --deb FILE or --binary PATH, not both"
  [ -z "$stage" ] || fail "--stage writes files only; it cannot install a package (give --binary PATH with --stage)"
  [ -f "$deb" ] || fail "package $deb is missing (make deb builds dist/herald-lab_VERSION_ARCH.deb)"
  case "$deb" in *.deb) ;; *) fail "--deb $deb: expected a .deb file" ;; esac
else
  [ -n "$binary" ] || fail "--deb FILE (the herald-lab package) or --binary PATH is required (see --help)"
  # A bare name is looked up on PATH, as a shell would (the systemd unit needs a path).
  case "$binary" in */*) ;; *) found=$(command -v "$binary" 2>/dev/null) || fail "--binary $binary: no such program on PATH; give its path, or --deb FILE"; binary=$found ;; esac
  [ -f "$binary" ] && [ -x "$binary" ] || fail "--binary $binary is not an executable file; build it with make release, or give --deb FILE"
fi
case "$radio" in bluez|sim) ;; *) fail "--radio must be bluez or sim, not \"$radio\"" ;; esac
case "$port" in ''|*[!0-9]*) fail "--port must be a number" ;; esac
valid_name() { case "$1" in *[!A-Za-z0-9._-]*|.*|"") return 1 ;; esac; [ ${#1} -le 64 ]; }
valid_address() { [[ "$1" =~ ^[0-9A-Fa-f]{2}(:[0-9A-Fa-f]{2}){5}$ ]]; }
valid_tags() { [[ "$1" =~ ^[A-Za-z0-9._,-]*$ ]]; }
valid_tags "$tags" || fail "--tags may hold only letters, digits, '-', '_', '.' and ','"

# The dongles to install: NAME ADDRESS TAGS PORT, one per line.
list=()
if [ -n "$dongles" ]; then
  [ -z "$name" ] && [ -z "$adapter" ] && [ -z "$enrolment" ] || fail "give --dongles FILE, or --name/--adapter/--enrolment for one dongle, not both"
  [ -f "$dongles" ] || fail "dongles file $dongles is missing"
  i=0
  while read -r n a t rest; do
    case "$n" in ''|'#'*) continue ;; esac
    [ -z "$rest" ] || fail "$dongles: \"$n $a $t $rest\": expected NAME ADDRESS [TAGS]"
    valid_name "$n" || fail "$dongles: name \"$n\" may hold only letters, digits, '-', '_' and '.' (64 at most)"
    valid_address "$a" || fail "$dongles: $n: \"$a\" is not a controller address (AA:BB:CC:DD:EE:FF; herald-lab dongles lists them)"
    [ "${t:-none}" = none ] && t=""
    valid_tags "$t" || fail "$dongles: $n: tags may hold only letters, digits, '-', '_', '.' and ','"
    for l in "${list[@]}"; do
      set -- $l
      [ "$1" != "$n" ] || fail "$dongles: $n is listed twice"
      [ "${2^^}" != "${a^^}" ] || fail "$dongles: $a is listed twice ($1 and $n)"
    done
    all_tags=$(echo "${tags},${t}" | sed 's/^,*//; s/,*$//; s/,,*/,/g')
    list+=("$n ${a^^} ${all_tags:-none} $((port + i))")
    i=$((i + 1))
  done < "$dongles"
  [ ${#list[@]} -gt 0 ] || fail "$dongles lists no dongle"
else
  valid_name "$name" || fail "--name (one dongle) or --dongles FILE is required; a name may hold only letters, digits, '-', '_' and '.'"
  list+=("$name ${adapter:-hci0} ${tags:-none} $port")
  [ -z "$enrolment" ] || enrolments=""
fi

# Credentials: an enrolment per agent, or the lab's shared token.
enrolment_of() { # NAME
  if [ -n "$enrolment" ]; then echo "$enrolment"; elif [ -n "$enrolments" ]; then echo "$enrolments/$1.enrol"; fi
}
if [ -n "$enrolment" ] || [ -n "$enrolments" ]; then
  [ -z "$token_file" ] || fail "give --enrolment(s) or --token-file, not both"
  for l in "${list[@]}"; do
    set -- $l
    e=$(enrolment_of "$1")
    [ -f "$e" ] && [ -s "$e" ] || fail "enrolment file $e for agent $1 is empty or missing (herald-lab agents enrol $1 --host NODE-ADDRESS --out $1.enrol)"
    # Checked before anything installed is touched: the enrolment is for this agent's name and
    # for this host (the names and addresses its certificate was issued for).
    for_name=$(sed -n 's/.*"name":"\([^"]*\)".*/\1/p' "$e")
    [ "$for_name" = "$1" ] || fail "the enrolment $e is for agent ${for_name:-(none)}, not $1; nothing was installed or changed"
    for_hosts=$(sed -n 's/.*"hosts":\[\([^]]*\)\].*/\1/p' "$e" | tr -d '"' | tr ',' ' ')
    [ -n "$for_hosts" ] || fail "the enrolment $e names no host (enrol it again: herald-lab agents enrol $1 --host NODE-ADDRESS); nothing was installed or changed"
    mine=${node_hosts:-"$(hostname 2>/dev/null || true) $(hostname -f 2>/dev/null || true) $(hostname -I 2>/dev/null || true)"}
    match=""
    for h in $for_hosts; do for m in $mine; do [ "$h" = "$m" ] && match=$h; done; done
    [ -n "$match" ] || fail "the enrolment $e is for host(s) $for_hosts, and this host is $mine (give --node-host HOST if it has another name); nothing was installed or changed"
    if [ -z "$coordinator" ]; then
      # The enrolment names the coordinator it came from (JSON, "/" written as "\/").
      coordinator=$(sed -n 's/.*"coordinator":"\([^"]*\)".*/\1/p' "$e" | sed 's#\\/#/#g')
    fi
  done
elif [ -n "$token_file" ]; then
  [ -s "$token_file" ] || fail "token file $token_file is empty or missing"
else
  fail "--enrolments DIR (or --enrolment FILE for one dongle; from herald-lab agents enrol) or --token-file FILE is required"
fi
[ -n "$coordinator" ] || fail "--coordinator is required (the enrolment names none)"

here=$(cd "$(dirname "$0")" && pwd)
root=${stage%/}
etc=$root/etc/herald-lab
if [ -z "$stage" ]; then
  . /etc/os-release
  case "${ID:-}" in debian|raspbian) ;; *) echo "install.sh: warning: tested on Debian and Raspberry Pi OS, this is ${ID:-unknown}" >&2 ;; esac
  apt-get update -qq
  if [ -n "$deb" ]; then
    # The package brings the binary (/usr/bin/herald-lab), the units, the udev rule, the user and
    # its dependencies (bluez, dbus, the libraries the binary links).
    case "$deb" in /*) ;; *) deb=$PWD/$deb ;; esac
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$deb"
    binary=/usr/bin/herald-lab
  else
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bluez dbus libbluetooth3 libcurl4 libsqlite3-0 ca-certificates
    id heraldlab >/dev/null 2>&1 || useradd --system --home /var/lib/herald-lab --shell /usr/sbin/nologin heraldlab
    getent group bluetooth >/dev/null && usermod -aG bluetooth heraldlab
    install -m 0755 "$binary" /usr/local/bin/herald-lab
    # The dashboard's templates, style sheet and scripts (a coordinator's; the build leaves them
    # beside the binary), where /usr/local/bin/herald-lab looks: ../share/herald-lab/dashboard.
    resources=$(dirname "$binary")/HeraldLab_LabCoordinator.resources/Dashboard
    if [ -d "$resources" ]; then
      install -d /usr/local/share/herald-lab/dashboard
      install -m 0644 "$resources"/* /usr/local/share/herald-lab/dashboard/
    fi
  fi
  install -d -m 0750 -o root -g heraldlab "$etc" "$etc/agents"
  install -d -m 0750 -o heraldlab -g heraldlab /var/lib/herald-lab
  owner() { chgrp heraldlab "$@"; }
else
  mkdir -p "$etc/agents" "$root/var/lib/herald-lab" "$root/etc/systemd/system" "$root/etc/udev/rules.d" "$root/usr/local/bin"
  ln -sf "$(cd "$(dirname "$binary")" && pwd)/$(basename "$binary")" "$root/usr/local/bin/herald-lab"
  owner() { :; }
fi

installed=()
for l in "${list[@]}"; do
  set -- $l
  n=$1 a=$2 t=$3 p=$4
  if [ -n "$enrolment" ] || [ -n "$enrolments" ]; then
    # This agent's own credential, the lab CA, its certificate and key, readable by the agents only.
    dir=$etc/agents/$n
    mkdir -p "$dir"
    "$binary" enrol "$(enrolment_of "$n")" --dir "$dir" >/dev/null
    enrolled=$(sed -n 's/.*"name":"\([^"]*\)".*/\1/p' "$dir/agent.json")
    [ "$enrolled" = "$n" ] || fail "the enrolment $(enrolment_of "$n") is for agent $enrolled, not $n"
    owner "$dir" "$dir/agent.json" "$dir/key.pem" "$dir/cert.pem" "$dir/ca.pem"
    chmod 0750 "$dir"
    # herald-lab enrol writes them 0600 (root): the agent (group heraldlab) must read all four.
    chmod 0640 "$dir/agent.json" "$dir/key.pem" "$dir/cert.pem" "$dir/ca.pem"
    auth="--credentials /etc/herald-lab/agents/$n"
  else
    install -m 0640 "$token_file" "$etc/token"
    owner "$etc/token"
    auth="--token-file /etc/herald-lab/token"
  fi
  cat > "$etc/agents/$n.env" <<ENV
# HeraldLab agent $n: dongle $a (herald-lab-agent@$n.service)
AGENT_HOST=$host
AGENT_PORT=$p
AGENT_RADIO=$radio
AGENT_ADAPTER=$a
AGENT_TAGS=$t
COORDINATOR_URL=$coordinator
AGENT_AUTH=$auth
AGENT_ARGS=
ENV
  owner "$etc/agents/$n.env"
  chmod 0640 "$etc/agents/$n.env"
  installed+=("$n")
done

if [ -z "$deb" ]; then
  # Without the package: the template unit and the udev rule it would have brought.
  unit_dir=$root/etc/systemd/system
  install -m 0644 "$here/herald-lab-agent@.service" "$unit_dir/herald-lab-agent@.service"
  # The agents may reset their own dongles at USB level (sysfs authorized of a Bluetooth USB device).
  cat > "$root/etc/udev/rules.d/90-herald-lab.rules" <<'RULES'
# HeraldLab: agents (group heraldlab) may reset a Bluetooth USB dongle that stops answering by
# writing 0 then 1 to its sysfs `authorized` (interface class e0 is "wireless controller").
ACTION=="add", SUBSYSTEM=="usb", ENV{DEVTYPE}=="usb_interface", ATTR{bInterfaceClass}=="e0", RUN+="/bin/sh -c 'chgrp heraldlab /sys%p/../authorized && chmod g+w /sys%p/../authorized'"
RULES
fi

if [ -n "$stage" ]; then
  echo "install.sh: staged ${#installed[@]} agent(s) under $root: ${installed[*]}"
  exit 0
fi

for n in "${installed[@]}"; do install -d -m 0750 -o heraldlab -g heraldlab "/var/lib/herald-lab/$n"; done
if [ ! -d /run/systemd/system ]; then
  # A container or chroot without systemd: everything is installed; the units are not started.
  echo "install.sh: ${#installed[@]} agent(s) installed: ${installed[*]}; systemd is not running here, so none was started (start herald-lab-agent@NAME as its unit does)"
  exit 0
fi
udevadm control --reload && udevadm trigger --subsystem-match=usb --action=add || true
# Advertising interval and TX power need bluetoothd's experimental interfaces on BlueZ 5.66.
if ! grep -q -- "-E" /lib/systemd/system/bluetooth.service 2>/dev/null; then
  install -d /etc/systemd/system/bluetooth.service.d
  cat > /etc/systemd/system/bluetooth.service.d/heraldlab.conf <<'DROPIN'
[Service]
ExecStart=
ExecStart=/usr/libexec/bluetooth/bluetoothd -E
DROPIN
fi
# An agent of the single-instance unit of earlier installs drives hci0: it goes.
if systemctl list-unit-files herald-lab-agent.service >/dev/null 2>&1 && [ -f /etc/systemd/system/herald-lab-agent.service ]; then
  systemctl disable --now herald-lab-agent.service || true
  rm -f /etc/systemd/system/herald-lab-agent.service /etc/herald-lab/agent.env
fi
systemctl daemon-reload
systemctl restart bluetooth
# Instances no longer listed stop (their data folders stay until gathered and removed by hand).
for f in /etc/herald-lab/agents/*.env; do
  [ -e "$f" ] || continue
  n=$(basename "$f" .env)
  case " ${installed[*]} " in *" $n "*) ;; *)
    if [ -n "$dongles" ]; then systemctl disable --now "herald-lab-agent@$n" || true; rm -f "$f"; echo "install.sh: agent $n is no longer listed: stopped"; fi ;;
  esac
done
for n in "${installed[@]}"; do
  systemctl enable "herald-lab-agent@$n"
  systemctl restart "herald-lab-agent@$n"
done
echo "install.sh: ${#installed[@]} agent(s) installed: ${installed[*]}"
echo "install.sh: status: systemctl status 'herald-lab-agent@*'; logs: journalctl -u herald-lab-agent@NAME -f; dongles: herald-lab dongles"
