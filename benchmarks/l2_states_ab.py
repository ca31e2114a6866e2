"""A/B of benchmarks/l2_states.py between two libflashattn builds: rounds of A B B A processes (each
a fresh l2_states.py run on one library), and per shape and L2 state the ratio of B's mean to A's in
each round; prints each build's median rate and the median ratio with the rounds' range.

    python3 benchmarks/l2_states_ab.py A/libflashattn.so B/libflashattn.so ROUNDS -- [l2_states.py options]
    e.g.  ... 3 -- --pages 1,16,0 --shape 1x8192 --states fill

Run from the repository root (it sets PYTHONPATH to python:benchmarks). Exit status 1 when a run
printed no rate (its output is shown), 2 for bad arguments.
"""
import os
import re
import statistics
import subprocess
import sys


def run(lib, extra):
    """{(call, state): GB/s} from one l2_states.py process on `lib`."""
    env = dict(os.environ, FLASHATTN_LIBRARY=lib, PYTHONPATH="python:benchmarks")
    r = subprocess.run([sys.executable, "benchmarks/l2_states.py"] + extra, capture_output=True, text=True, env=env)
    out = {}
    for line in r.stdout.splitlines():
        m = re.match(r"libflashattn (.*?): (.*) GB/s", line)
        if m:
            for name, val in re.findall(r"(\w+)\s+([0-9.]+)", m.group(2)):
                out[(m.group(1), name)] = float(val)
    if not out:
        print(r.stdout, r.stderr)
        raise SystemExit(1)
    return out


def main():
    args = sys.argv[1:]
    extra = args[args.index("--") + 1:] if "--" in args else []
    args = args[:args.index("--")] if "--" in args else args
    if len(args) != 3 or not args[2].isdigit() or int(args[2]) < 1:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        raise SystemExit(2)
    a, b, rounds = args[0], args[1], int(args[2])
    ratios, rates = {}, {}
    for _ in range(rounds):
        res = [run(lib, extra) for lib in (a, b, b, a)]
        for key in res[0]:
            ra, rb = (res[0][key] + res[3][key]) / 2, (res[1][key] + res[2][key]) / 2
            ratios.setdefault(key, []).append(rb / ra)
            rates.setdefault(key, []).append((ra, rb))
    for key, rs in ratios.items():
        ra = statistics.median(x for x, _ in rates[key])
        rb = statistics.median(y for _, y in rates[key])
        print(f"{key[0]:40} {key[1]:5} A {ra:7.0f} B {rb:7.0f} GB/s  B/A {statistics.median(rs):.3f}  "
              f"({min(rs):.3f}-{max(rs):.3f})", flush=True)


if __name__ == "__main__":
    main()
