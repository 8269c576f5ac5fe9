#!/usr/bin/env python3
"""Kill rate per directory and the surviving mutants of a `make mutants` run.

usage: ci/mutants-report.py MUTANTS_OUT_DIR   (cargo-mutants' `mutants.out`)

Reads `outcomes.json`. A mutant is viable when it built; the kill rate of a directory is
caught / (caught + missed + timeout), a timeout counting as caught (the suite noticed
the mutant by not finishing). Survivors are listed with their location and description;
each must be killed by a scenario or excluded in .cargo/mutants.toml with a reason.
"""
import json
import os
import sys
from collections import defaultdict


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


def main():
    if len(sys.argv) != 2:
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
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
    rate = 100.0 * (total["caught"] + total["timeout"]) / viable if viable else 0.0
    print(f"all: {rate:.0f}% of {viable} viable mutants killed")
    print(f"survivors ({len(survivors)}):")
    for file, line, text in sorted(survivors, key=lambda s: (s[0], s[1] or 0)):
        print(f"  {file}:{line}: {text}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
