"""Turns dev/fused_wgmma_run.sh's log ($OUT/fused_wgmma.txt) into the markdown tables the docs take:
per token count the library's strategy and time, then each variant's time (us) and, below, each
variant's error against float64 (a FAIL past the 1e-5 bound is marked). Rows printed by the
probe's --check runs (sanitizers, ncu: time 0.00) are skipped.

    python3 dev/fused_wgmma_table.py path/to/fused_wgmma.txt
"""
import re
import sys

ROW = re.compile(r"^T=(\d+)\s+sets=\d+\s+(\S+)\s+(\S+)\s+err\s+(\S+)\s+([\d.]+) us(.*)$")


def main(path):
    times, errors, strategy, names = {}, {}, {}, []
    with open(path) as f:
        for line in f:
            m = ROW.match(line.strip())
            if not m:
                continue
            t, name, label, err, us, rest = m.groups()
            if float(us) == 0.0:
                continue  # a --check row
            t = int(t)
            if name not in names:
                names.append(name)
            times[(t, name)] = float(us)
            errors[(t, name)] = err + (" FAIL" if "FAIL" in rest else "")
            if name == "library":
                strategy[t] = label
    tokens = sorted({t for t, _ in times})
    variants = [n for n in names if n != "library"]
    print("| T | library | " + " | ".join(variants) + " |")
    print("|---|---|" + "---|" * len(variants))
    for t in tokens:
        lib = times.get((t, "library"))
        cells = []
        for v in variants:
            us = times.get((t, v))
            cells.append("" if us is None else f"{us:.2f}")
        print(f"| {t} | {lib:.2f} ({strategy.get(t, '?')}) | " + " | ".join(cells) + " |")
    print()
    print("| T | " + " | ".join(names) + " |")
    print("|---|" + "---|" * len(names))
    for t in tokens:
        print(f"| {t} | " + " | ".join(errors.get((t, n), "") for n in names) + " |")


if __name__ == "__main__":
    main(sys.argv[1])
