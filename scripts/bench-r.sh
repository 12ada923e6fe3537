#!/usr/bin/env bash
# Times Herald's own R analysis (TestAnalysis.R from the Herald analysis repository) on an
# unpacked Herald test folder, for the side-by-side figure of `make bench-analysis`.
# The script is not part of this repository: it is located at run time, in this order:
#   $HERALD_R_SCRIPT                      a TestAnalysis.R
#   $HERALD_ANALYSIS_REPO                 a checkout, or a bare git directory, of the repository
#   .build/bench/herald-analysis          a clone left by an earlier run
#   a shallow git clone of theheraldproject/herald-analysis (needs the network)
# Prints "R: <seconds> s" on success, or "R: skipped (<why>)" and exits 0.
# Usage: scripts/bench-r.sh <herald test folder> <filter-start> <filter-end> <ce-start> <ce-end>
set -u
data=$1; fstart=$2; fend=$3; cstart=$4; cend=$5
work=.build/bench/herald-r
skip() { echo "R: skipped ($1)"; exit 0; }
command -v Rscript >/dev/null || skip "Rscript not installed: apt-get install r-base-core r-cran-plyr r-cran-chron r-cran-ggplot2 r-cran-scales r-cran-catools r-cran-dplyr"
mkdir -p .build/bench
src=""
if [ -n "${HERALD_R_SCRIPT:-}" ] && [ -f "$HERALD_R_SCRIPT" ]; then src=$(cat "$HERALD_R_SCRIPT")
elif [ -n "${HERALD_ANALYSIS_REPO:-}" ] && [ -f "$HERALD_ANALYSIS_REPO/TestAnalysis.R" ]; then src=$(cat "$HERALD_ANALYSIS_REPO/TestAnalysis.R")
elif [ -n "${HERALD_ANALYSIS_REPO:-}" ] && git --git-dir="$HERALD_ANALYSIS_REPO" rev-parse HEAD >/dev/null 2>&1; then src=$(git --git-dir="$HERALD_ANALYSIS_REPO" show HEAD:TestAnalysis.R)
else
  [ -f .build/bench/herald-analysis/TestAnalysis.R ] || \
    timeout 60 git clone -q --depth 1 https://github.com/theheraldproject/herald-analysis .build/bench/herald-analysis >/dev/null 2>&1 || \
    skip "Herald's TestAnalysis.R not found offline and the clone failed: set HERALD_R_SCRIPT or HERALD_ANALYSIS_REPO"
  src=$(cat .build/bench/herald-analysis/TestAnalysis.R)
fi
[ -n "$src" ] || skip "TestAnalysis.R is empty"
for p in plyr chron ggplot2 scales caTools dplyr; do
  Rscript -e "suppressMessages(library($p))" >/dev/null 2>&1 || skip "R package $p missing (Debian: r-cran-$(echo $p | tr A-Z a-z))"
done
rm -rf "$work" && mkdir -p "$work" && cp -r "$data" "$work/data"
abs=$(cd "$work/data" && pwd)
day() { echo "${1%% *}"; }
clock() { echo "${1##* }"; }
# The script's settings block is edited in a copy: folder, times; parsedate (not in Debian) is
# loaded but never called, so its library() line is dropped.
printf '%s\n' "$src" | sed \
  -e "s|^basedir <- .*|basedir <- \"$abs\"|" \
  -e "s|^library(parsedate)|# library(parsedate)|" \
  -e "s|^filtertimemin <- .*|filtertimemin <- as.POSIXct(paste(\"$(day "$fstart")\", \"$(clock "$fstart")\"), format=\"%Y-%m-%d %H:%M:%S\")|" \
  -e "s|^filtertimemax <- .*|filtertimemax <- as.POSIXct(paste(\"$(day "$fend")\", \"$(clock "$fend")\"), format=\"%Y-%m-%d %H:%M:%S\")|" \
  -e "s|^cestart <- .*|cestart <- as.POSIXct(paste(\"$(day "$cstart")\", \"$(clock "$cstart")\"), format=\"%Y-%m-%d %H:%M:%S\")|" \
  -e "s|^ceend <- .*|ceend <- as.POSIXct(paste(\"$(day "$cend")\", \"$(clock "$cend")\"), format=\"%Y-%m-%d %H:%M:%S\")|" \
  -e "s|^focusstart <- .*|focusstart <- cestart|" \
  -e "s|^focusend <- .*|focusend <- cestart + 3600|" \
  > "$work/TestAnalysis.R"
t0=$(date +%s.%N)
( cd "$work" && TZ=UTC Rscript TestAnalysis.R > r.log 2>&1 ) || { tail -5 "$work/r.log"; skip "Rscript failed (log in $work/r.log)"; }
t1=$(date +%s.%N)
echo "R: $(echo "$t1 - $t0" | bc -l | xargs printf '%.1f') s"
