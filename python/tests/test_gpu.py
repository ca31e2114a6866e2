"""GPU tests of the Python package: every flash_attn_func argument against attention computed by
PyTorch in fp32, by FlashAttention's rule (error <= 2x the error of plain low-precision attention);
torch, CuPy and DLPack inputs; non-contiguous inputs; a non-default stream; out=. Skipped when
there is no CUDA device or no PyTorch."""
import math

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device on this machine", allow_module_level=True)

import flashattn  # noqa: E402
from rotary import apply_rotary, rotary_tables  # noqa: E402


def reference(q, k, v, causal=False, window=(-1, -1), softcap=0.0, alibi=None, scale=None, upcast=True):
    """Plain attention in PyTorch, [B, S, H, D]; fp32 when upcast, else in the input dtype."""
    dt = torch.float32 if upcast else q.dtype
    q, k, v = q.to(dt), k.to(dt), v.to(dt)
    B, Sq, Hq, D = q.shape
    Sk, Hkv = k.shape[1], k.shape[2]
    k = k.repeat_interleave(Hq // Hkv, dim=2)
    v = v.repeat_interleave(Hq // Hkv, dim=2)
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    s = torch.einsum("bihd,bjhd->bhij", q * scale, k).float()
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    i = torch.arange(Sq, device=q.device)[:, None]
    j = torch.arange(Sk, device=q.device)[None, :]
    diag = i + Sk - Sq
    if alibi is not None:
        sl = alibi.reshape(-1, Hq, 1, 1) if alibi.dim() == 2 else alibi.reshape(1, Hq, 1, 1)
        s = s - sl * (diag - j).abs()
    visible = torch.ones(Sq, Sk, dtype=torch.bool, device=q.device)
    if causal:
        visible &= j <= diag
    if window[0] >= 0:
        visible &= j >= diag - window[0]
    if window[1] >= 0:
        visible &= j <= diag + window[1]
    s = s.masked_fill(~visible, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    p = torch.softmax(s, dim=-1).nan_to_num(0.0).to(dt)
    o = torch.einsum("bhij,bjhd->bihd", p, v)
    return o, lse


def check(q, k, v, **kw):
    out, lse, _ = flashattn.flash_attn_func(q, k, v, return_attn_probs=True, **kw)
    names = {"causal": "causal", "window_size": "window", "softcap": "softcap", "alibi_slopes": "alibi",
             "softmax_scale": "scale"}
    rk = {names[a]: b for a, b in kw.items() if a in names}
    ref, ref_lse = reference(q, k, v, **rk)
    low, _ = reference(q, k, v, upcast=False, **rk)
    err = (out.float() - ref).abs().max().item()
    err_low = (low.float() - ref).abs().max().item()
    assert not torch.isnan(out).any()
    assert err <= 2 * err_low + 1e-5, (err, err_low)
    finite = torch.isfinite(ref_lse)
    assert torch.equal(finite, torch.isfinite(lse))
    assert (lse[finite] - ref_lse[finite]).abs().max().item() < 2e-3
    return out


def rand(*shape, dtype=torch.bfloat16):
    return torch.randn(*shape, device="cuda", dtype=dtype)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("d", [32, 59, 64, 128, 256])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("sq,sk", [(113, 203), (256, 128), (1, 300)])
def test_matches_fp32_attention(dtype, d, causal, sq, sk):
    check(rand(2, sq, 4, d, dtype=dtype), rand(2, sk, 2, d, dtype=dtype), rand(2, sk, 2, d, dtype=dtype),
          causal=causal)


@pytest.mark.parametrize("kw", [
    dict(window_size=(32, 8)), dict(window_size=(16, 0), causal=True), dict(softcap=3.0),
    dict(softmax_scale=0.3), dict(alibi_slopes="heads"), dict(alibi_slopes="batch", causal=True),
    # FlashAttention-2 takes these too: a scale of 0 (uniform weights) or below 0, a softcap <= 0
    # (disabled), any negative window side (unbounded).
    dict(softmax_scale=0.0), dict(softmax_scale=0.0, alibi_slopes="heads"), dict(softmax_scale=-0.3, causal=True),
    dict(softcap=-1.0), dict(window_size=(-7, 20))])
def test_every_argument(kw):
    q, k, v = rand(2, 200, 8, 64), rand(2, 250, 2, 64), rand(2, 250, 2, 64)
    if kw.get("alibi_slopes") == "heads":
        kw["alibi_slopes"] = torch.rand(8, device="cuda") * 0.3
    elif kw.get("alibi_slopes") == "batch":
        kw["alibi_slopes"] = torch.rand(2, 8, device="cuda") * 0.3
    check(q, k, v, **kw)


def test_non_contiguous_inputs_and_mqa():
    qh = rand(2, 4, 150, 128)  # [B, H, S, D] storage, viewed as [B, S, H, D]
    kh, vh = rand(2, 1, 170, 128), rand(2, 1, 170, 128)
    q, k, v = qh.transpose(1, 2), kh.transpose(1, 2), vh.transpose(1, 2)
    assert not q.is_contiguous()
    check(q, k, v, causal=True)


def test_a_negative_scale_is_the_attention_of_minus_q_on_every_path():
    q, k, v = rand(2, 50, 4, 64), rand(2, 90, 2, 64), rand(2, 90, 2, 64)
    cu = torch.tensor([0, 20, 50], dtype=torch.int32, device="cuda")
    cuk = torch.tensor([0, 40, 90], dtype=torch.int32, device="cuda")
    for _ in range(2):  # the second varlen call would hit a kept entry, were the first kept
        got = flashattn.flash_attn_varlen_func(q[0], k[0], v[0], cu, cuk, 30, 50, softmax_scale=-0.2, causal=True)
        assert torch.equal(got, flashattn.flash_attn_varlen_func(-q[0], k[0], v[0], cu, cuk, 30, 50,
                                                                 softmax_scale=0.2, causal=True))
    lens = torch.tensor([70, 13], dtype=torch.int32, device="cuda")
    got = flashattn.flash_attn_with_kvcache(q[:, :3], k, v, cache_seqlens=lens, softmax_scale=-0.2)
    assert torch.equal(got, flashattn.flash_attn_with_kvcache(-q[:, :3], k, v, cache_seqlens=lens, softmax_scale=0.2))


def _last_dim_strided(x):
    """x's values in storage whose last dimension is not contiguous (its last two swapped)."""
    return x.transpose(-1, -2).contiguous().transpose(-1, -2)


def test_a_strided_last_dimension_is_copied_as_flashattention2_copies_it():
    """FlashAttention-2 makes q, k and v contiguous where their last stride is not 1; so do these
    functions, with results equal to the contiguous call's. flash_attn_with_kvcache also copies such
    a block_table and cache_batch_idx; a cache so laid out is refused. A serving call that copied is
    not kept by the per-structure cache, so a second call with new data is computed afresh."""
    q, k, v = rand(2, 70, 4, 64), rand(2, 90, 2, 64), rand(2, 90, 2, 64)
    qs, vs = _last_dim_strided(q), _last_dim_strided(v)
    assert qs.stride(-1) != 1 and torch.equal(qs, q)
    want = flashattn.flash_attn_func(q, k, v, causal=True)
    assert torch.equal(flashattn.flash_attn_func(qs, k, vs, causal=True), want)

    cu = torch.tensor([0, 30, 70], dtype=torch.int32, device="cuda")
    cuk = torch.tensor([0, 50, 90], dtype=torch.int32, device="cuda")
    qv, kv_, vv = q[0], k[0], v[0]
    want = flashattn.flash_attn_varlen_func(qv, kv_, vv, cu, cuk, 40, 50, causal=True)
    for _ in range(2):  # the second call would hit a kept entry, were the first kept
        assert torch.equal(flashattn.flash_attn_varlen_func(_last_dim_strided(qv), _last_dim_strided(kv_), vv, cu, cuk,
                                                            40, 50, causal=True), want)

    B, Hkv, D = 3, 2, 64
    ks, vs_ = [rand(n, Hkv, D) for n in (40, 17, 33)], [rand(n, Hkv, D) for n in (40, 17, 33)]
    kc, vc, table = page_pool(ks, vs_, 16)
    qd = rand(B, 1, 4, D)
    seqlens = torch.tensor([40, 17, 33], dtype=torch.int32, device="cuda")
    want = flashattn.flash_attn_with_kvcache(qd, kc, vc, cache_seqlens=seqlens, block_table=table)
    strided_table = table.t().contiguous().t()
    assert strided_table.stride(-1) != 1 and torch.equal(strided_table, table)
    for _ in range(2):
        got = flashattn.flash_attn_with_kvcache(_last_dim_strided(qd), kc, vc, cache_seqlens=seqlens,
                                                block_table=strided_table)
        assert torch.equal(got, want)
    dense_k, dense_v = rand(4, 64, Hkv, D), rand(4, 64, Hkv, D)
    idx = torch.tensor([3, 9, 0, 9, 1, 9], dtype=torch.int32, device="cuda")[::2]
    assert idx.stride(-1) != 1
    want = flashattn.flash_attn_with_kvcache(qd, dense_k, dense_v, cache_seqlens=seqlens,
                                             cache_batch_idx=idx.contiguous())
    assert torch.equal(flashattn.flash_attn_with_kvcache(qd, dense_k, dense_v, cache_seqlens=seqlens,
                                                         cache_batch_idx=idx), want)
    with pytest.raises(ValueError, match="k_cache must have a contiguous last dimension"):
        flashattn.flash_attn_with_kvcache(qd, _last_dim_strided(dense_k), dense_v, cache_seqlens=seqlens)


def test_a_dense_cache_with_more_rows_than_sequences():
    """Without cache_batch_idx, sequence b reads row b, and the cache may be taller (FlashAttention-2)."""
    q, kc, vc = rand(2, 1, 4, 64), rand(5, 80, 2, 64), rand(5, 80, 2, 64)
    lens = torch.tensor([80, 31], dtype=torch.int32, device="cuda")
    got = flashattn.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens)
    assert torch.equal(got, flashattn.flash_attn_with_kvcache(q, kc[:2].clone(), vc[:2].clone(), cache_seqlens=lens))


def test_out_and_non_default_stream():
    q, k, v = rand(1, 300, 4, 64), rand(1, 300, 4, 64), rand(1, 300, 4, 64)
    expected = flashattn.flash_attn_func(q, k, v)
    out = torch.full_like(q, float("nan"))
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        r = flashattn.flash_attn_func(q, k, v, out=out)
    s.synchronize()
    assert r is out
    assert torch.equal(out, expected)


def test_cupy_inputs():
    cupy = pytest.importorskip("cupy")
    q = cupy.random.standard_normal((2, 100, 4, 64)).astype(cupy.float16)
    k = cupy.random.standard_normal((2, 120, 4, 64)).astype(cupy.float16)
    v = cupy.random.standard_normal((2, 120, 4, 64)).astype(cupy.float16)
    out = flashattn.flash_attn_func(q, k, v, causal=True)
    assert isinstance(out, cupy.ndarray) and out.shape == q.shape
    tq, tk, tv = (torch.as_tensor(x, device="cuda") for x in (q, k, v))
    expected = flashattn.flash_attn_func(tq, tk, tv, causal=True)
    assert torch.equal(torch.as_tensor(out, device="cuda"), expected)
    # stream= on a CuPy stream that is not the current one, and a padded head dim (60 -> 64): the
    # call runs with that stream current (its output, padded copies and copy back made there)
    s = cupy.cuda.Stream(non_blocking=True)
    q60, k60, v60 = (x[..., :60].copy() for x in (q, k, v))
    cupy.cuda.get_current_stream().synchronize()
    got = flashattn.flash_attn_func(q60, k60, v60, causal=True, stream=s.ptr)
    s.synchronize()
    want = flashattn.flash_attn_func(*(torch.as_tensor(x, device="cuda") for x in (q60, k60, v60)), causal=True)
    assert torch.equal(torch.as_tensor(got, device="cuda"), want)


def test_return_attn_probs_gives_flashattention2s_empty_probability_tensor():
    """With return_attn_probs and no dropout, FlashAttention-2 returns (out, softmax_lse, S_dmask) with
    S_dmask an empty (0,) tensor of q's dtype on q's device: so does every path here (the cached torch
    call, the general one, a padded head dim, varlen, the packed forms; CuPy in the next test)."""
    q, k, v = rand(2, 33, 4, 64), rand(2, 40, 2, 64), rand(2, 40, 2, 64)
    slopes = torch.rand(4, device="cuda")
    q40, k40, v40 = (x[..., :40].contiguous() for x in (q, k, v))
    cu = torch.tensor([0, 33, 66], dtype=torch.int32, device="cuda")
    cuk = torch.tensor([0, 40, 80], dtype=torch.int32, device="cuda")
    calls = {
        "cached": lambda: flashattn.flash_attn_func(q, k, v, causal=True, return_attn_probs=True),
        "alibi": lambda: flashattn.flash_attn_func(q, k, v, alibi_slopes=slopes, return_attn_probs=True),
        "padded": lambda: flashattn.flash_attn_func(q40, k40, v40, return_attn_probs=True),
        "varlen": lambda: flashattn.flash_attn_varlen_func(q.reshape(66, 4, 64), k.reshape(80, 2, 64),
                                                           v.reshape(80, 2, 64), cu, cuk, 33, 40, causal=True,
                                                           return_attn_probs=True),
        "qkvpacked": lambda: flashattn.flash_attn_qkvpacked_func(torch.stack([q, q, q], 2), return_attn_probs=True),
    }
    for name, call in calls.items():
        r = call()
        assert isinstance(r, tuple) and len(r) == 3, name
        assert torch.is_tensor(r[2]) and r[2].shape == (0,) and r[2].dtype == q.dtype, name
        assert r[2].device == q.device and r[1].dtype == torch.float32, name


def test_return_attn_probs_with_cupy_inputs_gives_an_empty_cupy_array():
    cupy = pytest.importorskip("cupy")
    q, k, v = rand(2, 33, 4, 64), rand(2, 40, 2, 64), rand(2, 40, 2, 64)
    cq, ck, cv = (cupy.asarray(x.to(torch.float16)) for x in (q, k, v))
    _, lse, probs = flashattn.flash_attn_func(cq, ck, cv, return_attn_probs=True)
    assert isinstance(probs, cupy.ndarray) and probs.shape == (0,) and probs.dtype == cupy.float16
    assert probs.device.id == cq.device.id and lse.dtype == cupy.float32


class OnlyDlpack:
    """An array that only speaks DLPack (bf16 has no __cuda_array_interface__ typestr)."""

    def __init__(self, t):
        self.t = t

    def __dlpack__(self, stream=None):
        return self.t.__dlpack__()

    def __dlpack_device__(self):
        return self.t.__dlpack_device__()


def test_return_attn_probs_follows_q_when_out_is_another_kind_of_array():
    # S_dmask is made with q's options (FlashAttention-2's), not from out=, which may be any CUDA array.
    q, k, v = rand(1, 64, 2, 64), rand(1, 80, 2, 64), rand(1, 80, 2, 64)
    out = torch.full_like(q, float("nan"))
    r = flashattn.flash_attn_func(q, k, v, out=OnlyDlpack(out), return_attn_probs=True)
    assert isinstance(r[0], OnlyDlpack) and torch.is_tensor(r[1]) and torch.is_tensor(r[2])
    assert r[2].shape == (0,) and r[2].dtype == q.dtype and r[2].device == q.device
    want = flashattn.flash_attn_func(q, k, v)
    assert torch.equal(out, want)


def test_dlpack_inputs_with_out():
    q, k, v = rand(1, 64, 2, 64), rand(1, 80, 2, 64), rand(1, 80, 2, 64)
    out = torch.empty_like(q)
    flashattn.flash_attn_func(OnlyDlpack(q), OnlyDlpack(k), OnlyDlpack(v), out=OnlyDlpack(out))
    torch.cuda.synchronize()
    assert torch.equal(out, flashattn.flash_attn_func(q, k, v))


def test_dlpack_inputs_with_a_workspace():
    # A batch-1 decode over 8k keys splits its keys (a workspace for the partial results, in a full
    # build; a build without the kernels falls back to the reference, which needs one too): arrays
    # known only through DLPack get it from the CUDA runtime on the call's stream.
    q, k, v = rand(1, 1, 32, 128), rand(1, 8192, 8, 128), rand(1, 8192, 8, 128)
    out = torch.full_like(q, float("nan"))
    flashattn.flash_attn_func(OnlyDlpack(q), OnlyDlpack(k), OnlyDlpack(v), out=OnlyDlpack(out))
    torch.cuda.synchronize()
    assert flashattn._lib._CUDART is not None  # the workspace path ran
    assert torch.equal(out, flashattn.flash_attn_func(q, k, v))


def test_errors_name_the_argument():
    q, k, v = rand(1, 64, 4, 64), rand(1, 64, 3, 64), rand(1, 64, 3, 64)
    with pytest.raises(flashattn.FlashAttnError) as e:
        flashattn.flash_attn_func(q, k, v)
    assert e.value.name == "FLASHATTN_STATUS_BAD_HEAD_GROUPING"
    with pytest.raises(ValueError, match="k has shape"):
        flashattn.flash_attn_func(q, rand(1, 64, 4, 32), rand(1, 64, 4, 32))
    with pytest.raises(TypeError, match="float16 or bfloat16"):
        flashattn.flash_attn_func(q.float(), k, v)


def test_low_level_api_plan():
    h = flashattn.get_handle(0)
    p = flashattn.FwdParams.new()
    p.dtype = flashattn.Dtype.BFLOAT16
    p.batch, p.seqlen_q, p.seqlen_k, p.heads_q, p.heads_kv, p.head_dim = 2, 1024, 1024, 16, 16, 128
    q = rand(2, 1024, 16, 128)
    p.q = p.k = p.v = p.o = q.data_ptr()
    p.q_batch_stride, p.q_seq_stride, p.q_head_stride = q.stride()[:3]
    p.k_batch_stride, p.k_seq_stride, p.k_head_stride = q.stride()[:3]
    p.v_batch_stride, p.v_seq_stride, p.v_head_stride = q.stride()[:3]
    p.o_batch_stride, p.o_seq_stride, p.o_head_stride = q.stride()[:3]
    info = flashattn.plan(h, p)
    if torch.cuda.get_device_capability() == (9, 0):  # default builds carry the sm_90a kernels
        assert info.backend == flashattn.Backend.FUSED_SM90
        assert b"fused_sm90_bf16_d128" in info.kernel_name
    else:
        assert info.backend == flashattn.Backend.FUSED
        assert b"fused_fwd_bf16_d128" in info.kernel_name
    assert flashattn.workspace_size(h, p) == 0
    p.head_dim = 300
    ok, err = flashattn.supported(h, p)
    assert not ok and err.name == "FLASHATTN_STATUS_UNSUPPORTED_HEAD_DIM"


# ---- the cached PyTorch path: a cache hit must compute exactly what a fresh call computes -----------

def test_cached_calls_see_new_data_and_new_pointers():
    shape_q, shape_kv = (2, 130, 8, 64), (2, 170, 2, 64)
    for _ in range(3):  # the first call fills the cache, the others hit it, each with fresh tensors
        check(rand(*shape_q), rand(*shape_kv), rand(*shape_kv), causal=True)
    # Same shapes and strides, but q no longer 16-byte aligned: another plan (and workspace) may apply.
    big = rand(2 * 130 * 8 * 64 + 4)
    q = big[4:].view(*shape_q)
    assert q.data_ptr() % 16 == 8
    check(q, rand(*shape_kv), rand(*shape_kv), causal=True)


def test_cached_calls_decode_with_split_workspace_and_list_window():
    # Batch-1 decode with grouped heads: split keys, so the cached plan carries a workspace.
    q, k, v = rand(1, 1, 32, 128), rand(1, 8192, 8, 128), rand(1, 8192, 8, 128)
    for _ in range(2):
        check(q, k, v)
    check(rand(1, 4, 32, 128), k, v, window_size=[64, 0])  # a list: unhashable, so the general path


def test_cached_calls_follow_the_current_stream():
    q, k, v, q2 = rand(1, 300, 4, 64), rand(1, 300, 4, 64), rand(1, 300, 4, 64), rand(1, 300, 4, 64)
    flashattn.flash_attn_func(q, k, v)  # fills the cache
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        torch.cuda._sleep(50_000_000)  # holds s back: a call enqueued elsewhere would run first, on the old q
        q.copy_(q2)
        r = flashattn.flash_attn_func(q, k, v)
    s.synchronize()
    assert torch.equal(r, flashattn.flash_attn_func(q2, k, v))


def test_cached_calls_capture_in_a_cuda_graph():
    q, k, v = rand(2, 256, 8, 128), rand(2, 256, 8, 128), rand(2, 256, 8, 128)
    flashattn.flash_attn_func(q, k, v, causal=True)  # warm: fills the cache outside the capture
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        with torch.cuda.graph(g):
            out = flashattn.flash_attn_func(q, k, v, causal=True)
    torch.cuda.current_stream().wait_stream(s)
    for _ in range(2):
        q.copy_(rand(2, 256, 8, 128))
        g.replay()
        torch.cuda.synchronize()
        ref, _ = reference(q, k, v, causal=True)
        low, _ = reference(q, k, v, causal=True, upcast=False)
        assert (out.float() - ref).abs().max() <= 2 * (low.float() - ref).abs().max() + 1e-5


def test_cached_workspace_per_stream_and_under_capture():
    """Split decode keeps a workspace per (device, stream): back-to-back calls on one stream reuse it,
    another stream gets its own, a captured call takes one from the graph's pool; every result is
    exact, and a graph replayed after eager calls still is."""
    k, v = rand(1, 8192, 8, 128), rand(1, 8192, 8, 128)
    qs = [rand(1, 1, 32, 128) for _ in range(4)]
    want = [flashattn.flash_attn_func(q, k, v) for q in qs]
    outs = [flashattn.flash_attn_func(q, k, v) for q in qs]  # reuse on the current stream, in order
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        torch.cuda._sleep(20_000_000)
        other = [flashattn.flash_attn_func(q, k, v) for q in qs]  # its own workspace on s
    s.synchronize()
    for a, b, c in zip(want, outs, other):
        assert torch.equal(a, b) and torch.equal(a, c)
    g = torch.cuda.CUDAGraph()
    qg = qs[0].clone()
    with torch.cuda.graph(g):
        out = flashattn.flash_attn_func(qg, k, v)
    for q, w in zip(qs[::-1], want[::-1]):
        flashattn.flash_attn_func(q, k, v)  # eager calls between replays
        qg.copy_(q)
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, w)
    check(qs[0], k, v)


# ---- merge_attn_states: attention over two key halves, merged, is attention over all keys ------------

def test_merging_two_key_halves_gives_attention_over_all_keys():
    q, k, v = rand(2, 77, 8, 128), rand(2, 300, 2, 128), rand(2, 300, 2, 128)
    o1, l1, _ = flashattn.flash_attn_func(q, k[:, :130], v[:, :130], return_attn_probs=True)
    o2, l2, _ = flashattn.flash_attn_func(q, k[:, 130:], v[:, 130:], return_attn_probs=True)
    out, lse = flashattn.merge_attn_states(torch.stack([o1, o2]), torch.stack([l1, l2]))
    assert out.dtype == q.dtype and out.shape == q.shape and lse.shape == (2, 8, 77)
    ref, ref_lse = reference(q, k, v)
    low, _ = reference(q, k, v, upcast=False)
    # one more bf16 rounding than a single call: each part's output is rounded before the merge
    assert (out.float() - ref).abs().max() <= 2 * (low.float() - ref).abs().max() + 4e-3
    assert (lse - ref_lse).abs().max() < 2e-3
    # FlashInfer's base-2 LSE, fp32 partials (FlashAttention-3's combine input), a varlen layout
    out2, lse2 = flashattn.merge_attn_states(torch.stack([o1, o2]).float(), torch.stack([l1, l2]) * math.log2(math.e),
                                             lse_base2=True)
    assert out2.dtype == torch.float32
    assert (lse2 / math.log2(math.e) - lse).abs().max() < 1e-5
    assert (out2 - out.float()).abs().max() < 4e-3
    packed = torch.stack([o1, o2]).reshape(2, 2 * 77, 8, 128)
    packed_lse = torch.stack([l1, l2]).permute(0, 2, 1, 3).reshape(2, 8, 2 * 77)
    out3, lse3 = flashattn.merge_attn_states(packed, packed_lse)
    assert torch.equal(out3.reshape(2, 77, 8, 128), out)
    assert torch.equal(lse3.reshape(8, 2, 77).permute(1, 0, 2), lse)


def test_merge_treats_infinite_lse_as_an_empty_part():
    o = rand(3, 1, 5, 2, 64)
    lse = torch.randn(3, 1, 2, 5, device="cuda")
    lse[1] = float("inf")        # FlashAttention-2's empty rows
    lse[2, :, :, 0] = float("-inf")
    out, merged = flashattn.merge_attn_states(o, lse)
    only_first_two = torch.stack([o[0], o[2]])
    lse_two = torch.stack([lse[0], lse[2]])
    out_two, merged_two = flashattn.merge_attn_states(only_first_two, lse_two)
    assert torch.equal(out, out_two) and torch.equal(merged, merged_two)
    empty, empty_lse = flashattn.merge_attn_states(o[:1], torch.full_like(lse[:1], float("-inf")))
    assert torch.equal(empty, torch.zeros_like(empty)) and torch.isneginf(empty_lse).all()


# ---- serving calls: flash_attn_varlen_func and flash_attn_with_kvcache ----------------------------------

def check_sequence(out, lse, q, k, v, causal, **kw):
    """One sequence's rows of a serving call against fp32 attention on that sequence alone."""
    ref, ref_lse = reference(q[None], k[None], v[None], causal=causal, **kw)
    low, _ = reference(q[None], k[None], v[None], causal=causal, upcast=False, **kw)
    err = (out.float() - ref[0]).abs().max().item() if out.numel() else 0.0
    err_low = (low.float() - ref).abs().max().item() if out.numel() else 0.0
    assert not torch.isnan(out).any()
    assert err <= 2 * err_low + 1e-5, (err, err_low)
    finite = torch.isfinite(ref_lse[0])
    assert torch.equal(finite, torch.isfinite(lse))
    if finite.any():
        assert (lse[finite] - ref_lse[0][finite]).abs().max().item() < 2e-3


def page_pool(ks, vs, page, extra_pages=3, fill=None):
    """Page pools and a block table holding the sequences ks/vs ([S_b, Hkv, D] each), pages shuffled;
    the rows no sequence holds random, or `fill`."""
    Hkv, D = ks[0].shape[1], ks[0].shape[2]
    width = max(1, max(-(-k.shape[0] // page) for k in ks))
    n = len(ks) * width + extra_pages
    perm = torch.randperm(n, device="cuda").to(torch.int32)
    table = perm[: len(ks) * width].reshape(len(ks), width).contiguous()
    if fill is None:
        kp = torch.randn(n, page, Hkv, D, device="cuda", dtype=ks[0].dtype)
        vp = torch.randn(n, page, Hkv, D, device="cuda", dtype=ks[0].dtype)
    else:
        kp = torch.full((n, page, Hkv, D), fill, device="cuda", dtype=ks[0].dtype)
        vp = torch.full((n, page, Hkv, D), fill, device="cuda", dtype=ks[0].dtype)
    for b, (k, v) in enumerate(zip(ks, vs)):
        for j0 in range(0, k.shape[0], page):
            pg = table[b, j0 // page].item()
            m = min(page, k.shape[0] - j0)
            kp[pg, :m], vp[pg, :m] = k[j0:j0 + m], v[j0:j0 + m]
    return kp, vp, table


@pytest.mark.parametrize("page", [None, 1, 16, 19])
@pytest.mark.parametrize("causal", [False, True])
def test_varlen_matches_per_sequence_attention(page, causal):
    lens_q, lens_k = [37, 0, 1, 129, 5], [300, 50, 1, 129, 0]
    Hq, Hkv, D = 8, 2, 64
    qs = [rand(n, Hq, D) for n in lens_q]
    ks, vs = [rand(n, Hkv, D) for n in lens_k], [rand(n, Hkv, D) for n in lens_k]
    cu = lambda lens: torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), dtype=torch.int32, device="cuda")
    q = torch.cat(qs)
    kw = {}
    if page is None:
        k, v = torch.cat(ks), torch.cat(vs)
    else:
        k, v, kw["block_table"] = page_pool(ks, vs, page)
    out, lse, _ = flashattn.flash_attn_varlen_func(q, k, v, cu(lens_q), cu(lens_k), max(lens_q), max(lens_k),
                                                   causal=causal, return_attn_probs=True, **kw)
    assert out.shape == q.shape and lse.shape == (Hq, q.shape[0])
    o0 = 0
    for b in range(len(lens_q)):
        n = lens_q[b]
        check_sequence(out[o0:o0 + n], lse[:, o0:o0 + n], qs[b], ks[b], vs[b], causal)
        o0 += n


def test_varlen_seqused_k_overrides_the_counts():
    Hq, Hkv, D = 4, 4, 128
    lens_q, cap_k, used = [3, 9], 200, [150, 7]
    q = rand(sum(lens_q), Hq, D)
    k, v = rand(2 * cap_k, Hkv, D), rand(2 * cap_k, Hkv, D)
    cu_q = torch.tensor([0, 3, 12], dtype=torch.int32, device="cuda")
    cu_k = torch.tensor([0, cap_k, 2 * cap_k], dtype=torch.int32, device="cuda")
    su = torch.tensor(used, dtype=torch.int32, device="cuda")
    out, lse, _ = flashattn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 9, cap_k, causal=True, seqused_k=su,
                                                   return_attn_probs=True)
    check_sequence(out[:3], lse[:, :3], q[:3], k[:150], v[:150], True)
    check_sequence(out[3:], lse[:, 3:], q[3:], k[cap_k:cap_k + 7], v[cap_k:cap_k + 7], True)


@pytest.mark.parametrize("d", [64, 59])
def test_packed_forms_read_q_k_v_in_place(d):
    """FlashAttention-2's qkvpacked/kvpacked forms (dense and varlen) against the unpacked calls on
    copies of the same data (the same kernels, so the same bits) and against fp32 attention."""
    B, S, H, Hkv = 2, 77, 4, 2
    qkv = rand(B, S, 3, H, d)
    q, k, v = (qkv[:, :, i].contiguous() for i in range(3))
    out, lse, _ = flashattn.flash_attn_qkvpacked_func(qkv, causal=True, return_attn_probs=True)
    want, want_lse, _ = flashattn.flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    assert torch.equal(out, want) and torch.equal(lse, want_lse)
    check(q, k, v, causal=True)

    kv = rand(B, 130, 2, Hkv, d)
    out = flashattn.flash_attn_kvpacked_func(q, kv, window_size=(40, 3))
    assert torch.equal(out, flashattn.flash_attn_func(q, kv[:, :, 0].contiguous(), kv[:, :, 1].contiguous(),
                                                      window_size=(40, 3)))

    lens = [5, 0, 61, 11]
    cu = torch.tensor([0, 5, 5, 66, 77], dtype=torch.int32, device="cuda")
    packed = rand(sum(lens), 3, H, d)
    out, lse, _ = flashattn.flash_attn_varlen_qkvpacked_func(packed, cu, max(lens), causal=True, return_attn_probs=True)
    qv, kvv, vv = (packed[:, i].contiguous() for i in range(3))
    want, want_lse, _ = flashattn.flash_attn_varlen_func(qv, kvv, vv, cu, cu, max(lens), max(lens), causal=True,
                                                         return_attn_probs=True)
    assert torch.equal(out, want) and torch.equal(lse, want_lse)

    kvp = rand(sum(lens), 2, Hkv, d)
    qh = rand(sum(lens), H, d)
    out = flashattn.flash_attn_varlen_kvpacked_func(qh, kvp, cu, cu, max(lens), max(lens), softcap=5.0)
    want = flashattn.flash_attn_varlen_func(qh, kvp[:, 0].contiguous(), kvp[:, 1].contiguous(), cu, cu, max(lens),
                                            max(lens), softcap=5.0)
    assert torch.equal(out, want)


def test_window_as_a_tensor_and_changed_in_place():
    """FlashAttention-2 takes any indexable pair as window_size (its tests pass a tensor of two). A
    call remembers the window's values, not the object: a tensor changed in place between calls
    gives the new window."""
    q, k, v = rand(2, 150, 4, 64), rand(2, 170, 2, 64), rand(2, 170, 2, 64)
    w = torch.tensor([40, 3])
    assert torch.equal(flashattn.flash_attn_func(q, k, v, window_size=w),
                       flashattn.flash_attn_func(q, k, v, window_size=(40, 3)))
    w[0] = 7
    assert torch.equal(flashattn.flash_attn_func(q, k, v, window_size=w),
                       flashattn.flash_attn_func(q, k, v, window_size=(7, 3)))
    check(q, k, v, window_size=w)
    cu = torch.tensor([0, 70, 150], dtype=torch.int32, device="cuda")
    cuk = torch.tensor([0, 90, 170], dtype=torch.int32, device="cuda")
    qv, kv_, vv = q.reshape(-1, 4, 64)[:150], k.reshape(-1, 2, 64)[:170], v.reshape(-1, 2, 64)[:170]
    a = flashattn.flash_attn_varlen_func(qv, kv_, vv, cu, cuk, 80, 90, window_size=w)
    w[1] = 0
    b = flashattn.flash_attn_varlen_func(qv, kv_, vv, cu, cuk, 80, 90, window_size=w)
    assert torch.equal(b, flashattn.flash_attn_varlen_func(qv, kv_, vv, cu, cuk, 80, 90, window_size=[7, 0]))
    assert not torch.equal(a, b)
    with pytest.raises(ValueError, match="window_size"):
        flashattn.flash_attn_func(q, k, v, window_size=(1, 2, 3))


def test_explicit_stream_with_a_padded_head_dim():
    """stream= on a stream other than the current one, where the head dim is padded (59 -> 64): the
    padded copies, the output and the copy back are made on that stream, in order with the kernel."""
    q, k, v = rand(2, 300, 4, 59), rand(2, 400, 2, 59), rand(2, 400, 2, 59)
    want = flashattn.flash_attn_func(q, k, v, causal=True)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    for _ in range(3):
        out = torch.full_like(q, float("nan"))
        got = flashattn.flash_attn_func(q, k, v, causal=True, stream=s.cuda_stream)
        got2 = flashattn.flash_attn_func(q, k, v, causal=True, out=out, stream=s.cuda_stream)
        s.synchronize()
        assert torch.equal(got, want) and torch.equal(got2, want) and got2 is out


def test_kvcache_append_with_a_padded_head_dim_writes_the_caches():
    """Head dim 59: the call works on padded copies of the caches and must write them back (as
    FlashAttention-2 does): the appended rows land in the caller's caches, every other row keeps
    its bits, and the attention saw the appended keys."""
    B, S, Hq, Hkv, d, n_new = 2, 64, 4, 2, 59, 3
    lens = [5, 40]
    kc, vc = rand(B, S, Hkv, d), rand(B, S, Hkv, d)
    k0, v0 = kc.clone(), vc.clone()
    kn, vn, q = rand(B, n_new, Hkv, d), rand(B, n_new, Hkv, d), rand(B, n_new, Hq, d)
    seqlens = torch.tensor(lens, dtype=torch.int32, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    out, lse = flashattn.flash_attn_with_kvcache(q, kc, vc, kn, vn, cache_seqlens=seqlens, causal=True,
                                                 return_softmax_lse=True, stream=s.cuda_stream)
    s.synchronize()
    for b, n in enumerate(lens):
        assert torch.equal(kc[b, n:n + n_new], kn[b]) and torch.equal(vc[b, n:n + n_new], vn[b])
        for cache, before in ((kc, k0), (vc, v0)):
            assert torch.equal(cache[b, :n], before[b, :n]) and torch.equal(cache[b, n + n_new:], before[b, n + n_new:])
        check_sequence(out[b], lse[b], q[b], kc[b, :n + n_new], vc[b, :n + n_new], True)


def test_recorded_calls_get_a_backward_that_raises():
    """FlashAttention-2's functions are differentiable; these compute the forward pass only. A call
    autograd records returns the values an unrecorded one does, with an autograd node whose backward
    raises (no gradient is silently lost) and an LSE that is not differentiable; out= is refused
    there; calls under no_grad or inference_mode have no node."""
    q, k, v = rand(2, 97, 4, 64), rand(2, 130, 2, 64), rand(2, 130, 2, 64)
    want, want_lse, _ = flashattn.flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    assert not want.requires_grad
    qg = q.clone().requires_grad_()
    out, lse, probs = flashattn.flash_attn_func(qg, k, v, causal=True, return_attn_probs=True)
    assert probs.shape == (0,) and probs.dtype == q.dtype and not probs.requires_grad
    assert torch.equal(out, want) and torch.equal(lse, want_lse)
    assert out.requires_grad and out.grad_fn is not None and not lse.requires_grad
    with pytest.raises(NotImplementedError, match="flash_attn_func: libflashattn computes the forward pass only"):
        out.float().sum().backward()
    assert qg.grad is None
    vg = v.clone().requires_grad_()
    out = flashattn.flash_attn_func(q, k, vg, causal=True)  # v alone requires grad; the plain return
    assert torch.equal(out, want) and out.requires_grad
    with pytest.raises(NotImplementedError):
        (out.float() * 2).sum().backward()
    qkv = rand(2, 50, 3, 4, 64).requires_grad_()
    out = flashattn.flash_attn_qkvpacked_func(qkv, causal=True)
    with torch.no_grad():
        assert torch.equal(out, flashattn.flash_attn_qkvpacked_func(qkv, causal=True))
    assert out.requires_grad
    with pytest.raises(NotImplementedError):
        out.sum().backward()
    with pytest.raises(ValueError, match="out="):
        flashattn.flash_attn_func(qg, k, v, out=torch.empty_like(q))
    with torch.no_grad():
        out = flashattn.flash_attn_func(qg, k, v, causal=True)
    assert not out.requires_grad and torch.equal(out, want)
    with torch.inference_mode():
        out = flashattn.flash_attn_func(qg, k, v, causal=True)
    assert not out.requires_grad and torch.equal(out, want)

    cu = torch.tensor([0, 5, 5, 66], dtype=torch.int32, device="cuda")
    qv, kv_, vv = rand(66, 4, 64), rand(66, 2, 64), rand(66, 2, 64)
    want, want_lse, _ = flashattn.flash_attn_varlen_func(qv, kv_, vv, cu, cu, 61, 61, causal=True,
                                                         return_attn_probs=True)
    kg = kv_.clone().requires_grad_()
    out, lse, _ = flashattn.flash_attn_varlen_func(qv, kg, vv, cu, cu, 61, 61, causal=True, return_attn_probs=True)
    assert torch.equal(out, want) and torch.equal(lse, want_lse)
    assert out.requires_grad and not lse.requires_grad
    with pytest.raises(NotImplementedError, match="flash_attn_varlen_func"):
        out.float().sum().backward()
    with torch.no_grad():
        out = flashattn.flash_attn_varlen_func(qv, kg, vv, cu, cu, 61, 61, causal=True)
    assert not out.requires_grad and torch.equal(out, want)


@pytest.mark.parametrize("layout", ["dense", "indexed", "paged"])
def test_kvcache_decode(layout):
    B, Hq, Hkv, D, cap = 4, 8, 2, 128, 600
    lens = [600, 1, 0, 333]
    q = rand(B, 1, Hq, D)
    ks, vs = [rand(n, Hkv, D) for n in lens], [rand(n, Hkv, D) for n in lens]
    seqlens = torch.tensor(lens, dtype=torch.int32, device="cuda")
    kw = {}
    if layout == "paged":
        kc, vc, kw["block_table"] = page_pool(ks, vs, 16)
    else:
        rows = list(range(B)) if layout == "dense" else [5, 0, 2, 3]
        kc, vc = rand(max(rows) + 1, cap, Hkv, D), rand(max(rows) + 1, cap, Hkv, D)
        for b, r in enumerate(rows):
            kc[r, :lens[b]], vc[r, :lens[b]] = ks[b], vs[b]
        if layout == "indexed":
            kw["cache_batch_idx"] = torch.tensor(rows, dtype=torch.int32, device="cuda")
    out, lse = flashattn.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=seqlens, causal=True,
                                                 return_softmax_lse=True, **kw)
    assert out.shape == q.shape and lse.shape == (B, Hq, 1)
    for b in range(B):
        check_sequence(out[b], lse[b], q[b], ks[b], vs[b], True)


@pytest.mark.parametrize("layout", ["dense", "paged16", "paged19", "varlen"])
@pytest.mark.parametrize("d", [64, 128])
def test_rows_past_the_lengths_are_never_read_as_keys(layout, d):
    """Cache memory past each sequence's length (rows up to the capacity, a last page's rows past its
    last key, packed rows past seqused_k) may hold anything, NaN included: FlashAttention-2 treats
    those keys as absent, and so must every path here (decode, split over the keys, and prefill)."""
    Hq, Hkv, cap = 8, 2, 4096
    lens_k, nan = [3001, 100, 1500, 129], float("nan")
    B = len(lens_k)
    ks, vs = [rand(n, Hkv, d) for n in lens_k], [rand(n, Hkv, d) for n in lens_k]
    seqlens = torch.tensor(lens_k, dtype=torch.int32, device="cuda")
    if layout == "varlen":
        lens_q = [37, 1, 129, 5]
        qs = [rand(n, Hq, d) for n in lens_q]
        k = torch.full((B * cap, Hkv, d), nan, device="cuda", dtype=torch.bfloat16)
        v = torch.full_like(k, nan)
        for b in range(B):
            k[b * cap:b * cap + lens_k[b]], v[b * cap:b * cap + lens_k[b]] = ks[b], vs[b]
        cu = lambda lens: torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), dtype=torch.int32, device="cuda")
        out, lse, _ = flashattn.flash_attn_varlen_func(torch.cat(qs), k, v, cu(lens_q), cu([cap] * B), max(lens_q),
                                                       cap, causal=True, seqused_k=seqlens, return_attn_probs=True)
        o0 = 0
        for b in range(B):
            n = lens_q[b]
            check_sequence(out[o0:o0 + n], lse[:, o0:o0 + n], qs[b], ks[b], vs[b], True)
            o0 += n
        return
    q = rand(B, 1, Hq, d)
    kw = {}
    if layout.startswith("paged"):
        kc, vc, kw["block_table"] = page_pool(ks, vs, int(layout[5:]), fill=nan)
    else:
        kc = torch.full((B, cap, Hkv, d), nan, device="cuda", dtype=torch.bfloat16)
        vc = torch.full_like(kc, nan)
        for b in range(B):
            kc[b, :lens_k[b]], vc[b, :lens_k[b]] = ks[b], vs[b]
    out, lse = flashattn.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=seqlens, return_softmax_lse=True, **kw)
    for b in range(B):
        check_sequence(out[b], lse[b], q[b], ks[b], vs[b], False)


