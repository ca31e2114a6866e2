"""The Python API: a handle and the forward call mirroring the C ABI, and flash_attn_func, a drop-in
for FlashAttention-2's function of the same name, taking any CUDA array (PyTorch, CuPy,
__cuda_array_interface__, DLPack)."""
import contextlib
import ctypes
import math
import sys
import threading
import warnings

from . import _lib
from ._lib import (Backend, Dtype, FlashAttnError, FlashAttnTypeError, FlashAttnValueError, FwdParams, LseBase, Mask,
                   MergeParams, PlanInfo, _check, lib)

__all__ = ["Handle", "get_handle", "workspace_size", "supported", "plan", "fwd", "flash_attn_func",
           "flash_attn_qkvpacked_func", "flash_attn_kvpacked_func", "flash_attn_varlen_func",
           "flash_attn_varlen_qkvpacked_func", "flash_attn_varlen_kvpacked_func", "flash_attn_with_kvcache",
           "merge_attn_states"]


class Handle:
    """A libflashattn handle bound to one CUDA device (-1: the current one). Thread-safe."""

    def __init__(self, device=-1):
        h = ctypes.c_void_p()
        _check(lib().flashattn_handle_create(ctypes.byref(h), int(device)), "flashattn_handle_create")
        self._h = h
        dev = ctypes.c_int()
        _check(lib().flashattn_handle_device(h, ctypes.byref(dev)), "flashattn_handle_device")
        self.device = dev.value

    @property
    def ptr(self):
        return self._h

    def close(self):
        if self._h:
            lib().flashattn_handle_destroy(self._h)
            self._h = None

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


_handles = {}
_handles_lock = threading.Lock()


def get_handle(device):
    """The process-wide cached handle for a device ordinal."""
    with _handles_lock:
        h = _handles.get(device)
        if h is None:
            h = _handles[device] = Handle(device)
        return h


def workspace_size(handle, params):
    n = ctypes.c_size_t()
    _check(lib().flashattn_fwd_workspace_size(handle.ptr, ctypes.byref(params), ctypes.byref(n)),
           "flashattn_fwd_workspace_size")
    return n.value


def supported(handle, params):
    """(True, None) or (False, FlashAttnError) for what flashattn_fwd would return."""
    st = lib().flashattn_fwd_supported(handle.ptr, ctypes.byref(params))
    if st == 0:
        return True, None
    return False, FlashAttnError(st, lib().flashattn_status_name(st).decode(), lib().flashattn_last_error().decode())


def plan(handle, params):
    info = PlanInfo.new()
    _check(lib().flashattn_fwd_plan(handle.ptr, ctypes.byref(params), ctypes.byref(info)), "flashattn_fwd_plan")
    return info


def fwd(handle, params, workspace=0, workspace_bytes=0, stream=0):
    """flashattn_fwd: enqueue on `stream` (an int cudaStream_t, 0 = legacy default)."""
    _check(lib().flashattn_fwd(handle.ptr, ctypes.byref(params), ctypes.c_void_p(workspace or None),
                               ctypes.c_size_t(workspace_bytes), ctypes.c_void_p(stream or None)), "flashattn_fwd")


# ---- arrays from any CUDA library ---------------------------------------------------------------

class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


def _contiguous(shape):
    st, acc = [], 1
    for n in reversed(shape):
        st.append(acc)
        acc *= n
    return tuple(reversed(st))


class _ArrayLibrary:
    """What flash_attn_func needs from the library that owns an array: describe it (pointer, shape,
    strides in elements, dtype code, device), allocate outputs next to it, name its current stream,
    pad its head dim, and make its device current. One subclass per library; the base class is for
    arrays known only through a protocol (no allocation, no padding, the legacy default stream)."""

    @staticmethod
    def describe(a, obj, name):
        raise NotImplementedError

    @staticmethod
    def empty(a, shape, dtype):
        raise FlashAttnTypeError(f"cannot allocate an output for a {type(a.obj).__name__}; pass out= (and, for "
                                 f"return_attn_probs, a torch or CuPy input)")

    @staticmethod
    def current_stream(a):
        return 0

    @staticmethod
    def pad_head_dim(a, to):
        raise FlashAttnValueError(
            f"head dim {a.shape[-1]} is not a multiple of 8 and a {type(a.obj).__name__} cannot be "
            f"padded here; pad it to {to} yourself")

    @staticmethod
    def device_scope(a):
        return contextlib.nullcontext()

    @staticmethod
    def contiguous(a):
        """A copy of `a` whose last dimension is contiguous, made on the current stream."""
        raise FlashAttnValueError(f"{a.name} must be contiguous in its last dimension (stride {a.strides[-1]}): a "
                                  f"{type(a.obj).__name__} cannot be copied here; pass one that is")

    @staticmethod
    def copy_head_dims(dst, src):
        """dst[...] = src[..., :dst's head dim], on the current stream (a padded cache written back)."""
        raise NotImplementedError

    @staticmethod
    def negated(a):
        """-a, a new array made on the current stream (a negative softmax_scale's q)."""
        raise FlashAttnValueError(f"a negative softmax_scale is computed as attention of -q at the scale's magnitude, "
                                  f"and a {type(a.obj).__name__} cannot be negated here: pass torch or CuPy arrays")


class _Torch(_ArrayLibrary):
    @staticmethod
    def describe(a, obj, name):
        import torch
        if not obj.is_cuda:
            raise FlashAttnValueError(f"{name} is on {obj.device}; libflashattn needs CUDA tensors")
        codes = {torch.float16: Dtype.FLOAT16, torch.bfloat16: Dtype.BFLOAT16, torch.float32: "f32"}
        if obj.dtype not in codes:
            raise FlashAttnTypeError(f"{name} has dtype {obj.dtype}; expected torch.float16 or torch.bfloat16")
        a.ptr, a.shape, a.strides = obj.data_ptr(), tuple(obj.shape), tuple(obj.stride())
        a.dtype, a.device = codes[obj.dtype], obj.device.index

    @staticmethod
    def empty(a, shape, dtype):
        import torch
        dt = {"same": a.obj.dtype, "f32": torch.float32, "u8": torch.uint8}[dtype]
        return torch.empty(shape, dtype=dt, device=a.obj.device)

    @staticmethod
    def current_stream(a):
        import torch
        return torch.cuda.current_stream(a.obj.device).cuda_stream

    @staticmethod
    def pad_head_dim(a, to):
        import torch.nn.functional as F
        return F.pad(a.obj, (0, to - a.shape[-1]))

    @staticmethod
    def device_scope(a):
        import torch
        return torch.cuda.device(a.obj.device)

    @staticmethod
    def copy_head_dims(dst, src):
        dst.copy_(src[..., :dst.shape[-1]])

    @staticmethod
    def contiguous(a):
        return a.obj.contiguous()

    @staticmethod
    def negated(a):
        return -a.obj


