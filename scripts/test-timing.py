#!/usr/bin/env python3
"""Where a test tier's time went: the total test time, test counts, and the slowest classes.

Usage: scripts/test-timing.py LOG_OR_XUNIT [--budget SECONDS]

LOG_OR_XUNIT is either the output of a serial `swift test` (XCTest's "Test Case '...' passed (N
seconds)" lines and its final "Executed N tests ... in X (Y) seconds") or the xUnit XML that
`swift test --parallel --xunit-output` writes. Prints one line "tier: N tests, F failed, S skipped,
X s of test time" and the 15 slowest classes. With --budget, exits 1 when the test time is over
it (the budget of `make test` that .ci/run enforces: a budget for the tier, not a timed test).
Exit 2 when the file is missing or holds no test results.
"""
import re
import sys
import xml.etree.ElementTree as ET


def from_log(text):
    cases = []
    for m in re.finditer(r"^Test Case '([^.']+)\.([^']+)' (passed|failed|skipped) \(([0-9.]+) seconds\)", text, re.M):
        cases.append((m.group(1), m.group(2), m.group(3), float(m.group(4))))
    total = None
    summaries = re.findall(r"Executed (\d+) tests?, with (?:(\d+) tests? skipped and )?(\d+) failures? \(\d+ unexpected\) in ([0-9.]+) \(([0-9.]+)\) seconds", text)
    if summaries:
        executed, skipped, failures, seconds, _ = summaries[-1]
        total = (int(executed), int(failures), int(skipped or 0), float(seconds))
    return cases, total


def from_xunit(path):
    cases = []
    root = ET.parse(path).getroot()
    for tc in root.iter("testcase"):
        cls = tc.get("classname", "?").split(".")[-1]
        state = "failed" if tc.find("failure") is not None or tc.find("error") is not None else ("skipped" if tc.find("skipped") is not None else "passed")
        cases.append((cls, tc.get("name", "?"), state, float(tc.get("time", "0") or 0)))
    return cases, None


def main():
    args = sys.argv[1:]
    budget = None
    if "--budget" in args:
        i = args.index("--budget")
        try:
            budget = float(args[i + 1])
        except (IndexError, ValueError):
            print("test-timing: --budget needs a number of seconds", file=sys.stderr)
            return 2
        del args[i:i + 2]
    if len(args) != 1:
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    path = args[0]
    try:
        if path.endswith(".xml"):
            cases, total = from_xunit(path)
        else:
            with open(path, encoding="utf-8", errors="replace") as f:
                cases, total = from_log(f.read())
    except (OSError, ET.ParseError) as e:
        print(f"test-timing: {path}: {e}", file=sys.stderr)
        return 2
    if not cases and total is None:
        print(f"test-timing: {path}: no test results in it", file=sys.stderr)
        return 2
    if total is None:
        failed = sum(1 for c in cases if c[2] == "failed")
        skipped = sum(1 for c in cases if c[2] == "skipped")
        total = (len(cases), failed, skipped, sum(c[3] for c in cases))
    executed, failed, skipped, seconds = total
    note = " (summed over the tests; they ran side by side)" if path.endswith(".xml") else ""
    print(f"{path}: {executed} tests, {failed} failed, {skipped} skipped, {seconds:.1f} s of test time{note}")
    per_class = {}
    for cls, _, _, t in cases:
        n, s = per_class.get(cls, (0, 0.0))
        per_class[cls] = (n + 1, s + t)
    print("slowest classes (s, tests, class):")
    for cls, (n, s) in sorted(per_class.items(), key=lambda kv: -kv[1][1])[:15]:
        print(f"  {s:8.1f} {n:4d}  {cls}")
    if budget is not None and seconds > budget:
        print(f"test-timing: {seconds:.1f} s of test time is over the budget of {budget:.0f} s: move slow tests to a named tier or make them wait on conditions")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
