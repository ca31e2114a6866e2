"""Decode GPU time under three states of the L2 before each timed call, for libflashattn
(FLASHATTN_LIBRARY) or cuDNN (PyTorch's scaled_dot_product_attention, CUDNN backend):

  fill  a 512 MB fill before the call (what compare_peers.py --flush-l2 and flashattn_bench do):
        the L2 full of modified lines;
  read  a 512 MB read before the call: the L2 full of unmodified lines;
  warm  a sleep kernel before the call (no flush; the call's K and V stay from the last call where
        they fit), so that the host's launch gap is not timed.

Prints GB/s of K and V per shape (medians of --iters calls, GPU time between CUDA events).

    FLASHATTN_LIBRARY=build/libflashattn.so PYTHONPATH=python python3 benchmarks/l2_states.py [--peer cudnn]
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


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--peer", choices=("cudnn",), help="time cuDNN instead of libflashattn")
    ap.add_argument("--iters", type=int, default=25)
    args = ap.parse_args()
    buf = torch.empty(512 << 20, dtype=torch.uint8, device="cuda")
    acc = torch.empty(1, dtype=torch.int64, device="cuda")
    states = {
        "fill": lambda: buf.fill_(1),
        "read": lambda: torch.sum(buf.view(torch.int64), dim=0, out=acc),
        "warm": lambda: torch.cuda._sleep(400000),
    }
    for b, hq, hkv, sk, d in SHAPES:
        q = torch.randn(b, 1, hq, d, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(b, sk, hkv, d, device="cuda", dtype=torch.bfloat16)
        v = torch.randn_like(k)
        if args.peer == "cudnn":
            qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
            fn = lambda: torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, enable_gqa=hq != hkv)
        else:
            fn = lambda: flashattn.flash_attn_func(q, k, v)
        kv_bytes = 2 * k.numel() * k.element_size()
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            rates = {name: kv_bytes / bench(fn, args.iters, before=before) / 1e6 for name, before in states.items()}
        print(f"{args.peer or 'libflashattn'} decode {b}x{hq}/{hkv} sk={sk} d={d}: "
              + "  ".join(f"{name} {rate:7.0f}" for name, rate in rates.items()) + " GB/s", flush=True)


if __name__ == "__main__":
    main()
