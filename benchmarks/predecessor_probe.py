"""GPU time of one attention call with the L2 flushed before it, by what the GPU ran before the flush.

compare_peers.py's cold mode overwrites a 512 MB buffer before each timed call, which evicts the
L2 but not every state the last kernels leave (docs/performance.md v55: after some kernels a split
decode's merge, launched as a programmatic dependent triggered at the attention kernel's start,
started microseconds later; v56 moved the trigger after the partial stores). This times the same
call after different predecessors, each followed by the fill:

  self          nothing else: the call before is the same call (what a run of one library's
                cold calls, compare_peers.py --cold-order after-e2e, measures after its first);
  cudnn, fa2    the same shape through PyTorch's cuDNN or FlashAttention-2 backend;
  gemm          a 4096^3 bf16 cuBLAS GEMM;
  prefill       libflashattn's own 4x16/16 2k prefill (another of its kernels);
  sleep         a 20 us sleep kernel (the time between, without other code);
  X+again       predecessor X, then this library's same call on other tensors of the same
                shape (its kernels run again; the fill then evicts those tensors).

For libflashattn (FLASHATTN_LIBRARY, flash_attn_func) and cuDNN; shapes of one query row with 32/8
heads over 8k and 131k keys (split decode), 16 x 8k (unsplit) and a 8x16/16 2k prefill; head dim
128, bf16. Prints microseconds, the median of --iters calls per cell, in --rounds rounds.

    FLASHATTN_LIBRARY=build/libflashattn.so PYTHONPATH=python python3 benchmarks/predecessor_probe.py
"""
import argparse

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend

import flashattn
from compare_peers import bench, under

SHAPES = ((1, 32, 8, 1, 8192), (1, 32, 8, 1, 131072), (16, 32, 8, 1, 8192), (8, 16, 16, 2048, 2048))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--iters", type=int, default=25)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    flush = torch.empty(512 << 20, dtype=torch.uint8, device="cuda")
    ga, gb = (torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    pq, pk, pv = (torch.randn(4, 2048, 16, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))

    for bsz, hq, hkv, sq, sk in SHAPES:
        torch.manual_seed(0)
        q = torch.randn(bsz, sq, hq, 128, device="cuda", dtype=torch.bfloat16)
        k, v, k2, v2 = (torch.randn(bsz, sk, hkv, 128, device="cuda", dtype=torch.bfloat16) for _ in range(4))
        qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))

        def sdpa(backend):
            def call():
                with under(backend):
                    F.scaled_dot_product_attention(qt, kt, vt, enable_gqa=hq != hkv)
            return call

        cudnn, fa2 = sdpa(SDPBackend.CUDNN_ATTENTION), sdpa(SDPBackend.FLASH_ATTENTION)
        ours = lambda: flashattn.flash_attn_func(q, k, v)
        again = lambda: flashattn.flash_attn_func(q, k2, v2)
        befores = {"self": lambda: None, "cudnn": cudnn, "fa2": fa2, "gemm": lambda: torch.mm(ga, gb),
                   "prefill": lambda: flashattn.flash_attn_func(pq, pk, pv),
                   "sleep": lambda: torch.cuda._sleep(40000),
                   "fa2+again": lambda: (fa2(), again()),
                   "prefill+again": lambda: (flashattn.flash_attn_func(pq, pk, pv), again())}
        for rnd in range(args.rounds):
            for name, fn in (("ours", ours), ("cudnn", cudnn)):
                cells = {m: 1000.0 * bench(fn, args.iters, warm=3, flush=flush, before=b)
                         for m, b in befores.items() if not (name == "cudnn" and "again" in m)}
                print(f"{bsz}x{hq}/{hkv} {sq}x{sk} {name:5s} round {rnd} (us): "
                      + "  ".join(f"{m} {t:.1f}" for m, t in cells.items()), flush=True)


if __name__ == "__main__":
    main()