class _CuPy(_ArrayLibrary):
    @staticmethod
    def describe(a, obj, name):
        import cupy
        codes = {cupy.dtype("float16"): Dtype.FLOAT16, cupy.dtype("float32"): "f32"}
        if obj.dtype not in codes:
            raise FlashAttnTypeError(f"{name} has dtype {obj.dtype}; CuPy inputs must be float16")
        a.ptr, a.shape = obj.data.ptr, tuple(obj.shape)
        a.strides = tuple(s // obj.itemsize for s in obj.strides)
        a.dtype, a.device = codes[obj.dtype], obj.device.id

    @staticmethod
    def empty(a, shape, dtype):
        import cupy
        dt = {"same": a.obj.dtype, "f32": cupy.float32, "u8": cupy.uint8}[dtype]
        with cupy.cuda.Device(a.device):
            return cupy.empty(shape, dtype=dt)

    @staticmethod
    def current_stream(a):
        import cupy
        return cupy.cuda.get_current_stream().ptr

    @staticmethod
    def pad_head_dim(a, to):
        import cupy
        return cupy.pad(a.obj, [(0, 0)] * (len(a.shape) - 1) + [(0, to - a.shape[-1])])

    @staticmethod
    def device_scope(a):
        import cupy
        return cupy.cuda.Device(a.device)

    @staticmethod
    def copy_head_dims(dst, src):
        dst[...] = src[..., :dst.shape[-1]]

    @staticmethod
    def contiguous(a):
        import cupy
        with cupy.cuda.Device(a.device):
            return cupy.ascontiguousarray(a.obj)

    @staticmethod
    def negated(a):
        import cupy
        with cupy.cuda.Device(a.device):
            return -a.obj


class _CudaArrayInterface(_ArrayLibrary):
    @staticmethod
    def describe(a, obj, name):
        cai = obj.__cuda_array_interface__
        codes = {"<f2": (Dtype.FLOAT16, 2), "<f4": ("f32", 4)}
        if cai["typestr"] not in codes:
            raise FlashAttnTypeError(
                f"{name} has typestr {cai['typestr']}; expected '<f2' (bfloat16 arrays: use DLPack)")
        a.dtype, item = codes[cai["typestr"]]
        a.ptr, a.shape = cai["data"][0], tuple(cai["shape"])
        st = cai.get("strides")
        a.strides = tuple(s // item for s in st) if st else _contiguous(a.shape)
        a.device = None


class _DLPack(_ArrayLibrary):
    @staticmethod
    def describe(a, obj, name):
        cap = obj.__dlpack__()
        get = ctypes.pythonapi.PyCapsule_GetPointer
        get.restype, get.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
        t = _DLTensor.from_address(get(cap, b"dltensor"))  # DLManagedTensor starts with its DLTensor
        if t.device.device_type != 2:  # kDLCUDA
            raise FlashAttnValueError(f"{name} is not on a CUDA device (DLPack device type {t.device.device_type})")
        code = {(2, 16): Dtype.FLOAT16, (4, 16): Dtype.BFLOAT16, (2, 32): "f32"}.get((t.dtype.code, t.dtype.bits))
        if code is None:
            raise FlashAttnTypeError(
                f"{name} has DLPack dtype code {t.dtype.code} bits {t.dtype.bits}; expected fp16/bf16")
        a.keepalive, a.dtype, a.device = cap, code, t.device.device_id
        a.shape = tuple(t.shape[i] for i in range(t.ndim))
        a.strides = tuple(t.strides[i] for i in range(t.ndim)) if t.strides else _contiguous(a.shape)
        a.ptr = t.data + t.byte_offset


def _library_of(obj):
    mod = type(obj).__module__.split(".")[0]
    if mod == "torch":
        return _Torch
    if mod == "cupy":
        return _CuPy
    if hasattr(obj, "__cuda_array_interface__"):
        return _CudaArrayInterface
    if hasattr(obj, "__dlpack__"):
        return _DLPack
    return None


class _Array:
    """What the library needs of an array: pointer, shape, strides (elements), dtype code, device,
    and the _ArrayLibrary that owns it (to allocate outputs and find the current stream)."""

    def __init__(self, obj, name):
        self.obj, self.name, self.keepalive, self.copied = obj, name, None, False
        self.lib = _library_of(obj)
        if self.lib is None:
            raise FlashAttnTypeError(f"{name}: {type(obj).__name__} is not a CUDA array (torch, cupy, "
                                     f"__cuda_array_interface__ or __dlpack__)")
        self.lib.describe(self, obj, name)


def _copy(a, obj):
    """An _Array of `obj`, a copy of `a` made on the current stream, marked as such. It lives as long
    as the _Array; the allocator reuses its memory only for work ordered after the call."""
    c = _Array(obj, a.name)
    c.copied = True
    return c


def _last_contiguous(a):
    """`a`, or a copy of it where its last stride is not 1: FlashAttention-2 copies such q, k and v
    (its maybe_contiguous) rather than refusing them."""
    if a.strides[-1] == 1:
        return a
    c = _copy(a, a.lib.contiguous(a))
    if c.strides[-1] != 1:
        raise FlashAttnValueError(f"{a.name} must be contiguous in its last dimension (stride {a.strides[-1]})")
    return c


# FlashAttention-2 takes softmax_scale as any float, 0 and negative ones included (its "default"
# is None alone), while the library's field reads 0 as "the default" and takes positive scales. So
# a scale of 0 is passed as this one: every scaled score is then below 1e-26 in magnitude, exp of
# each score difference rounds to exactly 1 in fp32, and out and LSE equal those of scale 0 (the
# keys' plain average, with ALiBi's bias where given). A negative scale is computed as attention of
# -q at the scale's magnitude (s = scale q.k = |scale| (-q).k; rotary, being linear, commutes).
_ZERO_SCALE = 1e-30


def _scale_field(softmax_scale, D, padded):
    """FwdParams.softmax_scale for FlashAttention-2's softmax_scale argument, at real head dim D."""
    if softmax_scale is None:
        return 0.0 if padded == D else 1.0 / math.sqrt(D)  # the real head dim's scale, not the padded one's
    scale = abs(float(softmax_scale))
    return _ZERO_SCALE if scale == 0.0 else scale


def _signed_q(qa, softmax_scale):
    """q's _Array, or for a negative softmax_scale an _Array of -q (see _ZERO_SCALE)."""
    if softmax_scale is None or not softmax_scale < 0:
        return qa
    return _copy(qa, qa.lib.negated(qa))


def _softcap_field(softcap):
    """FwdParams.softcap for FlashAttention-2's softcap argument: anything > 0 activates it, any
    other value (0, negative) disables it."""
    softcap = float(softcap)
    return softcap if softcap > 0.0 else 0.0


def _empty(like, shape, dtype):
    """A new array from the same library and device as `like`. dtype: 'same', 'f32' or 'u8'."""
    return like.lib.empty(like, shape, dtype)


def _no_probs(q):
    """The third element of a return_attn_probs result: FlashAttention-2 returns an empty (0,) tensor
    made with q's options (dtype and device) for S_dmask when dropout_p is 0 (the only dropout taken
    here). From q's array library, whatever an out= argument is."""
    if hasattr(q, "new_empty"):  # torch, without building an _Array on the cached path
        return q.new_empty(0)
    return _empty(_Array(q, "q"), (0,), "same")


def _ptr(x):
    """Device address of an array this module allocated (torch or CuPy)."""
    return x.data_ptr() if hasattr(x, "data_ptr") else x.data.ptr


def _set_params(p, qa, ka, va, o_ptr, o_strides, lse_ptr, D, padded, softmax_scale, causal, window_size, softcap,
                slopes, backend):
    """Fills a FwdParams for flash_attn_func from validated arrays."""
    B, Sq, Hq, _ = qa.shape
    p.dtype, p.backend = qa.dtype, backend
    p.batch, p.seqlen_q, p.seqlen_k, p.heads_q, p.heads_kv, p.head_dim = B, Sq, ka.shape[1], Hq, ka.shape[2], padded
    p.q, (p.q_batch_stride, p.q_seq_stride, p.q_head_stride) = qa.ptr, qa.strides[:3]
    p.k, (p.k_batch_stride, p.k_seq_stride, p.k_head_stride) = ka.ptr, ka.strides[:3]
    p.v, (p.v_batch_stride, p.v_seq_stride, p.v_head_stride) = va.ptr, va.strides[:3]
    p.o, (p.o_batch_stride, p.o_seq_stride, p.o_head_stride) = o_ptr, o_strides[:3]
    p.lse = lse_ptr
    p.softmax_scale = _scale_field(softmax_scale, D, padded)
    p.softcap = _softcap_field(softcap)
    p.mask = Mask.CAUSAL_BOTTOM_RIGHT if causal else Mask.NONE
    p.window_left, p.window_right = _window(window_size)
    if slopes is not None:
        _set_alibi(p, slopes)


def _refuse_dropout(dropout_p):
    if dropout_p != 0.0:
        raise FlashAttnValueError(
            f"dropout_p={dropout_p}: libflashattn computes exact attention; dropout is not supported")


def _alibi_array(alibi_slopes, batch, heads):
    """alibi_slopes as FlashAttention-2 takes them: float32, (heads,) or (batch, heads), contiguous."""
    slopes = _Array(alibi_slopes, "alibi_slopes")
    if slopes.dtype != "f32":
        raise FlashAttnTypeError("alibi_slopes must be float32")
    if slopes.shape not in ((heads,), (batch, heads)) or slopes.strides[-1] != 1:
        raise FlashAttnValueError(
            f"alibi_slopes has shape {slopes.shape}; expected ({heads},) or ({batch}, {heads}), contiguous")
    return slopes


def _set_alibi(p, slopes):
    p.alibi_slopes = slopes.ptr
    p.alibi_batch_stride = slopes.strides[0] if len(slopes.shape) == 2 else 0


def _check_qkv(q, k, v):
    """_Arrays for q, k, v after every check flash_attn_func makes of them (FlashAttnValueError/FlashAttnTypeError)."""
    qa, ka, va = _Array(q, "q"), _Array(k, "k"), _Array(v, "v")
    for a in (qa, ka, va):
        if len(a.shape) != 4:
            raise FlashAttnValueError(f"{a.name} has shape {a.shape}; expected (batch, seqlen, nheads, headdim)")
        if a.dtype not in (Dtype.FLOAT16, Dtype.BFLOAT16):
            raise FlashAttnTypeError(f"{a.name} must be float16 or bfloat16")
    if not (qa.dtype == ka.dtype == va.dtype):
        raise FlashAttnTypeError("q, k and v must have the same dtype")
    B, Sq, Hq, D = qa.shape
    if ka.shape != va.shape:
        raise FlashAttnValueError(f"k has shape {ka.shape} but v has shape {va.shape}")
    if ka.shape[0] != B or ka.shape[3] != D:
        raise FlashAttnValueError(f"k has shape {ka.shape}; batch and headdim must match q's {qa.shape}")
    if len({a.device for a in (qa, ka, va) if a.device is not None}) > 1:
        raise FlashAttnValueError("q, k and v are on different devices")
    return qa, ka, va


# ---- the PyTorch fast path: per-shape state cached, so a call costs a few attribute reads ------------

class _FastEntry:
    """What a torch call of one shape/stride/dtype/option combination reuses: the filled params
    (pointers set per call), the workspace size, the handle and the library entry point."""
    __slots__ = ("params", "addr", "ws_bytes", "handle", "fwd", "out_shape", "lse_shape", "out_like_q")


_tls = threading.local()   # per thread: a FwdParams is mutated per call; workspaces per (device, stream)
_torch_state = None        # (torch module, Tensor type, get_device, set_device, raw_stream, capturing), once
                           # torch is imported
_FAST_CACHE_MAX = 512


def _torch():
    global _torch_state
    if _torch_state is None:
        torch = sys.modules.get("torch")
        if torch is None:
            return None
        c = torch._C
        get_dev = getattr(c, "_cuda_getDevice", None) or torch.cuda.current_device
        raw = getattr(c, "_cuda_getCurrentRawStream", None) or (lambda d: torch.cuda.current_stream(d).cuda_stream)
        capturing = getattr(c, "_cuda_isCurrentStreamCapturing", None) or torch.cuda.is_current_stream_capturing
        _torch_state = (torch, torch.Tensor, get_dev, torch.cuda.set_device, raw, capturing)
    return _torch_state


def _fast_entry(q, k, v, softmax_scale, causal, window_size, softcap, return_lse, backend):
    """A _FastEntry for these torch tensors, or None when the general path must run (head dim padding)."""
    qa, ka, va = _check_qkv(q, k, v)
    B, Sq, Hq, D = qa.shape
    if D % 8 != 0 or any(a.strides[-1] != 1 for a in (qa, ka, va)) or (softmax_scale is not None and
                                                                         softmax_scale < 0):
        return None
    e = _FastEntry()
    e.out_shape, e.lse_shape = (B, Sq, Hq, D), (B, Hq, Sq)
    e.out_like_q = qa.strides == _contiguous(qa.shape)  # then empty_like(q) is the output, and cheaper
    p = FwdParams.new()
    # O and LSE are allocated per call (PyTorch's allocator aligns them to 512 bytes): a 256-aligned
    # stand-in plans the same; the real pointers are set before every call.
    _set_params(p, qa, ka, va, 256, _contiguous(e.out_shape), 256 if return_lse else None, D, D, softmax_scale,
                causal, window_size, softcap, None, backend)
    handle = get_handle(qa.device)
    e.params, e.addr = p, ctypes.addressof(p)
    e.ws_bytes = workspace_size(handle, p)
    e.handle, e.fwd = handle.ptr, lib().flashattn_fwd
    return e


def _fast_call(state, q, k, v, softmax_scale, causal, window_size, softcap, return_lse, backend):
    qp, kp, vp = q.data_ptr(), k.data_ptr(), v.data_ptr()
    dev = q.get_device()
    # Pointer alignment is in the key: it decides which backend (and workspace) a call gets. What the
    # key leaves out (k's and v's dtype and device) is compared below, on every call.
    key = (q.shape, q.stride(), k.shape, k.stride(), v.shape, v.stride(), q.dtype, dev, (qp | kp | vp) & 15,
           softmax_scale, causal, window_size, softcap, return_lse, backend)
    try:
        cache = _tls.cache
    except AttributeError:
        cache = _tls.cache = {}
    try:
        e = cache.get(key)
    except TypeError:  # an unhashable argument (e.g. a list window_size): the general path takes it
        return None
    if e is None or k.dtype is not q.dtype or v.dtype is not q.dtype or k.get_device() != dev or v.get_device() != dev:
        e = _fast_entry(q, k, v, softmax_scale, causal, window_size, softcap, return_lse, backend)  # raises if bad
        if e is None:
            return None
        if len(cache) >= _FAST_CACHE_MAX:
            cache.clear()
        cache[key] = e
    o = state[0].empty_like(q) if e.out_like_q else q.new_empty(e.out_shape)
    p = e.params
    p.q, p.k, p.v, p.o = qp, kp, vp, o.data_ptr()
    lse = None
    if return_lse:
        lse = q.new_empty(e.lse_shape, dtype=state[0].float32)
        p.lse = lse.data_ptr()
    _enqueue(state, q, dev, e)
    return (o, lse, _no_probs(q)) if return_lse else o


def _enqueue(state, q, dev, e):
    """flashattn_fwd for a cached entry (_FastEntry or _ServingEntry) whose params are filled: on
    dev's current stream, with that stream's workspace, dev current during the call."""
    stream = state[4](dev)
    ws = _workspace(state, q, dev, stream, e.ws_bytes) if e.ws_bytes else None
    prev = state[2]()
    if prev != dev:
        state[3](dev)
    try:
        st = e.fwd(e.handle, e.addr, ws.data_ptr() if ws is not None else None, e.ws_bytes, stream)
    finally:
        if prev != dev:
            state[3](prev)
    if st != 0:
        _check(st, "flashattn_fwd")


def _workspace(state, q, dev, stream, nbytes):
    """A workspace tensor of at least `nbytes` for a call on (dev, stream): one per thread,
    device and stream, kept and grown as needed (calls on one stream run in order, so each may reuse
    it; a tensor dropped when it grows is reused by PyTorch's allocator only for work ordered after
    ours on that stream). While the stream is being captured into a CUDA graph a new one is taken
    from the graph's pool for every call, and never kept (it lives until the call is captured)."""
    if state[5]():
        return q.new_empty((nbytes,), dtype=state[0].uint8)
    last = getattr(_tls, "ws_last", None)  # (dev, stream, tensor, bytes) of this thread's last call
    if last is not None and last[0] == dev and last[1] == stream and last[3] >= nbytes:
        return last[2]
    try:
        cached = _tls.workspaces
    except AttributeError:
        cached = _tls.workspaces = {}
    ws = cached.get((dev, stream))
    if ws is None or ws.numel() < nbytes:
        ws = cached[(dev, stream)] = q.new_empty((nbytes,), dtype=state[0].uint8)
    _tls.ws_last = (dev, stream, ws, ws.numel())
    return ws


def _run(qa, p, stream):
    """flashattn_fwd for a filled FwdParams on q's device: its handle, a workspace from q's library
    (freed after the enqueue; the allocator reuses it only for work ordered after this call), and the
    given stream or q's library's current one."""
    with qa.lib.device_scope(qa):
        handle = get_handle(qa.device if qa.device is not None else -1)
        nbytes = workspace_size(handle, p)
        s = qa.lib.current_stream(qa) if stream is None else int(stream)
        if nbytes and qa.lib in (_CudaArrayInterface, _DLPack):
            # Arrays known only through a protocol: no library to allocate with, so the workspace is
            # taken from the CUDA runtime, ordered on the call's stream (cudaMallocAsync, then
            # cudaFreeAsync after the enqueue: the memory is reused only by work ordered after ours).
            rt = _lib.cudart()
            if rt is None:
                raise RuntimeError(f"this call needs a {nbytes}-byte workspace and its arrays "
                                   f"({type(qa.obj).__name__}) come with no allocator, nor was the CUDA "
                                   f"runtime found to take one from: pass torch or CuPy arrays")
            ptr = ctypes.c_void_p()
            err = rt.cudaMallocAsync(ctypes.byref(ptr), nbytes, s)
            if err != 0:
                raise RuntimeError(f"cudaMallocAsync of the call's {nbytes}-byte workspace failed: "
                                   f"{rt.cudaGetErrorString(err).decode()}")
            try:
                fwd(handle, p, ptr.value, nbytes, s)
            finally:
                rt.cudaFreeAsync(ptr, s)
            return
        ws = _empty(qa, (nbytes,), "u8") if nbytes else None
        fwd(handle, p, _ptr(ws) if ws is not None else 0, nbytes, s)


# ---- arguments as FlashAttention-2 takes them ---------------------------------------------------------

def _window(window_size):
    """window_size as a tuple of two ints. FlashAttention-2 indexes it, so a list or a tensor of two
    (its own tests pass torch.randint(0, seqlen_k, (2,))) works there; the entry points turn anything
    but a tuple into one, so that it can key the per-shape caches (a tensor, hashed by identity,
    would keep a stale value if changed in place), and the planning paths check a tuple's values.
    Any negative side is unbounded, as in FlashAttention-2 (the library's field takes -1 for it)."""
    if type(window_size) is tuple and len(window_size) == 2 and type(window_size[0]) is int and \
            type(window_size[1]) is int:
        if window_size[0] >= -1 and window_size[1] >= -1:
            return window_size
        return max(window_size[0], -1), max(window_size[1], -1)
    if len(window_size) != 2:
        raise FlashAttnValueError(f"window_size must be (left, right); got {len(window_size)} values")
    return max(int(window_size[0]), -1), max(int(window_size[1]), -1)


def _stream_scope(obj, stream):
    """For a torch tensor or a CuPy array: a context in which `stream` (an int cudaStream_t) is its
    library's current stream, so that whatever a call allocates, pads or copies besides its kernels
    is ordered with them and tied to that stream by the allocator. None for other arrays: they have
    no current stream, and nothing is allocated, padded or copied for them."""
    lib_ = _library_of(obj)
    if lib_ is _Torch:
        import torch
        return torch.cuda.stream(torch.cuda.ExternalStream(int(stream), device=obj.device))
    if lib_ is _CuPy:
        import cupy
        with warnings.catch_warnings():  # (newer CuPy deprecates ExternalStream; a raw handle has no other form)
            warnings.simplefilter("ignore", DeprecationWarning)
            try:
                return cupy.cuda.ExternalStream(int(stream), device_id=obj.device.id)
            except TypeError:  # CuPy before 10: no device_id (the stream must then be on obj's device)
                return cupy.cuda.ExternalStream(int(stream))
    return None


# ---- autograd: libflashattn computes the forward pass alone ------------------------------------------

_forward_only_fn = None  # the torch.autograd.Function below, made on first need


def _grad_recorded(state, q, k, v):
    """Whether autograd would record a call on q, k and v: grad mode on, and one of them a torch tensor
    that requires grad."""
    T = state[1]
    return (((isinstance(q, T) and q.requires_grad) or (isinstance(k, T) and k.requires_grad) or
             (isinstance(v, T) and v.requires_grad)) and state[0].is_grad_enabled())


def _without_backward(state, name, run, q, k, v, return_lse):
    """run()'s result (out, or (out, lse) with return_lse) as the output of an autograd node whose
    backward raises NotImplementedError. FlashAttention-2's functions are differentiable; these compute
    the forward pass only, and an output cut off from the graph would let training go on with no
    gradient reaching q, k or v. The LSE is marked non-differentiable."""
    global _forward_only_fn
    if _forward_only_fn is None:
        torch = state[0]

        class ForwardOnly(torch.autograd.Function):
            @staticmethod
            def forward(ctx, name, run, return_lse, q, k, v):
                ctx.name = name
                r = run()
                if not return_lse:
                    return r
                ctx.mark_non_differentiable(r[1])
                return r[0], r[1]

            @staticmethod
            def backward(ctx, *grads):
                raise NotImplementedError(
                    f"{ctx.name}: libflashattn computes the forward pass only, so no gradient reaches q, k or v. "
                    f"For inference, call it under torch.no_grad() or torch.inference_mode(), or on tensors that "
                    f"do not require grad; to train, use an implementation with a backward pass.")

        _forward_only_fn = ForwardOnly
    r = _forward_only_fn.apply(name, run, return_lse, q, k, v)
    return (r[0], r[1], _no_probs(q)) if return_lse else r


def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                    softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False,
                    *, out=None, stream=None, backend=Backend.AUTO):
    """FlashAttention-2's flash_attn_func on libflashattn.

    q: (batch, seqlen_q, nheads, headdim); k, v: (batch, seqlen_k, nheads_k, headdim), fp16/bf16,
    on one CUDA device, any strides (one whose last dimension is not contiguous is copied first, on
    the call's stream, as FlashAttention-2 copies it; arrays known only through a protocol are refused
    then). nheads % nheads_k == 0.
    causal: bottom-right aligned (FlashAttention >= 2.1). window_size: (left, right), a negative side
    unbounded. softmax_scale: None is 1/sqrt(headdim); any other float is taken as FlashAttention-2
    takes it, 0 and negative ones included (a negative one computes -q's attention at its magnitude,
    so -q is made first: torch and CuPy arrays). softcap: > 0 activates it, anything else disables it.
    alibi_slopes: fp32 (nheads,) or (batch, nheads). deterministic: always true.
    Returns out (batch, seqlen_q, nheads, headdim); with return_attn_probs, (out, softmax_lse
    (batch, nheads, seqlen_q) fp32, S_dmask): the probabilities are never materialised, and S_dmask
    is an empty (0,) array of q's dtype and device, as FlashAttention-2 returns it without dropout.
    Extensions: out= writes into a given array; stream= an int cudaStream_t (default: the input
    library's current stream; for torch and CuPy inputs the call runs as if it were the current
    one, so that outputs and padded copies are made on it); backend= a flashattn.Backend value.
    window_size may be any pair of ints (a tuple, a list, a tensor of two, as FlashAttention-2 takes).
    Raises FlashAttnValueError/FlashAttnTypeError (ValueError/TypeError, and RuntimeError as
    FlashAttention-2's checks raise) for inputs it cannot take, naming the argument, and
    FlashAttnError (a RuntimeError) for anything the library refuses.
    Autograd: the forward pass only. Where autograd records the call (grad mode on, and q, k or v
    requires grad) out has a grad_fn whose backward raises NotImplementedError, so that no gradient
    is silently lost (out= is then refused: FlashAttnValueError); under torch.no_grad() or
    torch.inference_mode(), or on tensors that do not require grad, out has none.
    PyTorch calls without out=, stream= or alibi_slopes reuse per-shape state (a thread-local cache),
    so their host cost is a few attribute reads, two allocations and the library call.
    """
    _refuse_dropout(dropout_p)
    del deterministic  # every call is deterministic
    if stream is not None:
        scope = _stream_scope(q, stream)
        if scope is not None:
            with scope:
                return flash_attn_func(q, k, v, 0.0, softmax_scale, causal, window_size, softcap, alibi_slopes, False,
                                       return_attn_probs, out=out, backend=backend)
    if window_size.__class__ is not tuple:  # (a tuple is checked where a call is first planned)
        window_size = _window(window_size)
    state = _torch_state or _torch()
    if (state is not None and out is None and stream is None and alibi_slopes is None and type(q) is state[1]
            and type(k) is state[1] and type(v) is state[1] and q.is_cuda
            and not ((q.requires_grad or k.requires_grad or v.requires_grad) and state[0].is_grad_enabled())):
        r = _fast_call(state, q, k, v, softmax_scale, causal, window_size, softcap, return_attn_probs, backend)
        if r is not None:
            return r
    if state is not None and _grad_recorded(state, q, k, v):
        if out is not None:
            raise FlashAttnValueError("out= takes no part in autograd, and q, k or v requires grad: call without out=, "
                                      "or under torch.no_grad()")

        def run():
            r = flash_attn_func(q.detach(), k.detach(), v.detach(), 0.0, softmax_scale, causal, window_size, softcap,
                                alibi_slopes, False, return_attn_probs, stream=stream, backend=backend)
            return r[:2] if return_attn_probs else r
        return _without_backward(state, "flash_attn_func", run, q, k, v, return_attn_probs)
    qa, ka, va = _check_qkv(q, k, v)
    B, Sq, Hq, D = qa.shape
    padded = (D + 7) // 8 * 8
    if padded != D:
        q, k, v = (a.lib.pad_head_dim(a, padded) for a in (qa, ka, va))
        qa, ka, va = _Array(q, "q"), _Array(k, "k"), _Array(v, "v")
    qa, ka, va = (_last_contiguous(a) for a in (qa, ka, va))
    qa = _signed_q(qa, softmax_scale)

    write_into = None
    if out is not None and padded == D:
        oa = _Array(out, "out")
        if oa.shape != (B, Sq, Hq, D) or oa.dtype != qa.dtype or oa.strides[-1] != 1:
            raise FlashAttnValueError(
                f"out must be a {(B, Sq, Hq, D)} array of q's dtype, contiguous in its last dimension")
        result = out
    else:
        if out is not None:
            write_into = out
        result = _empty(qa, (B, Sq, Hq, padded), "same")
        oa = _Array(result, "out")
    lse = None
    if return_attn_probs:
        lse = _empty(qa, (B, Hq, Sq), "f32")
    slopes = _alibi_array(alibi_slopes, B, Hq) if alibi_slopes is not None else None

    p = FwdParams.new()
    _set_params(p, qa, ka, va, oa.ptr, oa.strides, _ptr(lse) if lse is not None else None, D, padded, softmax_scale,
                causal, window_size, softcap, slopes, backend)
    _run(qa, p, stream)
    if padded != D:
        result = result[..., :D]
        if write_into is not None:
            write_into[...] = result
            result = write_into
    return (result, lse, _no_probs(q)) if return_attn_probs else result


# ---- serving calls: ragged batches, paged and indexed KV caches ---------------------------------------

def _int32_array(obj, name, ndim, device):
    """(pointer, shape, strides in elements) of an int32 CUDA array of `ndim` dimensions, contiguous in
    its last one, on `device`. Anything else is refused, never copied: a silent host-to-device copy
    would be a hidden synchronisation and would break CUDA-graph capture."""
    mod = type(obj).__module__.split(".")[0]
    if mod == "torch":
        import torch
        if not obj.is_cuda or obj.dtype != torch.int32:
            raise FlashAttnTypeError(f"{name} must be an int32 CUDA tensor (got {obj.dtype} on {obj.device})")
        ptr, shape, strides, dev = obj.data_ptr(), tuple(obj.shape), tuple(obj.stride()), obj.device.index
    elif hasattr(obj, "__cuda_array_interface__"):
        cai = obj.__cuda_array_interface__
        if cai["typestr"] != "<i4":
            raise FlashAttnTypeError(f"{name} must be an int32 CUDA array (typestr {cai['typestr']})")
        ptr, shape = cai["data"][0], tuple(cai["shape"])
        strides = tuple(x // 4 for x in cai["strides"]) if cai.get("strides") else _contiguous(shape)
        dev = obj.device.id if mod == "cupy" else None
    else:
        raise FlashAttnTypeError(f"{name}: {type(obj).__name__} is not an int32 CUDA array")
    if len(shape) != ndim:
        raise FlashAttnValueError(f"{name} has shape {shape}; expected {ndim} dimension(s)")
    if shape[-1] > 1 and strides[-1] != 1:
        raise FlashAttnValueError(f"{name} must be contiguous in its last dimension (stride {strides[-1]})")
    if device is not None and dev is not None and dev != device:
        raise FlashAttnValueError(f"{name} is on device {dev} but q is on device {device}")
    return ptr, shape, strides


def _per_sequence(obj, name, batch, device):
    """The pointer of an int32 CUDA array with one entry per sequence (_int32_array's rules)."""
    ptr, shape, _ = _int32_array(obj, name, 1, device)
    if shape[0] != batch:
        raise FlashAttnValueError(f"{name} has {shape[0]} entries; expected batch = {batch}")
    return ptr


class _ServingCall:
    """A serving call ready to run: its FwdParams filled but for O and LSE, q's _Array, the output
    shapes (at the real head dim D), the arrays that must outlive the call (`keep`), and of those
    the ones the call made itself (`owned`: an int cache_seqlens' tensor), which its params point to
    for as long as they are used. `write_back`: (cache, padded copy) pairs of a call that appends to a
    cache whose head dim was padded: the copy is what the library wrote, and goes back into the
    cache after the call."""
    __slots__ = ("p", "qa", "out_shape", "lse_shape", "D", "keep", "owned", "write_back", "copied")

    def __init__(self, p, qa, out_shape, lse_shape, D, keep, owned=()):
        self.p, self.qa, self.out_shape, self.lse_shape, self.D, self.keep = p, qa, out_shape, lse_shape, D, keep
        self.owned = tuple(owned)
        self.write_back = ()
        # Whether the params point to a copy of an argument (a last dimension made contiguous): such a
        # call is not kept by _serving_fast, whose hits pass the arguments' own addresses.
        self.copied = any(getattr(x, "copied", False) for x in keep)


def _serving_fields(qa, p, out_shape, lse_shape, D, softmax_scale, causal, window_size, softcap, alibi_slopes, keep,
                    owned=()):
    """Sets the fields every serving call shares (p already has the shapes, strides and serving
    fields); returns the _ServingCall."""
    padded = p.head_dim
    p.dtype = qa.dtype
    p.softmax_scale = _scale_field(softmax_scale, D, padded)
    p.softcap = _softcap_field(softcap)
    p.mask = Mask.CAUSAL_BOTTOM_RIGHT if causal else Mask.NONE
    p.window_left, p.window_right = _window(window_size)
    if alibi_slopes is not None:
        slopes = _alibi_array(alibi_slopes, p.batch, p.heads_q)
        _set_alibi(p, slopes)
        keep.append(slopes)
    return _ServingCall(p, qa, out_shape, lse_shape, D, keep, owned)


def _serving_run(sc, return_lse, stream):
    """Allocates out (at the padded head dim) and LSE next to q, runs the call, and returns (out sliced
    back to head dim D, lse)."""
    p, qa = sc.p, sc.qa
    padded = p.head_dim
    result = _empty(qa, sc.out_shape[:-1] + (padded,), "same")
    oa = _Array(result, "out")
    lse = _empty(qa, sc.lse_shape, "f32") if return_lse else None
    p.o = oa.ptr
    p.o_seq_stride, p.o_head_stride = oa.strides[-3], oa.strides[-2]
    p.o_batch_stride = oa.strides[0] if len(sc.out_shape) == 4 else 0
    p.lse = _ptr(lse) if lse is not None else None
    _run(qa, p, stream)
    for cache, copy in sc.write_back:  # (current stream: the call's, stream= having been made current)
        qa.lib.copy_head_dims(cache, copy)
    if padded != sc.D:
        result = result[..., :sc.D]
    return result, lse


# The FwdParams fields each serving function fills from its tensor arguments, in the order
# _serving_fast receives them.
_VARLEN_FIELDS = ("q", "k", "v", "cu_seqlens_q", "cu_seqlens_k", "block_table", "seqused_k", "alibi_slopes")
_KVCACHE_FIELDS = ("q", "k", "v", "k_new", "v_new", "rotary_cos", "rotary_sin", "seqused_k", "kv_batch_idx",
                   "cache_leftpad", "block_table", "alibi_slopes")


class _ServingEntry:
    """What a serving call of one structure reuses: its params (pointers set per call), the output
    shapes, which fields take which argument's address, the workspace size, handle and entry point,
    and what the call made itself (`owned`). No reference to a caller's tensor: a cached entry must
    not keep a KV cache the caller has dropped alive."""
    __slots__ = ("params", "out_shape", "lse_shape", "owned", "slots", "ws_bytes", "handle", "fwd", "addr")


def _serving_fast(kind, fields, tensors, options, build, return_lse):
    """(out, lse) of a serving call whose tensor arguments are all torch CUDA tensors (or None),
    through a per-thread cache keyed by everything the plan depends on: each tensor's shape,
    strides, dtype, device and address alignment, and the options. A miss builds the call with the
    general path's checks (`build`, which raises as it does) and runs it; a hit only sets the
    tensors' addresses, allocates out (and LSE) and calls the library. None: the general path
    must run (another array library, or an unhashable option)."""
    state = _torch_state or _torch()
    if state is None:
        return None
    T = state[1]
    q = tensors[0]
    if type(q) is not T or not q.is_cuda:
        return None
    shapes = []
    for t in tensors:
        if t is None:
            shapes.append(None)
        elif type(t) is not T:
            return None
        else:
            shapes.append((t.shape, t.stride(), t.dtype, t.get_device(), t.data_ptr() & 15))
    key = (kind, options, return_lse, tuple(shapes))
    try:
        cache = _tls.serving_cache
    except AttributeError:
        cache = _tls.serving_cache = {}
    try:
        e = cache.get(key)
    except TypeError:  # an unhashable option (e.g. a list window_size)
        return None
    if e is None:
        sc = build()
        out, lse = _serving_run(sc, return_lse, None)
        # Padded or contiguous copies of arguments are never reused, nor what a capture built (an int
        # cache_seqlens' tensor would be filled only when the graph replays).
        if sc.p.head_dim == sc.D and not sc.copied and not state[5]():
            e = _ServingEntry()
            e.params, e.addr, e.out_shape, e.lse_shape, e.owned = sc.p, ctypes.addressof(sc.p), sc.out_shape, \
                sc.lse_shape, sc.owned
            e.slots = tuple((name, i) for i, (name, t) in enumerate(zip(fields, tensors)) if t is not None)
            handle = get_handle(sc.qa.device)
            e.ws_bytes = workspace_size(handle, sc.p)
            e.handle, e.fwd = handle.ptr, lib().flashattn_fwd
            if len(cache) >= _FAST_CACHE_MAX:
                cache.clear()
            cache[key] = e
        return out, lse
    p = e.params
    for name, i in e.slots:
        setattr(p, name, tensors[i].data_ptr())
    out = q.new_empty(e.out_shape)
    p.o = out.data_ptr()
    lse = None
    if return_lse:
        lse = q.new_empty(e.lse_shape, dtype=state[0].float32)
        p.lse = lse.data_ptr()
    _enqueue(state, q, q.get_device(), e)
    return out, lse


def _padded_arrays(arrays, ndim, names=("q", "k", "v"), caches=False):
    """_Arrays of q, k, v checked for rank and dtype, padded to a head dim that is a multiple of 8
    when needed, and copied where their last dimension is not contiguous (FlashAttention-2 copies
    them). With `caches`, k and v are KV caches the call may write: one whose last dimension is not
    contiguous is refused, as FlashAttention-2 refuses it (a copy would not receive the appended
    rows). Returns (q, k, v _Arrays, real head dim, padded)."""
    qa, ka, va = (_Array(x, n) for x, n in zip(arrays, names))
    for a, nd in zip((qa, ka, va), ndim):
        if len(a.shape) != nd:
            raise FlashAttnValueError(f"{a.name} has shape {a.shape}; expected {nd} dimensions")
        if a.dtype not in (Dtype.FLOAT16, Dtype.BFLOAT16):
            raise FlashAttnTypeError(f"{a.name} must be float16 or bfloat16")
        if caches and a is not qa and a.strides[-1] != 1:
            raise FlashAttnValueError(f"{a.name} must have a contiguous last dimension (stride {a.strides[-1]})")
    if not (qa.dtype == ka.dtype == va.dtype):
        raise FlashAttnTypeError("q, k and v must have the same dtype")
    if ka.shape != va.shape:
        raise FlashAttnValueError(f"{ka.name} has shape {ka.shape} but {va.name} has shape {va.shape}")
    D = qa.shape[-1]
    if ka.shape[-1] != D:
        raise FlashAttnValueError(f"{ka.name} has head dim {ka.shape[-1]} but q has {D}")
    if len({a.device for a in (qa, ka, va) if a.device is not None}) > 1:
        raise FlashAttnValueError("q, k and v are on different devices")
    padded = (D + 7) // 8 * 8
    if padded != D:
        qa, ka, va = (_Array(a.lib.pad_head_dim(a, padded), a.name) for a in (qa, ka, va))
    qa, ka, va = (_last_contiguous(a) for a in (qa, ka, va))
    return qa, ka, va, D, padded


def _set_paged(p, ka, va, block_table, B, dev, keep):
    """K/V as page pools (num_pages, page_size, nheads_k, headdim) through block_table (B, max_pages)."""
    ptr, shape, strides = _int32_array(block_table, "block_table", 2, dev)
    if shape[0] != B:
        raise FlashAttnValueError(f"block_table has {shape[0]} rows; expected one per sequence ({B})")
    keep.append(block_table)
    p.block_table, p.pages_per_seq = ptr, shape[1]
    p.block_table_batch_stride = strides[0] if B > 1 else max(strides[0], shape[1])
    p.num_pages, p.page_size = ka.shape[0], ka.shape[1]
    p.k_batch_stride, p.v_batch_stride = ka.strides[0], va.strides[0]


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                           softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                           deterministic=False, return_attn_probs=False, block_table=None, seqused_k=None,
                           *, stream=None, backend=Backend.AUTO):
    """FlashAttention-2's flash_attn_varlen_func on libflashattn: a batch of sequences of different lengths.

    q: (total_q, nheads, headdim); k, v: (total_k, nheads_k, headdim), or with block_table the page
    pools (num_blocks, page_block_size, nheads_k, headdim) (any page size). cu_seqlens_q/k: int32 CUDA
    (batch + 1,) offsets (with block_table, cu_seqlens_k gives the key counts only); seqused_k: int32
    (batch,) keys used per sequence, overriding cu_seqlens_k's counts. max_seqlen_q/k: host ints, the
    longest sequence (capacities: a captured CUDA graph stays correct for any lengths within them).
    block_table: int32 (batch, max_pages), contiguous rows (a column slice is fine). q, k or v whose
    last dimension is not contiguous is copied first, as flash_attn_func says.
    causal is bottom-right within each sequence. Returns out (total_q, nheads, headdim); with
    return_attn_probs, (out, softmax_lse (nheads, total_q) fp32, an empty (0,) array as
    flash_attn_func's). Rows past cu_seqlens_q[-1] are not written (out is torch.empty-like there).
    Nothing on this path reads device memory on the host or synchronises: it can be captured in a
    CUDA graph. PyTorch calls without stream= reuse per-structure state (a thread-local cache), as
    flash_attn_func's do. Autograd: the forward pass only, as flash_attn_func says (a recorded
    call's out has a backward that raises).
    """
    _refuse_dropout(dropout_p)
    del deterministic
    if stream is not None:
        scope = _stream_scope(q, stream)
        if scope is not None:
            with scope:
                return flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, 0.0,
                                              softmax_scale, causal, window_size, softcap, alibi_slopes, False,
                                              return_attn_probs, block_table, seqused_k, backend=backend)
    if window_size.__class__ is not tuple:  # (a tuple is checked where a call is first planned)
        window_size = _window(window_size)
    state = _torch_state or _torch()
    if state is not None and _grad_recorded(state, q, k, v):
        def run():
            r = flash_attn_varlen_func(q.detach(), k.detach(), v.detach(), cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                       max_seqlen_k, 0.0, softmax_scale, causal, window_size, softcap, alibi_slopes,
                                       False, return_attn_probs, block_table, seqused_k, stream=stream, backend=backend)
            return r[:2] if return_attn_probs else r
        return _without_backward(state, "flash_attn_varlen_func", run, q, k, v, return_attn_probs)
    build = lambda: _varlen_call(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale,
                                 causal, window_size, softcap, alibi_slopes, block_table, seqused_k, backend)
    r = None
    if stream is None:
        r = _serving_fast(0, _VARLEN_FIELDS,
                          (q, k, v, cu_seqlens_q, cu_seqlens_k, block_table, seqused_k, alibi_slopes),
                          (max_seqlen_q, max_seqlen_k, softmax_scale, causal, window_size, softcap, backend), build,
                          return_attn_probs)
    out, lse = r if r is not None else _serving_run(build(), return_attn_probs, stream)
    return (out, lse, _no_probs(q)) if return_attn_probs else out


