#!/usr/bin/env bash
# Two labs write to one shared results store (issue 41), end to end with the real herald-lab:
# a PostgreSQL cluster of Debian's packages started in a temporary folder (as the postgres user
# when run as root), its schema made by `herald-lab results-store migrate` as the owner, the
# roles' grants from `herald-lab results-store grants`; lab A runs a plan through scripts/lab.sh
# with `--history` (its row lands); PostgreSQL is stopped and lab B runs (the run completes, its
# write waits in B's outbox, fsynced); PostgreSQL is started again and B's coordinator started
# (its write lands once at start). Then 3 coordinators at once (paris, rome, wien): each starts
# with 200 runs waiting in its outbox and runs a plan (paris: a study of 2 levels) while the others
# write; every row lands once, paris's study with its runs, each manifest names its lab. Last,
# `results-store prune` as the operators' role and its flags' range checks. Checks the rows with
# psql; stops and removes everything.
# Usage: scripts/results-server/e2e.sh [path/to/herald-lab]
set -uo pipefail
cd "$(dirname "$0")/../.."
bin=${1:-.build/debug/herald-lab}
[ -x "$bin" ] || { echo "e2e: $bin not found" >&2; exit 2; }
pgbin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)
[ -x "$pgbin/initdb" ] || { echo "e2e: PostgreSQL's server binaries not found (apt-get install postgresql)" >&2; exit 2; }

work=$(mktemp -d /tmp/hl-e2e.XXXXXX)
chmod 755 "$work"
pg="$work/pg"; mkdir -p "$pg"
as_pg=()
if [ "$(id -u)" = 0 ]; then chown postgres:postgres "$pg"; as_pg=(runuser -u postgres --); fi
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
pgctl() { (cd /tmp && "${as_pg[@]}" "$pgbin/pg_ctl" -D "$pg/data" -w -t 60 "$@" >/dev/null); }
cleanup() {
  pgctl -m immediate stop 2>/dev/null
  [ -n "${KEEP_E2E:-}" ] && { echo "e2e: kept $work" >&2; return; }
  rm -rf "$work"
}
trap cleanup EXIT
fail() { echo "e2e: FAILED: $*" >&2; exit 1; }
psql_admin() { psql -h "$pg" -p "$port" -U admin -X -q -v ON_ERROR_STOP=1 "$@"; }

(cd /tmp && "${as_pg[@]}" "$pgbin/initdb" -D "$pg/data" -U admin --auth-local=trust --auth-host=scram-sha-256 -E UTF8 --locale=C.UTF-8 --no-sync >/dev/null) || fail "initdb"
pgctl -l "$pg/server.log" -o "-p $port -k $pg -c listen_addresses=127.0.0.1" start || fail "pg_ctl start"

# Roles: passwords made here, kept in 0600 files, never on a command line.
for role in owner coordinator operator; do head -c 18 /dev/urandom | base64 | tr -d '/+=' > "$work/$role.pw"; chmod 600 "$work/$role.pw"; done
psql_admin -d postgres <<SQL || fail "roles"
CREATE ROLE results_owner LOGIN PASSWORD '$(cat "$work/owner.pw")';
CREATE ROLE lab_coordinator LOGIN PASSWORD '$(cat "$work/coordinator.pw")';
CREATE ROLE lab_operator LOGIN PASSWORD '$(cat "$work/operator.pw")';
CREATE DATABASE herald_results OWNER results_owner;
SQL
url="postgres://%s@127.0.0.1:$port/herald_results"
# A coordinator before the schema exists stops at start, naming the owner role.
out=$("$bin" coordinator --insecure --port 0 --results "$work/r0" --history "$(printf "$url" lab_coordinator)" --history-password-file "$work/coordinator.pw" --lab early 2>&1)
[ $? -eq 2 ] && grep -q "owner role" <<<"$out" || fail "a coordinator migrated, or did not say why not: $out"
"$bin" results-store migrate --history "$(printf "$url" results_owner)" --history-password-file "$work/owner.pw" || fail "migrate"
"$bin" results-store grants | psql_admin -d herald_results || fail "grants"

