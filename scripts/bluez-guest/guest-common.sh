# Sourced by the scripts that run inside the QEMU guest (run-in-guest.sh, run-dongles-in-guest.sh):
# what both need before their lab starts. OUT, REPO and G are set by the sourcing script.
pids=()
# What is written all through a run (bluetoothd -d: about 4 MB, one write per line; the bus
# monitor's objects; the lab's work folder: agents' data with every node log row, service logs)
# goes to the guest's own tmpfs and is copied into OUT when the script ends: each write to OUT
# goes over 9p to QEMU, and those writes had bluetoothd and dbus-monitor among the guest's
# busiest processes on a loaded host (issue 20). Bundles are still gathered into OUT directly. A
# guest whose kernel dies loses these; its console (kept by the host) has the kernel's trace.
GUEST_LOGS=/tmp/hl-logs
mkdir -p "$GUEST_LOGS"
finish() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done; wait 2>/dev/null
  cp -rf "$GUEST_LOGS"/. "$OUT"/ 2>/dev/null
}
trap finish EXIT
step() { echo "[guest $(date +%T)] $*"; }
wait_until() { # SECONDS DESCRIPTION COMMAND...
  local limit=$1 what=$2; shift 2
  for _ in $(seq 1 $((limit * 4))); do "$@" >/dev/null 2>&1 && return 0; sleep 0.25; done
  step "timed out after ${limit}s waiting for $what"; return 1
}

# The guest's load every 10 s, and the CPU seconds its busiest processes have used so far (TCG:
# the emulated radio's timing depends on the guest's CPU).
watch_load() {
  ( while true; do echo "$(date +%T) load $(cut -d' ' -f1-3 /proc/loadavg) cpu-s: $(ps -eo times=,comm= --sort=-times | head -6 | tr -s ' ' | tr '\n' ',')"; sleep 10; done ) >"$OUT/load.log" 2>&1 & pids+=($!)
}

start_system_bus() {
  step "system bus"
  mkdir -p /run/dbus
  dbus-daemon --system --fork || exit 10
}

# start_controllers MODEL: the Bumble controllers (and phone personas) of MODEL on vhci; sets
# `count`, the number of node controllers, once the kernel has them all.
start_controllers() {
  local model=$1
  step "Bumble controllers"
  HL_BUMBLE_TRACE=1 python3 "$G/controllers.py" "$model" "$OUT" >"$OUT/controllers.log" 2>&1 & pids+=($!)
  wait_until 60 "controllers" grep -q "controllers ready" "$OUT/controllers.log" || { cat "$OUT/controllers.log"; exit 11; }
  count=$(python3 -c "import json; print(len(json.load(open('$model'))['nodes']))")
  wait_until 60 "$count hci devices" test "$(ls /sys/class/bluetooth | grep -c '^hci[0-9]*$')" -ge "$count" || exit 12
  step "$(ls /sys/class/bluetooth | tr '\n' ' ')"
}

adapters_ready() {
  [ "$(dbus-send --system --print-reply --dest=org.bluez / org.freedesktop.DBus.ObjectManager.GetManagedObjects 2>/dev/null | grep -c '"org.bluez.Adapter1"')" -ge "$count" ]
}

# The stack's bluetoothd (this machine's for bookworm, Debian 13's chrooted in its root for
# trixie, on the guest's system bus), started with -n -d -E and restarted when it dies, as systemd
# does on a node; returns once it has every controller. Sets BLUETOOTHD and BLUETOOTHCTL and
# writes OUT/stack.json.
start_bluetoothd() {
  BLUETOOTHD=(/usr/libexec/bluetooth/bluetoothd)
  BLUETOOTHCTL=(bluetoothctl)
  if [ "${HL_STACK:-bookworm}" = trixie ]; then
    local R=${HL_STACK_ROOT:?}
    mount --bind /proc "$R/proc"; mount --bind /sys "$R/sys"; mount --bind /dev "$R/dev"
    mount --bind /run/dbus "$R/run/dbus"
    mount -t tmpfs tmpfs "$R/var/lib/bluetooth"; mount -t tmpfs tmpfs "$R/tmp"
    BLUETOOTHD=(chroot "$R" /usr/libexec/bluetooth/bluetoothd)
    BLUETOOTHCTL=(chroot "$R" bluetoothctl)
  fi
  local version; version=$("${BLUETOOTHD[@]}" --version)
  step "stack ${HL_STACK:-bookworm}: kernel $(uname -r), BlueZ $version"
  echo "{\"stack\": \"${HL_STACK:-bookworm}\", \"kernel\": \"$(uname -r)\", \"bluez\": \"$version\"}" > "$OUT/stack.json"
  step "bluetoothd -n -d -E"
  ( while true; do
      "${BLUETOOTHD[@]}" -n -d -E >>"$GUEST_LOGS/bluetoothd.log" 2>&1
      code=$?
      echo "[guest $(date +%T)] bluetoothd exited $code; restarting" | tee -a "$OUT/bluetoothd-restarts.log"
      sleep 1
    done ) & pids+=($!)
  wait_until 60 "bluetoothd adapters" adapters_ready || { tail -20 "$GUEST_LOGS/bluetoothd.log"; exit 13; }
}

# addr NAME: the address controllers.py gave controller NAME.
addr() { python3 -c "import json; print(json.load(open('$OUT/controllers.json'))['$1']['address'])"; }
