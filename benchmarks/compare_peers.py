"""Side by side on one GPU, in one process: libflashattn (through the ctypes package) against
PyTorch's scaled_dot_product_attention with its FLASH (FlashAttention-2) and CUDNN backends, on the
same tensors, for every prefill and decode shape of the peer table (prefill: 16k tokens, hidden
2048; decode: one query row against a long KV cache, grouped-query heads 32/8), prefill at head
dims 96, 160 and 192, and more prefill shapes (grouped-query heads 64/8, 64k tokens causal, a
chunked prefill of 1024 queries over 16k keys); the last two kinds are summarised apart, so the
peer table's lines keep their shapes.

    FLASHATTN_LIBRARY=build/libflashattn.so PYTHONPATH=python python3 benchmarks/compare_peers.py --json out.json

--backend fused forces the portable FUSED kernel (what A100/L40-class GPUs run) instead of AUTO's
choice: FA2 runs its sm80 code on Hopper too, so that comparison is same-hardware. --kinds keeps only
some kinds of rows (prefill, prefill-gqa, decode, prefill-hd), --head-dims some head dims.

Timing: CUDA events around each call, median of 30 after 5 warm-ups (the peer table's protocol); the
libraries take turns being timed first after a shape's tensors are made (the first timing of a shape
can read several percent slower), and --rounds N repeats every row's timings N times in a rotating
order, keeping each library's fastest median. End to end, what a Python caller sees (a call whose
host time exceeds its GPU time is timed at its host time). With --flush-l2, every row is also timed
in GPU time with a cold L2: before each timed call a 512 MB buffer is overwritten (evicting the 50
MB L2, so a decode's K/V comes from DRAM, as in a server where other layers ran in between), and the
events bracket only the call, which the host has enqueued while the GPU was still busy with the
flush (so no host time is counted). Both are reported; for decode the flushed GPU time is what the
kernel costs. The fill evicts the L2 but not every state the last kernels leave (after some
kernels a split decode's merge, launched as a programmatic dependent, starts microseconds later),
so a cold figure depends on what ran before the fill (benchmarks/predecessor_probe.py). By
default (--cold-order after-e2e) each library's cold calls follow its own end-to-end calls, so
each call comes after the same call; with --cold-order interleaved the libraries' cold calls take
turns one call at a time, so each comes after another library's call (docs/performance.md v55
has both on the peer table).
FLOPs = 4*B*Hq*Sq*Sk*D, halved for causal when Sq == Sk; decode rows report K+V bytes read per second
instead. The causal mask is bottom-right for libflashattn and top-left for PyTorch's is_causal; with
Sq == Sk they are the same mask. The chunked prefill's causal row (Sq < Sk) needs the bottom-right
mask: FA2 runs it through PyTorch's flash kernel called directly (what
torch.nn.attention.bias.causal_lower_right dispatches to; its mask is bottom-right), and cuDNN has no
such path in PyTorch, so that row has no cuDNN figure. Every row checks the output against a peer's.
"""
import argparse
import contextlib
import json

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import flashattn


def timed_call(fn, flush=None, before=None):
    """One call's milliseconds between CUDA events: `before` (a callable enqueueing GPU work), then
    the flush (`flush` overwritten), then the call, the events bracketing only the call."""
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    if before is not None:
        before()
    if flush is not None:
        flush.fill_(1)  # keeps the GPU busy while the call below is enqueued
    a.record()
    fn()
    b.record()
    b.synchronize()
    return a.elapsed_time(b)


