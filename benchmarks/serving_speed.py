"""GPU time of the serving paths beside the dense path on the same work.

Each shape is run as a dense batch (flash_attn_func: AUTO, and the FUSED backend forced), as a
ragged batch of equal lengths (flash_attn_varlen_func: AUTO and FUSED forced), as a dense cache with
per-sequence lengths (flash_attn_with_kvcache; for decode also with the step's new key and value
appended and rotary applied, over the same keys: "append+rotary"), and with K/V in pages of several
sizes (varlen with a block table for prefill, flash_attn_with_kvcache for decode). AUTO picks
FUSED_SM90 on Hopper: pages whose size is a multiple of 8 are read by TMA, others (1 key) gathered
with cp.async, as is every page size in a decode whose keys are split (fa_sm90_gathers_pages).
cuDNN's and FlashAttention-2's fused attention (PyTorch SDPA) on the dense tensors are the peers;
with --flex, PyTorch's FlexAttention (torch.compile'd) too, as the serving paths' peer: for prefill
over the packed ragged batch with a document mask ("flex doc mask": the varlen call's work), for
decode over the dense cache with a per-sequence length mask ("flex len mask": the cache call's work;
FlexAttention has no block-table form in this PyTorch's public API). GPU time: 10 calls captured in
a CUDA graph, CUDA-event timing of its replays (the host's enqueue cost is not counted, and no call
waits for it), median of `iters` after warm-up, a shape's functions taking turns in rounds
(time_interleaved: the GPU slows as it warms, which would favour whichever ran first), inputs drawn
once per shape (the same K/V call after call: a shape that fits in L2 is read from it); TFLOP/s for
prefill (causal counts half), GB/s of K/V read for decode.

The "ragged" rows are batches of 16k tokens in sequences of unequal lengths (RAGGED), run as one
varlen call (AUTO, FUSED forced, and over pages of 1, 16, 64 and 256) beside the same work done by
the dense path: "dense per seq" is one flash_attn_func call a sequence, all of them in one graph
(the ratio to it is the varlen call against the dense path at equal work); the peers likewise run
one call a sequence. The equal-length prefill rows of the same heads and total tokens (8x2k, 4x4k)
give the dense call's rate on a batch it can take at once.

    FLASHATTN_LIBRARY=build/libflashattn.so PYTHONPATH=python python3 benchmarks/serving_speed.py

--only TEXT (repeatable) keeps the shapes whose label contains TEXT (an A/B of a few rows, or a
build without some head dim); a TEXT that matches no label is an error. A shape the library answers
with FLASHATTN_STATUS_UNSUPPORTED (a build configured with FLASHATTN_HEAD_DIMS that leaves its head
dim out) prints "not run" and the library's message in place of its row; the other shapes still
run, and the script then exits with status 2.
"""
import argparse
import itertools
import json
import statistics
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import flashattn

SHAPES = [  # (label, B, Sq, Sk, Hq, Hkv, D, causal)
    ("prefill 8x2k 16/16 d128 causal", 8, 2048, 2048, 16, 16, 128, True),
    ("prefill 4x4k 32/8 d128", 4, 4096, 4096, 32, 8, 128, False),
    ("prefill 16x512 16/16 d64 causal", 16, 512, 512, 16, 16, 64, True),
    ("prefill 1x8k 32/8 d128", 1, 8192, 8192, 32, 8, 128, False),
    ("decode 64x1 sk=4k 32/8 d128", 64, 1, 4096, 32, 8, 128, True),
    ("decode 16x1 sk=8k 32/8 d128", 16, 1, 8192, 32, 8, 128, True),
    ("decode 1x1 sk=8k 32/8 d128", 1, 1, 8192, 32, 8, 128, True),
    ("decode 2x1 sk=32k 32/8 d128", 2, 1, 32768, 32, 8, 128, True),
    ("decode 128x1 sk=2k 32/8 d128", 128, 1, 2048, 32, 8, 128, True),
    ("decode 1x1 sk=128k 32/8 d128", 1, 1, 131072, 32, 8, 128, True),
]
# (label, sequence lengths (16k tokens), Hq, Hkv, D, causal): ragged prefill batches.
RAGGED_LENGTHS = (4096, 512, 2816, 1024, 3584, 1536, 768, 2048)
RAGGED = [
    ("prefill ragged 8 seqs 16k 16/16 d128 causal", RAGGED_LENGTHS, 16, 16, 128, True),
    ("prefill ragged 8 seqs 16k 32/8 d128", RAGGED_LENGTHS, 32, 8, 128, False),
    ("prefill ragged 8 seqs 16k 16/16 d64 causal", RAGGED_LENGTHS, 16, 16, 64, True),
]
PAGES = (1, 16, 64, 256)


