"""python -m flashattn: one screen on what this installation is: the package, the library it loads and
how that was built, and what the library makes of each CUDA device (or why it sees none)."""
import ctypes
import sys

from . import __version__
from ._lib import FlashAttnError, lib, library_path
from .api import Handle, plan


def _probe(handle, head_dim, backend):
    """The kernel a bf16 prefill call of this head dim would run on `backend`, or why it would not."""
    from ._lib import Dtype, FwdParams
    p = FwdParams.new()
    p.dtype, p.backend = Dtype.BFLOAT16, backend
    p.batch, p.seqlen_q, p.seqlen_k, p.heads_q, p.heads_kv, p.head_dim = 1, 1024, 1024, 8, 8, head_dim
    lib().flashattn_fwd_params_set_packed_strides(ctypes.byref(p))
    p.q, p.k, p.v, p.o = 1 << 20, 2 << 20, 3 << 20, 4 << 20  # planning never dereferences them
    try:
        return plan(handle, p).kernel_name.decode()
    except FlashAttnError as e:
        return f"- ({e.name.replace('FLASHATTN_STATUS_', '')})"


def main():
    print(f"flashattn (Python package) {__version__}, Python {sys.version.split()[0]}")
    try:
        l = lib()
    except (OSError, ImportError) as e:
        print(f"library: not loaded: {e}")
        return 1
    print(f"library: {library_path()}, version {l.flashattn_version_string().decode()}")
    print(f"build:   {l.flashattn_build_info().decode()}")
    for dev in range(64):
        try:
            h = Handle(dev)
        except FlashAttnError as e:
            if dev == 0 or e.name != "FLASHATTN_STATUS_NO_DEVICE":
                print(f"device {dev}: {e.name}: {e.message}")
            if e.name == "FLASHATTN_STATUS_NO_DEVICE":
                break
            continue
        with h:
            print(f"device {dev}: usable; the kernel a bf16 prefill call (8 heads, 1024 tokens) gets, per head dim:")
            print(f"  {'head dim':>8}  {'AUTO':38} {'FUSED_SM90':38} {'FUSED':38}")
            for d in (32, 64, 96, 128, 192, 256):
                names = [_probe(h, d, b) for b in (0, 3, 2)]
                print(f"  {d:>8}  {names[0]:38} {names[1]:38} {names[2]:38}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