plan="$work/e2e.yaml"
printf 'name: results-e2e\ndescription: Two nodes for 40 seconds (scripts/results-server/e2e.sh).\nduration: 40s\nwarmup: 2s\nnodes:\n  - name: alpha\n    position: [0, 0]\n  - name: beta\n    position: [1m, 0]\nradio:\n  kind: sim\n' > "$plan"
lab() { # NAME: one run of the plan through lab NAME's coordinator, writing to the store
  COORDINATOR_ARGS="--history $(printf "$url" lab_coordinator) --history-password-file $work/coordinator.pw --lab $1" \
    BIN="$bin" LAB_WORK="$work/lab-$1" scripts/lab.sh "$plan" 2 "$work/results-$1" > "$work/lab-$1.out" 2>&1
  local rc=$?; [ $rc -le 1 ] || { tail -20 "$work/lab-$1.out"; fail "lab $1: scripts/lab.sh exit $rc"; }
}
rows() { psql_admin -d herald_results -At -c "SELECT lab || ' ' || count(*) FROM lab_run GROUP BY lab ORDER BY lab" | tr '\n' ';'; }

t0=$(date +%s)
lab london
[ "$(rows)" = "london 1;" ] || fail "after lab london: $(rows)"
echo "e2e: lab london's run stored ($(( $(date +%s) - t0 )) s)"

pgctl -m fast stop || fail "pg_ctl stop"
lab oslo
queued=$(ls "$work/results-oslo/.history-outbox/"*.json 2>/dev/null | wc -l)
[ "$queued" = 1 ] || fail "PostgreSQL down: $queued files in oslo's outbox, expected 1"
[ "$(stat -c %a "$work/results-oslo/.history-outbox/"*.json)" = 600 ] || fail "the outbox file is not 0600"
cp "$work/results-oslo/.history-outbox/"*.json "$work/entry.json"
echo "e2e: PostgreSQL stopped: lab oslo's run completed, its write queued in its outbox"