def _varlen_call(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal, window_size,
                 softcap, alibi_slopes, block_table, seqused_k, backend):
    """flash_attn_varlen_func's checks and parameters: a _ServingCall."""
    paged = block_table is not None
    qa, ka, va, D, padded = _padded_arrays((q, k, v), (3, 4 if paged else 3, 4 if paged else 3))
    qa = _signed_q(qa, softmax_scale)
    dev = qa.device
    keep = [qa, ka, va]
    cq, cq_shape, _ = _int32_array(cu_seqlens_q, "cu_seqlens_q", 1, dev)
    ck, ck_shape, _ = _int32_array(cu_seqlens_k, "cu_seqlens_k", 1, dev)
    B = cq_shape[0] - 1
    if B < 1 or ck_shape[0] != B + 1:
        raise FlashAttnValueError(f"cu_seqlens_q has {cq_shape[0]} entries and cu_seqlens_k {ck_shape[0]}; "
                                  f"both must be batch + 1 >= 2")
    total_q, Hq, _ = qa.shape
    p = FwdParams.new()
    p.backend = backend
    p.batch, p.seqlen_q, p.seqlen_k = B, int(max_seqlen_q), int(max_seqlen_k)
    p.heads_q, p.heads_kv, p.head_dim = Hq, ka.shape[-2], padded
    p.q, p.q_seq_stride, p.q_head_stride = qa.ptr, qa.strides[0], qa.strides[1]
    p.cu_seqlens_q, p.total_q = cq, total_q
    p.k, p.v = ka.ptr, va.ptr
    p.k_seq_stride, p.k_head_stride = ka.strides[-3], ka.strides[-2]
    p.v_seq_stride, p.v_head_stride = va.strides[-3], va.strides[-2]
    p.cu_seqlens_k = ck
    if paged:
        _set_paged(p, ka, va, block_table, B, dev, keep)
    else:
        p.total_k = ka.shape[0]
    if seqused_k is not None:
        p.seqused_k = _per_sequence(seqused_k, "seqused_k", B, dev)
    return _serving_fields(qa, p, (total_q, Hq, D), (Hq, total_q), D, softmax_scale, causal, window_size, softcap,
                           alibi_slopes, keep)


