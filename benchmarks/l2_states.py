"""Decode GPU time under three states of the L2 before each timed call, for libflashattn
(FLASHATTN_LIBRARY) or cuDNN (PyTorch's scaled_dot_product_attention, CUDNN backend):

  fill  a 512 MB fill before the call (what compare_peers.py --flush-l2 and flashattn_bench do):
        the L2 full of modified lines;
  read  a 512 MB read before the call: the L2 full of unmodified lines;
  warm  a sleep kernel before the call (no flush; the call's K and V stay from the last call where
        they fit), so that the host's launch gap is not timed.

Prints GB/s of K and V per shape (medians of --iters calls, GPU time between CUDA events).
--pages P,... times flash_attn_with_kvcache over a cache in pages of P keys (the pool's pages in a
shuffled order, every sequence's cache full) for each P, and flash_attn_func over dense K and V for
P = 0 (the default: 0 alone);
--shape BxSK (repeatable; 32/8 heads, head dim 128, or BxSKxD) replaces the default shapes;
--states picks the L2 states to time.

    FLASHATTN_LIBRARY=build/libflashattn.so PYTHONPATH=python python3 benchmarks/l2_states.py [--peer cudnn]
        [--pages 0,1,16] [--shape 1x8192 ...] [--states fill,read,warm]
"""
import argparse

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

import flashattn
from compare_peers import bench

SHAPES = (  # batch, heads_q, heads_kv, seqlen_k, head_dim (one query, bf16)
    (1, 32, 8, 8192, 128),
    (2, 32, 8, 8192, 128),
    (1, 32, 8, 32768, 128),
    (16, 32, 8, 8192, 128),
)


def paged_call(q, k, v, ps):
    """flash_attn_with_kvcache over k and v copied into a pool of pages of ps keys in a shuffled
    order, each sequence's cache full; checked against flash_attn_func on k and v."""
    b, sk, hkv, d = k.shape
    per_seq = (sk + ps - 1) // ps
    gen = torch.Generator(device="cuda").manual_seed(0)
    order = torch.randperm(b * per_seq, device="cuda", generator=gen)
    rows = (order.view(b, per_seq, 1) * ps + torch.arange(ps, device="cuda")).view(b, -1)[:, :sk].reshape(-1)
    k_pool = torch.zeros(b * per_seq * ps, hkv, d, device="cuda", dtype=k.dtype)
    v_pool = torch.zeros_like(k_pool)
    k_pool[rows], v_pool[rows] = k.reshape(-1, hkv, d), v.reshape(-1, hkv, d)
    k_pool, v_pool = k_pool.view(-1, ps, hkv, d), v_pool.view(-1, ps, hkv, d)
    table = order.view(b, per_seq).to(torch.int32)
    lens = torch.full((b,), sk, dtype=torch.int32, device="cuda")
    fn = lambda: flashattn.flash_attn_with_kvcache(q, k_pool, v_pool, cache_seqlens=lens, block_table=table)
    diff = (fn().float() - flashattn.flash_attn_func(q, k, v).float()).abs().max().item()
    if not diff < 2e-2:
        raise SystemExit(f"pages of {ps}: the paged call differs from the dense one at {b}x{sk} by {diff}")
    return fn


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--peer", choices=("cudnn",), help="time cuDNN instead of libflashattn")
    ap.add_argument("--iters", type=int, default=25)
    ap.add_argument("--pages", default="0", help="comma-separated page sizes (0: dense K and V)")
    ap.add_argument("--shape", action="append", help="BxSK or BxSKxD (one query, 32/8 heads; repeatable)")
    ap.add_argument("--states", default="fill,read,warm", help="comma-separated L2 states (of fill, read, warm)")
    args = ap.parse_args()
    try:
        pages = [int(x) for x in args.pages.split(",")]
    except ValueError:
        pages = [-1]
    if min(pages) < 0 or (args.peer and pages != [0]):
        ap.error("--pages: page sizes >= 0 (0: dense K and V), libflashattn only")
    shapes = SHAPES
    if args.shape:
        try:
            dims = [[int(x) for x in sh.lower().split("x")] for sh in args.shape]
            shapes = [(d[0], 32, 8, d[1], d[2] if len(d) == 3 else 128) for d in dims if len(d) in (2, 3)]
        except ValueError:
            shapes = []
        if len(shapes) != len(args.shape) or any(min(sh) < 1 for sh in shapes):
            ap.error("--shape: BxSK or BxSKxD, positive integers")
    buf = torch.empty(512 << 20, dtype=torch.uint8, device="cuda")
    acc = torch.empty(1, dtype=torch.int64, device="cuda")
    states = {
        "fill": lambda: buf.fill_(1),
        "read": lambda: torch.sum(buf.view(torch.int64), dim=0, out=acc),
        "warm": lambda: torch.cuda._sleep(400000),
    }
    picked = args.states.split(",")
    if any(name not in states for name in picked):
        ap.error(f"--states: of {', '.join(states)}")
    states = {name: states[name] for name in picked}
    for (b, hq, hkv, sk, d), ps in ((shape, ps) for shape in shapes for ps in pages):
        q = torch.randn(b, 1, hq, d, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(b, sk, hkv, d, device="cuda", dtype=torch.bfloat16)
        v = torch.randn_like(k)
        if args.peer == "cudnn":
            qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
            fn = lambda: torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, enable_gqa=hq != hkv)
        elif ps:
            fn = paged_call(q, k, v, ps)
        else:
            fn = lambda: flashattn.flash_attn_func(q, k, v)
        kv_bytes = 2 * k.numel() * k.element_size()
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            rates = {name: kv_bytes / bench(fn, args.iters, before=before) / 1e6 for name, before in states.items()}
        what = f"pages of {ps}" if ps else "decode"
        print(f"{args.peer or 'libflashattn'} {what} {b}x{hq}/{hkv} sk={sk} d={d}: "
              + "  ".join(f"{name} {rate:7.0f}" for name, rate in rates.items()) + " GB/s", flush=True)


if __name__ == "__main__":
    main()
