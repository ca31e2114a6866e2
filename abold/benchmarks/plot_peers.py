"""Turns compare_peers.py's JSON into a PNG: TFLOP/s against sequence length, one panel per head
dim (bf16 prefill), one line per implementation, solid non-causal and dashed causal.

    python3 benchmarks/plot_peers.py peers.json peers.png
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main(src, dst):
    rows = [r for r in json.load(open(src))["rows"] if r["kind"] == "prefill" and r["dtype"] == "bfloat16"]
    dims = sorted({r["d"] for r in rows})
    fig, axes = plt.subplots(1, len(dims), figsize=(5 * len(dims), 4), sharey=True)
    for ax, d in zip(axes, dims):
        for name, color in (("ours", "tab:red"), ("fa2", "tab:blue"), ("cudnn", "tab:green")):
            for causal, style in ((False, "-"), (True, "--")):
                pts = sorted((r["sq"], r.get(name + "_tflops")) for r in rows if r["d"] == d and r["causal"] == causal)
                xs = [p[0] for p in pts if p[1] is not None]
                ys = [p[1] for p in pts if p[1] is not None]
                label = {"ours": "libflashattn", "fa2": "FlashAttention-2", "cudnn": "cuDNN"}[name]
                ax.plot(xs, ys, style, color=color, marker="o", label=f"{label}{' causal' if causal else ''}")
        ax.set_xscale("log", base=2)
        ax.set_title(f"head dim {d}, bf16, 16k tokens")
        ax.set_xlabel("sequence length")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("TFLOP/s")
    axes[-1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(dst, dpi=120)


if __name__ == "__main__":
    main(*sys.argv[1:3])
