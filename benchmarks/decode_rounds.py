"""One-row decodes (32/8 grouped heads, head dim 128, bf16) whose tiles (sequences x KV heads) fill
the SMs in whole rounds or leave a last round short, in GPU time with the L2 flushed (a 512 MB
fill before every call), our dense call, a cache with device lengths and pages of 16 (shuffled)
beside cuDNN's fused attention, the calls taking turns one call at a time (compare_peers.py's
bench_cold_interleaved). Prints each shape's plan, then the medians over rounds in GB/s of K and V
read. docs/performance.md v65: FUSED_SM90's resident decode blocks, one an SM, left 17 x 8k keys
(136 tiles on 132 SMs) at 0.68x cuDNN's rate; balanced rounds (as few blocks as take the tiles in
as many rounds) read it at 0.87x.

Usage: FLASHATTN_LIBRARY=build/libflashattn.so PYTHONPATH=python python3 benchmarks/decode_rounds.py
       [--label TEXT] [--rounds N] [--iters N] [--shapes BxKEYS,...]
"""
import argparse
import os
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import flashattn  # noqa: E402
from compare_peers import bench_cold_interleaved, median, ours_fn, under  # noqa: E402

DEFAULT_SHAPES = "9x8192,16x8192,17x8192,33x8192,64x4096,66x4096,128x2048,132x2048"
HQ, HKV, D, PAGE = 32, 8, 128, 16


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--label", default="", help="a tag printed on every line (an A/B run's side)")
    ap.add_argument("--rounds", type=int, default=3, help="times every shape is timed (medians over them)")
    ap.add_argument("--iters", type=int, default=30, help="calls a library per shape and round (medians)")
    ap.add_argument("--shapes", default=DEFAULT_SHAPES, help="comma-separated BATCHxKEYS (keys a multiple of 16)")
    args = ap.parse_args()
    shapes = [tuple(int(x) for x in s.split("x")) for s in args.shapes.split(",")]
    tag = f"[{args.label}] " if args.label else ""
    flush = torch.empty(512 << 20, dtype=torch.uint8, device="cuda")
    rates = {}
    for rnd in range(args.rounds):
        for b, sk in shapes:
            torch.manual_seed(b * sk + rnd)
            q = torch.randn(b, 1, HQ, D, device="cuda", dtype=torch.bfloat16)
            k = torch.randn(b, sk, HKV, D, device="cuda", dtype=torch.bfloat16)
            v = torch.randn(b, sk, HKV, D, device="cuda", dtype=torch.bfloat16)
            o = torch.empty_like(q)
            dense, kernel = ours_fn(q, k, v, o, False, flashattn.Backend.AUTO)
            seqlens = torch.full((b,), sk, dtype=torch.int32, device="cuda")
            n = sk // PAGE
            perm = torch.randperm(b * n, device="cuda")
            kp = torch.empty(b * n, PAGE, HKV, D, device="cuda", dtype=torch.bfloat16)
            vp = torch.empty_like(kp)
            kp[perm], vp[perm] = k.reshape(b * n, PAGE, HKV, D), v.reshape(b * n, PAGE, HKV, D)
            table = perm.reshape(b, n).to(torch.int32)
            qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
            calls = {
                "dense": (dense, lambda: under(None)),
                "cache": (lambda: flashattn.flash_attn_with_kvcache(q, k, v, cache_seqlens=seqlens), lambda: under(None)),
                "pages16": (lambda: flashattn.flash_attn_with_kvcache(q, kp, vp, cache_seqlens=seqlens, block_table=table),
                            lambda: under(None)),
                "cudnn": (lambda: F.scaled_dot_product_attention(qt, kt, vt, enable_gqa=True),
                          lambda: under(SDPBackend.CUDNN_ATTENTION)),
            }
            if rnd == 0:
                # the three forms of our call read the same keys: pages answer exactly as the cache
                # does (the same kernel, the same order of keys), the dense call within rounding
                ref = calls["cache"][0]().float()
                dense()
                for name, got, tol in (("pages16", calls["pages16"][0](), 0.0), ("dense", o, 1e-2)):
                    err = (got.float() - ref).abs().max().item()
                    if not err <= tol:
                        raise SystemExit(f"{b}x{sk}: {name} differs from the cache call by {err}")
                print(f"{tag}{b}x{sk}: {b * HKV} tiles ({b * HKV / 132:.2f} rounds of 132 SMs), {kernel}", flush=True)
            ms = bench_cold_interleaved(calls, args.iters, flush=flush)
            gb = 2 * b * sk * HKV * D * 2 / 1e6  # K and V bytes, per ms -> GB/s
            rates.setdefault((b, sk), []).append({name: gb / t for name, t in ms.items()})
            del q, k, v, o, kp, vp
    for (b, sk), runs in rates.items():
        med = {name: median([r[name] for r in runs]) for name in runs[0]}
        print(f"{tag}decode {b}x{sk} {HQ}/{HKV} d{D} cold GB/s: " + "  ".join(f"{n} {g:.1f}" for n, g in med.items()) +
              f"   dense/cudnn {med['dense'] / med['cudnn']:.3f}", flush=True)


if __name__ == "__main__":
    main()
