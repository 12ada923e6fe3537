#!/usr/bin/env bash
# How each cost grows with the number of nodes (make bench-scale): simulate a grid plan, analyse
# its bundle, both timed with /usr/bin/time (wall and CPU seconds, peak resident memory), then arm
# N heartbeating agents (herald-lab-bench arm). Prints one table.
#   NODES="10 30 100 150"  DURATION=1h  AGENTS="10 100 1000"  BIN=.build/release/herald-lab
#   RADIO_EXTRA=", devices: on, environment: on" adds fields to the grid plan's radio section
# Bundles are deleted after analysis (a 100-node hour is several GB); KEEP=1 keeps them.
set -u
BIN=${BIN:-.build/release/herald-lab}
NODES=${NODES:-10 30 100 150}
DURATION=${DURATION:-1h}
AGENTS=${AGENTS:-10 100 1000}
out=.build/bench/scale
mkdir -p "$out"
timed() { # timed LOG command...: prints "wall-seconds cpu-seconds peakMB" (exit 1, analyse's FAIL verdict, is a result)
  local log=$1; shift
  /usr/bin/time -f "%e %U %S %M" -o "$log.time" "$@" > "$log" 2>&1 || [ $? -eq 1 ] || { echo "failed: $* (see $log)" >&2; echo "- - -"; return; }
  # time(1) writes "Command exited with non-zero status 1" first when analyse says FAIL: the figures are the last line.
  tail -n 1 "$log.time" | awk '{printf "%.1f %.1f %.0f", $1, $2 + $3, $4 / 1024}'
}
# The machine may be shared: wall times are only comparable at similar load (CPU seconds are
# steadier; with both cores free, wall is about CPU / 2 for the parallel parts).
echo "  load before: $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) cores" >&2
rows=()
for n in $NODES; do
  cols=$(awk -v n="$n" 'BEGIN { c = int(sqrt(n)); if (c * c < n) c++; print c }')
  plan=$out/grid-$n.yaml
  cat > "$plan" <<PLAN
name: grid-$n
duration: $DURATION
warmup: 1m
nodes: {count: $n, prefix: node, grid: {columns: $cols, spacing: 2m}}
sensor: {scan: {on: 4s, rest: 1s, off: 2s}, advertInterval: 250ms}
radio: {kind: sim, referencePower: -59, pathLossExponent: 2.0, shadowing: 4, reportLoss: 0.1${RADIO_EXTRA:-}}
PLAN
  rm -rf "$out/grid-$n"
  read -r st sc sm < <(timed "$out/sim-$n.log" "$BIN" simulate "$plan" --out "$out/grid-$n" --quiet)
  mb=$(du -sm "$out/grid-$n" 2>/dev/null | cut -f1)
  read -r at ac am < <(timed "$out/analyse-$n.log" "$BIN" analyse "$out/grid-$n" --no-history)
  [ "${KEEP:-0}" = 1 ] || rm -rf "$out/grid-$n"
  rows+=("$(printf '%-7s %-9s %11s %9s %12s %9s %11s %9s %11s' "$n" "$DURATION" "$st" "$sc" "$sm" "${mb:--}" "$at" "$ac" "$am")")
  echo "  ($n nodes: simulate ${st} s (${sc} s CPU), ${sm} MB; ${mb} MB of logs; analyse ${at} s (${ac} s CPU), ${am} MB; load $(cut -d' ' -f1 /proc/loadavg))" >&2
done
arms=()
for a in $AGENTS; do
  line=$("$(dirname "$BIN")/herald-lab-bench" arm --agents "$a" 2>&1 | grep -E "^arm [0-9]+ agents \(")
  t=$(echo "$line" | sed -n 's/.*: \([0-9.]*\) s (target.*/\1/p')
  rss=$(echo "$line" | sed -n 's/.*peak \([0-9]*\) MB.*/\1/p')
  arms+=("$(printf '%-7s %12s %16s' "$a" "${t:--}" "${rss:--}")")
  echo "  ($a agents: arm ${t:-?} s, coordinator peak ${rss:-?} MB)" >&2
done
echo
echo "nodes   duration  simulate s  (CPU s)  simulate MB   logs MB   analyse s  (CPU s)  analyse MB"
printf '%s\n' "${rows[@]}"
echo "(load after: $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) cores; simulate and analyse use both cores)"
echo "(targets at 100 nodes x 1h: simulate <= 60 s; analyse <= 10 s and <= 1024 MB)"
echo
echo "agents  arm s (heartbeats every 1 s)  coordinator peak MB"
printf '%s\n' "${arms[@]}"
echo "(target at 1000 agents: arm <= 3 s, coordinator < 300 MB)"
