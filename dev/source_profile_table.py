"""Reads ncu's SASS source page (CSV, `ncu -i R --page source --csv --print-source sass`) and
prints where one kernel's warps waited: the instructions with the most stall samples (with the
reasons ncu attributes to them) and the samples of each phase, phases being the stretches between
BAR.SYNC instructions in address order. Used by dev/source_profile.sh."""
import csv
import sys


def number(text):
    try:
        return float(str(text).replace(",", ""))
    except ValueError:
        return 0.0


def main(path):
    with open(path, newline="") as f:
        lines = f.read().splitlines()
    start = next((i for i, line in enumerate(lines) if "Address" in line and "Source" in line), 0)
    rows = list(csv.DictReader(lines[start:]))
    if not rows:
        print("no rows in", path)
        print("\n".join(lines[:20]))
        return
    columns = list(rows[0].keys())
    print("columns:", " | ".join(columns))
    samples = next((c for c in columns if "Sampling (All" in c), None)
    if samples is None:
        print("no stall-sampling column in", path)
        return
    executed = next((c for c in columns if c.startswith("Instructions Executed")), None)
    reasons = [c for c in columns if c.startswith("stall_") or "Stall" in c and c != samples
               and "Not-issued" not in c]
    total = sum(number(r[samples]) for r in rows) or 1.0
    print(f"\n{len(rows)} SASS instructions, {total:.0f} stall samples")
    phase, phases = 0, {}
    for r in rows:
        if "BAR.SYNC" in r["Source"]:
            phase += 1
        r["phase"] = phase
        phases[phase] = phases.get(phase, 0.0) + number(r[samples])
    for p, s in phases.items():
        print(f"phase {p} (after {p} barriers): {s:.0f} samples, {100 * s / total:.1f}%")
    print("\ntop instructions by stall samples:")
    for r in sorted(rows, key=lambda r: -number(r[samples]))[:30]:
        why = sorted(((number(r[c]), c) for c in reasons), reverse=True)[:3]
        why = ", ".join(f"{c} {v:.0f}" for v, c in why if v > 0)
        ex = f" exec {number(r[executed]):.0f}" if executed else ""
        print(f"{number(r[samples]):7.0f} {100 * number(r[samples]) / total:5.1f}% ph{r['phase']}"
              f" {r['Address']} {r['Source'][:60]:60s}{ex}  {why}")


if __name__ == "__main__":
    main(sys.argv[1])