def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, rotary_cos=None, rotary_sin=None,
                            cache_seqlens=None, cache_batch_idx=None, cache_leftpad=None, block_table=None,
                            softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                            rotary_interleaved=True, alibi_slopes=None, num_splits=0, return_softmax_lse=False,
                            *, stream=None, backend=Backend.AUTO):
    """FlashAttention-2's flash_attn_with_kvcache on libflashattn: attention over a KV cache.

    q: (batch, seqlen_q, nheads, headdim); k_cache, v_cache: (batch_cache, seqlen_cache, nheads_k,
    headdim), or with block_table the page pools (num_blocks, page_block_size, nheads_k, headdim)
    (any page size); the caches' last dimension must be contiguous. cache_seqlens: int, or int32 CUDA
    (batch,): keys in use per sequence (default: the whole cache). cache_batch_idx: int32 CUDA (batch,),
    which cache row each sequence reads (dense cache only; without it sequence b reads row b, and the
    cache may have more rows than q has sequences, as in FlashAttention-2). As in FlashAttention-2,
    q, k and v whose last dimension is not contiguous are copied first, and so are torch block_table
    and cache_batch_idx whose last stride is not 1 (device copies on the call's stream, captured by
    a CUDA graph like the call). causal is bottom-right. num_splits is accepted and ignored (the
    library decides).
    k, v: (batch, seqlen_new, nheads_k, headdim), appended to the cache at cache_seqlens (which is then
    required) before attending; the cache tensors are written (with a head dim that is not a multiple
    of 8, the call works on padded copies of the caches and copies them back whole afterwards, as
    FlashAttention-2 does: pad the caches to a multiple of 8 to avoid it). rotary_cos, rotary_sin:
    (seqlen_ro, rotary_dim / 2) in q's dtype, seqlen_ro at least the cache's capacity in keys
    (k_cache's seqlen, or the block table's pages x page size: FlashAttention-2's check), applied to
    k and to q (with causal or a window, query row i at cache_seqlens + i; otherwise every row at
    cache_seqlens; a window being a window_size other than (-1, -1) once any negative side is read
    as -1), GPT-J interleaved pairs when rotary_interleaved (the default), GPT-NeoX halves
    otherwise; q itself is not modified.
    cache_leftpad: int32 CUDA (batch,): the first cache row of each sequence (the rows before it are
    padding and not attended to; dense cache only, as in FlashAttention-2). Positions (where k goes,
    the rotary rows) still count from row 0.
    Returns out (batch, seqlen_q, nheads, headdim); with return_softmax_lse, (out, lse (batch, nheads,
    seqlen_q) fp32). PyTorch calls without stream= reuse per-structure state (a thread-local cache;
    an int cache_seqlens is kept as a tensor of that value).
    """
    if (k is None) != (v is None):
        raise FlashAttnValueError("pass k and v together (the new keys and their values), or neither")
    if (rotary_cos is None) != (rotary_sin is None):
        raise FlashAttnValueError("pass rotary_cos and rotary_sin together, or neither")
    if rotary_cos is not None and k is None:
        raise FlashAttnValueError("rotary_cos/rotary_sin rotate the appended keys: they need k and v")
    if k is not None and cache_seqlens is None:
        raise FlashAttnValueError("appending k and v needs cache_seqlens (where each sequence's new keys go)")
    del num_splits
    if stream is not None:
        scope = _stream_scope(q, stream)
        if scope is not None:
            with scope:
                return flash_attn_with_kvcache(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens,
                                               cache_batch_idx, cache_leftpad, block_table, softmax_scale, causal,
                                               window_size, softcap, rotary_interleaved, alibi_slopes, 0,
                                               return_softmax_lse, backend=backend)
    if window_size.__class__ is not tuple:  # (a tuple is checked where a call is first planned)
        window_size = _window(window_size)
    build = lambda: _kvcache_call(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx,
                                  cache_leftpad, block_table, softmax_scale, causal, window_size, softcap,
                                  rotary_interleaved, alibi_slopes, backend)
    r = None
    if stream is None:
        lens_int = isinstance(cache_seqlens, int)
        r = _serving_fast(1, _KVCACHE_FIELDS,
                          (q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, None if lens_int else cache_seqlens,
                           cache_batch_idx, cache_leftpad, block_table, alibi_slopes),
                          (cache_seqlens if lens_int else None, softmax_scale, causal, window_size, softcap,
                           rotary_interleaved, backend), build, return_softmax_lse)
    out, lse = r if r is not None else _serving_run(build(), return_softmax_lse, stream)
    return (out, lse) if return_softmax_lse else out


