#!/bin/bash
# Runs inside the QEMU guest (guest.sh run): system D-Bus, Bumble controllers, real bluetoothd
# -E, then the plan through a coordinator and three agents with radio bluez, and bleak as an
# outside client. Everything the host-side check needs lands in OUT ($1).
set -u
OUT=$1
REPO=${HL_REPO:?}
BIN=${HERALD_LAB:-$REPO/.build/release/herald-lab}
G=$REPO/scripts/bluez-guest
. "$G/guest-common.sh"
watch_load
start_system_bus

# Objects bluetoothd adds and removes (devices found and gone, services resolved), for diagnosis
# (all of its signals would double the bus's load in the guest: every advert changes a property).
dbus-monitor --system "type='signal',sender='org.bluez',interface='org.freedesktop.DBus.ObjectManager'" >"$GUEST_LOGS/bluez-objects.log" 2>&1 & pids+=($!)

start_controllers "$G/model.json"
start_bluetoothd
"${BLUETOOTHCTL[@]}" --version

personas=$(python3 -c "import json; print(' '.join(f'{n}={m[\"address\"]} ({m[\"kind\"]})' for n, m in json.load(open('$OUT/controllers.json')).items() if 'kind' in m))")
[ -n "$personas" ] && step "phone personas on the link (logs: $OUT/persona-*.jsonl): $personas"
step "lab run: alpha=$(addr alpha) beta=$(addr beta) gamma=$(addr gamma)"
( sleep 45; step "bleak reads payloads through observer $(addr observer)"
  timeout 150 python3 -u "$G/bleak_read.py" "$(addr observer)" "$OUT/bleak.json" "$OUT/controllers.json" >"$OUT/bleak.log" 2>&1
  step "bleak done: $(tail -1 "$OUT/bleak.log")"; touch "$OUT/bleak-done" ) & pids+=($!)
# bluetoothd crashes once mid-run (SIGKILL, 110 s after the lab starts, or once bleak is done if
# later; start_bluetoothd's loop restarts it as systemd would): check.py wants every node
# measuring every peer again within 30 s of bluetoothd being back with its adapters (under TCG,
# bluetoothd itself takes 10-20 s to start again; the time from the kill is printed too).
( sleep 110; for _ in $(seq 1 60); do [ -e "$OUT/bleak-done" ] && break; sleep 1; done
  date +%s.%N >"$OUT/bluetoothd-killed"; pkill -KILL -x bluetoothd; step "killed bluetoothd"
  sleep 0.5; wait_until 90 "bluetoothd back with its adapters" adapters_ready && date +%s.%N >"$OUT/bluetoothd-ready"
  step "bluetoothd is back with its adapters" ) & pids+=($!)
cd "$REPO"
ADAPTERS="$(addr alpha) $(addr beta) $(addr gamma)" BIN="$BIN" LAB_WORK="$GUEST_LOGS/lab" \
  scripts/lab.sh plans/bluez-3.yaml 3 "$OUT/results"
status=$?
step "lab run exited $status"
wait "${pids[-1]}" 2>/dev/null
exit $status
