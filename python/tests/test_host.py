"""Host-only tests of the Python package: loading, version check, ABI layout, errors, and behaviour
without a GPU. They need libflashattn.so (FLASHATTN_LIBRARY) but no GPU."""
import ctypes
import inspect
import os
import re
import subprocess
import sys

import pytest

import flashattn
from flashattn import _lib


def has_gpu():
    try:
        flashattn.Handle(0).close()
        return True
    except flashattn.FlashAttnError as e:
        assert e.name == "FLASHATTN_STATUS_NO_DEVICE"
        return False


def _header_version():
    header = os.path.join(os.path.dirname(__file__), "..", "..", "include", "flashattn.h")
    text = open(header).read()
    return tuple(int(re.search(rf"#define FLASHATTN_VERSION_{p} (\d+)", text).group(1)) for p in ("MAJOR", "MINOR", "PATCH"))


def test_library_loads_and_versions_match_the_header():
    lib = flashattn.load_library()
    major, minor, patch = _header_version()
    assert flashattn.__version__ == f"{major}.{minor}.{patch}"
    assert flashattn.library_version() == flashattn.__version__
    assert lib.flashattn_version() == major * 10000 + minor * 100 + patch
    assert "fused=" in flashattn.build_info()


# Every field's (offset, size) in the C header (frozen by tests/test_host.cpp, which compiles it).
FWD_PARAMS_0_1 = {
    "struct_size": (0, 8), "dtype": (8, 4), "mask": (12, 4), "backend": (16, 4), "reserved0": (20, 4),
    "batch": (24, 8), "seqlen_q": (32, 8), "seqlen_k": (40, 8), "heads_q": (48, 8), "heads_kv": (56, 8),
    "head_dim": (64, 8), "q": (72, 8), "q_batch_stride": (80, 8), "q_seq_stride": (88, 8),
    "q_head_stride": (96, 8), "k": (104, 8), "k_batch_stride": (112, 8), "k_seq_stride": (120, 8),
    "k_head_stride": (128, 8), "v": (136, 8), "v_batch_stride": (144, 8), "v_seq_stride": (152, 8),
    "v_head_stride": (160, 8), "o": (168, 8), "o_batch_stride": (176, 8), "o_seq_stride": (184, 8),
    "o_head_stride": (192, 8), "lse": (200, 8), "softmax_scale": (208, 4), "softcap": (212, 4),
    "window_left": (216, 8), "window_right": (224, 8), "alibi_slopes": (232, 8), "alibi_batch_stride": (240, 8),
}
FWD_PARAMS_0_3 = dict(FWD_PARAMS_0_1, **{
    "cu_seqlens_q": (248, 8), "cu_seqlens_k": (256, 8), "seqused_k": (264, 8), "total_q": (272, 8),
    "total_k": (280, 8), "block_table": (288, 8), "block_table_batch_stride": (296, 8), "pages_per_seq": (304, 8),
    "page_size": (312, 8), "num_pages": (320, 8), "kv_batch_idx": (328, 8), "kv_batch": (336, 8),
    "k_new": (344, 8), "k_new_batch_stride": (352, 8), "k_new_seq_stride": (360, 8), "k_new_head_stride": (368, 8),
    "v_new": (376, 8), "v_new_batch_stride": (384, 8), "v_new_seq_stride": (392, 8), "v_new_head_stride": (400, 8),
    "seqlen_new": (408, 8), "rotary_cos": (416, 8), "rotary_sin": (424, 8), "rotary_dim": (432, 8),
    "seqlen_ro": (440, 8), "rotary_interleaved": (448, 4), "rotary_q_at_cache_len": (452, 4),
    "reserved1": (456, 4), "kv_indptr": (464, 8), "kv_last_page_len": (472, 8), "num_page_indices": (480, 8),
})
FWD_PARAMS_0_4 = dict(FWD_PARAMS_0_3, **{"cache_leftpad": (488, 8)})
PLAN_INFO_0_1 = {
    "struct_size": (0, 8), "backend": (8, 4), "block_m": (12, 4), "block_n": (16, 4), "num_warps": (20, 4),
    "grid_x": (24, 4), "grid_y": (28, 4), "grid_z": (32, 4), "num_splits": (36, 4), "kernel_head_dim": (40, 4),
    "workspace_bytes": (48, 8), "shared_mem_bytes": (56, 8), "kernel_name": (64, 64), "description": (128, 192),
}


@pytest.mark.parametrize("cls,frozen,size", [(flashattn.FwdParams, FWD_PARAMS_0_1, 248),
                                             (flashattn.FwdParams, FWD_PARAMS_0_3, 488),
                                             (flashattn.FwdParams, FWD_PARAMS_0_4, 496),
                                             (flashattn.PlanInfo, PLAN_INFO_0_1, 320)])