def _contiguous_rows(obj):
    """(obj, False), or for a torch tensor whose last stride is not 1 (a column slice of a block
    table, every other entry of an index), (a contiguous copy, True): flash_attn_with_kvcache copies
    its block_table and cache_batch_idx so, as FlashAttention-2 does. The copy is a device copy on
    the current stream, which a CUDA graph captures (a replay copies the current contents)."""
    if obj is not None and type(obj).__module__.split(".")[0] == "torch" and obj.dim() > 0 and obj.stride(-1) != 1:
        return obj.contiguous(), True
    return obj, False


def _kvcache_call(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx, cache_leftpad,
                  block_table, softmax_scale, causal, window_size, softcap, rotary_interleaved, alibi_slopes, backend):
    """flash_attn_with_kvcache's checks and parameters: a _ServingCall (an int cache_seqlens becomes a
    tensor of that value, kept with it)."""
    block_table, table_copied = _contiguous_rows(block_table)
    cache_batch_idx, index_copied = _contiguous_rows(cache_batch_idx)
    paged = block_table is not None
    qa, ka, va, D, padded = _padded_arrays((q, k_cache, v_cache), (4, 4, 4), ("q", "k_cache", "v_cache"), True)
    qa = _signed_q(qa, softmax_scale)
    dev = qa.device
    keep = [qa, ka, va]
    B, Sq, Hq, _ = qa.shape
    p = FwdParams.new()
    p.backend = backend
    p.batch, p.seqlen_q, p.heads_q, p.heads_kv, p.head_dim = B, Sq, Hq, ka.shape[2], padded
    p.q, (p.q_batch_stride, p.q_seq_stride, p.q_head_stride) = qa.ptr, qa.strides[:3]
    p.k, p.v = ka.ptr, va.ptr
    p.k_seq_stride, p.k_head_stride = ka.strides[1], ka.strides[2]
    p.v_seq_stride, p.v_head_stride = va.strides[1], va.strides[2]
    if paged:
        if cache_batch_idx is not None:
            raise FlashAttnValueError("cache_batch_idx indexes a dense cache; it cannot be combined with block_table")
        if cache_leftpad is not None:
            raise FlashAttnValueError("cache_leftpad pads a dense cache; it cannot be combined with block_table")
        _set_paged(p, ka, va, block_table, B, dev, keep)
        p.seqlen_k = p.pages_per_seq * p.page_size
    else:
        p.seqlen_k = ka.shape[1]
        p.k_batch_stride, p.v_batch_stride = ka.strides[0], va.strides[0]
        if cache_batch_idx is not None:
            p.kv_batch_idx, p.kv_batch = _per_sequence(cache_batch_idx, "cache_batch_idx", B, dev), ka.shape[0]
            keep.append(cache_batch_idx)
        elif ka.shape[0] < B:
            # (A larger cache is fine: sequence b reads its row b, as in FlashAttention-2.)
            raise FlashAttnValueError(
                f"k_cache has batch {ka.shape[0]} but q has {B} (pass cache_batch_idx to index it)")
        if cache_leftpad is not None:
            p.cache_leftpad = _per_sequence(cache_leftpad, "cache_leftpad", B, dev)
            keep.append(cache_leftpad)
    owned = []
    if cache_seqlens is not None:
        if isinstance(cache_seqlens, int):
            if qa.lib is not _Torch:
                raise FlashAttnTypeError("cache_seqlens as an int needs torch tensors; pass an int32 CUDA array")
            import torch
            cache_seqlens = torch.full((B,), cache_seqlens, dtype=torch.int32, device=qa.obj.device)
            owned.append(cache_seqlens)
        p.seqused_k = _per_sequence(cache_seqlens, "cache_seqlens", B, dev)
        keep.append(cache_seqlens)
    if k is not None:
        na, nv = _Array(k, "k"), _Array(v, "v")
        for a in (na, nv):
            if len(a.shape) != 4 or a.shape[0] != B or a.shape[2] != ka.shape[2] or a.shape[3] != D:
                raise FlashAttnValueError(
                    f"{a.name} has shape {a.shape}; expected ({B}, seqlen_new, {ka.shape[2]}, {D})")
            if a.dtype != qa.dtype:
                raise FlashAttnTypeError(f"{a.name} must have q's dtype")
        if na.shape != nv.shape:
            raise FlashAttnValueError(f"k has shape {na.shape} but v has shape {nv.shape}")
        if padded != D:
            na, nv = (_Array(a.lib.pad_head_dim(a, padded), a.name) for a in (na, nv))
        na, nv = _last_contiguous(na), _last_contiguous(nv)
        keep += [na, nv]
        p.k_new, (p.k_new_batch_stride, p.k_new_seq_stride, p.k_new_head_stride) = na.ptr, na.strides[:3]
        p.v_new, (p.v_new_batch_stride, p.v_new_seq_stride, p.v_new_head_stride) = nv.ptr, nv.strides[:3]
        p.seqlen_new = na.shape[1]
    if rotary_cos is not None:
        ca, sa = _Array(rotary_cos, "rotary_cos"), _Array(rotary_sin, "rotary_sin")
        for a in (ca, sa):
            if a.dtype != qa.dtype or len(a.shape) != 2 or a.strides != _contiguous(a.shape):
                raise FlashAttnValueError(
                    f"{a.name} must be a contiguous (seqlen_ro, rotary_dim / 2) array of q's dtype "
                    f"(got shape {a.shape}, strides {a.strides})")
        if ca.shape != sa.shape:
            raise FlashAttnValueError(f"rotary_cos has shape {ca.shape} but rotary_sin has shape {sa.shape}")
        if ca.shape[0] < p.seqlen_k:  # (FlashAttention-2's check: a row for every position the cache holds)
            raise FlashAttnValueError(f"rotary_cos has {ca.shape[0]} rows; it needs one for each of the cache's "
                                      f"{p.seqlen_k} positions (seqlen_ro >= seqlen_k, as in FlashAttention-2)")
        keep += [ca, sa]
        p.rotary_cos, p.rotary_sin = ca.ptr, sa.ptr
        p.seqlen_ro, p.rotary_dim = ca.shape[0], 2 * ca.shape[1]
        p.rotary_interleaved = 1 if rotary_interleaved else 0
    sc = _serving_fields(qa, p, (B, Sq, Hq, D), (B, Hq, Sq), D, softmax_scale, causal, window_size, softcap,
                         alibi_slopes, keep, owned)
    if rotary_cos is not None:
        # FlashAttention-2's documented rule: causal or local (window_size != (-1, -1)), query row i at
        # cache_seqlens + i; else all rows there. The window as the call's fields hold it (a negative
        # side -1, unbounded).
        p.rotary_q_at_cache_len = 0 if (causal or (p.window_left, p.window_right) != (-1, -1)) else 1
    sc.copied = sc.copied or table_copied or index_copied
    if k is not None and padded != D:
        # The library appended to padded copies of the caches: they go back after the call, whole, as
        # FlashAttention-2 copies its padded caches back (the rows written are known only on the device).
        sc.write_back = ((k_cache, ka.obj), (v_cache, va.obj))
    return sc