def test_kvcache_int_seqlens():
    q, kc, vc = rand(2, 2, 4, 64), rand(2, 100, 4, 64), rand(2, 100, 4, 64)
    out = flashattn.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=40, causal=True)
    for b in range(2):
        ref, _ = reference(q[b:b + 1], kc[b:b + 1, :40], vc[b:b + 1, :40], causal=True)
        assert (out[b].float() - ref[0]).abs().max().item() < 3e-2


@pytest.mark.parametrize("interleaved", [True, False])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("paged", [False, True])
def test_kvcache_append_with_rotary(interleaved, causal, paged):
    B, Sq, Hq, Hkv, D, cap, rd = 3, 2, 8, 2, 128, 300, 64
    lens = [10, 0, 250]
    q, k_new, v_new = rand(B, Sq, Hq, D), rand(B, Sq, Hkv, D), rand(B, Sq, Hkv, D)
    ks, vs = [rand(cap, Hkv, D) for _ in range(B)], [rand(cap, Hkv, D) for _ in range(B)]
    cos, sin = rotary_tables(cap + 8, rd, q.dtype)
    seqlens = torch.tensor(lens, dtype=torch.int32, device="cuda")
    kw = {}
    if paged:
        kc, vc, kw["block_table"] = page_pool(ks, vs, 16)
    else:
        kc, vc = torch.stack(ks), torch.stack(vs)
    out, lse = flashattn.flash_attn_with_kvcache(q, kc, vc, k=k_new, v=v_new, rotary_cos=cos, rotary_sin=sin,
                                                 cache_seqlens=seqlens, causal=causal, rotary_interleaved=interleaved,
                                                 return_softmax_lse=True, **kw)
    for b in range(B):
        L = lens[b]
        kr = apply_rotary(k_new[b], cos, sin, torch.arange(L, L + Sq, device="cuda"), interleaved)
        qpos = torch.arange(L, L + Sq, device="cuda") if causal else torch.full((Sq,), L, device="cuda")
        qr = apply_rotary(q[b], cos, sin, qpos, interleaved)
        k_all = torch.cat([ks[b][:L], kr]) if not paged else None
        # The cache itself now holds the rotated keys and the values at positions L .. L + Sq - 1.
        if paged:
            table = kw["block_table"]
            rows = [(table[b, j // 16].item(), j % 16) for j in range(L + Sq)]
            got_k = torch.stack([kc[p_, r_] for p_, r_ in rows])
            got_v = torch.stack([vc[p_, r_] for p_, r_ in rows])
        else:
            got_k, got_v = kc[b, :L + Sq], vc[b, :L + Sq]
        assert torch.allclose(got_k[L:].float(), kr.float(), rtol=2 ** -7, atol=1e-5)  # one rounding apart at most
        assert torch.equal(got_v[L:], v_new[b])
        if k_all is not None:
            assert torch.equal(got_k[:L], k_all[:L])
        check_sequence(out[b], lse[b], qr, got_k, got_v, causal)


@pytest.mark.parametrize("window,rowwise", [((-5, -3), False), ((-2, -7), False), ((300, 307), True),
                                            ((-4, 300), True)])
def test_kvcache_rotary_q_positions_with_windows_that_bound_nothing(window, rowwise):
    # FlashAttention-2's documented rule: causal or local (window_size != (-1, -1)) rotates query row i
    # at cache_seqlens + i, else every row at cache_seqlens; negative sides are -1 (no window). None of
    # these windows excludes a key (three queries, right sides of 300 or unbounded).
    B, Sq, Hq, Hkv, D, cap, rd = 2, 3, 8, 2, 128, 300, 128
    lens = [17, 280]
    q, k_new, v_new = rand(B, Sq, Hq, D), rand(B, Sq, Hkv, D), rand(B, Sq, Hkv, D)
    kc, vc = rand(B, cap, Hkv, D), rand(B, cap, Hkv, D)
    cos, sin = rotary_tables(cap, rd, q.dtype)
    seqlens = torch.tensor(lens, dtype=torch.int32, device="cuda")
    out, lse = flashattn.flash_attn_with_kvcache(q, kc, vc, k=k_new, v=v_new, rotary_cos=cos, rotary_sin=sin,
                                                 cache_seqlens=seqlens, window_size=window, return_softmax_lse=True)
    for b in range(B):
        L = lens[b]
        qpos = torch.arange(L, L + Sq, device="cuda") if rowwise else torch.full((Sq,), L, device="cuda")
        qr = apply_rotary(q[b], cos, sin, qpos, True)
        check_sequence(out[b], lse[b], qr, kc[b, :L + Sq], vc[b, :L + Sq], False)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("indexed", [False, True])
def test_kvcache_leftpad_skips_the_padding_rows(causal, indexed):
    # FlashAttention-2's cache_leftpad: sequence b attends to cache rows cache_leftpad[b] ..
    # cache_seqlens[b] + seqlen_new - 1; the append and the rotary positions still count from row 0.
    B, Sq, Hq, Hkv, D, cap, rd = 3, 2, 8, 2, 128, 300, 64
    lens, pads = [40, 5, 250], [7, 5, 0]  # the second: nothing but padding before its new keys
    q, k_new, v_new = rand(B, Sq, Hq, D), rand(B, Sq, Hkv, D), rand(B, Sq, Hkv, D)
    ks, vs = [rand(cap, Hkv, D) for _ in range(B)], [rand(cap, Hkv, D) for _ in range(B)]
    cos, sin = rotary_tables(cap + 8, rd, q.dtype)
    kw = {}
    rows = list(range(B))
    if indexed:
        rows = [2, 0, 3]
        kc, vc = rand(4, cap, Hkv, D), rand(4, cap, Hkv, D)
        for b, r in enumerate(rows):
            kc[r], vc[r] = ks[b], vs[b]
        kw["cache_batch_idx"] = torch.tensor(rows, dtype=torch.int32, device="cuda")
    else:
        kc, vc = torch.stack(ks), torch.stack(vs)
    out, lse = flashattn.flash_attn_with_kvcache(
        q, kc, vc, k=k_new, v=v_new, rotary_cos=cos, rotary_sin=sin,
        cache_seqlens=torch.tensor(lens, dtype=torch.int32, device="cuda"),
        cache_leftpad=torch.tensor(pads, dtype=torch.int32, device="cuda"), causal=causal,
        rotary_interleaved=False, return_softmax_lse=True, **kw)
    for b in range(B):
        L, P, r = lens[b], pads[b], rows[b]
        kr = apply_rotary(k_new[b], cos, sin, torch.arange(L, L + Sq, device="cuda"), False)
        qpos = torch.arange(L, L + Sq, device="cuda") if causal else torch.full((Sq,), L, device="cuda")
        qr = apply_rotary(q[b], cos, sin, qpos, False)
        assert torch.allclose(kc[r, L:L + Sq].float(), kr.float(), rtol=2 ** -7, atol=1e-5)
        assert torch.equal(vc[r, L:L + Sq], v_new[b])
        assert torch.equal(kc[r, :L], ks[b][:L])  # the padding and the old keys are untouched
        check_sequence(out[b], lse[b], qr, torch.cat([ks[b][P:L], kc[r, L:L + Sq]]),
                       torch.cat([vs[b][P:L], v_new[b]]), causal)


def test_serving_calls_reuse_their_structure_across_new_tensors():
    """The serving functions' per-structure cache: calls with new tensors (new data and addresses)
    of one structure give what the general path (taken with an explicit stream=) gives, bit for bit:
    varlen over pages, and with_kvcache with an int cache_seqlens and an append into the cache."""
    Hq, Hkv, D, page = 8, 2, 128, 16
    cur = lambda: torch.cuda.current_stream().cuda_stream
    lens_q, lens_k = [1, 0, 1, 1], [700, 5, 0, 130]
    cu = lambda lens: torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), dtype=torch.int32, device="cuda")
    for _ in range(3):
        ks, vs = [rand(n, Hkv, D) for n in lens_k], [rand(n, Hkv, D) for n in lens_k]
        kp, vp, table = page_pool(ks, vs, page)
        q = rand(sum(lens_q), Hq, D)
        args = (q, kp, vp, cu(lens_q), cu(lens_k), 1, max(lens_k))
        fast, lse, _ = flashattn.flash_attn_varlen_func(*args, causal=True, block_table=table, return_attn_probs=True)
        slow, slow_lse, _ = flashattn.flash_attn_varlen_func(*args, causal=True, block_table=table,
                                                             return_attn_probs=True, stream=cur())
        assert fast.shape == (3, Hq, D)  # every row belongs to a sequence with a query
        assert torch.equal(fast, slow) and torch.equal(lse, slow_lse)
    B, cap = 3, 300
    for step in range(3):
        kc, vc = rand(B, cap, Hkv, D), rand(B, cap, Hkv, D)
        kc2, vc2 = kc.clone(), vc.clone()
        q, kn, vn = rand(B, 1, Hq, D), rand(B, 1, Hkv, D), rand(B, 1, Hkv, D)
        fast = flashattn.flash_attn_with_kvcache(q, kc, vc, k=kn, v=vn, cache_seqlens=100 + step, causal=True)
        slow = flashattn.flash_attn_with_kvcache(q, kc2, vc2, k=kn, v=vn, cache_seqlens=100 + step, causal=True,
                                                 stream=cur())
        assert torch.equal(fast, slow) and torch.equal(kc, kc2) and torch.equal(vc, vc2)
        assert torch.equal(kc[:, 100 + step], kn[:, 0])


def test_cached_serving_calls_keep_no_caller_tensor_alive():
    """A server that drops its KV cache gets the memory back: the per-structure cache holds no
    reference to a caller's tensor (only the int cache_seqlens' tensor it made)."""
    import gc
    import weakref
    kc, vc, q = rand(2, 130, 2, 64), rand(2, 130, 2, 64), rand(2, 1, 8, 64)
    for _ in range(2):  # a miss, then a hit
        out = flashattn.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=100)
    ref, _ = reference(q, kc[:, :100], vc[:, :100])
    low, _ = reference(q, kc[:, :100], vc[:, :100], upcast=False)
    assert (out.float() - ref).abs().max() <= 2 * (low.float() - ref).abs().max() + 1e-5
    refs = [weakref.ref(t) for t in (kc, vc, q)]
    del kc, vc, q, out, ref, low
    gc.collect()
    assert all(r() is None for r in refs)


