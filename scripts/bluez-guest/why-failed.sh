#!/usr/bin/env bash
# why-failed.sh OUTDIR: a failed guest run's verdict in at most about 60 lines, printed last by
# make test-bluez and make test-dongles so that a CI log that keeps only its tail still says what
# went wrong: why guest.sh stopped the guest (if it did), the check's FAIL lines and its
# diagnosis, the guest script's exit code, bluetoothd restarts, and the kernel's trace of each
# BUG, Oops or panic on the console. The whole outputs stay in OUTDIR.
set -u
out=${1:?usage: why-failed.sh OUTDIR}
here=$(cd "$(dirname "$0")" && pwd)
echo "=== why $(basename "$out") failed (outputs in $out)"
[ -s "$out/guest-died.txt" ] && echo "guest.sh stopped the guest: $(head -1 "$out/guest-died.txt")"
if [ -f "$out/guest-exit-code" ]; then echo "guest script exit code: $(cat "$out/guest-exit-code")"
else echo "guest script exit code: none (the guest did not finish; see $out/console.log)"; fi
bugs=$(grep -c "kernel BUG\|list_del corruption" "$out/console.log" 2>/dev/null)
echo "kernel BUG lines on the console: ${bugs:-0}; bluetoothd restarts: $(cat "$out/bluetoothd-restarts.log" 2>/dev/null | wc -l)"
if [ -f "$out/check.txt" ]; then
  # The FAIL lines, then the diagnosis after them (node logs, guest load), without the traces.
  grep '^FAIL' "$out/check.txt" | head -20
  sed -n '/^FAIL/,$p' "$out/check.txt" | grep -v '^FAIL' | sed '/^--- kernel oops/,$d' | head -20
else
  echo "no check output ($out/check.txt)"
fi
python3 "$here/guest_console.py" report "$out" | grep -v '^FAIL' | head -30
