#!/usr/bin/env bash
# docs/RESULTS-SERVER.md followed on one machine, as root (section 8): Debian's PostgreSQL 15
# packages, a private cluster in a temporary folder in place of the 15/main cluster (no
# systemd here), TLS with a certificate of `herald-lab ca init`, the three roles, migrate,
# grants, two labs writing through scripts/lab.sh, pg_dump and pg_restore, an upgrade's migrate,
# prune. Removes everything at the end. Usage: scripts/results-server/walkthrough.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
bin=${BIN:-.build/debug/herald-lab}
[ "$(id -u)" = 0 ] || { echo "walkthrough: run as root (it runs PostgreSQL as the postgres user)" >&2; exit 2; }
w=$(mktemp -d /tmp/hl-walk.XXXXXX); chmod 755 $w
pg=$w/pg; mkdir -p $pg; chown postgres:postgres $pg
P() { (cd /tmp && runuser -u postgres -- "$@"); }
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
echo "## 1. server: PostgreSQL $(/usr/lib/postgresql/15/bin/postgres --version | awk '{print $3}'), private cluster on port $port"
P /usr/lib/postgresql/15/bin/initdb -D $pg/data -U postgres --auth-local=peer --auth-host=scram-sha-256 -E UTF8 --locale=C.UTF-8 >/dev/null
echo "## TLS: herald-lab ca init, the certificate for localhost"
$bin ca init --dir $w/ca --host localhost >/dev/null
install -o postgres -g postgres -m 0600 $w/ca/key.pem $pg/data/server.key
install -o postgres -g postgres -m 0644 $w/ca/cert.pem $pg/data/server.crt
cat >> $pg/data/postgresql.conf <<CONF
listen_addresses = '127.0.0.1'
port = $port
unix_socket_directories = '$pg'
ssl = on
ssl_cert_file = 'server.crt'
ssl_key_file = 'server.key'
password_encryption = scram-sha-256
CONF
cat > $pg/data/pg_hba.conf <<HBA
local all postgres peer
hostssl herald_results lab_coordinator 127.0.0.1/32 scram-sha-256
hostssl herald_results lab_operator 127.0.0.1/32 scram-sha-256
hostssl herald_results herald_owner 127.0.0.1/32 scram-sha-256
HBA
chown postgres:postgres $pg/data/pg_hba.conf
P /usr/lib/postgresql/15/bin/pg_ctl -D $pg/data -l $pg/log -w start >/dev/null
trap 'P /usr/lib/postgresql/15/bin/pg_ctl -D $pg/data -m immediate stop >/dev/null; rm -rf $w' EXIT
for r in owner coordinator operator; do head -c 18 /dev/urandom | base64 | tr -d '/+=' > $w/$r.pw; chmod 600 $w/$r.pw; done
echo "## roles and database (passwords set from 0600 files; the doc's \\password asks at a prompt)"
P psql -h $pg -p $port -X -q -v ON_ERROR_STOP=1 <<SQL
CREATE ROLE herald_owner LOGIN PASSWORD '$(cat $w/owner.pw)';
CREATE ROLE lab_coordinator LOGIN PASSWORD '$(cat $w/coordinator.pw)';
CREATE ROLE lab_operator LOGIN PASSWORD '$(cat $w/operator.pw)';
CREATE DATABASE herald_results OWNER herald_owner;
REVOKE ALL ON DATABASE herald_results FROM PUBLIC;
GRANT CONNECT ON DATABASE herald_results TO herald_owner, lab_coordinator, lab_operator;
SQL
u() { echo "postgres://$1@localhost:$port/herald_results?sslmode=verify-full"; }
echo "## migrate as the owner over TLS verify-full"
$bin results-store migrate --history "$(u herald_owner)" --history-ca-file $w/ca/ca.pem --history-password-file $w/owner.pw 2>&1 | grep -v notice
$bin results-store grants | P psql -h $pg -p $port -X -q -v ON_ERROR_STOP=1 herald_results
echo "## 2. two labs write to it (scripts/lab.sh, one short run each)"
printf 'name: walk\nduration: 8s\nwarmup: 2s\nnodes:\n  - name: alpha\n    position: [0, 0]\n  - name: beta\n    position: [1m, 0]\nradio:\n  kind: sim\n' > $w/walk.yaml
for lab in london oslo; do
  COORDINATOR_ARGS="--history $(u lab_coordinator) --history-ca-file $w/ca/ca.pem --history-password-file $w/coordinator.pw --lab $lab" \
    BIN=$bin LAB_WORK=$w/lab-$lab scripts/lab.sh $w/walk.yaml 2 $w/results-$lab > $w/lab-$lab.out 2>&1 || { tail $w/lab-$lab.out; exit 1; }
  for _ in $(seq 1 100); do [ -z "$(ls $w/results-$lab/.history-outbox/*.json 2>/dev/null)" ] && break; sleep 0.1; done
done
$bin results-store runs --history "$(u lab_operator)" --history-ca-file $w/ca/ca.pem --history-password-file $w/operator.pw
echo "## (pg_hba.conf admits these roles only by hostssl: every session above was TLS, verified against the lab CA)"
echo "## 4. backup and restore"
P pg_dump -h $pg -p $port --format=custom --file=$pg/herald_results.dump herald_results
P createdb -h $pg -p $port -O herald_owner herald_results_restored
P pg_restore -h $pg -p $port --dbname=herald_results_restored --no-owner --role=herald_owner $pg/herald_results.dump
P psql -h $pg -p $port -X -At -c "SELECT 'restored: ' || count(*) || ' runs, schema version ' || max(v) FROM lab_run, (SELECT max(version) v FROM schema_version) s" herald_results_restored
echo "## 5. upgrade (migrate again: nothing to do at the same version)"
$bin results-store migrate --history "$(u herald_owner)" --history-ca-file $w/ca/ca.pem --history-password-file $w/owner.pw
echo "## 6. retention"
$bin results-store prune --history "$(u lab_operator)" --history-ca-file $w/ca/ca.pem --history-password-file $w/operator.pw --keep-days 90 --summary-days 1825 --lab london
if $bin results-store prune --history "$(u lab_operator)" --history-ca-file $w/ca/ca.pem --history-password-file $w/operator.pw --keep-days 0; then exit 1; else echo "exit $?"; fi