def test_kvcache_call_first_seen_inside_a_capture():
    """A serving call whose structure is first seen while capturing is not kept for later calls
    (its int cache_seqlens tensor is filled only when the graph replays); eager calls after it
    build their own, and both agree with attention over the first 77 keys."""
    B, cap, Hq, Hkv, D = 2, 263, 8, 2, 64
    kc, vc, q = rand(B, cap, Hkv, D), rand(B, cap, Hkv, D), rand(B, 1, Hq, D)
    flashattn.get_handle(0)  # the device's handle (cuBLAS inside) is created outside any capture
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = flashattn.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=77)
    g.replay()
    torch.cuda.synchronize()
    eager = flashattn.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=77)
    assert torch.equal(out, eager)
    check(q, kc[:, :77], vc[:, :77])


def test_serving_metadata_must_be_int32_on_the_device():
    q, k, v = rand(10, 4, 64), rand(10, 4, 64), rand(10, 4, 64)
    cu64 = torch.tensor([0, 10], dtype=torch.int64, device="cuda")
    cu32 = cu64.to(torch.int32)
    with pytest.raises(TypeError, match="cu_seqlens_q must be an int32 CUDA tensor"):
        flashattn.flash_attn_varlen_func(q, k, v, cu64, cu32, 10, 10)
    with pytest.raises(TypeError, match="cu_seqlens_k must be an int32 CUDA tensor"):
        flashattn.flash_attn_varlen_func(q, k, v, cu32, cu32.cpu(), 10, 10)


