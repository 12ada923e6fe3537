#!/usr/bin/env bash
# why-failed.sh OUTDIR: a failed guest run's verdict in at most about 45 lines, printed last by
# make test-bluez so that a CI log that keeps only its tail still says what went wrong: the
# check's FAIL lines and its diagnosis, the guest script's exit code, kernel BUGs and bluetoothd
# restarts. The whole outputs stay in OUTDIR.
set -u
out=${1:?usage: why-failed.sh OUTDIR}
echo "=== why $(basename "$out") failed (outputs in $out)"
if [ -f "$out/guest-exit-code" ]; then echo "guest script exit code: $(cat "$out/guest-exit-code")"
else echo "guest script exit code: none (the guest did not finish; see $out/console.log)"; fi
bugs=$(grep -c "kernel BUG\|list_del corruption" "$out/console.log" 2>/dev/null)
echo "kernel BUG lines on the console: ${bugs:-0}; bluetoothd restarts: $(cat "$out/bluetoothd-restarts.log" 2>/dev/null | wc -l)"
if [ -f "$out/check.txt" ]; then
  # From the first FAIL line on: the FAIL lines, then the diagnosis (node logs, guest load).
  sed -n '/^FAIL/,$p' "$out/check.txt" | head -40
else
  echo "no check output ($out/check.txt)"
fi