def median(ts):
    return sorted(ts)[len(ts) // 2]


def bench(fn, iters=30, warm=5, flush=None, before=None):
    """Median milliseconds per call; with `flush` (a tensor), the L2 is overwritten before each call
    and only the call's GPU time is counted; with `before` (a callable enqueueing GPU work), that
    work runs before each call (benchmarks/l2_states.py), and before the flush when both are given
    (benchmarks/predecessor_probe.py)."""
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    return median([timed_call(fn, flush, before) for _ in range(iters)])


def bench_cold_interleaved(calls, iters=30, warm=5, flush=None):
    """Each library's median milliseconds per call in GPU time, the L2 flushed (`flush` overwritten)
    before each call, the libraries' calls taking turns: call i of every library, in an order that
    rotates with i, so each library's calls follow the others' in equal shares rather than its own.
    calls: {name: (the call, a function returning the context it runs in)}."""
    names = list(calls)
    for name in names:
        call, ctx = calls[name]
        with ctx():
            for _ in range(warm):
                call()
    torch.cuda.synchronize()
    ts = {name: [] for name in names}
    for i in range(iters):
        for name in names[i % len(names):] + names[:i % len(names)]:
            call, ctx = calls[name]
            with ctx():
                ts[name].append(timed_call(call, flush))
    return {name: median(t) for name, t in ts.items()}


def under(backend):
    """The context a call runs in: PyTorch's SDPA restricted to `backend`, or none (None: ours)."""
    return sdpa_kernel([backend]) if backend is not None else contextlib.nullcontext()


def shapes():
    """(kind, dtype, batch, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim, causal)"""
    out = []
    for d in (64, 128, 256):
        for s in (512, 1024, 2048, 4096, 8192, 16384):
            for c in (False, True):
                out.append(("prefill", torch.bfloat16, 16384 // s, 2048 // d, 2048 // d, s, s, d, c))
    for s in (512, 1024, 2048, 4096, 8192, 16384):
        for c in (False, True):
            out.append(("prefill", torch.float16, 16384 // s, 16, 16, s, s, 128, c))
    out.append(("prefill-gqa", torch.bfloat16, 8, 32, 8, 2048, 2048, 128, True))
    out.append(("prefill-gqa", torch.bfloat16, 2, 32, 8, 8192, 8192, 128, True))
    for b, sk in ((1, 8192), (16, 8192), (64, 4096), (128, 2048), (8, 32768), (1, 131072)):
        out.append(("decode", torch.bfloat16, b, 32, 8, 1, sk, 128, False))
    out.append(("decode", torch.bfloat16, 16, 32, 8, 1, 8192, 64, False))  # head dim 64
    out.append(("decode", torch.bfloat16, 16, 32, 8, 4, 8192, 128, False))  # speculative: 4 query rows
    # Head dims outside the peer table (hidden 2048 where it divides, else 16 heads), reported apart.
    for d in (96, 160, 192):
        for s in (1024, 4096, 16384):
            for c in (False, True):
                h = 2048 // d if 2048 % d == 0 else 16
                out.append(("prefill-hd", torch.bfloat16, 16384 // s, h, h, s, s, d, c))
    # More prefill shapes, reported apart: grouped-query heads 64/8 (hidden 8192),
    # 64k tokens causal, a chunked prefill (1024 new queries over a 16k-key context).
    for s, c in ((4096, False), (4096, True), (16384, True)):
        out.append(("prefill-more", torch.bfloat16, 16384 // s, 64, 8, s, s, 128, c))
    out.append(("prefill-more", torch.bfloat16, 1, 16, 16, 65536, 65536, 128, True))
    for c in (False, True):
        out.append(("prefill-more", torch.bfloat16, 4, 16, 16, 1024, 16384, 128, c))
    return out


def ours_fn(q, k, v, o, causal, backend):
    """The library's forward with everything prepared once, as a server would call it."""
    h = flashattn.get_handle(q.device.index)
    p = flashattn.FwdParams.new()
    p.backend = backend
    p.dtype = flashattn.Dtype.BFLOAT16 if q.dtype == torch.bfloat16 else flashattn.Dtype.FLOAT16
    p.batch, p.seqlen_q, p.heads_q, p.head_dim = q.shape
    p.seqlen_k, p.heads_kv = k.shape[1], k.shape[2]
    for name, t in (("q", q), ("k", k), ("v", v), ("o", o)):
        setattr(p, name, t.data_ptr())
        for field, st in zip(("batch", "seq", "head"), t.stride()[:3]):
            setattr(p, f"{name}_{field}_stride", st)
    p.mask = flashattn.Mask.CAUSAL_BOTTOM_RIGHT if causal else flashattn.Mask.NONE
    nbytes = flashattn.workspace_size(h, p)  # split decode needs one
    ws = torch.empty(nbytes, dtype=torch.uint8, device=q.device) if nbytes else None
    stream = torch.cuda.current_stream().cuda_stream
    info = flashattn.plan(h, p)
    kernel = info.kernel_name.decode() + (f" splits={info.num_splits}" if info.num_splits > 1 else "")
    return lambda: flashattn.fwd(h, p, ws.data_ptr() if ws is not None else 0, nbytes, stream), kernel


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", help="write the rows here")
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--flush-l2", action="store_true",
                    help="also time every row in GPU time with the L2 flushed before each call")
    ap.add_argument("--cold-order", choices=("after-e2e", "interleaved"), default="after-e2e",
                    help="with --flush-l2: each library's cold calls follow its own end-to-end timing "
                         "(after-e2e, the default), or the libraries' cold calls take turns call by "
                         "call (interleaved)")
    ap.add_argument("--backend", choices=("auto", "fused", "fused_sm90"), default="auto",
                    help="the library's backend (default: AUTO's choice)")
    all_kinds = sorted({shape[0] for shape in shapes()})
    ap.add_argument("--kinds", default=",".join(all_kinds),
                    help=f"comma-separated kinds of rows to run (of {', '.join(all_kinds)})")
    ap.add_argument("--head-dims", help="comma-separated head dims to keep (default: all)")
    ap.add_argument("--rounds", type=int, default=1,
                    help="time every row this many times, the libraries in a rotating order; each "
                         "figure is the fastest round's median (default: 1)")
    args = ap.parse_args()
    if args.rounds < 1:
        ap.error("--rounds: at least 1")
    head_dims = {int(x) for x in args.head_dims.split(",")} if args.head_dims else None
    backend = getattr(flashattn.Backend, args.backend.upper())
    kinds = set(args.kinds.split(","))
    unknown = kinds - set(all_kinds)
    if unknown:
        ap.error(f"--kinds: unknown kind(s) {', '.join(sorted(unknown))}")
    flush = torch.empty(512 << 20, dtype=torch.uint8, device="cuda") if args.flush_l2 else None
    props = torch.cuda.get_device_properties(0)
    print(f"# {props.name}, torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}, "
          f"libflashattn {flashattn.library_version()}, backend {args.backend}", flush=True)
    rows = []
    hdr = f"{'kind':<11} {'dtype':<5} {'b x hq/hkv':<10} {'sq':>5} {'sk':>6} {'d':>3} {'mask':<6} {'ours':>7} {'FA2':>7} {'cuDNN':>7} {'vs FA2':>7} {'vs cuDNN':>8} unit     check"
    print(hdr, flush=True)
    for kind, dt, b, hq, hkv, s, sk, d, causal in shapes():
        if kind not in kinds or (head_dims is not None and d not in head_dims):
            continue
        torch.manual_seed(len(rows))
        q = torch.randn(b, s, hq, d, device="cuda", dtype=dt)
        k = torch.randn(b, sk, hkv, d, device="cuda", dtype=dt)
        v = torch.randn(b, sk, hkv, d, device="cuda", dtype=dt)
        o = torch.empty_like(q)
        decode = kind == "decode"
        # work per call: FLOPs (prefill, rate in TFLOP/s) or K+V bytes (decode, rate in GB/s)
        work = 2 * b * sk * hkv * d * 2 if decode else 4 * b * hq * s * sk * d / (2 if causal and s == sk else 1)
        unit, key, per_ms = ("GB/s", "_gbps", 1e6) if decode else ("TFLOP/s", "_tflops", 1e9)
        row = dict(kind=kind, dtype=str(dt).split(".")[-1], b=b, hq=hq, hkv=hkv, sq=s, sk=sk, d=d, causal=causal,
                   unit=unit)
        fn, kernel = ours_fn(q, k, v, o, causal, backend)
        row["kernel"] = kernel
        qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        bottom_right = causal and s != sk  # (SDPA's is_causal is top-left: see the module's note)

        def peer():  # run inside sdpa_kernel([the peer's backend])
            if bottom_right:
                return torch.ops.aten._scaled_dot_product_flash_attention(qt, kt, vt, 0.0, True)[0]
            return F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal, enable_gqa=hq != hkv)

        calls = {"ours": (fn, None)}  # name: (the call, the SDPA backend it runs under)
        for name, be in (("fa2", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION)):
            if bottom_right and name == "cudnn":
                row[name + "_error"] = "no bottom-right causal mask for Sq != Sk in PyTorch's cuDNN path"
            else:
                calls[name] = (peer, be)
        # Each round times every library (end to end, then cold), starting with a different one per
        # shape and per round, so that none is always the first timed after a shape's tensors are
        # made; each figure is the library's fastest median over the rounds.
        names = list(calls)
        for rnd in range(args.rounds):
            start = (len(rows) + rnd) % len(names)
            for name in names[start:] + names[:start]:
                if name + "_error" in row:
                    continue
                call, be = calls[name]
                try:
                    with under(be):
                        for mode, fl in (("_ms", None), ("_cold_ms", flush)):
                            if mode == "_cold_ms" and (flush is None or args.cold_order == "interleaved"):
                                continue
                            t = bench(call, args.iters, flush=fl)
                            row[name + mode] = min(t, row.get(name + mode, t))
                except (RuntimeError, TypeError) as e:  # (TypeError: a private op whose signature moved)
                    if name == "ours":
                        raise
                    row[name + "_error"] = str(e).splitlines()[0]
                    row.pop(name + "_ms", None), row.pop(name + "_cold_ms", None)
            if flush is not None and args.cold_order == "interleaved":
                turns = {name: (calls[name][0], lambda be=calls[name][1]: under(be))
                         for name in names[start:] + names[:start] if name + "_error" not in row}
                for name, t in bench_cold_interleaved(turns, args.iters, flush=flush).items():
                    row[name + "_cold_ms"] = min(t, row.get(name + "_cold_ms", t))
        peer_out = None
        for name in ("fa2", "cudnn"):
            if name in calls and name + "_error" not in row:
                with sdpa_kernel([calls[name][1]]):
                    peer_out = peer().transpose(1, 2)
                break
        for name in ("ours", "fa2", "cudnn"):
            if name + "_ms" in row:
                row[name + key] = work / row[name + "_ms"] / per_ms
            if name + "_cold_ms" in row:
                row[name + "_cold" + key] = work / row[name + "_cold_ms"] / per_ms
        fn()
        torch.cuda.synchronize()
        row["max_diff_vs_peer"] = (o.float() - peer_out.float()).abs().max().item() if peer_out is not None else None
        r_fa2 = row["ours" + key] / row["fa2" + key] if "fa2" + key in row else float("nan")
        r_cud = row["ours" + key] / row["cudnn" + key] if "cudnn" + key in row else float("nan")
        row["ratio_vs_fa2"], row["ratio_vs_cudnn"] = r_fa2, r_cud
        cold = ""
        if flush is not None:
            c_fa2 = row["ours_cold" + key] / row["fa2_cold" + key] if "fa2_cold" + key in row else float("nan")
            c_cud = row["ours_cold" + key] / row["cudnn_cold" + key] if "cudnn_cold" + key in row else float("nan")
            row["cold_ratio_vs_fa2"], row["cold_ratio_vs_cudnn"] = c_fa2, c_cud
            cold = (f" | cold L2, GPU time: {row['ours_cold' + key]:7.1f} {row.get('fa2_cold' + key, float('nan')):7.1f} "
                    f"{row.get('cudnn_cold' + key, float('nan')):7.1f} {c_fa2:5.2f} {c_cud:5.2f}")
        rows.append(row)
        ok = row["max_diff_vs_peer"] is not None and row["max_diff_vs_peer"] < 0.05
        diff = "n/a" if row["max_diff_vs_peer"] is None else f"{row['max_diff_vs_peer']:.3g}"
        print(f"{kind:<11} {row['dtype'][:5]:<5} {f'{b}x{hq}/{hkv}':<10} {s:>5} {sk:>6} {d:>3} {'causal' if causal else 'none':<6} "
              f"{row['ours' + key]:7.1f} {row.get('fa2' + key, float('nan')):7.1f} {row.get('cudnn' + key, float('nan')):7.1f} "
              f"{r_fa2:7.2f} {r_cud:8.2f} {unit:<8} {'ok' if ok else 'DIFF'} {diff}{cold}", flush=True)
        del q, k, v, o, qt, kt, vt, peer_out
    for label, sel in (("prefill", [r for r in rows if r["kind"] in ("prefill", "prefill-gqa")]),
                       ("decode", [r for r in rows if r["kind"] == "decode"]),
                       ("prefill, head dims 96/160/192", [r for r in rows if r["kind"] == "prefill-hd"]),
                       ("prefill, more shapes", [r for r in rows if r["kind"] == "prefill-more"])):
        if not sel:
            continue
        for mode, pre in (("end to end", ""), ("cold L2, GPU time", "cold_")):
            if pre and flush is None:
                continue
            # (a row without a peer's figure, NaN, counts for neither side: the shapes say how many had one)
            parts = []
            for peer, name in (("fa2", "FA2"), ("cudnn", "cuDNN")):
                rs = [r[pre + "ratio_vs_" + peer] for r in sel]
                rs = [x for x in rs if x == x]
                gm = torch.tensor(rs).log().mean().exp().item() if rs else float("nan")
                parts.append((name, sum(x >= 1.0 for x in rs), len(rs), gm))
            print(f"{label} ({mode}): ours >= {parts[0][0]} on {parts[0][1]}/{parts[0][2]} shapes, "
                  f">= {parts[1][0]} on {parts[1][1]}/{parts[1][2]}; geomean vs {parts[0][0]} {parts[0][3]:.3f}, "
                  f"vs {parts[1][0]} {parts[1][3]:.3f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(gpu=props.name, torch=torch.__version__, cudnn=torch.backends.cudnn.version(),
                           library=flashattn.library_version(), backend=args.backend, rounds=args.rounds,
                           iters=args.iters, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