def test_every_field_matches_the_c_layout(cls, frozen, size):
    fields = [name for name, _ in cls._fields_]
    assert fields[:len(frozen)] == list(frozen)  # the 0.1.0 fields, in order; new ones only after them
    for name, (offset, nbytes) in frozen.items():
        f = getattr(cls, name)
        assert (f.offset, f.size) == (offset, nbytes), name
    assert ctypes.sizeof(cls) >= size


def test_params_defaults_come_from_the_library():
    p = flashattn.FwdParams.new()
    assert p.struct_size == ctypes.sizeof(flashattn.FwdParams)
    assert (p.window_left, p.window_right) == (-1, -1)
    assert p.backend == flashattn.Backend.AUTO


def test_status_constants_match_library_names():
    lib = flashattn.load_library()
    for name, value in vars(flashattn.Status).items():
        if name.isupper():
            assert lib.flashattn_status_name(value).decode() == "FLASHATTN_STATUS_" + name


def test_handle_without_gpu_raises_no_device():
    if has_gpu():
        pytest.skip("a GPU is present: NO_DEVICE cannot be provoked")
    with pytest.raises(flashattn.FlashAttnError) as e:
        flashattn.Handle(0)
    assert e.value.name == "FLASHATTN_STATUS_NO_DEVICE"
    assert e.value.status == flashattn.Status.NO_DEVICE
    assert "device" in str(e.value)


def test_handle_with_bad_ordinal_raises():
    with pytest.raises(flashattn.FlashAttnError) as e:
        flashattn.Handle(4096)
    assert e.value.name == "FLASHATTN_STATUS_NO_DEVICE"


def test_dropout_is_refused_by_name():
    with pytest.raises(ValueError, match="dropout_p"):
        flashattn.flash_attn_func(None, None, None, dropout_p=0.1)


def test_non_cuda_inputs_are_refused():
    with pytest.raises(TypeError, match="q: list is not a CUDA array"):
        flashattn.flash_attn_func([1.0], [1.0], [1.0])


def test_refused_arguments_are_runtime_errors_too_as_flashattention2s_are():
    # FlashAttention-2 reports bad arguments from its C++ checks as RuntimeError; ours are
    # ValueError or TypeError and RuntimeError at once, so either except clause catches them.
    calls = [
        (flashattn.FlashAttnValueError, ValueError, lambda: flashattn.flash_attn_func(None, None, None, dropout_p=0.1)),
        (flashattn.FlashAttnTypeError, TypeError, lambda: flashattn.flash_attn_func([1.0], [1.0], [1.0])),
        (flashattn.FlashAttnValueError, ValueError,
         lambda: flashattn.flash_attn_varlen_func(None, None, None, None, None, 1, 1, dropout_p=0.5)),
        (flashattn.FlashAttnValueError, ValueError,
         lambda: flashattn.flash_attn_with_kvcache(None, None, None, rotary_cos=object())),
    ]
    for cls, base, call in calls:
        with pytest.raises(RuntimeError) as e:
            call()
        assert type(e.value) is cls, repr(e.value)
        assert isinstance(e.value, base) and not isinstance(e.value, flashattn.FlashAttnError)


def test_version_mismatch_is_refused(monkeypatch):
    monkeypatch.setattr(_lib, "EXPECTED_VERSION", (9, 9, 0))
    with pytest.raises(ImportError, match=f"version {flashattn.__version__}; this package needs 9.x with x >= 9"):
        _lib.load_library(os.environ.get("FLASHATTN_LIBRARY") or "libflashattn.so.0")


def test_an_older_library_of_the_same_major_version_is_refused_a_newer_accepted(monkeypatch):
    major, minor, _ = _header_version()
    monkeypatch.setattr(_lib, "EXPECTED_VERSION", (major, minor + 1, 0))
    with pytest.raises(ImportError, match="this package needs"):
        _lib.load_library(os.environ.get("FLASHATTN_LIBRARY") or "libflashattn.so.0")
    if minor > 0:
        monkeypatch.setattr(_lib, "EXPECTED_VERSION", (major, minor - 1, 0))
        assert _lib.load_library(os.environ.get("FLASHATTN_LIBRARY") or "libflashattn.so.0")


def test_a_library_missing_symbols_is_named(monkeypatch):
    monkeypatch.setattr(_lib, "_signatures", lambda: {"flashattn_version": ([], ctypes.c_int),
                                                      "flashattn_from_the_future": ([], ctypes.c_int)})
    monkeypatch.setattr(_lib, "_LIB", None)
    with pytest.raises(ImportError, match="lacks flashattn_from_the_future: it is older than this package"):
        _lib.load_library()


