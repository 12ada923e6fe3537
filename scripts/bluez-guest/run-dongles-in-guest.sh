#!/bin/bash
# Runs inside the QEMU guest (guest.sh run) for `make test-dongles`: six Bumble controllers of
# several makes and firmware versions, real bluetoothd -E, and two "hosts" of three dongles each:
# each host's agents are installed by agents/install.sh (--stage, with the lab's shared token)
# and started as systemd starts the template unit herald-lab-agent@NAME (instances.py). Then:
# the lab's dongles are listed, a health check (all pass), dongle d3 goes mute (its adverts reach
# nobody), a second health check (d3 fails), and plans/dongles-5.yaml (five nodes, one spare):
# its pre-flight fails d3 a second time, which quarantines it, and the spare runs its node.
# Finally `herald-lab dongles` shows the six with identity, health and history. Everything the
# host-side check (check-dongles.py) needs lands in OUT ($1).
set -u
OUT=$1
REPO=${HL_REPO:?}
BIN=${HERALD_LAB:-$REPO/.build/release/herald-lab}
G=$REPO/scripts/bluez-guest
. "$G/guest-common.sh"
watch_load
start_system_bus
start_controllers "$G/model-dongles.json"
start_bluetoothd

W=$GUEST_LOGS/lab  # copied into OUT/lab at the end (guest-common.sh)
mkdir -p "$W/logs"
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$W/token"
C=http://127.0.0.1:8700
ADMIN=(--coordinator "$C" --token-file "$W/token")

step "two hosts' dongles installed as install.sh installs them"
for h in A B; do
  first=$([ $h = A ] && echo 1 || echo 4)
  : > "$W/host$h.conf"
  for d in $(seq "$first" $((first + 2))); do echo "host$h-d$d $(addr d$d) hub$h" >> "$W/host$h.conf"; done
  "$REPO/agents/install.sh" --binary "$BIN" --dongles "$W/host$h.conf" --token-file "$W/token" --coordinator "$C" \
    --tags "host$h" --port $([ $h = A ] && echo 8701 || echo 8711) --stage "$W/host$h" || exit 14
done

step "coordinator (quarantine after 2 failures in a row)"
"$BIN" coordinator --port 8700 --port-file "$W/coordinator.port" --token-file "$W/token" --results "$OUT/results" \
  --quarantine-after 2 >"$W/logs/coordinator.log" 2>&1 & pids+=($!)
wait_until 30 "the coordinator" test -s "$W/coordinator.port" || exit 15
for h in A B; do
  python3 "$G/instances.py" "$W/host$h" "$BIN" "$W/logs" --host-name "host$h" >"$W/logs/instances-$h.log" 2>&1 & pids+=($!)
done
registered() {
  [ "$("$BIN" dongles "${ADMIN[@]}" --json 2>/dev/null | python3 -c 'import json,sys; print(sum(1 for d in json.load(sys.stdin) if d.get("agentState") == "alive"))')" = "$count" ]
}
wait_until 120 "six dongles registered" registered || { tail -5 "$W"/logs/*.log; exit 16; }

step "this host's dongles (sysfs, the kernel, bluetoothd, HCI)"
"$BIN" dongles > "$OUT/dongles-local.txt" 2>&1
"$BIN" dongles --json > "$OUT/dongles-local.json" 2>/dev/null
cat "$OUT/dongles-local.txt"

step "health check 1: every dongle works"
started=$(date +%s.%N)
"$BIN" dongles check "${ADMIN[@]}" --bound 45s > "$OUT/check1.txt" 2>&1
check1=$?
echo "{\"seconds\": $(python3 -c "print(round($(date +%s.%N) - $started, 1))")}" > "$OUT/check1.json"
cat "$OUT/check1.txt"

step "d3 goes mute (its adverts reach nobody)"
touch "$OUT/fault-d3"
sleep 1 # the controllers look for the file at most twice a second

step "health check 2: d3 fails"
"$BIN" dongles check "${ADMIN[@]}" --bound 45s > "$OUT/check2.txt" 2>&1
check2=$?
cat "$OUT/check2.txt"

step "the nightly run: plans/dongles-5.yaml (5 nodes of 6 dongles, one spare)"
cd "$REPO"
"$BIN" run plans/dongles-5.yaml "${ADMIN[@]}" --out "$OUT/results" > "$OUT/run.txt" 2>&1
run=$?
cat "$OUT/run.txt"

step "the lab's dongles: identity, health, history"
"$BIN" dongles "${ADMIN[@]}" --history 20 > "$OUT/dongles.txt" 2>&1
"$BIN" dongles "${ADMIN[@]}" --history 50 --json > "$OUT/dongles.json" 2>/dev/null
cat "$OUT/dongles.txt"
echo "{\"check1\": $check1, \"check2\": $check2, \"run\": $run}" > "$OUT/exits.json"
step "health check 1 exit $check1, health check 2 exit $check2, run exit $run"
[ $check1 -eq 0 ] && [ $check2 -eq 1 ] && [ $run -le 1 ]
