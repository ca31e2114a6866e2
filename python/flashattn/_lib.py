"""Loading libflashattn.so and its C ABI, mirrored one to one: structs, enums, status codes."""
import ctypes
import glob
import os

from ._version import __version__

__all__ = ["FlashAttnError", "lib", "load_library", "library_path", "FwdParams", "PlanInfo", "MergeParams", "Status",
           "Dtype", "LseBase", "Mask", "Backend", "EXPECTED_VERSION"]

# The library version this package was written against: any library of the same major version and at
# least this minor works (the C ABI only grows within a major version).
EXPECTED_VERSION = tuple(int(x) for x in __version__.split(".")[:3])


class Status:
    SUCCESS = 0
    NULL_POINTER = 1
    MISALIGNED_POINTER = 2
    BAD_STRUCT_SIZE = 3
    BAD_SHAPE = 4
    BAD_STRIDE = 5
    INDEX_OVERFLOW = 6
    BAD_HEAD_GROUPING = 7
    UNSUPPORTED_HEAD_DIM = 8
    BAD_DTYPE = 9
    BAD_SCALE = 10
    BAD_MASK = 11
    BAD_WINDOW = 12
    BAD_SOFTCAP = 13
    BAD_BACKEND = 14
    UNSUPPORTED = 15
    WORKSPACE_TOO_SMALL = 16
    DEVICE_TOO_OLD = 17
    WRONG_DEVICE = 18
    NO_DEVICE = 19
    CUDA_ERROR = 20
    CUBLAS_ERROR = 21
    OUT_OF_HOST_MEMORY = 22
    BAD_LSE_BASE = 23
    BAD_VARLEN = 24
    BAD_PAGED_KV = 25
    BAD_APPEND = 26
    BAD_ROTARY = 27


class Dtype:
    FLOAT16 = 0
    BFLOAT16 = 1
    FLOAT32 = 2  # flashattn_merge's partial results only


class LseBase:
    NATURAL = 0
    BASE2 = 1


class Mask:
    NONE = 0
    CAUSAL_BOTTOM_RIGHT = 1
    CAUSAL_TOP_LEFT = 2


class Backend:
    AUTO = 0
    REFERENCE = 1
    FUSED = 2
    FUSED_SM90 = 3


def _new_struct(cls, init_size):
    """A ctypes mirror of a growable struct, given its defaults by the library for this mirror's size."""
    s = cls()
    _check(getattr(lib(), init_size)(ctypes.byref(s), ctypes.sizeof(cls)), init_size)
    return s


class FwdParams(ctypes.Structure):
    """flashattn_fwd_params; create with FwdParams.new() so the library sets the defaults."""
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("dtype", ctypes.c_int32), ("mask", ctypes.c_int32), ("backend", ctypes.c_int32),
        ("reserved0", ctypes.c_int32),
        ("batch", ctypes.c_int64), ("seqlen_q", ctypes.c_int64), ("seqlen_k", ctypes.c_int64),
        ("heads_q", ctypes.c_int64), ("heads_kv", ctypes.c_int64), ("head_dim", ctypes.c_int64),
        ("q", ctypes.c_void_p), ("q_batch_stride", ctypes.c_int64), ("q_seq_stride", ctypes.c_int64),
        ("q_head_stride", ctypes.c_int64),
        ("k", ctypes.c_void_p), ("k_batch_stride", ctypes.c_int64), ("k_seq_stride", ctypes.c_int64),
        ("k_head_stride", ctypes.c_int64),
        ("v", ctypes.c_void_p), ("v_batch_stride", ctypes.c_int64), ("v_seq_stride", ctypes.c_int64),
        ("v_head_stride", ctypes.c_int64),
        ("o", ctypes.c_void_p), ("o_batch_stride", ctypes.c_int64), ("o_seq_stride", ctypes.c_int64),
        ("o_head_stride", ctypes.c_int64),
        ("lse", ctypes.c_void_p),
        ("softmax_scale", ctypes.c_float), ("softcap", ctypes.c_float),
        ("window_left", ctypes.c_int64), ("window_right", ctypes.c_int64),
        ("alibi_slopes", ctypes.c_void_p), ("alibi_batch_stride", ctypes.c_int64),
        # 0.3.0: serving calls
        ("cu_seqlens_q", ctypes.c_void_p), ("cu_seqlens_k", ctypes.c_void_p), ("seqused_k", ctypes.c_void_p),
        ("total_q", ctypes.c_int64), ("total_k", ctypes.c_int64),
        ("block_table", ctypes.c_void_p), ("block_table_batch_stride", ctypes.c_int64),
        ("pages_per_seq", ctypes.c_int64), ("page_size", ctypes.c_int64), ("num_pages", ctypes.c_int64),
        ("kv_batch_idx", ctypes.c_void_p), ("kv_batch", ctypes.c_int64),
        ("k_new", ctypes.c_void_p), ("k_new_batch_stride", ctypes.c_int64), ("k_new_seq_stride", ctypes.c_int64),
        ("k_new_head_stride", ctypes.c_int64),
        ("v_new", ctypes.c_void_p), ("v_new_batch_stride", ctypes.c_int64), ("v_new_seq_stride", ctypes.c_int64),
        ("v_new_head_stride", ctypes.c_int64),
        ("seqlen_new", ctypes.c_int64), ("rotary_cos", ctypes.c_void_p), ("rotary_sin", ctypes.c_void_p),
        ("rotary_dim", ctypes.c_int64), ("seqlen_ro", ctypes.c_int64),
        ("rotary_interleaved", ctypes.c_int32), ("rotary_q_at_cache_len", ctypes.c_int32),
        ("reserved1", ctypes.c_int32),
        ("kv_indptr", ctypes.c_void_p), ("kv_last_page_len", ctypes.c_void_p), ("num_page_indices", ctypes.c_int64),
        # 0.4.0: left-padded caches
        ("cache_leftpad", ctypes.c_void_p),
    ]

    @classmethod
    def new(cls):
        return _new_struct(cls, "flashattn_fwd_params_init_size")


