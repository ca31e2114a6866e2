"""Host time per call of flashattn.flash_attn_func (and of the serving functions), beside PyTorch's
scaled_dot_product_attention.

Host time is what a Python caller pays to enqueue one call: for decode steps it can exceed the
kernel. Each round enqueues `calls` calls of each function back to back (fewer than the launch queue
holds, so the CPU never waits for the GPU) and divides the thread's CPU time by `calls`; the
functions take turns within a round, and the median over `reps` rounds is reported, in microseconds. The "library" column is the C call
alone (flashattn_fwd through ctypes with a prepared parameter struct: validation, planning and the
kernel launches), the part of a call no Python wrapper can remove.

    FLASHATTN_LIBRARY=build/libflashattn.so PYTHONPATH=python python3 benchmarks/python_host_cost.py
"""
import argparse
import ctypes
import json
import statistics
import sys
import time

import torch
import torch.nn.functional as F

import flashattn

# Shapes whose kernels take less GPU time than a call's host time, so the host is what is measured:
# when the GPU is the slower side, the driver holds back submissions once its queue fills and the
# time per call becomes the GPU's (then host cost no longer decides the rate). Each path of the
# wrapper is here: split-key decode (workspace and a combine kernel), GQA-packed decode, prefill.
SHAPES = [  # (label, B, Sq, Sk, Hq, Hkv, D, causal)
    ("decode 1x32/8 sk=1024 d128 (split)", 1, 1, 1024, 32, 8, 128, False),
    ("decode 16x32/8 sk=256 d128", 16, 1, 256, 32, 8, 128, False),
    ("prefill 1x8/8 s=128 d64 causal", 1, 128, 128, 8, 8, 64, True),
    ("prefill 1x16/16 s=256 d128 causal", 1, 256, 256, 16, 16, 128, True),
]


def host_us(fns, calls, reps):
    """Host microseconds per call of each function: the median over `reps` rounds, each round timing
    `calls` back-to-back calls of every function in turn (so all see the same machine state) in CPU
    time of this thread (time spent descheduled does not count)."""
    for fn in fns:
        for _ in range(20):
            fn()
    torch.cuda.synchronize()
    times = [[] for _ in fns]
    for _ in range(reps):
        for i, fn in enumerate(fns):
            t0 = time.thread_time()
            for _ in range(calls):
                fn()
            times[i].append((time.thread_time() - t0) / calls * 1e6)
            torch.cuda.synchronize()
    return [statistics.median(t) for t in times]


def _params_for(q, k, v, causal, o=None):
    """A FwdParams for these tensors (O: `o`, else q's own address, for planning only)."""
    p = flashattn.FwdParams.new()
    p.dtype = flashattn.Dtype.BFLOAT16
    p.batch, p.seqlen_q, p.heads_q, p.head_dim = q.shape
    p.seqlen_k, p.heads_kv = k.shape[1], k.shape[2]
    p.mask = flashattn.Mask.CAUSAL_BOTTOM_RIGHT if causal else flashattn.Mask.NONE
    for name, t in (("q", q), ("k", k), ("v", v), ("o", q if o is None else o)):
        setattr(p, name, t.data_ptr())
        for dim, stride in zip(("batch", "seq", "head"), t.stride()[:3]):
            setattr(p, f"{name}_{dim}_stride", stride)
    return p


