#!/bin/bash
# Runs inside the QEMU guest (guest.sh run): system D-Bus, Bumble controllers, real bluetoothd
# -E, then the plan through a coordinator and three agents with radio bluez, and bleak as an
# outside client. Everything the host-side check needs lands in OUT ($1).
set -u
OUT=$1
REPO=${HL_REPO:?}
BIN=${HERALD_LAB:-$REPO/.build/release/herald-lab}
G=$REPO/scripts/bluez-guest
pids=()
finish() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done; wait 2>/dev/null; }
trap finish EXIT
step() { echo "[guest $(date +%T)] $*"; }
wait_until() { # SECONDS DESCRIPTION COMMAND...
  local limit=$1 what=$2; shift 2
  for _ in $(seq 1 $((limit * 4))); do "$@" >/dev/null 2>&1 && return 0; sleep 0.25; done
  step "timed out after ${limit}s waiting for $what"; return 1
}

# The guest's load every 10 s, and the CPU seconds its busiest processes have used so far (TCG:
# the emulated radio's timing depends on the guest's CPU).
( while true; do echo "$(date +%T) load $(cut -d' ' -f1-3 /proc/loadavg) cpu-s: $(ps -eo times=,comm= --sort=-times | head -6 | tr -s ' ' | tr '\n' ',')"; sleep 10; done ) >"$OUT/load.log" 2>&1 & pids+=($!)

step "system bus"
mkdir -p /run/dbus
dbus-daemon --system --fork || exit 10

# Objects bluetoothd adds and removes (devices found and gone, services resolved), for diagnosis
# (all of its signals would double the bus's load in the guest: every advert changes a property).
dbus-monitor --system "type='signal',sender='org.bluez',interface='org.freedesktop.DBus.ObjectManager'" >"$OUT/bluez-objects.log" 2>&1 & pids+=($!)

step "Bumble controllers"
HL_BUMBLE_TRACE=1 python3 "$G/controllers.py" "$G/model.json" "$OUT" >"$OUT/controllers.log" 2>&1 & pids+=($!)
wait_until 60 "controllers" grep -q "controllers ready" "$OUT/controllers.log" || { cat "$OUT/controllers.log"; exit 11; }
count=$(python3 -c "import json; print(len(json.load(open('$G/model.json'))['nodes']))")
wait_until 60 "$count hci devices" test "$(ls /sys/class/bluetooth | grep -c '^hci')" -ge "$count" || exit 12
step "$(ls /sys/class/bluetooth | tr '\n' ' ')"

# The stack's bluetoothd: this machine's (bookworm), or Debian 13's chrooted in its root, on the
# guest's system bus (the socket folder bound into the root).
BLUETOOTHD=(/usr/libexec/bluetooth/bluetoothd)
BLUETOOTHCTL=(bluetoothctl)
if [ "${HL_STACK:-bookworm}" = trixie ]; then
  R=${HL_STACK_ROOT:?}
  mount --bind /proc "$R/proc"; mount --bind /sys "$R/sys"; mount --bind /dev "$R/dev"
  mount --bind /run/dbus "$R/run/dbus"
  mount -t tmpfs tmpfs "$R/var/lib/bluetooth"; mount -t tmpfs tmpfs "$R/tmp"
  BLUETOOTHD=(chroot "$R" /usr/libexec/bluetooth/bluetoothd)
  BLUETOOTHCTL=(chroot "$R" bluetoothctl)
fi
step "stack ${HL_STACK:-bookworm}: kernel $(uname -r), BlueZ $("${BLUETOOTHD[@]}" --version)"
echo "{\"stack\": \"${HL_STACK:-bookworm}\", \"kernel\": \"$(uname -r)\", \"bluez\": \"$("${BLUETOOTHD[@]}" --version)\"}" > "$OUT/stack.json"

step "bluetoothd -n -d -E"
# Restarted when it dies, as systemd does on a node (the nodes must ride through it).
( while true; do
    "${BLUETOOTHD[@]}" -n -d -E >>"$OUT/bluetoothd.log" 2>&1
    code=$?
    echo "[guest $(date +%T)] bluetoothd exited $code; restarting" | tee -a "$OUT/bluetoothd-restarts.log"
    sleep 1
  done ) & pids+=($!)
adapters_ready() {
  [ "$(dbus-send --system --print-reply --dest=org.bluez / org.freedesktop.DBus.ObjectManager.GetManagedObjects 2>/dev/null | grep -c '"org.bluez.Adapter1"')" -ge "$count" ]
}
wait_until 60 "bluetoothd adapters" adapters_ready || { tail -20 "$OUT/bluetoothd.log"; exit 13; }
"${BLUETOOTHCTL[@]}" --version

addr() { python3 -c "import json; print(json.load(open('$OUT/controllers.json'))['$1']['address'])"; }
personas=$(python3 -c "import json; print(' '.join(f'{n}={m[\"address\"]} ({m[\"kind\"]})' for n, m in json.load(open('$OUT/controllers.json')).items() if 'kind' in m))")
[ -n "$personas" ] && step "phone personas on the link (logs: $OUT/persona-*.jsonl): $personas"
step "lab run: alpha=$(addr alpha) beta=$(addr beta) gamma=$(addr gamma)"
( sleep 45; step "bleak reads payloads through observer $(addr observer)"
  timeout 150 python3 -u "$G/bleak_read.py" "$(addr observer)" "$OUT/bleak.json" "$OUT/controllers.json" >"$OUT/bleak.log" 2>&1
  step "bleak done: $(tail -1 "$OUT/bleak.log")"; touch "$OUT/bleak-done" ) & pids+=($!)
# bluetoothd crashes once mid-run (SIGKILL, 110 s after the lab starts, or once bleak is done if
# later; the loop above restarts it as systemd would): check.py wants every node measuring every
# peer again within 30 s of bluetoothd being back with its adapters (under TCG, bluetoothd itself
# takes 10-20 s to start again; the time from the kill is printed too).
( sleep 110; for _ in $(seq 1 60); do [ -e "$OUT/bleak-done" ] && break; sleep 1; done
  date +%s.%N >"$OUT/bluetoothd-killed"; pkill -KILL -x bluetoothd; step "killed bluetoothd"
  sleep 0.5; wait_until 90 "bluetoothd back with its adapters" adapters_ready && date +%s.%N >"$OUT/bluetoothd-ready"
  step "bluetoothd is back with its adapters" ) & pids+=($!)
cd "$REPO"
ADAPTERS="$(addr alpha) $(addr beta) $(addr gamma)" BIN="$BIN" LAB_WORK="$OUT/lab" \
  scripts/lab.sh plans/bluez-3.yaml 3 "$OUT/results"
status=$?
step "lab run exited $status"
wait "${pids[-1]}" 2>/dev/null
exit $status
