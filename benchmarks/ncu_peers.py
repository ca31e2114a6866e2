"""Our dense call beside cuDNN's fused attention (PyTorch SDPA's CUDNN backend), each twice per
shape, for Nsight Compute; and a table of what ncu printed for them (docs/performance.md v64 has
one, for the cold rows where compare_peers.py had us below cuDNN).

    FLASHATTN_LIBRARY=build/libflashattn.so PYTHONPATH=python \\
        ncu --clock-control none -k regex:'fused_sm90|cudnn|sdpa|fmha' --section SpeedOfLight \\
            --section LaunchStats --metrics sm__inst_executed.sum,sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active \\
            python3 benchmarks/ncu_peers.py [--shape prefill:bf16:32:32:32:512:512:64:causal ...] > ncu.txt
    python3 benchmarks/ncu_peers.py --summarize ncu.txt

A shape is kind:dtype:b:hq:hkv:sq:sk:d:mask as flashattn_bench takes it (kind prefill or decode,
dtype bf16 or fp16, mask none or causal; K and V [b, sk, hkv, d], Q [b, sq, hq, d]). Without
--shape: the rows of v64's table. ncu replays each profiled kernel on its own with the caches
flushed (its default), so each figure is a cold call's; --clock-control none leaves the clock to the
GPU, as in the benchmarks. Before each library's calls the script prints a line "ncu_peers: <who>
<shape>", which --summarize uses to label the kernels that follow. --summarize reads only text: it
needs neither torch nor a GPU.
"""
import argparse
import re
import sys

DEFAULT_SHAPES = [
    "prefill:bf16:1:16:16:16384:16384:128:none",
    "prefill:bf16:1:16:16:16384:16384:128:causal",
    "prefill:bf16:4:16:16:4096:4096:128:none",
    "prefill:fp16:4:16:16:4096:4096:128:none",
    "prefill:fp16:2:16:16:8192:8192:128:causal",
    "prefill:bf16:8:32:8:2048:2048:128:causal",
    "prefill:bf16:8:16:16:2048:2048:128:none",
    "prefill:bf16:16:16:16:1024:1024:128:none",
    "prefill:bf16:16:16:16:1024:1024:192:none",
    "prefill:bf16:32:32:32:512:512:64:causal",
    "prefill:bf16:16:32:32:1024:1024:64:causal",
    "prefill:bf16:16:32:32:1024:1024:64:none",
    "prefill:bf16:32:32:32:512:512:64:none",
    "prefill:bf16:32:8:8:512:512:256:causal",
    "decode:bf16:64:32:8:1:4096:128:none",
    "decode:bf16:16:32:8:1:8192:128:none",
]


def parse_shape(text):
    parts = text.split(":")
    if len(parts) != 9 or parts[0] not in ("prefill", "decode") or parts[1] not in ("bf16", "fp16") \
            or parts[8] not in ("none", "causal"):
        raise argparse.ArgumentTypeError(f"bad shape {text!r}: kind:dtype:b:hq:hkv:sq:sk:d:mask")
    try:
        b, hq, hkv, sq, sk, d = (int(x) for x in parts[2:8])
    except ValueError:
        raise argparse.ArgumentTypeError(f"bad shape {text!r}: b, hq, hkv, sq, sk and d are integers")
    return {"text": text, "kind": parts[0], "dtype": parts[1], "b": b, "hq": hq, "hkv": hkv, "sq": sq,
            "sk": sk, "d": d, "causal": parts[8] == "causal"}