def library_call(q, k, v, causal):
    """flashattn_fwd alone: the parameter struct, output and workspace prepared once (and kept alive
    by the returned function)."""
    h = flashattn.get_handle(q.device.index)
    o = torch.empty_like(q)
    p = _params_for(q, k, v, causal, o)
    n = flashattn.workspace_size(h, p)
    ws = torch.empty(max(n, 1), dtype=torch.uint8, device=q.device)
    fwd, hp, addr, wp = flashattn.load_library().flashattn_fwd, h.ptr, ctypes.addressof(p), ws.data_ptr()
    stream = torch.cuda.current_stream().cuda_stream
    assert fwd(hp, addr, wp, n, stream) == 0, flashattn.load_library().flashattn_last_error()
    return lambda keep=(p, o, ws): fwd(hp, addr, wp, n, stream)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--reps", type=int, default=300)
    ap.add_argument("--json", help="write the rows here")
    args = ap.parse_args()
    torch.manual_seed(0)
    rows = []
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, libflashattn {flashattn.library_version()}, "
          f"Python {sys.version.split()[0]}; host CPU microseconds per call (median of {args.reps} rounds of {args.calls} calls)")
    print(f"{'shape':38} {'splits':>6} {'flash_attn_func':>16} {'sdpa':>8} {'ratio':>6} {'library':>8}")
    for label, B, Sq, Sk, Hq, Hkv, D, causal in SHAPES:
        q = torch.randn(B, Sq, Hq, D, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(B, Sk, Hkv, D, device="cuda", dtype=torch.bfloat16)
        v = torch.randn_like(k)
        qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        ours, sdpa, lib_us = host_us(
            [lambda: flashattn.flash_attn_func(q, k, v, causal=causal),
             lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal, enable_gqa=Hq != Hkv),
             library_call(q, k, v, causal)], args.calls, args.reps)
        plan = flashattn.plan(flashattn.get_handle(0), _params_for(q, k, v, causal))
        rows.append({"shape": label, "splits": plan.num_splits, "flash_attn_func_us": round(ours, 2), "sdpa_us": round(sdpa, 2),
                     "library_us": round(lib_us, 2)})
        print(f"{label:38} {plan.num_splits:6d} {ours:16.1f} {sdpa:8.1f} {ours / sdpa:6.2f} {lib_us:8.1f}")
    # The serving functions (per-structure cache as well): a decode step of 16 sequences, 32/8 heads,
    # d128, 256 keys each, through varlen with pages of 16 and through with_kvcache.
    B, Hq, Hkv, D, Sk, page = 16, 32, 8, 128, 256, 16
    q = torch.randn(B, 1, Hq, D, device="cuda", dtype=torch.bfloat16)
    kc = torch.randn(B, Sk, Hkv, D, device="cuda", dtype=torch.bfloat16)
    vc = torch.randn_like(kc)
    pool_k, pool_v = kc.reshape(B * Sk // page, page, Hkv, D), vc.reshape(B * Sk // page, page, Hkv, D)
    table = torch.arange(B * Sk // page, device="cuda", dtype=torch.int32).reshape(B, -1)
    cu_q = torch.arange(B + 1, device="cuda", dtype=torch.int32)
    cu_k = torch.arange(0, (B + 1) * Sk, Sk, device="cuda", dtype=torch.int32)
    lens = torch.full((B,), Sk, device="cuda", dtype=torch.int32)
    qp = q.reshape(B, Hq, D)
    qt, kt, vt = q.transpose(1, 2), kc.transpose(1, 2), vc.transpose(1, 2)
    serving = [
        ("varlen_func 16x32/8 sk=256 pages of 16",
         lambda: flashattn.flash_attn_varlen_func(qp, pool_k, pool_v, cu_q, cu_k, 1, Sk, causal=True, block_table=table)),
        ("with_kvcache 16x32/8 sk=256",
         lambda: flashattn.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, causal=True)),
    ]
    sdpa = lambda: F.scaled_dot_product_attention(qt, kt, vt, enable_gqa=True)
    for label, fn in serving:
        ours, ref = host_us([fn, sdpa], args.calls, args.reps)
        rows.append({"shape": label, "serving_us": round(ours, 2), "sdpa_us": round(ref, 2)})
        print(f"{label:38} {'':6} {ours:16.1f} {ref:8.1f} {ours / ref:6.2f}")
    worst = max(r["flash_attn_func_us"] for r in rows if "flash_attn_func_us" in r)
    print(f"host cost: worst {worst:.1f} us per flash_attn_func call (target <= 15)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
