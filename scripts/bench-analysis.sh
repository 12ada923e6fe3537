#!/usr/bin/env bash
# The analyser on Herald's published 2020-12-08 test, side by side with Herald's own R script
# (scripts/bench-r.sh) on the same machine: medians of RUNS (ours) and R_RUNS (R) wall times,
# and the ratio (target >= 200x).
set -u
BIN=${BIN:-.build/release/herald-lab}
RUNS=${RUNS:-5}
R_RUNS=${R_RUNS:-1}
data=.build/bench/herald-2020-12-08
cs="2020-12-08 23:20:00"; ce="2020-12-09 11:00:00"; fs="2020-12-08 23:00:00"; fe="2020-12-09 11:20:00"
median() { sort -n | awk '{ v[NR] = $1 } END { if (NR == 0) print ""; else if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
ours=()
# The machine may be shared: ours runs on both cores, R on one; say how loaded it was.
echo "  load before: $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) cores"
for i in $(seq "$RUNS"); do
  rm -rf "$data-report"
  /usr/bin/time -f "%e %M" -o .build/bench/analysis.time "$BIN" analyse "$data" --mode herald --no-history --timings \
    --ce-start "$cs" --ce-end "$ce" --filter-start "$fs" --filter-end "$fe" > .build/bench/analysis.log 2>&1 || [ $? -eq 1 ] || { cat .build/bench/analysis.log; exit 1; }  # 1: verdict FAIL
  read -r wall kb < .build/bench/analysis.time
  echo "  run $i: $wall s wall, $((kb / 1024)) MB peak; $(grep -h '^timings' .build/bench/analysis.log)"
  ours+=("$wall")
done
ourmed=$(printf '%s\n' "${ours[@]}" | median)
ourmin=$(printf '%s\n' "${ours[@]}" | sort -n | head -1)
echo "ours: median $ourmed s wall of $RUNS, fastest $ourmin s (target < 0.35 s: 200x a 70 s R run; < 200 MB); load $(cut -d' ' -f1 /proc/loadavg)"
rs=()
for i in $(seq "$R_RUNS"); do
  line=$(scripts/bench-r.sh "$data" "$fs" "$fe" "$cs" "$ce")
  echo "  $line"
  case $line in "R: skipped"*) echo "ratio: not measured (R skipped)"; exit 0;; esac
  rs+=("$(echo "$line" | sed -n 's/^R: \([0-9.]*\) s$/\1/p')")
done
rmed=$(printf '%s\n' "${rs[@]}" | median)
echo "Herald's R script: median $rmed s wall of $R_RUNS; load after: $(cut -d' ' -f1-3 /proc/loadavg)"
awk -v r="$rmed" -v o="$ourmed" 'BEGIN { printf "ratio: %.0fx faster than R (target >= 200x)\n", r / o }'
