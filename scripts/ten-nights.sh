#!/usr/bin/env bash
# Ten simulated nights of one nightly plan judged by `herald-lab regress --baseline history`, as
# docs/CI.md's job runs it (issue 38's closing figures): nights 1-5 normal, night 6 with a paused
# node (infra), nights 7-10 on a "firmware" that loses 60 % of scan reports under the same declared
# settings (the manifest says what the plan said, as a lab's would), night 9 with a paused node as
# well. Prints each night's verdict line and exit code. Usage: scripts/ten-nights.sh [BIN] [DIR]
set -u
BIN=${1:-.build/debug/herald-lab}
DIR=${2:-.build/ten-nights}
rm -rf "$DIR" && mkdir -p "$DIR"
cat > "$DIR/nightly.yaml" <<'EOF'
name: nightly
duration: 40s
warmup: 5s
nodes: {count: 24, prefix: n, grid: {columns: 6, spacing: 1m}}
sensor: {advertInterval: 1s}
radio: {kind: sim, crowding: on}
thresholds: {regressionTolerancePct: 2}
EOF
sed 's/radio: {kind: sim, crowding: on}/radio: {kind: sim, crowding: on, reportLoss: 0.6}/' "$DIR/nightly.yaml" > "$DIR/firmware.yaml"
# Edits a bundle's manifest: the plan's radio as the nightly plan declares it (the firmware's
# loss is not a setting anyone declared), and optionally a paused node's gap.
edit() {
  python3 - "$1" "$2" "$3" <<'PY'
import json, sys
path, declared, paused = sys.argv[1] + "/manifest.json", sys.argv[2] == "1", sys.argv[3] == "1"
m = json.load(open(path))
if declared:
    first = json.load(open(sys.argv[1].rsplit("/", 1)[0] + "/night-1/manifest.json"))
    m["plan"]["radio"] = first["plan"]["radio"]
if paused:
    m["nodes"][0]["gaps"] = [{"from": "2026-01-01T00:00:10Z", "to": "2026-01-01T00:00:20Z", "reason": "agent paused"}]
json.dump(m, open(path, "w"))
PY
}
printf "%-6s %-9s %-5s %s\n" night firmware exit "verdict"
for night in $(seq 1 10); do
  plan=nightly.yaml; fw=old
  [ "$night" -ge 7 ] && { plan=firmware.yaml; fw=new; }
  paused=0; { [ "$night" = 6 ] || [ "$night" = 9 ]; } && paused=1
  bundle="$DIR/night-$night"
  "$BIN" simulate "$DIR/$plan" --seed "$night" --out "$bundle" --quiet > /dev/null 2>&1 || { echo "night $night: simulate failed"; exit 1; }
  edit "$bundle" "$([ $fw = new ] && echo 1 || echo 0)" "$paused"
  # As a lab's night: the run is analysed into the history (the coordinator does it at gather),
  # then judged against it.
  "$BIN" analyse "$bundle" --results "$DIR/results" > /dev/null 2>&1
  out=$("$BIN" regress "$bundle" --baseline history --results "$DIR/results" 2>&1); code=$?
  verdict=$(grep -E "^(no regression|REGRESSION|inconclusive|infra)" <<<"$out" | head -1 | cut -c1-110)
  printf "%-6s %-9s %-5s %s\n" "$night" "$fw$([ $paused = 1 ] && echo ",paused")" "$code" "$verdict"
  grep -E "^(alert:|infra noted|change point:)" <<<"$out" | cut -c1-150 | sed 's/^/                   /'
done
