#!/usr/bin/env bash
# make bench-results (issue 41 item 6): a PostgreSQL cluster of Debian's packages started in a
# temporary folder (as the postgres user when run as root; fsync and synchronous_commit on, as a
# real server runs), its database owned by a role with a password in a 0600 file; then
# herald-lab-bench results: the insert rate of 3 writers at once and the query times of the
# dashboard's Trends series and of `regress --baseline history` over a simulated year of 10 labs.
# Stops and removes everything. Usage: scripts/results-server/bench.sh [path/to/herald-lab-bench] [bench flags]
set -uo pipefail
cd "$(dirname "$0")/../.."
bin=${1:-.build/release/herald-lab-bench}
shift || true
[ -x "$bin" ] || { echo "bench-results: $bin not found" >&2; exit 2; }
pgbin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)
[ -x "$pgbin/initdb" ] || { echo "bench-results: PostgreSQL's server binaries not found (apt-get install postgresql)" >&2; exit 2; }

work=$(mktemp -d /tmp/hl-bench-results.XXXXXX)
chmod 755 "$work"
pg="$work/pg"; mkdir -p "$pg"
as_pg=()
if [ "$(id -u)" = 0 ]; then chown postgres:postgres "$pg"; as_pg=(runuser -u postgres --); fi
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
pgctl() { (cd /tmp && "${as_pg[@]}" "$pgbin/pg_ctl" -D "$pg/data" -w -t 60 "$@" >/dev/null); }
cleanup() { pgctl -m immediate stop 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT

(cd /tmp && "${as_pg[@]}" "$pgbin/initdb" -D "$pg/data" -U admin --auth-local=trust --auth-host=scram-sha-256 -E UTF8 --locale=C.UTF-8 >/dev/null) || { echo "bench-results: initdb failed" >&2; exit 2; }
pgctl -l "$pg/server.log" -o "-p $port -k $pg -c listen_addresses=127.0.0.1 -c shared_buffers=256MB" start || { echo "bench-results: pg_ctl start failed" >&2; exit 2; }
head -c 18 /dev/urandom | base64 | tr -d '/+=' > "$work/owner.pw"; chmod 600 "$work/owner.pw"
psql -h "$pg" -p "$port" -U admin -X -q -v ON_ERROR_STOP=1 -d postgres <<SQL || { echo "bench-results: roles" >&2; exit 2; }
CREATE ROLE results_owner LOGIN PASSWORD '$(cat "$work/owner.pw")';
CREATE DATABASE herald_results OWNER results_owner;
SQL
echo "bench-results: PostgreSQL $("$pgbin/postgres" --version | awk '{print $3}') on $(nproc) cores"
"$bin" results --history "postgres://results_owner@127.0.0.1:$port/herald_results" --history-password-file "$work/owner.pw" "$@"
