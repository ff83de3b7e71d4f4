#!/usr/bin/env python3
"""The summary table of e2e.sh runs: one Markdown row per spec that ran
(passed or failed) from ginkgo's JUnit reports, grouped by the spec's area,
with the counts per area and in all. Specs the focus left out ("skipped"
with no message) are not listed; a spec skipped by the spec itself (a
missing capability) is, with its reason.

A spec in several reports (a rerun) gets the outcome of the last report
given: name them oldest first.

Usage: e2e-summary.py JUNIT.xml [JUNIT.xml ...]
"""

import re
import sys
import xml.etree.ElementTree as ET

# The area of a spec: "CSI Mock volume expansion ..." -> "CSI Mock volume
# expansion"; "External Storage [Driver: d] [Testpattern: p] volumes ..." ->
# "External Storage: volumes".
MOCK = re.compile(r"\[sig-storage\] CSI Mock (.*)")
# The "CSI Mock" specs' top-level containers (test/e2e/storage/csimock).
MOCK_AREAS = [
    "fsgroup as mount option",
    "honor pv reclaim policy",
    "volume attach",
    "volume expansion",
    "volume fsgroup policies",
    "volume limit",
    "volume node stage",
    "volume service account token",
    "volume snapshot",
    "volume storage capacity",
    "workload info",
]
EXTERNAL = re.compile(r"External Storage \[Driver: [^\]]+\] \[Testpattern: [^\]]+\] (\S+)")


def area(name):
    m = MOCK.search(name)
    if m:
        rest = m.group(1)
        known = [a for a in MOCK_AREAS if rest.startswith(a)]
        return "CSI Mock " + (known[0] if known else " ".join(rest.split()[:2]))
    m = EXTERNAL.search(name)
    if m:
        return "External Storage: " + m.group(1)
    return "other"


def short(name):
    name = re.sub(r"^\[It\] ", "", name)
    name = re.sub(r" \[sig-storage[^\]]*\]$", "", name)
    return name.replace("[sig-storage] ", "").replace("|", "\\|")


def cases(path):
    for case in ET.parse(path).getroot().iter("testcase"):
        name = case.get("name", "")
        if not name.startswith("[It]"):
            continue
        status = case.get("status", "")
        skipped = case.find("skipped")
        message = (skipped.get("message", "") if skipped is not None else "").strip()
        if status == "skipped" and not message.startswith("skipped - "):
            continue  # left out by the focus or skip
        failure = case.find("failure")
        reason = ""
        if failure is not None:
            reason = (failure.get("message") or failure.text or "").strip().splitlines()[0][:160]
        elif status == "skipped":
            reason = message.removeprefix("skipped - ")[:160]
        yield area(name), short(name), status, float(case.get("time", "0")), reason


def main(paths):
    latest = {}
    for p in paths:
        for c in cases(p):
            latest[c[1]] = c
    rows = sorted(latest.values())
    totals = {}
    for a, _, status, _, _ in rows:
        t = totals.setdefault(a, {"passed": 0, "failed": 0, "skipped": 0})
        t[status if status in t else "failed"] += 1
    print("| Area | Passed | Failed or interrupted | Skipped by the spec |")
    print("|---|---:|---:|---:|")
    for a, t in sorted(totals.items()):
        print(f"| {a} | {t['passed']} | {t['failed']} | {t['skipped']} |")
    s = {k: sum(t[k] for t in totals.values()) for k in ("passed", "failed", "skipped")}
    print(f"| **all** | **{s['passed']}** | **{s['failed']}** | **{s['skipped']}** |")
    print()
    print("| Spec | Outcome | Seconds | Reason |")
    print("|---|---|---:|---|")
    for a, name, status, secs, reason in rows:
        print(f"| {name} | {status} | {secs:.0f} | {reason.replace('|', '/')} |")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1:])