# ---- FlashAttention-2's packed-input forms: views of one tensor, then the functions above -------------

def _unpack(x, name, axis, count, ndim, layout):
    """The `count` views x[..., i, ...] (index i on `axis`) of a packed q/k/v tensor: no copy."""
    a = _Array(x, name)
    if len(a.shape) != ndim or a.shape[axis] != count:
        raise FlashAttnValueError(f"{name} has shape {a.shape}; expected {layout}")
    if not hasattr(x, "__getitem__"):
        raise FlashAttnTypeError(f"{name} must be a torch tensor or a CuPy array (packed inputs are split by indexing)")
    lead = (slice(None),) * axis
    return [x[lead + (i,)] for i in range(count)]


def flash_attn_qkvpacked_func(qkv, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                              softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False,
                              *, out=None, stream=None, backend=Backend.AUTO):
    """FlashAttention-2's flash_attn_qkvpacked_func: flash_attn_func on qkv (batch, seqlen, 3, nheads,
    headdim), q, k and v read in place (qkv[:, :, 0], [:, :, 1], [:, :, 2]; no copy). Same arguments,
    returns and errors as flash_attn_func."""
    q, k, v = _unpack(qkv, "qkv", 2, 3, 5, "(batch, seqlen, 3, nheads, headdim)")
    return flash_attn_func(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                           deterministic, return_attn_probs, out=out, stream=stream, backend=backend)