class PlanInfo(ctypes.Structure):
    """flashattn_plan_info: what flashattn_fwd would run; create with PlanInfo.new()."""
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("backend", ctypes.c_int32), ("block_m", ctypes.c_int32), ("block_n", ctypes.c_int32),
        ("num_warps", ctypes.c_int32), ("grid_x", ctypes.c_int32), ("grid_y", ctypes.c_int32),
        ("grid_z", ctypes.c_int32), ("num_splits", ctypes.c_int32), ("kernel_head_dim", ctypes.c_int32),
        ("workspace_bytes", ctypes.c_int64), ("shared_mem_bytes", ctypes.c_int64),
        ("kernel_name", ctypes.c_char * 64), ("description", ctypes.c_char * 192),
    ]

    @classmethod
    def new(cls):
        return _new_struct(cls, "flashattn_plan_info_init_size")


class MergeParams(ctypes.Structure):
    """flashattn_merge_params; create with MergeParams.new() so the library sets the defaults."""
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("dtype_parts", ctypes.c_int32), ("dtype_out", ctypes.c_int32), ("lse_base", ctypes.c_int32),
        ("reserved0", ctypes.c_int32),
        ("num_parts", ctypes.c_int64), ("batch", ctypes.c_int64), ("seqlen", ctypes.c_int64),
        ("heads", ctypes.c_int64), ("head_dim", ctypes.c_int64),
        ("o_parts", ctypes.c_void_p), ("o_part_stride", ctypes.c_int64), ("o_batch_stride", ctypes.c_int64),
        ("o_seq_stride", ctypes.c_int64), ("o_head_stride", ctypes.c_int64),
        ("lse_parts", ctypes.c_void_p), ("lse_part_stride", ctypes.c_int64), ("lse_batch_stride", ctypes.c_int64),
        ("lse_head_stride", ctypes.c_int64), ("lse_seq_stride", ctypes.c_int64),
        ("o", ctypes.c_void_p), ("out_batch_stride", ctypes.c_int64), ("out_seq_stride", ctypes.c_int64),
        ("out_head_stride", ctypes.c_int64),
        ("lse", ctypes.c_void_p), ("lse_out_batch_stride", ctypes.c_int64), ("lse_out_head_stride", ctypes.c_int64),
        ("lse_out_seq_stride", ctypes.c_int64),
    ]

    @classmethod
    def new(cls):
        return _new_struct(cls, "flashattn_merge_params_init_size")


class FlashAttnError(RuntimeError):
    """A libflashattn call failed: .status (int), .name (e.g. 'FLASHATTN_STATUS_BAD_SHAPE'), and
    the library's detail message."""

    def __init__(self, status, name, message, call=""):
        self.status, self.name, self.message = status, name, message
        super().__init__(f"{call + ': ' if call else ''}{name}: {message}")


class FlashAttnValueError(ValueError, RuntimeError):
    """An argument the Python functions refuse before calling the library (a bad shape, device,
    option or combination, naming the argument). A ValueError, and a RuntimeError too: FlashAttention-2
    reports the same problems from its C++ checks as RuntimeError, so code written against it that
    catches RuntimeError still catches them."""


class FlashAttnTypeError(TypeError, RuntimeError):
    """An argument of the wrong type or dtype, refused before calling the library: a TypeError, and a
    RuntimeError as FlashAttention-2 raises for a wrong dtype (see FlashAttnValueError)."""


_LIB = None
_LIB_PATH = None


def _candidates():
    env = os.environ.get("FLASHATTN_LIBRARY")
    if env:
        yield env
        return
    here = os.path.dirname(os.path.abspath(__file__))
    for path in sorted(glob.glob(os.path.join(here, "libflashattn.so*"))):
        yield path
    yield "libflashattn.so.0"
    yield "libflashattn.so"


_SIGNATURES = None