def run(shapes):
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    import flashattn

    for s in shapes:
        dt = torch.bfloat16 if s["dtype"] == "bf16" else torch.float16
        q = torch.randn(s["b"], s["sq"], s["hq"], s["d"], device="cuda", dtype=dt)
        k, v = (torch.randn(s["b"], s["sk"], s["hkv"], s["d"], device="cuda", dtype=dt) for _ in range(2))
        torch.cuda.synchronize()
        print(f"ncu_peers: ours {s['text']}", flush=True)
        for _ in range(2):
            flashattn.flash_attn_func(q, k, v, causal=s["causal"])
        torch.cuda.synchronize()
        # SDPA's is_causal is top-left; with sq == sk it is the bottom-right mask ours takes.
        if s["causal"] and s["sq"] != s["sk"]:
            print(f"ncu_peers: cudnn {s['text']} skipped (causal with sq != sk)", flush=True)
            continue
        qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        print(f"ncu_peers: cudnn {s['text']}", flush=True)
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            for _ in range(2):
                F.scaled_dot_product_attention(qt, kt, vt, is_causal=s["causal"], enable_gqa=s["hq"] != s["hkv"])
        torch.cuda.synchronize()


def summarize(path):
    """One line per profiled kernel: its label (the last "ncu_peers:" line before it), duration in
    microseconds, SM clock, tensor pipe and DRAM shares, instructions, grid."""
    text = open(path, encoding="utf-8", errors="replace").read()
    # ncu prints "==PROF== Profiling" as it profiles each kernel, among the script's own lines, and
    # the reports at the end in the same order: the k-th report is the k-th profiled kernel.
    labels, label = [], "-"
    for line in text.splitlines():
        if line.startswith("ncu_peers: "):
            label = line[len("ncu_peers: "):]
        elif line.startswith("==PROF== Profiling"):
            labels.append(label)
    rows = []
    # ncu starts each kernel's report with a line of two spaces and the kernel's name
    for chunk in re.split(r"\n(?=  \S)", text):
        if "Duration" not in chunk:
            continue
        name = chunk.strip().splitlines()[0]
        t = re.search(r"<([^>]*)>", name)
        c = re.search(r"sdpa_(\w*?)(?:_cga|_kernel|\s|\()", name)
        kernel = ("fused_sm90<" + t.group(1).replace(" ", "") + ">" if "fused_sm90" in name and t
                  else "cudnn " + c.group(1) if "cudnn" in name and c else name.split("(")[0][:44])
        label = labels[len(rows)] if len(rows) < len(labels) else "-"

        def num(pattern):
            m = re.search(pattern, chunk)
            return float(m.group(1).replace(",", "")) if m else None

        dur = num(r"Duration\s+\S+\s+([\d.,]+)")
        unit = re.search(r"Duration\s+(\S+)", chunk).group(1)
        dur = dur * {"ns": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3}.get(unit, 1.0)
        rows.append((label, kernel, dur, num(r"SM Frequency\s+\S+\s+([\d.]+)"),
                     num(r"pipe_tensor_cycles_active\S*\s+%\s+([\d.]+)"), num(r"DRAM Throughput\s+%\s+([\d.]+)"),
                     num(r"inst_executed\.sum\s+inst\s+([\d,]+)"), num(r"Grid Size\s+([\d,]+)")))
    # (label, kernel) then the figures: width and format of each column
    cols = [("us", 9, ".1f"), ("GHz", 5, ".2f"), ("tensor%", 7, ".1f"), ("DRAM%", 6, ".1f"), ("inst", 13, ",.0f"),
            ("grid", 6, ".0f")]
    print(f"{'shape (who)':56s} {'kernel':44s} " + " ".join(f"{name:>{w}s}" for name, w, _ in cols))
    for label, kernel, *figures in rows:
        print(f"{label[:56]:56s} {kernel[:44]:44s} " +
              " ".join(f"{'-' if v is None else format(v, spec):>{w}s}" for v, (_, w, spec) in zip(figures, cols)))
    return 0 if rows else 1


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", action="append", type=parse_shape, metavar="KIND:DTYPE:B:HQ:HKV:SQ:SK:D:MASK",
                    help="a shape to run (repeatable; default: v64's rows)")
    ap.add_argument("--summarize", metavar="NCU_OUTPUT", help="print the table of an ncu output and exit")
    a = ap.parse_args()
    if a.summarize:
        return summarize(a.summarize)
    run(a.shape or [parse_shape(s) for s in DEFAULT_SHAPES])
    return 0


if __name__ == "__main__":
    sys.exit(main())
