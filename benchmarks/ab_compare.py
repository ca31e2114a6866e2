"""Side-by-side A/B of two flashattn_bench builds on the same shapes: reads the --json files of
alternating runs (A, B, A, B, ...), takes each shape's best median per build, and prints B / A.

    python3 benchmarks/ab_compare.py a1.json b1.json a2.json b2.json
"""
import json
import math
import sys


def rates(paths):
    best = {}
    for path in paths:
        for r in json.load(open(path))["rows"]:
            window = tuple(r["window"]) if r.get("window") else None
            key = (r["kind"], r["dtype"], r["b"], r["hq"], r["hkv"], r["sq"], r["sk"], r["d"], r["causal"], window,
                   r.get("kv", "dense"))  # (builds before the kv field: dense)
            rate = r.get("tflops") or r.get("gbps")
            if rate is not None:
                best[key] = max(best.get(key, 0.0), rate)
    return best


def main():
    paths = sys.argv[1:]
    a, b = rates(paths[0::2]), rates(paths[1::2])
    print(f"{'shape':52} {'A':>9} {'B':>9} {'B/A':>6}")
    ratios = []
    for key in a:
        if key not in b:
            continue
        kind, dtype, bb, hq, hkv, sq, sk, d, causal, window, kv = key
        label = (f"{kind} {dtype} {bb}x{hq}/{hkv} sq={sq} sk={sk} d={d}{' causal' if causal else ''}"
                 f"{f' window={window[0]},{window[1]}' if window else ''}{'' if kv == 'dense' else ' ' + kv}")
        ratios.append(b[key] / a[key])
        print(f"{label:52} {a[key]:9.1f} {b[key]:9.1f} {ratios[-1]:6.3f}")
    geo = math.exp(sum(math.log(x) for x in ratios) / len(ratios))
    print(f"A/B over {len(ratios)} shapes: B/A geomean {geo:.4f}, min {min(ratios):.3f}, max {max(ratios):.3f}")


if __name__ == "__main__":
    main()