pgctl -l "$pg/server.log" -o "-p $port -k $pg -c listen_addresses=127.0.0.1" start || fail "pg_ctl start again"
"$bin" coordinator --insecure --port 0 --results "$work/results-oslo" --history "$(printf "$url" lab_coordinator)" --history-password-file "$work/coordinator.pw" --lab oslo > "$work/oslo-restart.log" 2>&1 &
cpid=$!
for _ in $(seq 1 100); do [ -z "$(ls "$work/results-oslo/.history-outbox/"*.json 2>/dev/null)" ] && break; sleep 0.1; done
kill -INT $cpid; wait $cpid
[ -z "$(ls "$work/results-oslo/.history-outbox/"*.json 2>/dev/null)" ] || fail "oslo's outbox not drained: $(cat "$work/oslo-restart.log")"
[ "$(rows)" = "london 1;oslo 1;" ] || fail "after PostgreSQL came back: $(rows)"
dups=$(psql_admin -d herald_results -At -c "SELECT count(*) FROM (SELECT lab, run_id FROM lab_run GROUP BY 1, 2 HAVING count(*) > 1) d")
[ "$dups" = 0 ] || fail "$dups duplicated rows"
# Reading across labs: every lab, then the two by name (JSON), and the infra rate per lab and testbed.
read_args=(--history "$(printf "$url" lab_coordinator)" --history-password-file "$work/coordinator.pw")
"$bin" results-store runs "${read_args[@]}" || fail "results-store runs"
n=$("$bin" results-store runs "${read_args[@]}" --lab london --lab oslo --plan results-e2e --json | python3 -c 'import json,sys; r=json.load(sys.stdin); print(" ".join(sorted(x["lab"] for x in r)))')
[ "$n" = "london oslo" ] || fail "results-store runs --lab london --lab oslo: $n"
"$bin" results-store infra "${read_args[@]}" | tee "$work/infra.txt"
grep -q "^london/sim  0 of 1 runs" "$work/infra.txt" || fail "results-store infra"
# history, regress and compare read the shared store (issue 41 item 4).
"$bin" history "${read_args[@]}" --lab london --lab oslo > "$work/history.txt" 2>&1 || { cat "$work/history.txt"; fail "history --lab london --lab oslo"; }
head -1 "$work/history.txt" | grep -q "^recorded  *lab  *plan" || fail "history: no lab column: $(head -3 "$work/history.txt")"
[ "$(grep -c ' london  *results-e2e ' "$work/history.txt")" = 1 ] && [ "$(grep -c ' oslo  *results-e2e ' "$work/history.txt")" = 1 ] || fail "history: a row of each lab: $(cat "$work/history.txt")"
n=$("$bin" history "${read_args[@]}" --lab oslo --json | python3 -c 'import json,sys; r=json.load(sys.stdin); print(" ".join(x["lab"] for x in r))')
[ "$n" = "oslo" ] || fail "history --lab oslo --json: $n"
out=$("$bin" history "${read_args[@]}" --lab lodnon 2>&1); rc=$?
[ $rc -eq 2 ] && grep -q -- "--lab \"lodnon\": no runs of that lab.*did you mean 'london'" <<<"$out" || fail "history --lab lodnon: exit $rc: $out"
bundle=$(dirname "$(ls "$work"/results-london/*/manifest.json | head -1)")
out=$("$bin" regress "$bundle" --baseline history "${read_args[@]}" --lab london 2>&1); rc=$?
[ $rc -eq 3 ] && grep -q "by lab london in the shared store" <<<"$out" && grep -q "other labs' runs are never its baseline" <<<"$out" || fail "regress --history --lab london: exit $rc: $out"
out=$("$bin" regress "$bundle" --baseline history "${read_args[@]}" --lab london --lab oslo 2>&1); rc=$?
[ $rc -eq 2 ] && grep -q -- "--lab given 2 times" <<<"$out" || fail "regress with two --lab: exit $rc: $out"
out=$("$bin" compare "${read_args[@]}" --lab london --lab oslo --plan results-e2e --resamples 200 2>&1); rc=$?
[ $rc -eq 0 ] && grep -q "oslo" <<<"$out" || fail "compare --lab london --lab oslo: exit $rc: $out"
out=$("$bin" regress accept results-e2e --by e2e --reason "nothing open" --history "$(printf "$url" results_owner)" --history-password-file "$work/owner.pw" --lab london 2>&1); rc=$?
[ $rc -eq 3 ] && grep -q "no open alert of lab london, plan results-e2e" <<<"$out" || fail "regress accept --lab london: exit $rc: $out"
echo "e2e: history, regress and compare read both labs from the shared store"
grep -q "$(cat "$work/coordinator.pw")" "$work"/lab-*/logs/*.log "$work"/*.out "$work/oslo-restart.log" && fail "a password is in a log"
echo "e2e: PostgreSQL back: lab oslo's write landed once; 2 labs, 2 rows, no duplicates, no password in any log ($(( $(date +%s) - t0 )) s)"

# A lab name that is not a safe name is refused at start, naming the flag.
out=$("$bin" coordinator --insecure --port 0 --results "$work/r-bad" --lab 'evil;name' 2>&1)
[ $? -eq 2 ] && grep -q -- "--lab" <<<"$out" || fail "a hostile --lab was taken: $out"

# 3 coordinators at once: each with 200 runs already in its outbox (from another night with the
# store down), drained at start while the others write theirs and run a plan.
t1=$(date +%s)
for l in paris rome wien; do
  python3 - "$work/entry.json" "$work/results-$l/.history-outbox" "$l" <<'PY' || fail "outbox of $l"
import json, os, sys
entry, box, lab = json.load(open(sys.argv[1])), sys.argv[2], sys.argv[3]
os.makedirs(box, mode=0o700, exist_ok=True)
for k in range(200):
    e = dict(entry, lab=lab, runId="waiting-%03d" % k, path="/srv/%s/waiting-%03d" % (lab, k), bundleURL="/srv/%s/waiting-%03d" % (lab, k))
    name = os.path.join(box, "%016x-%08x-%06x.json" % (1_700_000_000_000_000 + k, 1, k))
    fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(e, f, sort_keys=True); f.flush(); os.fsync(f.fileno())
PY
done
short="$work/short.yaml"; study="$work/study.yaml"
sed -e 's/^duration: 40s/duration: 8s/' -e 's/^name: results-e2e/name: results-e2e-short/' "$plan" > "$short"
printf 'name: results-e2e-study\nduration: 8s\nwarmup: 2s\nnodes:\n  - name: alpha\n    position: [0, 0]\n  - name: beta\n    position: [1m, 0]\nradio:\n  kind: sim\nstudy:\n  factors:\n    - path: sensor.advertInterval\n      levels: [100ms, 1s]\n  repeats: 1\n' > "$study"
labrun() { # NAME PLAN
  COORDINATOR_ARGS="--history $(printf "$url" lab_coordinator) --history-password-file $work/coordinator.pw --lab $1" \
    BIN="$bin" LAB_WORK="$work/lab-$1" scripts/lab.sh "$2" 2 "$work/results-$1" > "$work/lab-$1.out" 2>&1
}
labrun paris "$study" & p1=$!
labrun rome "$short" & p2=$!
labrun wien "$short" & p3=$!
for p in $p1 $p2 $p3; do wait $p; rc=$?; [ $rc -le 1 ] || { tail -20 "$work"/lab-{paris,rome,wien}.out; fail "a lab of the three: scripts/lab.sh exit $rc"; }; done
# A coordinator stopped before its background drain ended (lab.sh stops it at the run's end)
# leaves the rest queued: started again, it sends them (the condition waited on, no fixed sleep).
for l in paris rome wien; do
  [ -z "$(ls "$work/results-$l/.history-outbox/"*.json 2>/dev/null)" ] && continue
  "$bin" coordinator --insecure --port 0 --results "$work/results-$l" --history "$(printf "$url" lab_coordinator)" --history-password-file "$work/coordinator.pw" --lab $l > "$work/$l-restart.log" 2>&1 &
  cpid=$!
  for _ in $(seq 1 300); do [ -z "$(ls "$work/results-$l/.history-outbox/"*.json 2>/dev/null)" ] && break; sleep 0.1; done
  kill -INT $cpid; wait $cpid
  [ -z "$(ls "$work/results-$l/.history-outbox/"*.json 2>/dev/null)" ] || fail "$l's outbox not drained: $(cat "$work/$l-restart.log")"
done
[ "$(rows)" = "london 1;oslo 1;paris 202;rome 201;wien 201;" ] || fail "3 coordinators at once: $(rows)"
dups=$(psql_admin -d herald_results -At -c "SELECT count(*) FROM (SELECT lab, run_id FROM lab_run GROUP BY 1, 2 HAVING count(*) > 1) d")
[ "$dups" = 0 ] || fail "$dups duplicated rows"
waiting=$(psql_admin -d herald_results -At -c "SELECT count(DISTINCT (lab, run_id)) FROM lab_run WHERE run_id LIKE 'waiting-%' AND summary_json = (SELECT summary_json FROM lab_run WHERE lab = 'oslo')")
[ "$waiting" = 600 ] || fail "$waiting of the 600 waiting runs landed whole"
for l in rome wien; do
  m=$(ls "$work/results-$l"/*/manifest.json | head -1)
  [ "$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1])).get("lab"))' "$m")" = "$l" ] || fail "$m does not name lab $l"
