#!/usr/bin/env bash
# loop.sh TIER N: first runs of a guest tier, counted. Each of the N runs is `make TIER` in a fresh
# clone of this checkout's branch (git clone into $LOOP_DIR, default /tmp/heraldlab-loop), with
# no retry; one line per run: pass or fail, wall time, kernel BUGs (those outside the Bluetooth
# stack that stop the guest, and in all), the host's load (1-min average at the start, mean and
# peak while the guest ran), and for a failure its first FAIL line. Lines go to stdout and to
# $LOOP_DIR/loop.log.
#
#   TIER   dongles (make test-dongles, DONGLES_STACK default trixie), dongles-bookworm,
#          dongles-bookworm-backports, bluez-bookworm-backports, bluez-bookworm or bluez-trixie
#          (make test-bluez with that BLUEZ_STACK)
#   LOOP_BURN=1      a CPU burner on every core beside each run (a loaded machine on purpose)
#   LOOP_BIN=PATH    the herald-lab to run, built from the same commit (default: the packaged
#                    binary, `make deb-binary`, built once in the first clone and reused)
#   BLUEZ_CACHE      the prepared kernels and roots (default: this checkout's .build-bluez, so a
#                    clone does not download them again)
set -uo pipefail
tier=${1:?usage: loop.sh TIER N}
count=${2:?usage: loop.sh TIER N}
case "$count" in ''|*[!0-9]*) echo "loop.sh: N must be a whole number, not '$count'" >&2; exit 2 ;; esac
case "$tier" in
  dongles) target=test-dongles; vars=(DONGLES_STACK=trixie); outs=results/test-dongles ;;
  dongles-bookworm|dongles-bookworm-backports) target=test-dongles; vars=(DONGLES_STACK=${tier#dongles-}); outs=results/test-dongles ;;
  bluez-bookworm-backports|bluez-bookworm|bluez-trixie) target=test-bluez; vars=(BLUEZ_STACK=${tier#bluez-}); outs=results/test-bluez/${tier#bluez-} ;;
  *) echo "loop.sh: TIER must be dongles, dongles-bookworm, dongles-bookworm-backports, bluez-bookworm-backports, bluez-bookworm or bluez-trixie, not '$tier'" >&2; exit 2 ;;
esac
here=$(cd "$(dirname "$0")" && pwd)
source=$(cd "$here/../.." && pwd)
branch=$(git -C "$source" rev-parse --abbrev-ref HEAD)
commit=$(git -C "$source" rev-parse --short HEAD)
dir=${LOOP_DIR:-/tmp/heraldlab-loop}
export BLUEZ_CACHE=${BLUEZ_CACHE:-$source/.build-bluez}
mkdir -p "$dir"
bin=${LOOP_BIN:-}
say() { echo "$*" | tee -a "$dir/loop.log"; }

burners=()
stop_burners() { for p in "${burners[@]}"; do kill "$p" 2>/dev/null; done; burners=(); }
trap stop_burners EXIT

say "# loop.sh $tier x$count: branch $branch at $commit ($(date -u +%FT%TZ)), burner ${LOOP_BURN:-0}"
passed=0
for i in $(seq 1 "$count"); do
  tag="$tier-$(date -u +%H%M%S)-$i"
  clone="$dir/$tag"
  git clone -q --branch "$branch" "$source" "$clone" || { say "$tag: git clone failed"; exit 1; }
  if [ -z "$bin" ]; then
    say "$tag: building herald-lab (make deb-binary) in the clone, once for the loop"
    (cd "$clone" && make deb-binary >"$clone/build.log" 2>&1) || { say "$tag: build failed (see $clone/build.log)"; exit 1; }
    bin="$clone/.build-deb/release/herald-lab"
  fi
  if [ "${LOOP_BURN:-0}" = 1 ]; then
    for _ in $(seq 1 "$(nproc)"); do (while :; do :; done) & burners+=($!); done
  fi
  load0=$(cut -d' ' -f1 /proc/loadavg)
  started=$(date +%s)
  # The herald-lab of this commit, not built again: copied where the clone's own build puts it (the
  # guest sees the clone, not other folders under /tmp), and SWIFT=true makes the Makefile's
  # build a no-op.
  if [ "$bin" != "$clone/.build-deb/release/herald-lab" ]; then
    mkdir -p "$clone/.build-deb/release" && cp -a "$bin" "$(dirname "$bin")"/*.resources "$clone/.build-deb/release/" 2>/dev/null
    [ -x "$clone/.build-deb/release/herald-lab" ] || { say "$tag: cannot copy $bin into the clone"; exit 1; }
  fi
  (cd "$clone" && make "$target" "${vars[@]}" SWIFT=true >"$clone/make.log" 2>&1)
  status=$?
  wall=$(( $(date +%s) - started ))
  stop_burners
  out="$clone/$outs"
  read -r bugs fatal < <(python3 "$here/guest_console.py" count "$out/console.log")
  load=$(awk '{ for (i = 1; i <= NF; i++) if ($i == "load") { v = $(i + 1); s += v; n++; if (v > m) m = v } } END { if (n) printf "mean %.1f peak %.1f", s / n, m; else print "n/a" }' "$out/host-load.log" 2>/dev/null)
  if [ "$status" -eq 0 ]; then verdict=PASS; passed=$((passed + 1)); cause=""
  else
    verdict=FAIL
    cause=$(grep -m1 -h '^FAIL' "$out/check.txt" 2>/dev/null || tail -1 "$clone/make.log")
    [ -s "$out/guest-died.txt" ] && cause="guest stopped: $(head -1 "$out/guest-died.txt")"
  fi
  say "$tag: $verdict in ${wall} s; kernel BUGs ${bugs:-?} (guest-fatal ${fatal:-?}); host load at start $load0, during $load; outputs $out${cause:+; cause: $cause}"
done
say "# $tier: $passed of $count first runs passed"
