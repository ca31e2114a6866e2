#!/usr/bin/env python3
"""Summarises an ncu SASS export: warp-level executions by opcode (with the stall samples each
opcode took), and the instructions grouped by how many times each ran, so that a loop body shows
up as one group (a key loop runs tiles x key tiles x warps times). Two exports side by side
compare two kernels instruction by instruction (docs/performance.md v54: ours beside cuDNN's).

Make an export on the GPU machine (the SourceCounters section holds the per-instruction counts):

    ncu --section SourceCounters -k regex:fused_sm90 -c 1 -o rep python3 ...
    ncu --import rep.ncu-rep --page source --print-source sass --csv > ours.csv

then, anywhere (a .csv or a gzipped .csv.gz):

    python3 scripts/ncu_sass_summary.py ours.csv [theirs.csv] [--top 30] [--groups 12]
"""
import argparse
import collections
import csv
import gzip
import re
import sys

OPCODE = re.compile(r"(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)")


def load(path):
    """(kernel name, [(opcode, executions, stall samples, text)]) of one export."""
    opener = gzip.open if path.endswith(".gz") else open
    try:
        with opener(path, "rt", errors="replace") as f:
            rows = list(csv.reader(f))
    except OSError as e:
        sys.exit(f"{path}: {e.strerror or e}")
    name = next((r[1] for r in rows if len(r) > 1 and r[0] == "Kernel Name"), "?")
    try:
        hdr_i = next(i for i, r in enumerate(rows) if r and r[0] == "Address")
    except StopIteration:
        sys.exit(f"{path}: no 'Address' header row; export with --page source --print-source sass --csv")
    hdr = rows[hdr_i]
    try:
        col_e = hdr.index("Instructions Executed")
    except ValueError:
        sys.exit(f"{path}: no 'Instructions Executed' column; profile with --section SourceCounters")
    col_s = hdr.index("Warp Stall Sampling (All Samples)") if "Warp Stall Sampling (All Samples)" in hdr else None
    num = lambda s: int(s.replace(",", "") or 0)
    out = []
    for r in rows[hdr_i + 1:]:
        if len(r) <= col_e:
            continue
        m = OPCODE.match(r[1].strip())
        if not m:
            continue
        out.append((m.group(1), num(r[col_e]), num(r[col_s]) if col_s is not None else 0, r[1].strip()))
    return name, out


def summary(path, top, groups):
    name, instrs = load(path)
    total = sum(e for _, e, _, _ in instrs)
    stalls = sum(s for _, _, s, _ in instrs)
    by_op, st_op = collections.Counter(), collections.Counter()
    by_count = collections.defaultdict(collections.Counter)
    for op, e, s, _ in instrs:
        by_op[op] += e
        st_op[op] += s
        by_count[e][op] += 1
    print(f"{path}\n  kernel: {name[:150]}")
    print(f"  {len(instrs)} instructions in the code, {total / 1e6:.2f}M executed (warp level), {stalls} stall samples")
    for op, e in by_op.most_common(top):
        print(f"  {op:<12} {e / 1e6:9.2f}M {100 * e / max(total, 1):5.1f}%   stall samples {st_op[op]:7d}"
              f" ({100 * st_op[op] / max(stalls, 1):4.1f}%)")
    print("  instructions grouped by how many times each ran (the groups with the most executions):")
    ranked = sorted(by_count.items(), key=lambda kv: kv[0] * sum(kv[1].values()), reverse=True)
    for count, ops in ranked[:groups]:
        n = sum(ops.values())
        print(f"    ran {count:>10}: {n:5d} instructions, {count * n / 1e6:8.2f}M  "
              + ", ".join(f"{op} {c}" for op, c in ops.most_common(8)))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("exports", nargs="+", help="ncu SASS exports (.csv or .csv.gz), one or more")
    ap.add_argument("--top", type=int, default=30, help="opcodes to list (default 30)")
    ap.add_argument("--groups", type=int, default=12, help="execution-count groups to list (default 12)")
    a = ap.parse_args()
    for path in a.exports:
        summary(path, a.top, a.groups)


if __name__ == "__main__":
    main()
