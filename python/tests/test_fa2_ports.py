"""FlashAttention-2's own test grids for its forward functions, run on this package: the
parametrisations of test_flash_attn_qkvpacked, test_flash_attn_output (dense batches, packed and
not), test_flash_attn_varlen_qkvpacked, test_flash_attn_varlen_output and test_flash_attn_kvcache
(FlashAttention-2's tests/test_flash_attn.py), with that file's reference
semantics re-implemented here: random padding masks (lengths max-20..max), bottom-right causal
masks and local windows per sequence (a window drawn as torch.randint(0, seqlen_k, (2,)), a tensor,
as FlashAttention-2's tests pass it), ALiBi slopes per batch entry, softcap, MHA/MQA/GQA, keys
appended to the cache with rotary embeddings (both layouts, rotary dims of 0, half and all of the
head dim rounded down to 16; query rows at cache_seqlens + i under causal or local, all at
cache_seqlens otherwise), cache_leftpad, cache_batch_idx, pages of 256 through a shuffled block
table, num_splits 0 and 1, and the caches' contents after an append.

FlashAttention-2 runs every combination (millions for the cache test); each test here runs a
seeded sample of its grid, the same cases on every run: PORT_SAMPLES cases (or
FLASHATTN_PORT_SAMPLES), and then for any value of an axis that none holds, a case that does. The combinations
FlashAttention-2 skips are left out before sampling. Left out of the grids: dropout (this library
is exact attention; a dropout_p > 0 call must raise, checked once). Added to them: bfloat16 in the
cache test (FlashAttention-2 tests float16 there).

The rule is this project's, stricter than those tests' (the cache test allows 3x, with ALiBi 5x):
max |out - ref| <= 2 max |out_lowprec - ref| + 1e-5, both against attention computed in fp32
(out_lowprec: the same in the input dtype, scaling K rather than Q, as FlashAttention-2's
reference does with reorder_ops); rows that see no key give 0; LSE within 2e-3 where a row sees
keys, -inf where none. Skipped without a CUDA device or PyTorch."""
import math
import os
import random

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device on this machine", allow_module_level=True)

import flashattn  # noqa: E402
from rotary import apply_rotary  # noqa: E402

PORT_SAMPLES = {"qkvpacked": 40, "output": 160, "varlen_qkvpacked": 40, "varlen_output": 160, "kvcache": 240}


def sample(name, grid, skip):
    """A seeded sample, without repeats, of the grid's combinations that FlashAttention-2 does not
    skip, as pytest params with readable ids (combinations are drawn by their index in the grid,
    which is never built whole: the cache test's has 2.4 million)."""
    keys, values = list(grid), list(grid.values())
    total = math.prod(len(v) for v in values)
    n = int(os.environ.get("FLASHATTN_PORT_SAMPLES", PORT_SAMPLES[name]))
    rng, seen, picked = random.Random(f"{name}-52"), set(), []

    def draw(want=None):  # a new combination not skipped (with want = (axis, value): one holding it)
        for _ in range(100000):
            index = rng.randrange(total)
            c, rest = {}, index
            for key, vals in zip(keys, values):
                rest, i = divmod(rest, len(vals))
                c[key] = vals[i]
            if want is not None:
                c[want[0]] = want[1]
                index = sum(values[a].index(c[key]) * math.prod(len(v) for v in values[:a])
                            for a, key in enumerate(keys))
            if index not in seen and not skip(c):
                seen.add(index)
                return c
        return None

    while len(picked) < min(n, total) and (c := draw()) is not None:
        picked.append(c)
    for key, vals in grid.items():  # every value of every axis in some case
        for val in vals:
            if all(c[key] != val for c in picked) and (c := draw((key, val))) is not None:
                picked.append(c)
    return [pytest.param(c, id="-".join(f"{k}={v}" for k, v in c.items()).replace(" ", "")) for c in picked]


# ---- the reference: attention in PyTorch with FlashAttention-2's test semantics ---------------------

