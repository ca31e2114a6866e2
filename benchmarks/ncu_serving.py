"""A decode step's serving call, made twice, for Nsight Compute to profile (ncu replays each kernel
it profiles on its own; -c 1 takes the first): over a dense cache, a paged cache, or a dense cache
with the step's key and value appended and rotary applied (docs/performance.md v15 quotes its
figures); or a prefill of `batch` equal sequences of `keys` tokens, as a dense batch or a ragged one.

    FLASHATTN_LIBRARY=build/libflashattn.so PYTHONPATH=python \\
        ncu -k regex:fused_sm90 -c 1 --section SpeedOfLight --section WarpStateStats \\
        python3 benchmarks/ncu_serving.py --page 1

--page 0 (default): the dense cache; --page N: pages of N keys in a shuffled pool; --append: the
dense cache with append + rotary (profile every kernel: the append kernel precedes attention);
--prefill dense|varlen [--causal] [--queries N]: flash_attn_func, or flash_attn_varlen_func over the
same tokens (N queries a sequence; default: as many as keys).
"""
import argparse

import torch

import flashattn
from serving_speed import append_inputs, to_pages  # (benchmarks/, the script's folder, is on sys.path)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--keys", type=int, default=8192)
    ap.add_argument("--heads", type=int, nargs=2, default=(32, 8), metavar=("HQ", "HKV"))
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--page", type=int, default=0)
    ap.add_argument("--append", action="store_true")
    ap.add_argument("--prefill", choices=("dense", "varlen"))
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--queries", type=int, help="--prefill: queries per sequence (default: --keys)")
    a = ap.parse_args()
    B, Sk, (Hq, Hkv), D = a.batch, a.keys, a.heads, a.head_dim
    g = torch.Generator(device="cuda").manual_seed(1)
    if a.prefill:
        Sq = a.queries or Sk
        q, k, v = (torch.randn(B, n, h, D, device="cuda", dtype=torch.bfloat16, generator=g)
                   for n, h in ((Sq, Hq), (Sk, Hkv), (Sk, Hkv)))
        if a.prefill == "dense":
            def call():
                flashattn.flash_attn_func(q, k, v, causal=a.causal)
        else:
            cu_q = torch.arange(0, (B + 1) * Sq, Sq, dtype=torch.int32, device="cuda")
            cu_k = torch.arange(0, (B + 1) * Sk, Sk, dtype=torch.int32, device="cuda")
            qp, kp, vp = (x.reshape(-1, x.shape[2], D) for x in (q, k, v))

            def call():
                flashattn.flash_attn_varlen_func(qp, kp, vp, cu_q, cu_k, Sq, Sk, causal=a.causal)
        call()
        call()
        torch.cuda.synchronize()
        return
    q = torch.randn(B, 1, Hq, D, device="cuda", dtype=torch.bfloat16, generator=g)
    k = torch.randn(B, Sk, Hkv, D, device="cuda", dtype=torch.bfloat16, generator=g)
    v = torch.randn(B, Sk, Hkv, D, device="cuda", dtype=torch.bfloat16, generator=g)
    seqlens = torch.full((B,), Sk, dtype=torch.int32, device="cuda")
    if a.append:
        kn, vn, cos, sin = append_inputs(B, Sk, Hkv, D, g)
        before = seqlens - 1

        def call():
            flashattn.flash_attn_with_kvcache(q, k, v, k=kn, v=vn, rotary_cos=cos, rotary_sin=sin,
                                              cache_seqlens=before, causal=True)
    elif a.page > 0:
        perm = torch.randperm(B * -(-Sk // a.page), device="cuda", generator=g)  # a shuffled page order
        kp, vp = to_pages(k, a.page, perm), to_pages(v, a.page, perm)
        table = perm.to(torch.int32).reshape(B, -1).contiguous()

        def call():
            flashattn.flash_attn_with_kvcache(q, kp, vp, cache_seqlens=seqlens, block_table=table, causal=True)
    else:
        def call():
            flashattn.flash_attn_with_kvcache(q, k, v, cache_seqlens=seqlens, causal=True)
    call()
    call()
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