def test_python_m_flashattn_describes_the_installation():
    out = subprocess.run([sys.executable, "-m", "flashattn"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert f"flashattn (Python package) {flashattn.__version__}" in out.stdout
    assert "library: " in out.stdout and "build:   commit=" in out.stdout
    assert "device 0: " in out.stdout
    if not has_gpu():
        assert "FLASHATTN_STATUS_NO_DEVICE" in out.stdout


def test_missing_library_says_where_it_looked(monkeypatch):
    monkeypatch.setenv("FLASHATTN_LIBRARY", "/nonexistent/libflashattn.so")
    monkeypatch.setattr(_lib, "_LIB", None)
    with pytest.raises(OSError, match="/nonexistent/libflashattn.so"):
        _lib.load_library()


class FakeCuda:
    """An array known only through __cuda_array_interface__: the argument checks below refuse it
    before anything is dereferenced or any device is needed."""

    def __init__(self, shape, typestr="<f2", ptr=0x100000, strides=None):
        self.__cuda_array_interface__ = {"shape": tuple(shape), "typestr": typestr, "data": (ptr, False),
                                         "strides": strides, "version": 3}


def _varlen_args(**over):
    a = dict(q=FakeCuda((10, 4, 64)), k=FakeCuda((12, 2, 64)), v=FakeCuda((12, 2, 64)),
             cu_seqlens_q=FakeCuda((3,), "<i4"), cu_seqlens_k=FakeCuda((3,), "<i4"), max_seqlen_q=8, max_seqlen_k=8)
    a.update(over)
    return a


@pytest.mark.parametrize("over,exc,match", [
    (dict(cu_seqlens_q=FakeCuda((3,), "<i8")), TypeError, "cu_seqlens_q must be an int32 CUDA array"),
    (dict(cu_seqlens_k=FakeCuda((4,), "<i4")), ValueError, "both must be batch \\+ 1"),
    (dict(cu_seqlens_q=FakeCuda((3, 1), "<i4")), ValueError, "cu_seqlens_q has shape"),
    (dict(seqused_k=FakeCuda((5,), "<i4")), ValueError, "seqused_k has 5 entries; expected batch = 2"),
    (dict(k=FakeCuda((12, 2, 32)), v=FakeCuda((12, 2, 32))), ValueError, "k has head dim 32 but q has 64"),
    (dict(v=FakeCuda((11, 2, 64))), ValueError, "k has shape"),
    (dict(k=FakeCuda((3, 16, 2, 64)), v=FakeCuda((3, 16, 2, 64)), block_table=FakeCuda((3, 4), "<i4")), ValueError,
     "block_table has 3 rows; expected one per sequence \\(2\\)"),
    (dict(dropout_p=0.1), ValueError, "dropout_p"),
])
def test_varlen_arguments_are_checked_before_any_device_work(over, exc, match):
    with pytest.raises(exc, match=match):
        flashattn.flash_attn_varlen_func(**_varlen_args(**over))


@pytest.mark.parametrize("kw,exc,match", [
    (dict(cache_leftpad=FakeCuda((3,), "<i4")), ValueError, "cache_leftpad has 3 entries; expected batch = 2"),
    (dict(cache_leftpad=FakeCuda((2,), "<i8")), TypeError, "cache_leftpad must be an int32 CUDA array"),
    (dict(block_table=FakeCuda((2, 4), "<i4"), cache_leftpad=FakeCuda((2,), "<i4")), ValueError,
     "cache_leftpad pads a dense cache"),
    (dict(k=FakeCuda((2, 1, 2, 64))), ValueError, "pass k and v together"),
    (dict(rotary_cos=FakeCuda((50, 16))), ValueError, "rotary_cos and rotary_sin together"),
    (dict(rotary_cos=FakeCuda((50, 16)), rotary_sin=FakeCuda((50, 16))), ValueError, "they need k and v"),
    (dict(k=FakeCuda((2, 1, 2, 64)), v=FakeCuda((2, 1, 2, 64)), cache_seqlens=FakeCuda((2,), "<i4"),
          rotary_cos=FakeCuda((99, 16)), rotary_sin=FakeCuda((99, 16))), ValueError,
     "rotary_cos has 99 rows; it needs one for each of the cache's 100 positions"),
    (dict(k=FakeCuda((2, 1, 2, 64)), v=FakeCuda((2, 1, 2, 64))), ValueError, "needs cache_seqlens"),
    (dict(cache_seqlens=7), TypeError, "cache_seqlens as an int needs torch tensors"),
    (dict(cache_seqlens=FakeCuda((2,), "<i8")), TypeError, "cache_seqlens must be an int32 CUDA array"),
    (dict(cache_batch_idx=FakeCuda((3,), "<i4")), ValueError, "cache_batch_idx has 3 entries"),
    (dict(block_table=FakeCuda((2, 4), "<i4"), cache_batch_idx=FakeCuda((2,), "<i4")), ValueError,
     "cannot be combined with block_table"),
])
def test_kvcache_arguments_are_checked_before_any_device_work(kw, exc, match):
    q, kc, vc = FakeCuda((2, 1, 4, 64)), FakeCuda((2, 100, 2, 64)), FakeCuda((2, 100, 2, 64))
    with pytest.raises(exc, match=match):
        flashattn.flash_attn_with_kvcache(q, kc, vc, **kw)


def _transposed(shape, ptr=0x100000):
    """A FakeCuda of `shape` whose last two dimensions are stored swapped (last stride != 1)."""
    *lead, a, b = shape
    strides = [0] * len(shape)
    strides[-2], strides[-1], acc = 2, 2 * a, 2 * a * b
    for i in reversed(range(len(lead))):
        strides[i], acc = acc, acc * lead[i]
    return FakeCuda(shape, ptr=ptr, strides=tuple(strides))


@pytest.fixture
def copying_arrays(monkeypatch):
    """FakeCuda arrays owned by a library that can allocate and copy (as torch and CuPy can), and the
    FwdParams of every flashattn_fwd the functions would have run (nothing reaches a device)."""
    from flashattn import api
    made, runs = [], []

    class Lib(api._CudaArrayInterface):
        @staticmethod
        def contiguous(a):
            c = FakeCuda(a.shape, ptr=0x900000 + 0x10000 * len(made))
            made.append((a.obj, c))
            return c

        @staticmethod
        def empty(a, shape, dtype):
            return FakeCuda(shape, "<f4" if dtype == "f32" else a.obj.__cuda_array_interface__["typestr"],
                            ptr=0x500000 + 0x10000 * len(runs))

        @staticmethod
        def negated(a):
            c = FakeCuda(a.shape, ptr=0xa00000 + 0x10000 * len(made))
            made.append((a.obj, c))
            return c

    monkeypatch.setattr(api, "_library_of", lambda obj: Lib if isinstance(obj, FakeCuda) else None)
    monkeypatch.setattr(api, "_ptr", lambda x: x.__cuda_array_interface__["data"][0])
    monkeypatch.setattr(api, "_run", lambda qa, p, stream: runs.append(
        {f: getattr(p, f) for f in ("q", "q_seq_stride", "q_head_stride", "k", "k_seq_stride", "k_head_stride",
                                    "v", "v_seq_stride", "k_new", "k_new_seq_stride", "k_new_head_stride",
                                    "softmax_scale", "softcap", "window_left", "window_right",
                                    "rotary_q_at_cache_len", "alibi_slopes", "alibi_batch_stride")}))
    return made, runs


def test_scale_softcap_and_window_are_taken_as_flashattention2_takes_them(copying_arrays):
    """FlashAttention-2's softmax_scale is any float (None alone is the default), its softcap is active
    only when > 0, and a negative window side is unbounded. The library's fields read 0 as the default
    scale, take only positive scales and refuse softcaps below 0 and windows below -1, so the Python
    layer maps them: 0 to a scale whose scores all round away, a negative scale to -q at its
    magnitude, softcap <= 0 to 0, window sides below -1 to -1."""
    from flashattn import api
    made, runs = copying_arrays
    shapes = ((1, 16, 4, 64), (1, 16, 2, 64), (1, 16, 2, 64))
    q, k, v = (FakeCuda(s, ptr=0x100000 * (i + 1)) for i, s in enumerate(shapes))
    flashattn.flash_attn_func(q, k, v, softmax_scale=0.0, softcap=-2.0, window_size=(-5, 3))
    assert runs[-1]["softmax_scale"] == pytest.approx(api._ZERO_SCALE) and runs[-1]["softcap"] == 0.0
    assert (runs[-1]["window_left"], runs[-1]["window_right"]) == (-1, 3) and not made
    flashattn.flash_attn_func(q, k, v, softmax_scale=-0.25, window_size=[2, -9])
    assert made[-1][0] is q and runs[-1]["q"] == made[-1][1].__cuda_array_interface__["data"][0]
    assert runs[-1]["softmax_scale"] == 0.25 and (runs[-1]["window_left"], runs[-1]["window_right"]) == (2, -1)
    flashattn.flash_attn_func(q, k, v)
    assert runs[-1]["softmax_scale"] == 0.0 and runs[-1]["q"] == 0x100000  # the library's default
    flashattn.flash_attn_varlen_func(FakeCuda((10, 4, 64)), FakeCuda((12, 2, 64)), FakeCuda((12, 2, 64)),
                                     FakeCuda((3,), "<i4"), FakeCuda((3,), "<i4"), 8, 8, softmax_scale=-2.0,
                                     softcap=0.0)
    assert runs[-1]["softmax_scale"] == 2.0 and runs[-1]["q"] == made[-1][1].__cuda_array_interface__["data"][0]
    flashattn.flash_attn_with_kvcache(FakeCuda((2, 1, 4, 64)), FakeCuda((2, 9, 2, 64)), FakeCuda((2, 9, 2, 64)),
                                      softmax_scale=0.0, window_size=(-3, -3))
    assert runs[-1]["softmax_scale"] == pytest.approx(api._ZERO_SCALE)
    assert (runs[-1]["window_left"], runs[-1]["window_right"]) == (-1, -1)


def test_alibi_slopes_are_taken_and_refused_alike_by_the_three_functions(copying_arrays):
    """alibi_slopes as FlashAttention-2 takes them: float32, (nheads,) or (batch, nheads), contiguous;
    a (batch, nheads) array's rows are alibi_batch_stride elements apart, a (nheads,) one is shared
    (stride 0). Anything else is refused by name before any device work, by each function alike."""
    _, runs = copying_arrays
    calls = {
        "func": lambda **kw: flashattn.flash_attn_func(FakeCuda((2, 16, 4, 64)), FakeCuda((2, 16, 2, 64)),
                                                       FakeCuda((2, 16, 2, 64)), **kw),
        "varlen": lambda **kw: flashattn.flash_attn_varlen_func(
            FakeCuda((10, 4, 64)), FakeCuda((12, 2, 64)), FakeCuda((12, 2, 64)), FakeCuda((3,), "<i4"),
            FakeCuda((3,), "<i4"), 8, 8, **kw),
        "kvcache": lambda **kw: flashattn.flash_attn_with_kvcache(FakeCuda((2, 1, 4, 64)), FakeCuda((2, 9, 2, 64)),
                                                                  FakeCuda((2, 9, 2, 64)), **kw),
    }
    for name, call in calls.items():
        call(alibi_slopes=FakeCuda((2, 4), "<f4", ptr=0x710000))
        assert (runs[-1]["alibi_slopes"], runs[-1]["alibi_batch_stride"]) == (0x710000, 4), name
        call(alibi_slopes=FakeCuda((4,), "<f4", ptr=0x720000))
        assert (runs[-1]["alibi_slopes"], runs[-1]["alibi_batch_stride"]) == (0x720000, 0), name
        call()
        assert runs[-1]["alibi_slopes"] is None, name
        n = len(runs)
        with pytest.raises(TypeError, match="alibi_slopes must be float32"):
            call(alibi_slopes=FakeCuda((4,), "<f2"))
        for bad in (FakeCuda((3,), "<f4"), FakeCuda((3, 4), "<f4"), FakeCuda((2, 4, 1), "<f4"),
                    FakeCuda((2, 4), "<f4", strides=(4, 8))):
            with pytest.raises(ValueError, match=r"alibi_slopes has shape .*; expected \(4,\) or \(2, 4\), contiguous"):
                call(alibi_slopes=bad)
        assert len(runs) == n, name  # nothing refused reached the library


@pytest.mark.parametrize("causal,window,rowwise", [
    (False, (-1, -1), False), (True, (-1, -1), True), (False, (15, -1), True), (False, (-1, 0), True),
    (False, (100, 2), True), (False, (0, 0), True), (False, (16, 16), True), (True, (16, 99), True),
    # negative sides are -1 (unbounded), here as for the attention itself
    (False, (-5, -3), False), (False, (-2, -1), False), (False, (-2, 40), True), (True, (-7, -7), True)])
def test_rotary_q_positions_follow_flashattention2s_causal_or_local_rule(copying_arrays, causal, window, rowwise):
    """flash_attn_with_kvcache rotates query row i at cache_seqlens + i when the call is causal or
    local (window_size != (-1, -1), FlashAttention-2's documented rule), else every row at
    cache_seqlens; a window whose sides are all negative is no window, as for the attention."""
    _, runs = copying_arrays
    q, new = FakeCuda((2, 3, 4, 64)), FakeCuda((2, 3, 2, 64))
    flashattn.flash_attn_with_kvcache(q, FakeCuda((2, 16, 2, 64)), FakeCuda((2, 16, 2, 64)), k=new, v=new,
                                      rotary_cos=FakeCuda((16, 16)), rotary_sin=FakeCuda((16, 16)),
                                      cache_seqlens=FakeCuda((2,), "<i4"), causal=causal, window_size=window)
    assert runs[-1]["rotary_q_at_cache_len"] == (0 if rowwise else 1)


def test_a_dense_cache_may_have_more_rows_than_sequences(copying_arrays):
    """FlashAttention-2 checks a dense cache's shape against its own batch only: without
    cache_batch_idx, sequence b reads row b of a cache that may have more rows (fewer is refused)."""
    _, runs = copying_arrays
    q = FakeCuda((2, 1, 4, 64))
    flashattn.flash_attn_with_kvcache(q, FakeCuda((5, 9, 2, 64), ptr=0x600000), FakeCuda((5, 9, 2, 64), ptr=0x700000))
    assert runs[-1]["k"] == 0x600000
    with pytest.raises(ValueError, match="k_cache has batch 1 but q has 2"):
        flashattn.flash_attn_with_kvcache(q, FakeCuda((1, 9, 2, 64)), FakeCuda((1, 9, 2, 64)))


def test_a_negative_scale_needs_an_array_library_that_can_negate_q():
    q, k, v = FakeCuda((1, 16, 4, 64)), FakeCuda((1, 16, 2, 64)), FakeCuda((1, 16, 2, 64))
    with pytest.raises(ValueError, match="negative softmax_scale .* cannot be negated here"):
        flashattn.flash_attn_func(q, k, v, softmax_scale=-1.0)


def test_q_k_v_with_a_strided_last_dimension_are_copied_as_flashattention2_copies_them(copying_arrays):
    """FlashAttention-2 makes q, k and v contiguous where their last stride is not 1 (its
    maybe_contiguous); so do these functions, passing the copies' addresses and strides to the library.
    A KV cache so laid out is refused (FlashAttention-2 asserts), and so is any such array of a library
    that cannot copy (an array known only through __cuda_array_interface__)."""
    made, runs = copying_arrays
    q, k, v = _transposed((1, 16, 4, 64)), FakeCuda((1, 16, 2, 64), ptr=0x200000), _transposed((1, 16, 2, 64), 0x300000)
    flashattn.flash_attn_func(q, k, v)
    assert [m[0] for m in made] == [q, v]
    assert runs[-1]["q"] == made[0][1].__cuda_array_interface__["data"][0]
    assert (runs[-1]["q_seq_stride"], runs[-1]["q_head_stride"]) == (4 * 64, 64)   # the copy's, in elements
    assert runs[-1]["k"] == 0x200000 and runs[-1]["v"] == made[1][1].__cuda_array_interface__["data"][0]

    made.clear()
    flashattn.flash_attn_varlen_func(_transposed((10, 4, 64)), _transposed((12, 2, 64), 0x300000),
                                     FakeCuda((12, 2, 64), ptr=0x400000), FakeCuda((3,), "<i4"),
                                     FakeCuda((3,), "<i4"), 8, 8)
    assert len(made) == 2 and runs[-1]["k"] == made[1][1].__cuda_array_interface__["data"][0]
    assert (runs[-1]["k_seq_stride"], runs[-1]["k_head_stride"]) == (2 * 64, 64)

    made.clear()
    kc, vc = FakeCuda((2, 100, 2, 64), ptr=0x600000), FakeCuda((2, 100, 2, 64), ptr=0x700000)
    flashattn.flash_attn_with_kvcache(FakeCuda((2, 1, 4, 64)), kc, vc, k=_transposed((2, 1, 2, 64), 0x800000),
                                      v=FakeCuda((2, 1, 2, 64), ptr=0x810000), cache_seqlens=FakeCuda((2,), "<i4"))
    assert len(made) == 1 and runs[-1]["k_new"] == made[0][1].__cuda_array_interface__["data"][0]
    assert runs[-1]["k"] == 0x600000 and runs[-1]["k_new_head_stride"] == 64
    for name in ("k_cache", "v_cache"):
        caches = {"k_cache": kc, "v_cache": vc, name: _transposed((2, 100, 2, 64))}
        with pytest.raises(ValueError, match=f"{name} must have a contiguous last dimension"):
            flashattn.flash_attn_with_kvcache(FakeCuda((2, 1, 4, 64)), caches["k_cache"], caches["v_cache"])


def test_a_strided_last_dimension_that_cannot_be_copied_is_refused_by_name():
    k, v = FakeCuda((1, 16, 2, 64)), FakeCuda((1, 16, 2, 64))
    with pytest.raises(ValueError, match="q must be contiguous in its last dimension .*cannot be copied here"):
        flashattn.flash_attn_func(_transposed((1, 16, 4, 64)), k, v)
    with pytest.raises(ValueError, match="v must be contiguous in its last dimension .*cannot be copied here"):
        flashattn.flash_attn_varlen_func(FakeCuda((10, 4, 64)), FakeCuda((12, 2, 64)), _transposed((12, 2, 64)),
                                         FakeCuda((3,), "<i4"), FakeCuda((3,), "<i4"), 8, 8)


# FlashAttention-2's (2.6+) forward functions: every parameter, in order, with its default. The
# library's keyword-only extensions (out=, stream=, backend=) come after them.
_FA2 = {
    "flash_attn_func": "q k v dropout_p=0.0 softmax_scale=None causal=False window_size=(-1, -1) softcap=0.0 "
                       "alibi_slopes=None deterministic=False return_attn_probs=False",
    "flash_attn_qkvpacked_func": "qkv dropout_p=0.0 softmax_scale=None causal=False window_size=(-1, -1) softcap=0.0 "
                                 "alibi_slopes=None deterministic=False return_attn_probs=False",
    "flash_attn_kvpacked_func": "q kv dropout_p=0.0 softmax_scale=None causal=False window_size=(-1, -1) softcap=0.0 "
                                "alibi_slopes=None deterministic=False return_attn_probs=False",
    "flash_attn_varlen_func": "q k v cu_seqlens_q cu_seqlens_k max_seqlen_q max_seqlen_k dropout_p=0.0 "
                              "softmax_scale=None causal=False window_size=(-1, -1) softcap=0.0 alibi_slopes=None "
                              "deterministic=False return_attn_probs=False block_table=None",
    "flash_attn_varlen_qkvpacked_func": "qkv cu_seqlens max_seqlen dropout_p=0.0 softmax_scale=None causal=False "
                                        "window_size=(-1, -1) softcap=0.0 alibi_slopes=None deterministic=False "
                                        "return_attn_probs=False",
    "flash_attn_varlen_kvpacked_func": "q kv cu_seqlens_q cu_seqlens_k max_seqlen_q max_seqlen_k dropout_p=0.0 "
                                       "softmax_scale=None causal=False window_size=(-1, -1) softcap=0.0 "
                                       "alibi_slopes=None deterministic=False return_attn_probs=False",
    "flash_attn_with_kvcache": "q k_cache v_cache k=None v=None rotary_cos=None rotary_sin=None cache_seqlens=None "
                               "cache_batch_idx=None cache_leftpad=None block_table=None softmax_scale=None "
                               "causal=False window_size=(-1, -1) softcap=0.0 rotary_interleaved=True "
                               "alibi_slopes=None num_splits=0 return_softmax_lse=False",
}


def _fa2_params(spec):
    out = []
    for item in re.findall(r"\S+=\([^)]*\)|\S+", spec):
        name, _, default = item.partition("=")
        out.append((name, eval(default) if default else inspect.Parameter.empty))
    return out


@pytest.mark.parametrize("name", sorted(_FA2))
def test_flashattention2_signatures(name):
    """A caller of FlashAttention-2 switches by changing the import: same names, order and defaults."""
    sig = inspect.signature(getattr(flashattn, name))
    positional = [(p.name, p.default) for p in sig.parameters.values()
                  if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD]
    fa2 = _fa2_params(_FA2[name])
    # Extensions may follow FA2's last parameter (varlen_func's seqused_k does).
    assert positional[:len(fa2)] == fa2
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in sig.parameters.values()
               if p.name in ("out", "stream", "backend"))


def test_star_imports_bring_every_flashattention2_function():
    """`from flashattn import *` (and from flashattn.api) gives every FlashAttention-2 function, and
    each name an __all__ lists exists."""
    from flashattn import api
    for module in (flashattn, api):
        assert set(_FA2) <= set(module.__all__), sorted(set(_FA2) - set(module.__all__))
        assert "merge_attn_states" in module.__all__
        assert [n for n in module.__all__ if not hasattr(module, n)] == []


@pytest.mark.parametrize("call,exc,match", [
    (lambda: flashattn.flash_attn_qkvpacked_func(FakeCuda((2, 8, 2, 4, 64))), ValueError,
     r"qkv has shape \(2, 8, 2, 4, 64\); expected \(batch, seqlen, 3, nheads, headdim\)"),
    (lambda: flashattn.flash_attn_qkvpacked_func(FakeCuda((2, 8, 3, 4, 64))), TypeError,
     "qkv must be a torch tensor or a CuPy array"),
    (lambda: flashattn.flash_attn_kvpacked_func(FakeCuda((2, 8, 4, 64)), FakeCuda((2, 8, 4, 64))), ValueError,
     r"kv has shape \(2, 8, 4, 64\); expected \(batch, seqlen_k, 2, nheads_k, headdim\)"),
    (lambda: flashattn.flash_attn_varlen_qkvpacked_func(FakeCuda((10, 2, 4, 64)), FakeCuda((3,), "<i4"), 8),
     ValueError, r"expected \(total, 3, nheads, headdim\)"),
    (lambda: flashattn.flash_attn_varlen_kvpacked_func(FakeCuda((10, 4, 64)), FakeCuda((12, 3, 2, 64)),
                                                       FakeCuda((3,), "<i4"), FakeCuda((3,), "<i4"), 8, 8),
     ValueError, r"expected \(total_k, 2, nheads_k, headdim\)"),
])
def test_packed_forms_check_their_packing(call, exc, match):
    with pytest.raises(exc, match=match):
        call()


class _FakeTensor:
    """Just enough of a torch CUDA tensor for the serving functions' per-structure cache."""
    is_cuda = True
    _next = [0x200000]

    def __init__(self, shape, dtype="bf16"):
        self.shape, self.dtype = tuple(shape), dtype
        self._ptr = _FakeTensor._next[0]
        _FakeTensor._next[0] += 0x10000

    def stride(self):
        st, acc = [], 1
        for n in reversed(self.shape):
            st.append(acc)
            acc *= n
        return tuple(reversed(st))

    def get_device(self):
        return 0

    def data_ptr(self):
        return self._ptr

    def new_empty(self, shape, dtype=None):
        return _FakeTensor(shape, dtype or self.dtype)


def test_serving_cache_sets_every_address_and_keeps_no_caller_tensor(monkeypatch):
    """The serving functions' per-structure cache, without a GPU: a hit passes the library the new
    tensors' addresses (none of the first call's), a different structure builds again, a call seen
    while capturing is not kept, a cached entry holds no caller tensor (only what the call made),
    and an unhashable option falls back to the general path."""
    import gc
    import types
    import weakref
    from flashattn import api
    capturing = [False]
    state = (types.SimpleNamespace(float32="f32", uint8="u8"), _FakeTensor, lambda: 0, lambda d: None,
             lambda d: 0, lambda: capturing[0])
    monkeypatch.setattr(api, "_torch_state", state)
    monkeypatch.setattr(api._tls, "serving_cache", {}, raising=False)
    monkeypatch.setattr(api._tls, "workspaces", {}, raising=False)
    built, seen = [], []

    def fwd(handle, addr, ws, n, stream):
        p = flashattn.FwdParams.from_address(addr)
        seen.append({f: getattr(p, f) for f in api._VARLEN_FIELDS + ("o",)})
        return 0
    monkeypatch.setattr(api, "lib", lambda: types.SimpleNamespace(flashattn_fwd=fwd))
    monkeypatch.setattr(api, "get_handle", lambda dev: types.SimpleNamespace(ptr=None))
    monkeypatch.setattr(api, "workspace_size", lambda h, p: 0)
    monkeypatch.setattr(api, "_serving_run", lambda sc, ret, stream: (sc.qa.obj.new_empty(sc.out_shape), None))
    made = [_FakeTensor((2,), "i32")]  # what each build makes itself (an int cache_seqlens' tensor)

    def call(t, options=(1, 100, None, True, (-1, -1), 0.0, 0)):
        def build():
            built.append(1)
            p = flashattn.FwdParams.new()
            p.head_dim = 64  # no padding: the call can be kept
            for f, x in zip(api._VARLEN_FIELDS, t):  # the general path would set these from t
                setattr(p, f, x.data_ptr() if x is not None else None)
            qa = types.SimpleNamespace(obj=t[0], device=0)
            return api._ServingCall(p, qa, t[0].shape, (4, 3), 64, [qa] + [x for x in t if x is not None], (made[0],))
        return api._serving_fast(0, api._VARLEN_FIELDS, t, options, build, False)

    def tensors(total_q=3):
        return (_FakeTensor((total_q, 4, 64)), _FakeTensor((48, 16, 2, 64)), _FakeTensor((48, 16, 2, 64)),
                _FakeTensor((4,), "i32"), _FakeTensor((4,), "i32"), _FakeTensor((3, 16), "i32"), None, None)

    first = tensors()
    call(first)
    assert len(built) == 1 and not seen  # a miss runs the general path
    second = tensors()
    out, _ = call(second)
    assert len(built) == 1 and len(seen) == 1
    want = {f: x.data_ptr() for f, x in zip(api._VARLEN_FIELDS, second) if x is not None}
    assert {f: seen[0][f] for f in want} == want and seen[0]["o"] == out.data_ptr()
    assert seen[0]["seqused_k"] is None and seen[0]["alibi_slopes"] is None
    refs = [weakref.ref(x) for x in first + second if x is not None]
    made_ref = weakref.ref(made[0])
    made[0] = _FakeTensor((2,), "i32")
    del first, second, out
    gc.collect()
    assert all(r() is None for r in refs)  # the cache holds no caller tensor...
    assert made_ref() is not None          # ...but keeps what the call made
    call(tensors(total_q=5))               # another structure: built again
    assert len(built) == 2
    capturing[0] = True
    call(tensors(total_q=7))               # first seen while capturing: run, not kept
    capturing[0] = False
    call(tensors(total_q=7))
    assert len(built) == 4
    assert call(tensors(), options=(1, 100, None, True, [-1, -1], 0.0, 0)) is None  # unhashable: general path


def test_grad_recorded_only_in_grad_mode_with_a_torch_tensor_requiring_grad():
    """Which calls get an autograd node whose backward raises (flash_attn_func, flash_attn_varlen_func):
    grad mode on and q, k or v a torch tensor that requires grad; never another library's array."""
    import types
    from flashattn import api
    enabled = [True]

    class Tensor:
        def __init__(self, requires_grad):
            self.requires_grad = requires_grad

    state = (types.SimpleNamespace(is_grad_enabled=lambda: enabled[0]), Tensor)
    plain, wants = Tensor(False), Tensor(True)
    other = types.SimpleNamespace(requires_grad=True)  # not a torch tensor
    assert not api._grad_recorded(state, plain, plain, plain)
    assert api._grad_recorded(state, wants, plain, plain)
    assert api._grad_recorded(state, plain, plain, wants)
    assert not api._grad_recorded(state, other, plain, plain)
    enabled[0] = False
    assert not api._grad_recorded(state, wants, wants, wants)