def _prepare(fn, warm=5, calls=10):
    """(run, eager): `calls` calls of fn captured in one CUDA graph, run = its replay; a function that
    cannot be captured runs its calls eagerly (eager = True)."""
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            for _ in range(calls):
                fn()
        run, eager = graph.replay, False
    except Exception:  # noqa: BLE001 - any capture failure: time eagerly, and say so
        torch.cuda.synchronize()
        graph = None

        def run():
            for _ in range(calls):
                fn()
        eager = True
    run()
    return run, eager


def _replays(run, n, calls):
    """GPU milliseconds per call of n runs, each between two events."""
    ts = []
    for _ in range(n):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        run()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b) / calls)
    return ts


def time_ms(fn, iters, warm=5, calls=10):
    """GPU milliseconds per call: `calls` calls captured in one CUDA graph and replayed between two
    events, so no call waits for the host (the serving functions' host cost exceeds a small decode's
    kernel time; eager timing would measure the host), median over `iters` replays. A function that
    cannot be captured is timed eagerly, and its name gets a '*'."""
    run, eager = _prepare(fn, warm, calls)
    return statistics.median(_replays(run, iters, calls)), eager


def time_interleaved(fns, iters, rounds=4, calls=10):
    """time_ms of every function of `fns` ({name: fn}), taken in turns: each function's graph is
    captured once, then `rounds` rounds replay every function iters / rounds times, in the dict's
    order and in reverse on alternate rounds; each function's median over all its replays. A GPU's
    clock falls as it warms (its power cap): one function after another, the later ones would run
    on a hotter, slower GPU (several percent within a shape). Returns {name: (ms, eager)}."""
    prepared = {name: _prepare(fn, calls=calls) for name, fn in fns.items()}
    per_round = max(1, -(-iters // rounds))
    ts = {name: [] for name in fns}
    for r in range(rounds):
        for name in (list(fns) if r % 2 == 0 else list(fns)[::-1]):
            ts[name] += _replays(prepared[name][0], per_round, calls)
    return {name: (statistics.median(ts[name]), prepared[name][1]) for name in fns}


def to_pages(x, page, perm):
    """[B, S, H, D] -> a pool [B * ceil(S/page), page, H, D] with page i of the batch at perm[i]."""
    B, S, H, D = x.shape
    n = -(-S // page)
    pad = torch.zeros(B, n * page - S, H, D, device=x.device, dtype=x.dtype)
    pool = torch.empty(B * n, page, H, D, device=x.device, dtype=x.dtype)
    pool[perm] = torch.cat([x, pad], 1).reshape(B * n, page, H, D)
    return pool


def ragged_pages(x, lengths, page, perm):
    """Packed [total, H, D] in sequences of `lengths` -> (pool [n, page, H, D], table [B, max_pages] int32):
    each sequence's keys from the start of its own pages (its last page zero-padded), page i of the
    batch (sequence by sequence) at perm[i]; a table row's entries past its pages are 0 (never read)."""
    H, D = x.shape[1:]
    counts = [-(-n // page) for n in lengths]
    pool = torch.zeros(sum(counts), page, H, D, device=x.device, dtype=x.dtype)
    table = torch.zeros(len(lengths), max(counts), device=x.device, dtype=torch.int32)
    row0, first = 0, 0
    for b, (n, c) in enumerate(zip(lengths, counts)):
        padded = torch.zeros(c * page, H, D, device=x.device, dtype=x.dtype)
        padded[:n] = x[row0:row0 + n]
        pool[perm[first:first + c]] = padded.reshape(c, page, H, D)
        table[b, :c] = perm[first:first + c].to(torch.int32)
        row0, first = row0 + n, first + c
    return pool, table


def append_inputs(B, Sk, Hkv, D, g):
    """A decode step's new key and value [B, 1, Hkv, D] and GPT-J rotary tables cos, sin [Sk, D / 2]
    (bf16, base 10000), drawn from generator g."""
    kn = torch.randn(B, 1, Hkv, D, device="cuda", dtype=torch.bfloat16, generator=g)
    vn = torch.randn(B, 1, Hkv, D, device="cuda", dtype=torch.bfloat16, generator=g)
    angle = torch.arange(Sk, device="cuda", dtype=torch.float32)[:, None] * \
        torch.pow(10000.0, -torch.arange(0, D, 2, device="cuda", dtype=torch.float32) / D)[None, :]
    return kn, vn, angle.cos().to(torch.bfloat16), angle.sin().to(torch.bfloat16)


def flex_peer():
    """A builder of FlexAttention calls, or None (said once) where this PyTorch cannot run it."""
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
        # Each shape compiles its own kernel (dynamic=False): past the default limit of eight
        # recompilations, dynamo falls back to the unfused eager form (which materialises the
        # scores), and the later rows' "flex" cells would time that instead.
        import torch._dynamo
        for knob in ("recompile_limit", "cache_size_limit"):
            if hasattr(torch._dynamo.config, knob):
                setattr(torch._dynamo.config, knob, max(64, getattr(torch._dynamo.config, knob)))
        compiled = torch.compile(flex_attention, dynamic=False)
    except Exception as e:  # noqa: BLE001 - reported, and the peer left out
        print(f"flex: not available ({type(e).__name__}: {e})", flush=True)
        return None

    def call(qt, kt, vt, mask, batch, q_len, k_len, gqa, what):
        """The compiled call over [batch or 1, H, S, D] views with a block mask of `mask`, run once;
        None (said) where it fails."""
        try:
            bm = create_block_mask(mask, batch, None, q_len, k_len, device="cuda")
            fn = lambda: compiled(qt, kt, vt, block_mask=bm, enable_gqa=gqa)  # noqa: E731
            fn()
            return fn
        except Exception as e:  # noqa: BLE001 - reported, and the cell left empty
            print(f"flex: {what} failed ({type(e).__name__}: {str(e)[:200]})", flush=True)
            return None

    def build(q, k, v, seqlens, causal):
        B, Sq, Hq, D = q.shape
        Sk, Hkv = k.shape[1], k.shape[2]
        if Sq == 1:  # decode: [B, H, S, D] views of the dense cache, keys below each sequence's length
            qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))

            def mask(b, h, qi, ki):
                return ki < seqlens[b]
            return call(qt, kt, vt, mask, B, 1, Sk, Hq != Hkv, f"{B}x{Sq}x{Sk}")
        # prefill: the ragged batch packed into one sequence, a query sees its own document's keys
        qt, kt, vt = (x.reshape(1, -1, *x.shape[2:]).transpose(1, 2) for x in (q, k, v))
        doc_q = torch.arange(B * Sq, device="cuda") // Sq
        doc_k = torch.arange(B * Sk, device="cuda") // Sk

        def mask(b, h, qi, ki):
            same = doc_q[qi] == doc_k[ki]
            if not causal:
                return same
            # bottom-right within the document (Sk - Sq keys more than queries)
            return same & (qi - doc_q[qi] * Sq + (Sk - Sq) >= ki - doc_k[ki] * Sk)
        return call(qt, kt, vt, mask, None, B * Sq, B * Sk, Hq != Hkv, f"{B}x{Sq}x{Sk}")

    def build_ragged(qp, kp, vp, lengths, causal):
        """Packed [total, H, D] sequences of `lengths` (queries and keys alike) as one sequence with a
        document mask (causal: a query sees its own document's keys up to its own position)."""
        total = qp.shape[0]
        qt, kt, vt = (x.unsqueeze(0).transpose(1, 2) for x in (qp, kp, vp))
        doc = torch.repeat_interleave(torch.arange(len(lengths), device="cuda"), torch.tensor(lengths, device="cuda"))

        def mask(b, h, qi, ki):
            same = doc[qi] == doc[ki]
            return same & (qi >= ki) if causal else same
        return call(qt, kt, vt, mask, None, total, total, qp.shape[1] != kp.shape[1], f"ragged {total}")
    build.ragged = build_ragged
    return build


def ragged_row(label, lengths, Hq, Hkv, D, causal, flex, args):
    """One ragged row: {column: TFLOP/s} (FLOPs summed over the sequences, causal halved)."""
    g = torch.Generator(device="cuda").manual_seed(1)
    total, B, longest = sum(lengths), len(lengths), max(lengths)
    qp = torch.randn(total, Hq, D, device="cuda", dtype=torch.bfloat16, generator=g)
    kp = torch.randn(total, Hkv, D, device="cuda", dtype=torch.bfloat16, generator=g)
    vp = torch.randn(total, Hkv, D, device="cuda", dtype=torch.bfloat16, generator=g)
    offsets = [0] + list(itertools.accumulate(lengths))
    cu = torch.tensor(offsets, device="cuda", dtype=torch.int32)
    # each sequence as a dense [1, n, H, D] view of the packed tensors
    seqs = [tuple(x[s0:s0 + n].unsqueeze(0) for x in (qp, kp, vp)) for s0, n in zip(offsets, lengths)]

    def per_seq(call):
        def run():
            for q, k, v in seqs:
                call(q, k, v)
        return run
    fns = {
        "dense per seq": per_seq(lambda q, k, v: flashattn.flash_attn_func(q, k, v, causal=causal)),
        "varlen": lambda: flashattn.flash_attn_varlen_func(qp, kp, vp, cu, cu, longest, longest, causal=causal),
        "varlen FUSED": lambda: flashattn.flash_attn_varlen_func(qp, kp, vp, cu, cu, longest, longest, causal=causal,
                                                                 backend=flashattn.Backend.FUSED),
    }
    for page in PAGES:
        perm = torch.randperm(sum(-(-n // page) for n in lengths), device="cuda", generator=g)
        kpool, table = ragged_pages(kp, lengths, page, perm)
        vpool, _ = ragged_pages(vp, lengths, page, perm)
        fns[f"paged {page}"] = (lambda kpool=kpool, vpool=vpool, table=table: flashattn.flash_attn_varlen_func(
            qp, kpool, vpool, cu, cu, longest, longest, causal=causal, block_table=table))
        # the pages hold the packed keys: the paged call answers as the packed one does
        err = (fns[f"paged {page}"]().float() - fns["varlen"]().float()).abs().max().item()
        if not err < 1e-2:
            raise SystemExit(f"{label}: pages of {page} differ from the packed call by {err}")
    for name, be in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("fa2", SDPBackend.FLASH_ATTENTION)):
        def peer(q, k, v, be=be):
            with sdpa_kernel(be):
                return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                      is_causal=causal, enable_gqa=Hq != Hkv)
        try:
            per_seq(peer)()
            fns[name + " per seq"] = per_seq(peer)
        except RuntimeError:
            pass
    if flex is not None:
        fn = flex.ragged(qp, kp, vp, lengths, causal)
        if fn is not None:
            fns["flex doc mask"] = fn
    flops = sum(4 * Hq * n * n * D * (0.5 if causal else 1.0) for n in lengths)
    row = {"shape": label}
    for name, (ms, eager) in time_interleaved(fns, args.iters, args.rounds).items():
        row[name + ("*" if eager else "")] = round(flops / ms / 1e9, 1)
    return row


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=32, help="replays per function (medians)")
    ap.add_argument("--rounds", type=int, default=4, help="turns the functions take (time_interleaved)")
    ap.add_argument("--json")
    ap.add_argument("--flex", action="store_true", help="add PyTorch FlexAttention (compiled) as a peer")
    ap.add_argument("--only", action="append", default=[], metavar="TEXT",
                    help="keep the shapes whose label contains TEXT (repeatable)")
    args = ap.parse_args()
    labels = [shape[0] for shape in SHAPES + RAGGED]
    for text in args.only:
        if not any(text in label for label in labels):
            ap.error(f"--only {text!r} matches no shape: " + "; ".join(labels))
    keep = lambda label: not args.only or any(text in label for text in args.only)  # noqa: E731
    shapes = [s for s in SHAPES if keep(s[0])]
    flex = flex_peer() if args.flex else None
    rows, skipped = [], []

    def unless_unsupported(label, fn):
        """fn(), or None where the library answers FLASHATTN_STATUS_UNSUPPORTED (a shape this build
        has no kernel for), said and counted; any other error propagates."""
        try:
            return fn()
        except flashattn.FlashAttnError as e:
            if e.status != flashattn.Status.UNSUPPORTED:
                raise
            skipped.append(label)
            print(f"{label}: not run: {e.message}", flush=True)
            return None

    for label, B, Sq, Sk, Hq, Hkv, D, causal in shapes:
        g = torch.Generator(device="cuda").manual_seed(1)
        q = torch.randn(B, Sq, Hq, D, device="cuda", dtype=torch.bfloat16, generator=g)
        k = torch.randn(B, Sk, Hkv, D, device="cuda", dtype=torch.bfloat16, generator=g)
        v = torch.randn(B, Sk, Hkv, D, device="cuda", dtype=torch.bfloat16, generator=g)
        decode = Sq == 1
        cu_q = torch.arange(0, (B + 1) * Sq, Sq, device="cuda", dtype=torch.int32)
        cu_k = torch.arange(0, (B + 1) * Sk, Sk, device="cuda", dtype=torch.int32)
        seqlens = torch.full((B,), Sk, device="cuda", dtype=torch.int32)
        qp, kp, vp = (x.reshape(-1, *x.shape[2:]) for x in (q, k, v))
        fns = {
            "dense AUTO": lambda: flashattn.flash_attn_func(q, k, v, causal=causal),
            "dense FUSED": lambda: flashattn.flash_attn_func(q, k, v, causal=causal, backend=flashattn.Backend.FUSED),
            "varlen": lambda: flashattn.flash_attn_varlen_func(qp, kp, vp, cu_q, cu_k, Sq, Sk, causal=causal),
            "varlen FUSED": lambda: flashattn.flash_attn_varlen_func(qp, kp, vp, cu_q, cu_k, Sq, Sk, causal=causal,
                                                                     backend=flashattn.Backend.FUSED),
            "cache": lambda: flashattn.flash_attn_with_kvcache(q, k, v, cache_seqlens=seqlens, causal=causal),
        }
        if decode:
            # A decode step that appends its new key and value (rotary on q and the new key, GPT-J
            # style) at position Sk - 1 of copies of the cache, then attends over the same Sk keys as
            # "cache": the difference is what the append and the rotary add to a step.
            kc, vc = k.clone(), v.clone()
            kn, vn, cos, sin = append_inputs(B, Sk, Hkv, D, g)
            before = seqlens - 1
            fns["append+rotary"] = lambda: flashattn.flash_attn_with_kvcache(
                q, kc, vc, k=kn, v=vn, rotary_cos=cos, rotary_sin=sin, cache_seqlens=before, causal=causal)
        for page in PAGES:
            perm = torch.randperm(B * -(-Sk // page), device="cuda")  # one shuffled page order for K and V
            kpool, vpool = to_pages(k, page, perm), to_pages(v, page, perm)
            table = perm.to(torch.int32).reshape(B, -1).contiguous()
            if decode:
                fns[f"paged {page}"] = (lambda kpool=kpool, vpool=vpool, table=table: flashattn.flash_attn_with_kvcache(
                    q, kpool, vpool, cache_seqlens=seqlens, block_table=table, causal=causal))
            else:
                fns[f"paged {page}"] = (lambda kpool=kpool, vpool=vpool, table=table: flashattn.flash_attn_varlen_func(
                    qp, kpool, vpool, cu_q, cu_k, Sq, Sk, causal=causal, block_table=table))
        qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
        for name, be in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("fa2", SDPBackend.FLASH_ATTENTION)):
            def peer(be=be):
                with sdpa_kernel(be):
                    return F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal and not decode,
                                                          enable_gqa=Hq != Hkv)
            try:
                peer()
                fns[name] = peer
            except RuntimeError:
                pass
        if flex is not None:
            fn = flex(q, k, v, seqlens, causal)
            if fn is not None:
                fns["flex doc mask" if not decode else "flex len mask"] = fn
        flops = 4 * B * Hq * Sq * Sk * D * (0.5 if causal and not decode else 1.0)
        kv_bytes = 2 * B * Sk * Hkv * D * 2
        row = {"shape": label}
        timed = unless_unsupported(label, lambda: time_interleaved(fns, args.iters, args.rounds))
        if timed is None:
            continue
        for name, (ms, eager) in timed.items():
            row[name + ("*" if eager else "")] = round(kv_bytes / ms / 1e6, 1) if decode else round(flops / ms / 1e9, 1)
        rows.append(row)
        unit = "GB/s" if decode else "TFLOP/s"
        print(f"{label} ({unit}): " + "  ".join(f"{n} {x}" for n, x in row.items() if n != "shape"), flush=True)
    for label, lengths, Hq, Hkv, D, causal in (r for r in RAGGED if keep(r[0])):
        row = unless_unsupported(label, lambda: ragged_row(label, lengths, Hq, Hkv, D, causal, flex, args))
        if row is None:
            continue
        rows.append(row)
        print(f"{label} (TFLOP/s): " + "  ".join(f"{n} {x}" for n, x in row.items() if n != "shape"), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    if skipped:
        print(f"{len(skipped)} shape(s) not run, unsupported by this build: " + "; ".join(skipped), flush=True)
        sys.exit(2)


if __name__ == "__main__":
    main()