def padding_mask(max_len, batch, gen):
    """[batch, max_len] bool, True for a real row: each length drawn from max(1, max_len - 20) ..
    max_len (FlashAttention-2's generate_random_padding_mask, mode "random")."""
    lengths = torch.randint(max(1, max_len - 20), max_len + 1, (batch, 1), device="cuda", generator=gen)
    return torch.arange(max_len, device="cuda")[None, :] < lengths


def visible(q_len, k_len, sq, sk, causal, window, key_leftpad=None):
    """[B, sq, sk] bool: key j visible from query i. q_len, k_len: [B] real rows and keys (key
    columns shifted left by key_leftpad); bottom-right alignment per sequence: row i's diagonal is
    column i + k_len - q_len; a window (left, right) keeps columns diag - left .. diag + right (a
    negative side unbounded); causal sets right to 0."""
    left, right = int(window[0]), int(window[1])
    if causal:
        right = 0
    i = torch.arange(sq, device="cuda")[None, :, None]
    j = torch.arange(sk, device="cuda")[None, None, :]
    if key_leftpad is not None:
        j = j - key_leftpad.long()[:, None, None]
    diag = i + (k_len - q_len).long()[:, None, None]
    ok = (j >= 0) & (j < k_len.long()[:, None, None])
    if left >= 0:
        ok = ok & (j >= diag - left)
    if right >= 0:
        ok = ok & (j <= diag + right)
    return ok


def alibi_bias(slopes, q_len, k_len, sq, sk, key_leftpad=None):
    """[B, H, sq, sk]: -slope x |i + k_len - q_len - j| (bottom-right, per sequence)."""
    i = torch.arange(sq, device="cuda")[None, :, None]
    j = torch.arange(sk, device="cuda")[None, None, :]
    if key_leftpad is not None:
        j = j - key_leftpad.long()[:, None, None]
    dist = (i + (k_len - q_len).long()[:, None, None] - j).abs().float()
    return -slopes[:, :, None, None] * dist[:, None]


