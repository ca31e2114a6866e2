"""A/B of two flashattn_bench builds (or A/B/C of three), shape by shape: each shape runs A, B, B, A
(A, B, C, C, B, A) as separate processes before the next shape starts, and each build's best median
counts.

ab_compare.py compares whole runs (all shapes of A, then all of B, ...). There a shape's neighbours
in the run are the same build's, and when a change makes one shape draw more or less power, the
shapes after it run at other clocks in that build only (docs/performance.md v14 and v20 saw
3-8% moves on kernels whose code had not changed). Here every run of a shape starts from the
same state: a fresh process, after the benchmark's own ceiling measurements.

    python3 benchmarks/ab_interleave.py --a old/build/benchmarks/flashattn_bench \
        --b build/benchmarks/flashattn_bench [--c other/build/benchmarks/flashattn_bench] \
        --shape prefill:bf16:4:16:16:4096:4096:192:none [--shape ...] [--json out.json] \
        [--rounds 3] [-- extra benchmark options, e.g. --backend fused_sm90]

Prints one line per shape (A, B, B/A, and with --c: C, C/A) and the geometric means of the ratios.
With --rounds N each shape runs N such rounds back to back: a build's rate is its best in each round,
a ratio is the median of the rounds' ratios, and the line adds their range (kernels held at the GPU's
power limit move by several percent from one process to the next, unchanged code included:
docs/performance.md v44).
Exit status: 0 when every run gave a rate, 1 when a run failed (its output is printed), 2 for bad
arguments.
"""
import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile


def run_once(exe, shape, iters, warmup, extra, tmpdir):
    """The shape's rate (TFLOP/s or GB/s) from one process of `exe`, or raises RuntimeError."""
    path = os.path.join(tmpdir, "row.json")
    if os.path.exists(path):
        os.remove(path)
    cmd = [exe, "--shape", shape, "--no-check", "--iters", str(iters), "--warmup", str(warmup), "--json", path] + extra
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0 or not os.path.exists(path):
        raise RuntimeError(f"{' '.join(cmd)} exited {r.returncode}:\n{r.stdout}{r.stderr}")
    with open(path) as f:
        rows = json.load(f)["rows"]
    rate = (rows[0].get("tflops") or rows[0].get("gbps")) if len(rows) == 1 else None
    if rate is None:
        raise RuntimeError(f"{' '.join(cmd)}: no rate in {rows}")
    return float(rate)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--a", required=True, help="the A build's flashattn_bench")
    ap.add_argument("--b", required=True, help="the B build's flashattn_bench")
    ap.add_argument("--c", help="a third build's flashattn_bench (optional)")
    ap.add_argument("--shape", action="append", required=True, help="kind:dtype:b:hq:hkv:sq:sk:d:mask[:kv] (repeat)")
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=1, help="A B B A rounds per shape (the median ratio counts)")
    ap.add_argument("--json", help="write the per-shape results here")
    ap.add_argument("extra", nargs="*", help="after --: options passed to every build")
    args = ap.parse_args()
    exes = {"a": args.a, "b": args.b}
    if args.c:
        exes["c"] = args.c
    for exe in exes.values():
        if not os.access(exe, os.X_OK):
            ap.error(f"{exe} is not an executable file")
    if args.iters < 1 or args.warmup < 0 or args.rounds < 1:
        ap.error("--iters and --rounds must be >= 1 and --warmup >= 0")
    sides = sorted(exes)
    order = sides + sides[::-1]  # A B B A, or A B C C B A
    results, ratios = [], {x: [] for x in sides[1:]}
    spread = args.rounds > 1
    head = f"{'shape':52} {'A':>9} {'B':>9} {'B/A':>6}" + (f" {'range':>13}" if spread else "")
    print(head + (f" {'C':>9} {'C/A':>6}" + (f" {'range':>13}" if spread else "") if "c" in exes else ""))
    with tempfile.TemporaryDirectory() as tmpdir:
        for shape in args.shape:
            rounds = []  # each round's best rate per build
            try:
                for _ in range(args.rounds):
                    best = {x: 0.0 for x in sides}
                    for side in order:
                        best[side] = max(best[side], run_once(exes[side], shape, args.iters, args.warmup, args.extra, tmpdir))
                    rounds.append(best)
            except RuntimeError as e:
                print(e, file=sys.stderr)
                return 1
            # (keys a, b, c: each build's median over the rounds of its best rate in a round)
            row = {"shape": shape, **{x: statistics.median(r[x] for r in rounds) for x in sides}}
            line = f"{shape:52} {row['a']:9.1f}"
            for x in sides[1:]:
                per_round = [r[x] / r["a"] for r in rounds]
                ratios[x].append(statistics.median(per_round))
                row[f"{x}_over_a"] = ratios[x][-1]
                line += f" {row[x]:9.1f} {ratios[x][-1]:6.3f}"
                if spread:
                    row[f"{x}_over_a_rounds"] = per_round
                    line += f" {min(per_round):6.3f}-{max(per_round):6.3f}"
            results.append(row)
            print(line, flush=True)
    geos = {x: math.exp(sum(math.log(r) for r in ratios[x]) / len(ratios[x])) for x in sides[1:]}
    print(f"A/B over {len(args.shape)} shapes, interleaved per shape" + (f", {args.rounds} rounds each" if spread else "") + ": " +
          ", ".join(f"{x.upper()}/A geomean {geos[x]:.4f}, min {min(ratios[x]):.3f}, max {max(ratios[x]):.3f}"
                    for x in sides[1:]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": results, "geomean": geos["b"], "geomeans": geos}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
