#!/usr/bin/env bash
# Starts a whole lab on loopback (the air, a coordinator, N agents), runs a plan through it with
# `herald-lab run`, and stops every process it started, whatever happens.
# Usage: scripts/lab.sh PLAN [AGENTS] [RESULTS]     (BIN=path/to/herald-lab to choose the binary)
#        scripts/lab.sh --serve [AGENTS] [RESULTS]  (make lab: the lab stays up, with its URL and
#                                                    credentials printed, until Ctrl-C)
# ADAPTERS="hci0 hci1 ..." gives agent i radio bluez on the i-th adapter (name or address) instead
# of the simulated air; LAB_WORK=DIR keeps tokens, ports and service logs in DIR; COORDINATOR_ARGS
# adds options to the coordinator's command (e.g. --history postgres://... --lab NAME).
set -uo pipefail
plan=${1:?usage: scripts/lab.sh PLAN [AGENTS] [RESULTS]}
agents=${2:-3}
results=${3:-results}
bin=${BIN:-.build/debug/herald-lab}
[ -x "$bin" ] || { echo "lab: $bin not found; run make build first" >&2; exit 2; }

work=${LAB_WORK:-$(mktemp -d /tmp/heraldlab-lab.XXXXXX)}
mkdir -p "$work"
read -r -a adapters <<< "${ADAPTERS:-}"
read -r -a coordinator_args <<< "${COORDINATOR_ARGS:-}"

pids=()
# Every child is stopped on exit, INT or TERM: TERM first, KILL for one still there after 4 s, so
# that the lab is gone within 5 s (issue 40). The script waits on its children with `wait`, never
# in a foreground command, so a signal's trap runs at once.
cleanup() {
  trap - INT TERM
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  for _ in $(seq 1 40); do
    alive=0
    for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
    [ $alive -eq 0 ] && break
    sleep 0.1
  done
  for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null; done
  if [ -n "${KEEP_LAB:-}" ] || [ -n "${LAB_WORK:-}" ]; then echo "lab: logs kept in $work/logs" >&2; else rm -rf "$work"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

wait_for_file() { # FILE SECONDS
  for _ in $(seq 1 $(( $2 * 10 ))); do [ -s "$1" ] && return 0; sleep 0.1; done
  echo "lab: timed out waiting for $1" >&2; return 1
}

token="$work/token"
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$token"
mkdir -p "$results" "$work/logs"

"$bin" air --port 0 --port-file "$work/air.port" --token-file "$token" >"$work/logs/air.log" 2>&1 & pids+=($!)
wait_for_file "$work/air.port" 20 || exit 2
air="127.0.0.1:$(cat "$work/air.port")"

"$bin" coordinator --port 0 --port-file "$work/coordinator.port" --token-file "$token" --results "$results" --air "$air" \
  "${coordinator_args[@]}" >"$work/logs/coordinator.log" 2>&1 & pids+=($!)
wait_for_file "$work/coordinator.port" 20 || exit 2
coordinator="http://127.0.0.1:$(cat "$work/coordinator.port")"

for i in $(seq 1 "$agents"); do
  radio=(--air "$air")
  if [ ${#adapters[@]} -gt 0 ]; then radio=(--radio bluez --adapter "${adapters[$((i - 1))]}"); fi
  "$bin" agent --name "agent$i" --port 0 --port-file "$work/agent$i.port" --token-file "$token" \
    --data "$work/agent$i" --coordinator "$coordinator" "${radio[@]}" >"$work/logs/agent$i.log" 2>&1 & pids+=($!)
done
for i in $(seq 1 "$agents"); do wait_for_file "$work/agent$i.port" 20 || exit 2; done
sleep 1.5 # first heartbeats

echo "lab: air $air, coordinator $coordinator, $agents agents"
if [ "$plan" = --serve ]; then
  cat <<SERVE
lab: up until Ctrl-C (logs in $work/logs)
  coordinator:  $coordinator   operator credential: $token
  dashboard:    $coordinator/   sign in with the operator credential: $(cat "$token")
  run a plan:   $bin run plans/smoke.yaml --coordinator $coordinator --token-file $token
  follow:       $bin runs list --coordinator $coordinator --token-file $token
  metrics:      curl -H "Authorization: Bearer \$(cat $token)" $coordinator/metrics
SERVE
  KEEP_LAB=1
  while :; do sleep 3600 & pids+=($!); wait $!; done
fi
"$bin" run "$plan" --coordinator "$coordinator" --token-file "$token" --out "$results" & pids+=($!)
wait $!
status=$?
if [ $status -eq 2 ]; then
  echo "lab: the run did not complete; service logs:" >&2
  tail -n 20 "$work"/logs/*.log >&2
fi
exit $status