def test_varlen_is_capturable_in_a_cuda_graph():
    Hq, D, cap = 4, 64, 128
    q, k, v = rand(2 * cap, Hq, D), rand(2 * cap, Hq, D), rand(2 * cap, Hq, D)
    cu_q = torch.tensor([0, 50, 60], dtype=torch.int32, device="cuda")
    cu_k = torch.tensor([0, 100, 228], dtype=torch.int32, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        flashattn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, cap, cap, causal=True)  # warm-up
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = flashattn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, cap, cap, causal=True)
    for lens_q, lens_k in (([50, 10], [100, 128]), ([128, 3], [1, 127])):
        cu_q.copy_(torch.tensor([0, lens_q[0], sum(lens_q)], dtype=torch.int32))
        cu_k.copy_(torch.tensor([0, lens_k[0], sum(lens_k)], dtype=torch.int32))
        q.normal_(), k.normal_(), v.normal_()
        g.replay()
        torch.cuda.synchronize()
        for b in range(2):
            q0, k0 = sum(lens_q[:b]), sum(lens_k[:b])
            ref, _ = reference(q[None, q0:q0 + lens_q[b]], k[None, k0:k0 + lens_k[b]], v[None, k0:k0 + lens_k[b]],
                               causal=True)
            assert (out[q0:q0 + lens_q[b]].float() - ref[0]).abs().max().item() < 3e-2
