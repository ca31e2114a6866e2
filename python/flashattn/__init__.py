"""flashattn: exact FlashAttention-style attention on NVIDIA GPUs through libflashattn.so (ctypes).

    import flashattn
    out = flashattn.flash_attn_func(q, k, v, causal=True)     # FlashAttention-2's function

Lower level, mirroring the C ABI: Handle, FwdParams, PlanInfo, workspace_size, supported, plan, fwd,
and the Status / Dtype / Mask / Backend constants. Errors: FlashAttnError (status, name, message).
The library is loaded on first use: FLASHATTN_LIBRARY, next to this package, or the system loader.
"""
from ._lib import (Backend, Dtype, FlashAttnError, FwdParams, Mask, PlanInfo, Status, load_library)
from .api import Handle, flash_attn_func, fwd, get_handle, plan, supported, workspace_size

__version__ = "0.1.0"


def library_version():
    """The loaded libflashattn's version string."""
    return load_library().flashattn_version_string().decode()


__all__ = ["flash_attn_func", "Handle", "get_handle", "FwdParams", "PlanInfo", "workspace_size", "supported",
           "plan", "fwd", "FlashAttnError", "Status", "Dtype", "Mask", "Backend", "load_library",
           "library_version", "__version__"]
