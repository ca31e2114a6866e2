"""Where a call's late blocks run: per-SM lateness from block_timeline.py's recordings.

block_timeline.py writes every FUSED_SM90 block's stamps to $OUT/timelines$TAG.npz (calls x blocks x
8: entry, after the wait, K_0 landed, K_1 + V_0, last V, end, the producer's first load, SM). This
reads one or more such files and prints, for a case (default dense_fill):

- the SMs no block ran on;
- how many SMs a block runs on over the calls, and how consistent an SM's lateness (its blocks' ends
  relative to each call's median block) is: its mean over the first half of a file's calls against
  its mean over the second half, correlated over the SMs;
- the eight latest and earliest SMs, and their blocks' K_0 landing and last-V-to-end times;
- each SM's mean lateness over every file given, the earliest and latest SMs, and the means over
  ranges of 12 SM ids.

docs/performance.md v82 read a batch-1 decode's late blocks this way: the blocks move from SM to SM
between calls, and the same SMs run late, the idle SMs' TPC partners earliest.

    python3 benchmarks/timeline_sms.py /tmp/out/timelines_main.npz [more.npz ...] [--case pages16_fill]

Needs numpy only (runs where the recordings were copied, no GPU).
"""
import argparse
import sys

np = None  # numpy, imported once the arguments are read (so that --help needs none)


def load(path, case):
    """The case's stamps as int64 (calls x blocks x 8), or None where the file lacks the case."""
    z = np.load(path)
    if case not in z:
        return None
    return z[case].astype(np.int64)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("files", nargs="+", help="timelines*.npz from block_timeline.py")
    ap.add_argument("--case", default="dense_fill", help="the case's name in the files (default dense_fill)")
    args = ap.parse_args(argv)
    global np
    try:
        import numpy
    except ImportError:
        print("timeline_sms.py: needs numpy", file=sys.stderr)
        return 2
    np = numpy
    lateness = {}  # SM -> lateness of its blocks (ns after their call's median block), every file
    used_any = False
    for path in args.files:
        a = load(path, args.case)
        if a is None or a.shape[0] < 2:
            print(f"{path}: no case {args.case} (or fewer than 2 calls)")
            continue
        used_any = True
        calls, blocks = a.shape[0], a.shape[1]
        start = a[:, :, 0].min(axis=1, keepdims=True)
        end, k0, last_v, sm = a[:, :, 5] - start, a[:, :, 2] - start, a[:, :, 4] - start, a[:, :, 7]
        late = end - np.median(end, axis=1, keepdims=True)
        half = calls // 2

        def per_sm(rows):
            """Each SM's mean lateness and its blocks' mean K_0 landing and last-V-to-end, over `rows`."""
            out = {}
            for s in np.unique(sm[rows]):
                m = sm[rows] == s
                out[int(s)] = (late[rows][m].mean(), k0[rows][m].mean(), (end - last_v)[rows][m].mean())
            return out

        first, second, every = per_sm(slice(0, half)), per_sm(slice(half, calls)), per_sm(slice(0, calls))
        common = sorted(set(first) & set(second))
        corr = np.corrcoef([first[s][0] for s in common], [second[s][0] for s in common])[0, 1]
        moves = np.mean([len(set(sm[:, b].tolist())) for b in range(blocks)])
        idle = sorted(set(range(int(sm.max()) + 1)) - set(np.unique(sm).tolist()))
        order = sorted(every, key=lambda s: every[s][0])
        print(f"{path} ({args.case}): {calls} calls x {blocks} blocks; SMs with no block: {idle}")
        print(f"  a block runs on {moves:.1f} SMs over the calls; each SM's lateness, first half of the calls "
              f"against the second: correlation {corr:.2f}")
        print(f"  last block {np.median(late.max(axis=1)):.0f} ns after the median block (median over calls)")
        for name, sel in (("latest 8", order[-8:]), ("earliest 8", order[:8])):
            vals = np.array([every[s] for s in sel])
            print(f"  {name} SMs {sel}: lateness {vals[:, 0].mean():+.0f} ns, their blocks' K_0 at "
                  f"{vals[:, 1].mean():.0f} ns, last V to end {vals[:, 2].mean():.0f} ns")
        for s in np.unique(sm):
            lateness.setdefault(int(s), []).append(late[sm == s].mean())
    if not used_any:
        return 1
    avg = {s: float(np.mean(v)) for s, v in lateness.items()}
    order = sorted(avg, key=avg.get)
    print(f"every file: earliest SMs {[(s, round(avg[s])) for s in order[:6]]}")
    print(f"            latest SMs {[(s, round(avg[s])) for s in order[-6:]]}")
    top = max(avg) + 1
    ranges = []
    for g in range(0, top, 12):
        vals = [avg[s] for s in range(g, min(g + 12, top)) if s in avg]
        if vals:
            ranges.append(f"{g}-{min(g + 11, top - 1)}: {np.mean(vals):+.0f}")
    print("            by SM range (ns): " + ", ".join(ranges))
    return 0


if __name__ == "__main__":
    sys.exit(main())