def flash_attn_kvpacked_func(q, kv, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                             softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False,
                             *, out=None, stream=None, backend=Backend.AUTO):
    """FlashAttention-2's flash_attn_kvpacked_func: flash_attn_func on q (batch, seqlen_q, nheads,
    headdim) and kv (batch, seqlen_k, 2, nheads_k, headdim), k and v read in place (kv[:, :, 0] and
    [:, :, 1]). Same arguments, returns and errors as flash_attn_func."""
    k, v = _unpack(kv, "kv", 2, 2, 5, "(batch, seqlen_k, 2, nheads_k, headdim)")
    return flash_attn_func(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                           deterministic, return_attn_probs, out=out, stream=stream, backend=backend)


def flash_attn_varlen_qkvpacked_func(qkv, cu_seqlens, max_seqlen, dropout_p=0.0, softmax_scale=None, causal=False,
                                     window_size=(-1, -1), softcap=0.0, alibi_slopes=None, deterministic=False,
                                     return_attn_probs=False, *, stream=None, backend=Backend.AUTO):
    """FlashAttention-2's flash_attn_varlen_qkvpacked_func: flash_attn_varlen_func on qkv (total, 3,
    nheads, headdim) with the same offsets for queries and keys (cu_seqlens int32 CUDA (batch + 1,),
    max_seqlen a host int). Returns out (total, nheads, headdim); with return_attn_probs, (out,
    softmax_lse (nheads, total) fp32, an empty (0,) array as flash_attn_func's)."""
    q, k, v = _unpack(qkv, "qkv", 1, 3, 4, "(total, 3, nheads, headdim)")
    return flash_attn_varlen_func(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, dropout_p,
                                  softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
                                  return_attn_probs, stream=stream, backend=backend)


