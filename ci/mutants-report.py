#!/usr/bin/env python3
"""Kill rate per directory and the surviving mutants of a `make mutants` run.

usage: ci/mutants-report.py MUTANTS_OUT_DIR [REVIEWED_FILE]   (cargo-mutants' `mutants.out`)

Reads `outcomes.json`. A mutant is viable when it built; the kill rate of a directory is
caught / (caught + missed + timeout), a timeout counting as caught (the suite noticed
the mutant by not finishing). Every survivor is listed with its location and
description, and with the verdict and reason of its line in REVIEWED_FILE (default
ci/mutants-reviewed.txt) when it has one. The exit status is 1 when a survivor has no
reviewed line or fewer than MIN_KILL_RATE percent of the viable mutants were killed.
"""
import json
import os
import re
import sys
from collections import defaultdict

MIN_KILL_RATE = 85.0
DEFAULT_REVIEWED = os.path.join(os.path.dirname(os.path.abspath(__file__)), "mutants-reviewed.txt")


def mutant_of(outcome):
    scenario = outcome.get("scenario")
    if isinstance(scenario, dict) and "Mutant" in scenario:
        return scenario["Mutant"]
    return None


def location(mutant):
    file = mutant.get("file") or mutant.get("source_file") or "?"
    span = mutant.get("span") or {}
    line = (span.get("start") or {}).get("line")
    return file, line


def describe(mutant):
    for key in ("name", "description"):
        if mutant.get(key):
            return mutant[key]
    replacement = mutant.get("replacement", "")
    function = (mutant.get("function") or {}).get("function_name", "")
    return f"{function}: replace with {replacement}".strip()


def key_of(file, text):
    """`file | mutation` with the `file:line:column: ` prefix cargo-mutants puts in names
    removed, so a reviewed line survives edits that move the code."""
    mutation = re.sub(r"^\S+?:\d+:\d+:\s*", "", text)
    return f"{file} | {mutation}"


def load_reviewed(path):
    """`file | mutation | verdict | reason` lines; `#` starts a comment line."""
    reviewed = {}
    if not os.path.exists(path):
        return reviewed
    with open(path, encoding="utf-8") as f:
        for n, raw in enumerate(f, 1):
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            parts = [p.strip() for p in line.split(" | ")]
            if len(parts) != 4 or parts[2] not in ("equivalent", "untestable") or not parts[3]:
                print(f"{path}:{n}: expected `file | mutation | equivalent|untestable | reason`",
                      file=sys.stderr)
                sys.exit(2)
            reviewed[f"{parts[0]} | {parts[1]}"] = (parts[2], parts[3])
    return reviewed


def main():
    if len(sys.argv) not in (2, 3):
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    reviewed = load_reviewed(sys.argv[2] if len(sys.argv) == 3 else DEFAULT_REVIEWED)
    path = os.path.join(sys.argv[1], "outcomes.json")
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except OSError as e:
        print(f"mutants-report: cannot read {path}: {e}", file=sys.stderr)
        return 1
    per_dir = defaultdict(lambda: defaultdict(int))
    survivors = []
    for outcome in data.get("outcomes", []):
        mutant = mutant_of(outcome)
        if mutant is None:
            continue
        summary = outcome.get("summary", "")
        file, line = location(mutant)
        directory = os.path.dirname(file)
        kind = {
            "CaughtMutant": "caught",
            "MissedMutant": "missed",
            "Timeout": "timeout",
            "Unviable": "unviable",
        }.get(summary, summary.lower() or "unknown")
        per_dir[directory][kind] += 1
        if kind == "missed":
            survivors.append((file, line, describe(mutant)))
    total = defaultdict(int)
    print("kill rate per directory (caught + timeout over viable):")
    for directory in sorted(per_dir):
        counts = per_dir[directory]
        for k, v in counts.items():
            total[k] += v
        viable = counts["caught"] + counts["missed"] + counts["timeout"]
        rate = 100.0 * (counts["caught"] + counts["timeout"]) / viable if viable else 0.0
        print(
            f"  {directory}: {rate:.0f}% of {viable} viable "
            f"(caught {counts['caught']}, timeout {counts['timeout']}, missed {counts['missed']}, "
            f"unviable {counts['unviable']})"
        )
    viable = total["caught"] + total["missed"] + total["timeout"]
    killed = total["caught"] + total["timeout"]
    rate = 100.0 * killed / viable if viable else 0.0
    print(f"all: {rate:.1f}% of {viable} viable mutants killed ({killed}; bar {MIN_KILL_RATE:.0f}%)")
    unreviewed = 0
    print(f"survivors ({len(survivors)}):")
    for file, line, text in sorted(survivors, key=lambda s: (s[0], s[1] or 0)):
        verdict = reviewed.get(key_of(file, text))
        if verdict:
            print(f"  {text}\n      {verdict[0]}: {verdict[1]}")
        else:
            unreviewed += 1
            print(f"  {text}\n      NOT REVIEWED: kill it with a scenario or add it to the reviewed list")
    judged = viable - (len(survivors) - unreviewed)
    if judged:
        print(
            f"score without the reviewed survivors (equivalent or untestable through the "
            f"wire): {100.0 * killed / judged:.1f}% of {judged}"
        )
    if unreviewed or rate < MIN_KILL_RATE:
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
