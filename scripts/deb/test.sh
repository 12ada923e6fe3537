#!/usr/bin/env bash
# make test-deb: the .deb as a new node gets it. For Debian 12 and Debian 13, a clean root made by
# mmdebstrap (variant apt: nothing but the base system) installs the package with
# `apt-get install ./herald-lab_*.deb` (its dependencies from Debian's mirror), then:
#   - herald-lab --version runs (no Swift toolchain or runtime in the root);
#   - ldd finds every library the binary needs;
#   - the package made the heraldlab user, and installed the units, the udev rule and the
#     dashboard's templates, style sheet and scripts (/usr/share/herald-lab/dashboard);
#   - an agent started from the root as user heraldlab (as herald-lab-agent@.service starts it)
#     registers with a coordinator running on this host and is listed alive;
#   - agents/README.md's deployment from the package (deploy_in_root.py): install-coordinator.sh,
#     agents enrol, install.sh --deb --radio sim for two agents, every service started as its
#     unit starts it, and a run over TLS from this host that ends with both nodes complete.
# Prints one PASS/FAIL line per check and suite; exit 1 on any FAIL.
#
#   scripts/deb/test.sh DEB HOST_BINARY [SUITE...]    (root; default suites: bookworm trixie)
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
deb=$(readlink -f "${1:?usage: test.sh DEB HOST_BINARY [SUITE...]}")
host_bin=$(readlink -f "${2:?usage: test.sh DEB HOST_BINARY [SUITE...]}")
shift 2
suites=${*:-bookworm trixie}
mirror=${DEB_TEST_MIRROR:-http://deb.debian.org/debian}
[ "$(id -u)" = 0 ] || { echo "test-deb: run as root (chroot, mmdebstrap)"; exit 2; }
command -v mmdebstrap >/dev/null || { echo "test-deb: mmdebstrap is missing"; exit 2; }
work=$(mktemp -d /var/tmp/heraldlab-deb-XXXXXX)
coordinator_pid=""
cleanup() {
  [ -n "$coordinator_pid" ] && kill "$coordinator_pid" 2>/dev/null
  for s in $suites; do
    for m in proc sys dev; do mountpoint -q "$work/$s/$m" && umount -l "$work/$s/$m"; done
  done
  rm -rf "$work"
}
trap cleanup EXIT
failed=0
check() { # SUITE WHAT CONDITION-EXIT-CODE [DETAIL]
  if [ "$3" = 0 ]; then echo "test-deb $1: PASS $2"; else echo "test-deb $1: FAIL $2${4:+: $4}"; failed=1; fi
}

# A coordinator on this host (loopback, no credentials): the agents in the roots register with it.
"$host_bin" coordinator --insecure --host 127.0.0.1 --port 0 --port-file "$work/coordinator.port" --results "$work/results" > "$work/coordinator.log" 2>&1 &
coordinator_pid=$!
for _ in $(seq 100); do [ -s "$work/coordinator.port" ] && break; sleep 0.1; done
port=$(cat "$work/coordinator.port" 2>/dev/null)
[ -n "$port" ] || { echo "test-deb: the coordinator did not start: $(tail -5 "$work/coordinator.log")"; exit 1; }

for suite in $suites; do
  root=$work/$suite
  started=$(date +%s)
  # Only the base system and apt: whatever herald-lab needs comes through its Depends.
  if ! mmdebstrap --quiet --variant=apt --include=ca-certificates \
        --customize-hook="copy-in $deb /tmp" \
        --customize-hook="chroot \"\$1\" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q /tmp/$(basename "$deb")" \
        "$suite" "$root" "$mirror" > "$work/$suite-mmdebstrap.log" 2>&1; then
    check "$suite" "apt-get install ./$(basename "$deb") in a clean $suite root" 1 "$(tail -15 "$work/$suite-mmdebstrap.log")"
    continue
  fi
  check "$suite" "apt-get install ./$(basename "$deb") in a clean $suite root ($(( $(date +%s) - started )) s)" 0
  for m in proc sys dev; do mkdir -p "$root/$m"; mount --bind "/$m" "$root/$m"; done
  version=$(chroot "$root" herald-lab --version 2>&1); rc=$?
  check "$suite" "herald-lab --version: $version" $rc
  [ ! -e "$root/usr/lib/swift" ] && ! chroot "$root" sh -c 'ls /usr/lib/*/libswiftCore.so* /usr/lib/libswiftCore.so*' >/dev/null 2>&1
  check "$suite" "no Swift runtime in the root" $?
  missing=$(chroot "$root" ldd /usr/bin/herald-lab | grep "not found")
  [ -z "$missing" ]; check "$suite" "every shared library found" $? "$missing"
  chroot "$root" id heraldlab >/dev/null 2>&1; check "$suite" "user heraldlab made by the package" $?
  for f in lib/systemd/system/herald-lab-agent@.service lib/systemd/system/herald-lab-coordinator.service \
           lib/systemd/system/herald-lab-air.service lib/udev/rules.d/90-herald-lab.rules \
           usr/share/herald-lab/dashboard/layout.mustache usr/share/herald-lab/dashboard/dashboard.css \
           usr/share/herald-lab/dashboard/live.js usr/share/herald-lab/dashboard/list.js; do
    [ -f "$root/$f" ]; check "$suite" "/$f installed" $?
  done
  grep -q "ExecStart=/usr/bin/herald-lab agent" "$root/lib/systemd/system/herald-lab-agent@.service"
  check "$suite" "the agent unit starts /usr/bin/herald-lab" $?
  # An agent as the unit runs it: user heraldlab, its own data folder.
  name=deb-$suite
  chroot "$root" install -d -o heraldlab -g heraldlab "/var/lib/herald-lab/$name"
  chroot "$root" runuser -u heraldlab -- herald-lab agent --insecure --name "$name" --host 127.0.0.1 --port 0 \
      --data "/var/lib/herald-lab/$name" --coordinator "http://127.0.0.1:$port" --radio sim --air 127.0.0.1:9 \
      > "$work/$suite-agent.log" 2>&1 &
  agent=$!
  alive=1
  for _ in $(seq 150); do
    if "$host_bin" agents --coordinator "http://127.0.0.1:$port" --json 2>/dev/null | python3 -c "
import json, sys
agents = json.load(sys.stdin)
sys.exit(0 if any(a['info']['name'] == '$name' and a['state'] == 'alive' for a in agents) else 1)"; then alive=0; break; fi
    sleep 0.2
  done
  check "$suite" "an agent from the package registered and is alive" $alive "$(tail -5 "$work/$suite-agent.log")"
  kill "$agent" 2>/dev/null; wait "$agent" 2>/dev/null
  pkill -f "herald-lab agent --insecure --name $name" 2>/dev/null
  # agents/README.md's steps from the package: coordinator and air by install-coordinator.sh,
  # two agents by install.sh --deb --radio sim, each started as its unit starts it, and a run
  # from this host as the operator's machine (scripts/deb/deploy_in_root.py).
  cp -L /etc/resolv.conf "$root/etc/resolv.conf" 2>/dev/null
  python3 "$here/deploy_in_root.py" "$root" "$deb" "$host_bin" "$work" "$suite" || failed=1
  for m in proc sys dev; do umount -l "$root/$m"; done
done
echo "test-deb: package $(basename "$deb"), $(du -k "$deb" | cut -f1) KB; binary $(( $(dpkg-deb --fsys-tarfile "$deb" | tar -xO ./usr/bin/herald-lab | wc -c) / 1024 )) KB"
exit $failed