def _signatures():
    c = ctypes
    vp, i32, sz = c.c_void_p, c.c_int, c.c_size_t
    return {
        "flashattn_version": ([], i32), "flashattn_version_string": ([], c.c_char_p),
        "flashattn_build_info": ([], c.c_char_p),
        "flashattn_status_name": ([i32], c.c_char_p), "flashattn_status_string": ([i32], c.c_char_p),
        "flashattn_last_error": ([], c.c_char_p),
        "flashattn_handle_create": ([c.POINTER(vp), i32], i32), "flashattn_handle_destroy": ([vp], i32),
        "flashattn_handle_device": ([vp, c.POINTER(i32)], i32),
        "flashattn_fwd_params_init_size": ([vp, sz], i32), "flashattn_fwd_params_set_packed_strides": ([vp], i32),
        "flashattn_plan_info_init_size": ([vp, sz], i32),
        "flashattn_fwd_workspace_size": ([vp, vp, c.POINTER(sz)], i32),
        "flashattn_fwd_supported": ([vp, vp], i32), "flashattn_fwd_plan": ([vp, vp, vp], i32),
        "flashattn_fwd": ([vp, vp, vp, sz, vp], i32),
        "flashattn_merge_params_init_size": ([vp, sz], i32), "flashattn_merge": ([vp, vp, vp], i32),
    }


def _declare(l, path):
    missing = [name for name in _signatures() if not hasattr(l, name)]
    if missing:
        raise ImportError(f"libflashattn at {path} lacks {', '.join(missing)}: it is older than this package "
                          f"({__version__}) needs. Point FLASHATTN_LIBRARY at a build of libflashattn {__version__} "
                          f"or newer.")
    for name, (args, res) in _signatures().items():
        fn = getattr(l, name)
        fn.argtypes, fn.restype = args, res


def _version_ok(got):
    return got[0] == EXPECTED_VERSION[0] and got[1:] >= EXPECTED_VERSION[1:2]


def load_library(path=None):
    """Loads (once) and returns the ctypes library. Raises OSError naming every place it looked, or
    ImportError when the library is older than this package or of another major version."""
    global _LIB, _LIB_PATH
    if _LIB is not None and path is None:
        return _LIB
    tried, last_err = [], None
    for cand in ([path] if path else _candidates()):
        try:
            l = ctypes.CDLL(cand)
        except OSError as e:
            tried.append(cand)
            last_err = e
            continue
        if not hasattr(l, "flashattn_version"):
            raise ImportError(f"{cand} is not libflashattn (no flashattn_version symbol)")
        l.flashattn_version.restype = ctypes.c_int
        v = l.flashattn_version()
        got = (v // 10000, v // 100 % 100, v % 100)
        if not _version_ok(got):
            raise ImportError(f"libflashattn at {cand} is version {'.'.join(map(str, got))}; this package needs "
                              f"{EXPECTED_VERSION[0]}.x with x >= {EXPECTED_VERSION[1]} (it was written for "
                              f"{__version__}). Point FLASHATTN_LIBRARY at a matching build.")
        _declare(l, cand)
        _LIB, _LIB_PATH = l, cand
        return l
    raise OSError("libflashattn.so not found; looked in: " + ", ".join(tried) +
                  f" ({last_err}). Build it with CMake and set FLASHATTN_LIBRARY=/path/to/libflashattn.so.")


def library_path():
    """Where the loaded library came from (loading it if needed): the path or name it was opened by."""
    load_library()
    return _LIB_PATH


def lib():
    return _LIB if _LIB is not None else load_library()


_CUDART = None


def cudart():
    """The CUDA runtime libflashattn was linked against (already in the process once the library is
    loaded: found through /proc/self/maps, else by its usual names), with cudaMallocAsync and
    cudaFreeAsync declared; None where it cannot be found. For the workspace of a call whose arrays
    come through a protocol only (no library to allocate with)."""
    global _CUDART
    if _CUDART is not None:
        return _CUDART
    lib()
    cands = []
    try:
        with open("/proc/self/maps") as f:
            cands = sorted({line.split()[-1] for line in f if "/libcudart.so" in line})
    except OSError:
        pass
    for cand in cands + ["libcudart.so", "libcudart.so.13", "libcudart.so.12"]:
        try:
            l = ctypes.CDLL(cand)
            malloc_async, free_async = l.cudaMallocAsync, l.cudaFreeAsync
        except (OSError, AttributeError):
            continue
        malloc_async.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t, ctypes.c_void_p]
        free_async.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
        malloc_async.restype = free_async.restype = ctypes.c_int
        l.cudaGetErrorString.argtypes, l.cudaGetErrorString.restype = [ctypes.c_int], ctypes.c_char_p
        _CUDART = l
        return l
    return None


def _check(status, call=""):
    if status != Status.SUCCESS:
        l = lib()
        raise FlashAttnError(status, l.flashattn_status_name(status).decode(), l.flashattn_last_error().decode(), call)
