"""The SM clock and power draw while one dense prefill shape runs back to back: ours (through
FLASHATTN_LIBRARY) or cuDNN's fused attention (through PyTorch's SDPA). Calls for --secs seconds
while nvidia-smi samples every 25 ms; prints TFLOP/s over the run and the medians of the second
half's samples (docs/performance.md v27: at the H200's power limit, the clock a kernel keeps
depends on what it issues).

    FLASHATTN_LIBRARY=build/libflashattn.so PYTHONPATH=python \\
        python3 benchmarks/clock_probe.py --who ours --b 4 --h 8 --s 4096 --d 256 [--dtype fp16]
"""
import argparse
import os
import statistics
import subprocess
import tempfile
import time

import torch


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--who", choices=("ours", "cudnn"), default="ours")
    ap.add_argument("--b", type=int, required=True)
    ap.add_argument("--h", type=int, required=True)
    ap.add_argument("--s", type=int, required=True)
    ap.add_argument("--d", type=int, required=True)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--secs", type=float, default=3.0)
    ap.add_argument("--dtype", choices=("bf16", "fp16"), default="bf16")
    a = ap.parse_args()
    dt = torch.bfloat16 if a.dtype == "bf16" else torch.float16
    q, k, v = (torch.randn(a.b, a.s, a.h, a.d, device="cuda", dtype=dt) for _ in range(3))
    if a.who == "ours":
        import flashattn

        def call():
            flashattn.flash_attn_func(q, k, v, causal=a.causal)
    else:
        from torch.nn.attention import SDPBackend, sdpa_kernel
        qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))

        def call():
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=a.causal)
    for _ in range(5):
        call()
    torch.cuda.synchronize()
    with tempfile.NamedTemporaryFile("w+", suffix=".csv") as log:
        smi = subprocess.Popen(["nvidia-smi", "--query-gpu=clocks.sm,power.draw,temperature.gpu",
                                "--format=csv,noheader,nounits", "-lms", "25"], stdout=log)
        time.sleep(0.3)
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0, n = time.time(), 0
        e0.record()
        while time.time() - t0 < a.secs:
            for _ in range(10):
                call()
            n += 10
            if n % 100 == 0:
                torch.cuda.synchronize()  # (keeps the host within a few calls of the GPU)
        e1.record()
        torch.cuda.synchronize()
        smi.terminate()
        smi.wait()
        log.seek(0)
        rows = [line.split(",") for line in log.read().strip().splitlines() if line.count(",") == 2]
    rows = rows[len(rows) // 2:]
    ms = e0.elapsed_time(e1) / n
    flops = 4 * a.b * a.h * a.s * a.s * a.d * (0.5 if a.causal else 1.0)
    clock = statistics.median(float(r[0]) for r in rows)
    power = statistics.median(float(r[1]) for r in rows)
    print(f"{a.who:6s} {a.dtype} b{a.b} h{a.h} s{a.s} d{a.d}{' causal' if a.causal else ''}: {flops / ms / 1e9:6.1f} TFLOP/s  "
          f"clock {clock:.0f} MHz  power {power:.0f} W  ({len(rows)} samples, {n} calls)")


if __name__ == "__main__":
    main()