def reference(q, k, v, see, bias=None, softcap=0.0, q_real=None, upcast=True):
    """(out [B, sq, H, D], lse [B, H, sq]). q [B, sq, H, D]; k, v [B, sk, Hkv, D]; see [B, sq, sk]
    (visible keys); bias [B, H, sq, sk]; q_real [B, sq] (rows past a sequence's queries give 0).
    In fp32 when upcast; else in the input dtype, K scaled instead of Q (FlashAttention-2's
    reorder_ops), P rounded to it."""
    dt = q.dtype
    if upcast:
        q, k, v = q.float(), k.float(), v.float()
    H, Hkv, D = q.shape[2], k.shape[2], q.shape[3]
    k, v = k.repeat_interleave(H // Hkv, dim=2), v.repeat_interleave(H // Hkv, dim=2)
    scale = 1.0 / math.sqrt(D)
    s = (torch.einsum("bihd,bjhd->bhij", q * scale, k) if upcast else
         torch.einsum("bihd,bjhd->bhij", q, k * scale)).float()
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    if bias is not None:
        s = s + bias
    s = s.masked_fill(~see[:, None], float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    p = torch.softmax(s, dim=-1).nan_to_num(0.0).to(v.dtype)
    o = torch.einsum("bhij,bjhd->bihd", p, v)
    if q_real is not None:
        o = o.masked_fill(~q_real[:, :, None, None], 0.0)
    return o.to(dt), lse


def assert_close(out, ref, low, lse=None, ref_lse=None):
    assert not torch.isnan(out).any()
    err = (out.float() - ref.float()).abs().max().item()
    err_low = (low.float() - ref.float()).abs().max().item()
    assert err <= 2 * err_low + 1e-5, (err, err_low)
    if lse is not None:
        finite = torch.isfinite(ref_lse)
        assert torch.equal(finite, torch.isfinite(lse))
        assert (lse[~finite] == float("-inf")).all()
        if finite.any():
            assert (lse[finite] - ref_lse[finite]).abs().max().item() < 2e-3


def unpad(x, real):
    """The real rows of x [B, S, ...] packed: ([total, ...], cu_seqlens int32 [B + 1], max length)."""
    lens = real.sum(-1, dtype=torch.int32)
    cu = torch.nn.functional.pad(torch.cumsum(lens, 0, dtype=torch.int32), (1, 0))
    return x[real], cu, int(lens.max())


def pad_back(x, real):
    out = torch.zeros(real.shape + x.shape[1:], dtype=x.dtype, device=x.device)
    out[real] = x
    return out


# ---- the dense and ragged grids: test_flash_attn_{,varlen_}{qkvpacked,output} ----------------------

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
PACKED_AXES = {"dtype": list(DTYPES), "deterministic": [False, True], "alibi": [False, True], "local": [False, True],
               "causal": [False, True], "d": [32, 40, 59, 64, 80, 96, 111, 128, 160, 192, 224, 256]}
OUTPUT_AXES = {"kvpacked": [True, False], "mha_type": ["mha", "mqa", "gqa"], **PACKED_AXES, "softcap": [0.0, 50.0]}
OUTPUT_SEQLENS = [(113, 203), (128, 217), (113, 211), (108, 256), (256, 512), (512, 256), (1024, 1024), (1023, 1024),
                  (1024, 1023), (2048, 2048)]


def case_inputs(c, B, H, sq, sk):
    """Case c's inputs as FlashAttention-2's tests draw them: (generator, q, k, v, ALiBi slopes or
    None, window): q [B, sq, H, d] (scaled by the softcap, so that the scores reach its range), k and
    v [B, sk, Hkv, d] with Hkv by mha_type, the window a tensor of two when local."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    dtype, d = DTYPES[c["dtype"]], c["d"]
    Hkv = {"mha": H, "mqa": 1, "gqa": 3}[c.get("mha_type", "mha")]
    window = torch.randint(0, sk, (2,), device="cpu") if c["local"] else (-1, -1)
    q = torch.randn(B, sq, H, d, device="cuda", dtype=dtype, generator=gen) * max(1.0, c.get("softcap", 0.0))
    k, v = (torch.randn(B, sk, Hkv, d, device="cuda", dtype=dtype, generator=gen) for _ in range(2))
    slopes = torch.rand(B, H, device="cuda", generator=gen) * 0.3 if c["alibi"] else None
    return gen, q, k, v, slopes, window


def check_case(c, q, k, v, slopes, window, out, lse, q_len, k_len, q_real=None):
    """out [B, sq, H, d] (padded rows zero) and lse (dense [B, H, sq]; with q_real, packed [H, total])
    against the reference on q, k, v with q_len queries and k_len keys a sequence."""
    sq, sk = q.shape[1], k.shape[1]
    see = visible(q_len, k_len, sq, sk, c["causal"], window)
    bias = alibi_bias(slopes, q_len, k_len, sq, sk) if slopes is not None else None
    softcap = c.get("softcap", 0.0)
    ref, ref_lse = reference(q, k, v, see, bias, softcap, q_real=q_real)
    low, _ = reference(q, k, v, see, bias, softcap, q_real=q_real, upcast=False)
    if q_real is not None:  # each sequence's real rows, packed as the varlen LSE is
        ref_lse = torch.cat([ref_lse[b, :, : int(q_len[b])] for b in range(q.shape[0])], dim=1)
    assert_close(out, ref, low, lse, ref_lse)


@pytest.mark.parametrize("c", sample("qkvpacked", {**PACKED_AXES, "seqlen": [97, 128, 200, 384, 768, 1024, 1025, 2048]},
                                     lambda c: False))
def test_qkvpacked(c):
    B, S = 4, c["seqlen"]
    _, q, k, v, slopes, window = case_inputs(c, B, 9, S, S)
    out, lse, _ = flashattn.flash_attn_qkvpacked_func(torch.stack([q, k, v], dim=2), 0.0, causal=c["causal"],
                                                      window_size=window, alibi_slopes=slopes,
                                                      deterministic=c["deterministic"], return_attn_probs=True)
    n = torch.full((B,), S, device="cuda")
    check_case(c, q, k, v, slopes, window, out, lse, n, n)


@pytest.mark.parametrize("c", sample("output", {**OUTPUT_AXES, "seqlens": OUTPUT_SEQLENS}, lambda c: False))
def test_output(c):
    B, (sq, sk) = 4, c["seqlens"]
    _, q, k, v, slopes, window = case_inputs(c, B, 9, sq, sk)
    kw = dict(causal=c["causal"], window_size=window, softcap=c["softcap"], alibi_slopes=slopes,
              deterministic=c["deterministic"], return_attn_probs=True)
    if c["kvpacked"]:
        out, lse, _ = flashattn.flash_attn_kvpacked_func(q, torch.stack([k, v], dim=2), 0.0, **kw)
    else:
        out, lse, _ = flashattn.flash_attn_func(q, k, v, 0.0, **kw)
    check_case(c, q, k, v, slopes, window, out, lse, torch.full((B,), sq, device="cuda"),
               torch.full((B,), sk, device="cuda"))


@pytest.mark.parametrize("c", sample("varlen_qkvpacked", {
    **PACKED_AXES, "seqlen": [97, 128, 200, 257, 384, 512, 768, 1025, 2048]}, lambda c: False))
def test_varlen_qkvpacked(c):
    B, S = 5, c["seqlen"]
    gen, q, k, v, slopes, window = case_inputs(c, B, 6, S, S)
    real = padding_mask(S, B, gen)
    qkv_unpad, cu, max_len = unpad(torch.stack([q, k, v], dim=2), real)
    out, lse, _ = flashattn.flash_attn_varlen_qkvpacked_func(
        qkv_unpad, cu, max_len, 0.0, causal=c["causal"], window_size=window, alibi_slopes=slopes,
        deterministic=c["deterministic"], return_attn_probs=True)
    n = real.sum(-1)
    check_case(c, q, k, v, slopes, window, pad_back(out, real), lse, n, n, q_real=real)


@pytest.mark.parametrize("c", sample("varlen_output", {**OUTPUT_AXES, "seqlens": [(1, 147)] + OUTPUT_SEQLENS},
                                     lambda c: False))
def test_varlen_output(c):
    B, (sq, sk) = 4, c["seqlens"]
    gen, q, k, v, slopes, window = case_inputs(c, B, 9, sq, sk)
    q_real, k_real = padding_mask(sq, B, gen), padding_mask(sk, B, gen)
    q_unpad, cu_q, max_q = unpad(q, q_real)
    k_unpad, cu_k, max_k = unpad(k, k_real)
    v_unpad = v[k_real]
    kw = dict(causal=c["causal"], window_size=window, softcap=c["softcap"], alibi_slopes=slopes,
              deterministic=c["deterministic"], return_attn_probs=True)
    if c["kvpacked"]:
        kv = torch.stack([k_unpad, v_unpad], dim=1)
        out, lse, _ = flashattn.flash_attn_varlen_kvpacked_func(q_unpad, kv, cu_q, cu_k, max_q, max_k, 0.0, **kw)
    else:
        out, lse, _ = flashattn.flash_attn_varlen_func(q_unpad, k_unpad, v_unpad, cu_q, cu_k, max_q, max_k, 0.0,
                                                       **kw)
    check_case(c, q, k, v, slopes, window, pad_back(out, q_real), lse, q_real.sum(-1), k_real.sum(-1),
               q_real=q_real)


def test_dropout_is_refused():
    """FlashAttention-2's grids run dropout 0.17 too; this library computes exact attention and says so."""
    q, k, v = (torch.randn(10, 2, 64, device="cuda", dtype=torch.float16) for _ in range(3))
    cu = torch.tensor([0, 10], dtype=torch.int32, device="cuda")
    with pytest.raises(ValueError, match="dropout"):
        flashattn.flash_attn_varlen_func(q, k, v, cu, cu, 10, 10, 0.17)
    with pytest.raises(ValueError, match="dropout"):
        flashattn.flash_attn_func(q[None], k[None], v[None], 0.17)


# ---- test_flash_attn_kvcache -------------------------------------------------------------------------

def kvcache_skip(c):
    sq, sk = c["seqlens"]
    return ((sq > sk and c["new_kv"]) or (not c["new_kv"] and c["rotary_fraction"] > 0.0)
            or (c["has_batch_idx"] and c["page"] is not None) or (c["has_leftpad"] and c["page"] is not None))


@pytest.mark.parametrize("c", sample("kvcache", {
    "dtype": list(DTYPES), "num_splits": [1, 0], "mha_type": ["mha", "mqa", "gqa"], "new_kv": [False, True],
    "alibi": [False, True], "local": [False, True], "causal": [False, True], "seqlen_new_eq_seqlen_q": [True, False],
    "rotary_interleaved": [False, True], "rotary_fraction": [0.0, 0.5, 1.0], "page": [None, 256],
    "has_leftpad": [False, True], "has_batch_idx": [False, True], "d": [32, 59, 64, 80, 128, 256],
    "seqlens": [(1, 128), (1, 339), (3, 1024), (64, 800), (64, 256), (3, 799), (64, 2048), (16, 20000),
                (1, 128 * 1024), (16, 128 * 1024), (128, 128)]}, kvcache_skip))
def test_kvcache(c):
    dtype, gen = DTYPES[c["dtype"]], torch.Generator(device="cuda").manual_seed(0)
    (sq, sk), d, page = c["seqlens"], c["d"], c["page"]
    B, H = 2, 6
    B_cache = 5 if c["has_batch_idx"] else B
    Hkv = {"mha": H, "mqa": 1, "gqa": 3}[c["mha_type"]]
    local, causal = c["local"], c["causal"]
    window = torch.randint(0, sk, (2,), device="cpu") if local else (-1, -1)
    q = torch.randn(B, sq, H, d, device="cuda", dtype=dtype, generator=gen)
    s_new = sq if c["seqlen_new_eq_seqlen_q"] else int(torch.randint(1, sq + 1, (1,), device="cpu"))
    k_new = v_new = None
    if c["new_kv"]:
        k_new = torch.randn(B, s_new, Hkv, d, device="cuda", dtype=dtype, generator=gen)
        v_new = torch.randn(B, s_new, Hkv, d, device="cuda", dtype=dtype, generator=gen)
    block_table = None
    if page is None:
        k_cache = torch.randn(B_cache, sk, Hkv, d, device="cuda", dtype=dtype, generator=gen)
        v_cache = torch.randn(B_cache, sk, Hkv, d, device="cuda", dtype=dtype, generator=gen)
    else:  # a pool three times the pages needed, pages in a shuffled order (FlashAttention-2's layout)
        n_pages = math.ceil(sk / page) * B * 3
        k_pool = torch.randn(n_pages, page, Hkv, d, device="cuda", dtype=dtype, generator=gen)
        v_pool = torch.randn(n_pages, page, Hkv, d, device="cuda", dtype=dtype, generator=gen)
        block_table = torch.randperm(n_pages, device="cuda", generator=gen).to(torch.int32).reshape(B, -1)
        gather = lambda pool: pool[block_table.long().flatten()].reshape(B, -1, Hkv, d)[:, :sk]  # noqa: E731
        k_cache, v_cache = gather(k_pool), gather(v_pool)
    rotary_dim = math.floor(int(c["rotary_fraction"] * d) / 16) * 16
    new = s_new if c["new_kv"] else 0
    if c["new_kv"]:
        room = sk - (sq if (causal or local) and rotary_dim > 1 else s_new)
        cache_seqlens = torch.randint(0, room + 1, (B,), dtype=torch.int32, device="cuda", generator=gen)
    else:
        cache_seqlens = torch.randint(1, sk + 1, (B,), dtype=torch.int32, device="cuda", generator=gen)
    leftpad = None
    if c["has_leftpad"]:
        leftpad = torch.stack([torch.randint(0, int(n), (), dtype=torch.int32, device="cuda", generator=gen)
                               if int(n) > 0 else torch.zeros((), dtype=torch.int32, device="cuda")
                               for n in cache_seqlens])
    batch_idx = None
    if c["has_batch_idx"]:
        batch_idx = torch.randperm(B_cache, device="cuda", generator=gen).to(torch.int32)[:B]
    slopes = torch.rand(B, H, device="cuda", generator=gen) * 0.3 if c["alibi"] else None
    cos = sin = None
    q_ro, k_ro = q, k_new
    if rotary_dim > 0:
        n_ro = sk if page is None else n_pages * page
        angle = torch.rand(n_ro, rotary_dim // 2, device="cuda", generator=gen) * 2 * math.pi
        cos, sin = torch.cos(angle).to(dtype), torch.sin(angle).to(dtype)
        at = cache_seqlens.long()[:, None]
        q_pos = at + torch.arange(sq, device="cuda")[None] if (causal or local) else at.expand(B, sq)
        q_ro = apply_rotary(q, cos, sin, q_pos, c["rotary_interleaved"])
        k_ro = apply_rotary(k_new, cos, sin, at + torch.arange(s_new, device="cuda")[None], c["rotary_interleaved"])

    # What the cache holds after the call, and the keys each sequence sees.
    k_ref = (k_cache if batch_idx is None else k_cache[batch_idx.long()]).clone()
    v_ref = (v_cache if batch_idx is None else v_cache[batch_idx.long()]).clone()
    cols = torch.arange(sk, device="cuda")[None]
    if c["new_kv"]:
        rows = (cols >= cache_seqlens[:, None]) & (cols < cache_seqlens[:, None] + s_new)
        k_ref[rows] = k_ro.reshape(-1, Hkv, d)
        v_ref[rows] = v_new.reshape(-1, Hkv, d)
    n_keys = cache_seqlens.long() + new - (leftpad.long() if leftpad is not None else 0)
    see = visible(torch.full((B,), sq, device="cuda"), n_keys, sq, sk, causal, window, leftpad)
    n_q = torch.full((B,), sq, device="cuda")
    bias = alibi_bias(slopes, n_q, n_keys, sq, sk, leftpad) if slopes is not None else None

    out = flashattn.flash_attn_with_kvcache(
        q, k_cache if page is None else k_pool, v_cache if page is None else v_pool, k_new, v_new,
        rotary_cos=cos, rotary_sin=sin, cache_seqlens=cache_seqlens, cache_batch_idx=batch_idx,
        cache_leftpad=leftpad, block_table=block_table, causal=causal, window_size=window,
        rotary_interleaved=c["rotary_interleaved"], alibi_slopes=slopes, num_splits=c["num_splits"])
    ref, _ = reference(q_ro, k_ref, v_ref, see, bias)
    low, _ = reference(q_ro, k_ref, v_ref, see, bias, upcast=False)
    assert_close(out, ref, low)
    if c["new_kv"]:
        if page is None:
            k_got = k_cache if batch_idx is None else k_cache[batch_idx.long()]
            v_got = v_cache if batch_idx is None else v_cache[batch_idx.long()]
        else:
            k_got, v_got = gather(k_pool), gather(v_pool)
        # K: rotated here and by the library, both in fp32, rounded apart by at most one unit in the
        # last place (FlashAttention-2's tolerance, float16's; bfloat16's unit is 8x float16's)
        tol = 1e-3 if dtype == torch.float16 else 8e-3
        assert torch.allclose(k_got, k_ref, rtol=tol, atol=tol)
        assert torch.equal(v_got, v_ref)