def flash_attn_varlen_kvpacked_func(q, kv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                                    softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                                    alibi_slopes=None, deterministic=False, return_attn_probs=False,
                                    *, stream=None, backend=Backend.AUTO):
    """FlashAttention-2's flash_attn_varlen_kvpacked_func: flash_attn_varlen_func on q (total_q, nheads,
    headdim) and kv (total_k, 2, nheads_k, headdim), k and v read in place (kv[:, 0] and kv[:, 1])."""
    k, v = _unpack(kv, "kv", 1, 2, 4, "(total_k, 2, nheads_k, headdim)")
    return flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p,
                                  softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
                                  return_attn_probs, stream=stream, backend=backend)


def merge_attn_states(outs, lses, *, lse_base2=False, stream=None):
    """Merges partial attention results over disjoint key sets into the result over their union.

    outs: (S, batch, seqlen, nheads, headdim) or, packed (varlen), (S, total, nheads, headdim): float16,
    bfloat16 or float32, head dim contiguous. lses: (S, batch, nheads, seqlen) or (S, nheads, total),
    float32 (natural log; base 2 with lse_base2=True, FlashInfer's convention). Parts are added in
    order (deterministic); a part whose LSE is -inf or +inf (FlashAttention-2's empty row) counts for
    nothing; a row no part covers gets out 0 and lse -inf. Returns (out, lse): out like one part, in
    outs' dtype; lse float32 like one part of lses.
    """
    if stream is not None:
        scope = _stream_scope(outs, stream)
        if scope is not None:
            with scope:
                return merge_attn_states(outs, lses, lse_base2=lse_base2)
    oa, la = _Array(outs, "outs"), _Array(lses, "lses")
    varlen = len(oa.shape) == 4
    if len(oa.shape) not in (4, 5):
        raise FlashAttnValueError(f"outs has shape {oa.shape}; expected (S, batch, seqlen, nheads, headdim) or "
                                  f"(S, total, nheads, headdim)")
    if la.dtype != "f32":
        raise FlashAttnTypeError("lses must be float32")
    S, D = oa.shape[0], oa.shape[-1]
    if varlen:
        _, T, H, _ = oa.shape
        B, Sq = 1, T
        want_lse = (S, H, T)
        o_st = (oa.strides[0], 0, oa.strides[1], oa.strides[2])
        l_st = (la.strides[0], 0, la.strides[1], la.strides[2]) if la.shape == want_lse else None
    else:
        _, B, Sq, H, _ = oa.shape
        want_lse = (S, B, H, Sq)
        o_st = tuple(oa.strides[:4])
        l_st = tuple(la.strides) if la.shape == want_lse else None
    if l_st is None:
        raise FlashAttnValueError(f"lses has shape {la.shape}; expected {want_lse} for outs of shape {oa.shape}")
    if oa.strides[-1] != 1:
        raise FlashAttnValueError(f"outs must be contiguous in its last dimension (stride {oa.strides[-1]})")
    dtypes = {Dtype.FLOAT16: Dtype.FLOAT16, Dtype.BFLOAT16: Dtype.BFLOAT16, "f32": Dtype.FLOAT32}
    out = _empty(oa, oa.shape[1:], "same")
    lse = _empty(oa, want_lse[1:], "f32")
    ob, lb = _ptr(out), _ptr(lse)
    m = MergeParams.new()
    m.dtype_parts = m.dtype_out = dtypes[oa.dtype]
    m.lse_base = LseBase.BASE2 if lse_base2 else LseBase.NATURAL
    m.num_parts, m.batch, m.seqlen, m.heads, m.head_dim = S, B, Sq, H, D
    m.o_parts, (m.o_part_stride, m.o_batch_stride, m.o_seq_stride, m.o_head_stride) = oa.ptr, o_st
    m.lse_parts, (m.lse_part_stride, m.lse_batch_stride, m.lse_head_stride, m.lse_seq_stride) = la.ptr, l_st
    m.o, m.out_head_stride, m.out_seq_stride, m.out_batch_stride = ob, D, H * D, Sq * H * D
    m.lse, m.lse_out_seq_stride, m.lse_out_head_stride, m.lse_out_batch_stride = lb, 1, Sq, H * Sq
    with oa.lib.device_scope(oa):
        handle = get_handle(oa.device if oa.device is not None else -1)
        s = oa.lib.current_stream(oa) if stream is None else int(stream)
        _check(lib().flashattn_merge(handle.ptr, ctypes.byref(m), ctypes.c_void_p(s or None)), "flashattn_merge")
    return out, lse
