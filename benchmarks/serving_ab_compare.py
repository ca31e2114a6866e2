"""A/B of the serving paths of two libflashattn builds: reads serving_speed.py's --json files of
alternating runs (A, B, B, A, ...: A's files in the odd places, B's in the even ones), takes each
cell's mean per build, and prints B / A for every shape and column (the peers' columns, which
neither build changes, show the run-to-run spread).

    python3 benchmarks/serving_ab_compare.py a1.json b1.json b2.json a2.json
"""
import json
import math
import sys


def cells(paths):
    """{(shape, column): [values]} over the runs in `paths`."""
    out = {}
    for path in paths:
        for row in json.load(open(path)):
            for col, value in row.items():
                if col != "shape" and isinstance(value, (int, float)):
                    out.setdefault((row["shape"], col), []).append(float(value))
    return out


def main():
    paths = sys.argv[1:]
    if len(paths) < 2 or len(paths) % 2:
        raise SystemExit("usage: serving_ab_compare.py A1.json B1.json [B2.json A2.json ...] (pairs)")
    # A B B A A B B A ...: A's runs are places 0 and 3 of every four.
    a_paths = [p for i, p in enumerate(paths) if i % 4 in (0, 3)]
    b_paths = [p for i, p in enumerate(paths) if i % 4 in (1, 2)]
    a, b = cells(a_paths), cells(b_paths)
    shapes = []
    for shape, _ in a:
        if shape not in shapes:
            shapes.append(shape)
    ratios = []
    for shape in shapes:
        parts = []
        for (s, col), va in a.items():
            if s != shape or (s, col) not in b:
                continue
            r = (sum(b[(s, col)]) / len(b[(s, col)])) / (sum(va) / len(va))
            ratios.append(r)
            parts.append(f"{col} {r:.3f}")
        print(f"{shape}: " + "  ".join(parts))
    if ratios:
        geo = math.exp(sum(math.log(x) for x in ratios) / len(ratios))
        print(f"serving A/B over {len(ratios)} cells: B/A geomean {geo:.4f}, min {min(ratios):.3f}, max {max(ratios):.3f}")


if __name__ == "__main__":
    main()
