"""flashattn: exact FlashAttention-style attention on NVIDIA GPUs through libflashattn.so (ctypes).

    import flashattn
    out = flashattn.flash_attn_func(q, k, v, causal=True)     # FlashAttention-2's function
    out = flashattn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k, block_table=pages)
    out = flashattn.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=lens)
    out = flashattn.flash_attn_qkvpacked_func(qkv)   # and the kvpacked / varlen packed forms

Lower level, mirroring the C ABI: Handle, FwdParams, PlanInfo, workspace_size, supported, plan, fwd,
and the Status / Dtype / Mask / Backend constants. Errors: FlashAttnError (status, name, message)
for what the library refuses; FlashAttnValueError and FlashAttnTypeError for arguments refused
before the call (ValueError and TypeError, and each a RuntimeError as FlashAttention-2's are).
The library is loaded on first use: FLASHATTN_LIBRARY, next to this package, or the system loader.
`python -m flashattn` prints where it was found, its version and build, and the devices it sees.
"""
from ._lib import (Backend, Dtype, FlashAttnError, FlashAttnTypeError, FlashAttnValueError, FwdParams, LseBase, Mask,
                   MergeParams, PlanInfo, Status, library_path, load_library)
from ._version import __version__
from .api import (Handle, flash_attn_func, flash_attn_kvpacked_func, flash_attn_qkvpacked_func, flash_attn_varlen_func,
                  flash_attn_varlen_kvpacked_func, flash_attn_varlen_qkvpacked_func, flash_attn_with_kvcache, fwd,
                  get_handle, merge_attn_states, plan, supported, workspace_size)


def library_version():
    """The loaded libflashattn's version string."""
    return load_library().flashattn_version_string().decode()


def build_info():
    """How the loaded libflashattn was built: commit, CUDA runtime, architectures, compiled kernels."""
    return load_library().flashattn_build_info().decode()


__all__ = ["flash_attn_func", "flash_attn_qkvpacked_func", "flash_attn_kvpacked_func", "flash_attn_varlen_func",
           "flash_attn_varlen_qkvpacked_func", "flash_attn_varlen_kvpacked_func", "flash_attn_with_kvcache",
           "merge_attn_states", "Handle", "get_handle", "FwdParams", "PlanInfo", "workspace_size", "supported",
           "plan", "fwd", "FlashAttnError", "FlashAttnValueError", "FlashAttnTypeError", "Status", "Dtype", "LseBase",
           "Mask", "Backend", "MergeParams", "load_library", "library_version", "library_path", "build_info",
           "__version__"]