done
st=$(psql_admin -d herald_results -At -c "SELECT s.lab || ' ' || s.name || ' ' || array_length(s.levels, 1) || ' ' || s.runs_total || ' ' || (SELECT count(*) FROM lab_study_run r WHERE r.study = s.id) || ' ' || (SELECT count(*) FROM lab_run x WHERE x.lab = s.lab AND x.run_id IN (SELECT run_id FROM lab_study_run r WHERE r.study = s.id)) FROM lab_study s")
[ "$st" = "paris results-e2e-study 2 2 2 2" ] || fail "paris's study: '$st' ($(grep -i study "$work/lab-paris/logs/"*coordinator* 2>/dev/null | tail -3))"
effects=$(psql_admin -d herald_results -At -c "SELECT count(*) || ' effects (' || COALESCE(string_agg(DISTINCT verdict, ', '), 'none') || ')' FROM lab_study_effect")
echo "e2e: 3 coordinators at once: 603 rows, each once, 600 of them waiting in outboxes; paris's study with its 2 runs and $effects; manifests name their labs ($(( $(date +%s) - t1 )) s)"

# Retention: the flags' ranges (exit 2 naming the flag), then a prune as the operators' role.
op_args=(--history "$(printf "$url" lab_operator)" --history-password-file "$work/operator.pw")
out=$("$bin" results-store prune "${op_args[@]}" --keep-days 0 2>&1); [ $? -eq 2 ] && grep -q -- "--keep-days" <<<"$out" || fail "prune --keep-days 0: $out"
out=$("$bin" results-store prune "${op_args[@]}" --keep-days 30 --summary-days 7 2>&1); [ $? -eq 2 ] && grep -q -- "--summary-days" <<<"$out" || fail "prune --summary-days 7: $out"
out=$("$bin" results-store prune "${read_args[@]}" --keep-days 1 2>&1); [ $? -eq 2 ] && grep -q "42501" <<<"$out" || fail "a coordinator pruned: $out"
psql_admin -d herald_results -q -c "UPDATE lab_run SET recorded_at = recorded_at - interval '40 days' WHERE lab = 'wien' AND run_id LIKE 'waiting-1%'" || fail "aging wien's runs"
out=$("$bin" results-store prune "${op_args[@]}" --keep-days 30 --lab wien) || fail "prune: $out"
echo "e2e: $out"
grep -q "100 runs before" <<<"$out" || fail "prune deleted other than wien's 100 old runs"
[ "$(rows)" = "london 1;oslo 1;paris 202;rome 201;wien 101;" ] || fail "after prune: $(rows)"
[ "$(psql_admin -d herald_results -At -c "SELECT sum(runs) FROM lab_night WHERE lab = 'wien'")" = 100 ] || fail "wien's pruned nights not summed up"
echo "e2e: 2 passed, 0 failed"
