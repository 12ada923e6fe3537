#!/usr/bin/env bash
# The simulator with devices that differ, runs that differ and crowding on (make bench-variance),
# beside the same plans with them off: plans/longevity-10.yaml (10 nodes x 8 h, target <= 5 s
# wall) and a 150-node grid for 1 h (targets: simulate <= 60 s, analyse <= 10 s), and the
# determinism of a seed (two runs of the same seed, byte-compared).
set -u
BIN=${BIN:-.build/release/herald-lab}
out=.build/bench/variance
mkdir -p "$out"
echo "  load before: $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) cores" >&2
on='  devices: on\n  environment: on\n  crowding: on'
plan_on=$out/longevity-10-on.yaml
sed "s/^  kind: sim$/  kind: sim\n$on/" plans/longevity-10.yaml > "$plan_on"
for mode in off on; do
  plan=plans/longevity-10.yaml; [ $mode = on ] && plan=$plan_on
  rm -rf "$out/l10-$mode"
  /usr/bin/time -f "%e %U %S" -o "$out/l10-$mode.time" "$BIN" simulate "$plan" --out "$out/l10-$mode" --quiet > /dev/null 2>&1
  printf "longevity-10 (10 nodes x 8 h), variance %-3s: simulate %s s wall (%s s CPU)%s\n" $mode \
    "$(awk '{print $1}' "$out/l10-$mode.time")" "$(awk '{printf "%.1f", $2 + $3}' "$out/l10-$mode.time")" "$([ $mode = on ] && echo '; target <= 5 s')"
done
rm -rf "$out/l10-on-again"
"$BIN" simulate "$plan_on" --out "$out/l10-on-again" --quiet > /dev/null 2>&1
if diff -rq -x log.txt "$out/l10-on" "$out/l10-on-again" -x manifest.json > /dev/null; then echo "determinism: the same seed twice, logs byte-identical"; else echo "determinism: FAILED, logs differ"; fi
rm -rf "$out/l10-off" "$out/l10-on" "$out/l10-on-again"
NODES=${NODES:-150} DURATION=${DURATION:-1h} AGENTS=" " RADIO_EXTRA=", devices: on, environment: on, crowding: on" BIN=$BIN scripts/bench-scale.sh 2>&1 | grep -vE "^agents|^\(target at 1000|^$" 
echo "(targets with variance on, 150 nodes x 1 h: simulate <= 60 s, analyse <= 10 s)"
