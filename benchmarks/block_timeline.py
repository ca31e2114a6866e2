"""Block timelines of a batch-1 decode (1 x 32/8 heads, 8k keys, head dim 128, bf16): each FUSED_SM90
block's %globaltimer at its entry, after griddepcontrol.wait, when its consumer sees K_0 land, K_1 and
V_0, the last V, and at its end (after the split's partial stores), for the dense call under four
states of the L2 (a 512 MB fill before the call; a 512 MB read; a fill and then a touch of one element
per 64 KB of K and V, for the pages' translations; warm, a sleep kernel) and for a cache and shuffled
pages of 256 and 16 keys after a fill. Stamp kernels just before the call's start event and just
after its end event place the blocks within the call (meaningful while the GPU runs behind the host:
the 512 MB fill before each call keeps it so, and a run whose stamp gaps read tens of microseconds was
not).

The recording lives in a patch, not in the library: apply benchmarks/block_timeline.patch to a copy of
the tree and build it with the FA_DIAG_TL macro; the kernels then write to the buffer whose device
address FA_DIAG_TL_PTR holds (this script sets it before the library's first launch), and the split
merge's blocks after them: their entry, release (griddepcontrol.wait), the first group's loads issued,
its LSEs landed, its parts summed, and their end (and their SMs):

    cp -r . /tmp/tl && cd /tmp/tl && patch -p1 < benchmarks/block_timeline.patch
    cmake -S . -B b -G Ninja -DFLASHATTN_HEAD_DIMS=128 -DCMAKE_CUDA_ARCHITECTURES=90a \
        -DCMAKE_CUDA_FLAGS=-DFA_DIAG_TL -DFLASHATTN_BUILD_TESTS=OFF -DFLASHATTN_BUILD_BENCHMARKS=OFF
    cmake --build b --target flashattn
    FLASHATTN_LIBRARY=b/libflashattn.so PYTHONPATH=python OUT=/tmp python3 benchmarks/block_timeline.py

Prints one line per case (medians over REPS calls, default 30, of the blocks' medians; ns from the
earliest block's start; the merge's steps after the last attention block's end, the latest block's
and the median block's, and on how many SMs its blocks ran; CASES, e.g. "dense_fill,pages16_fill",
keeps those cases only) and writes every block's stamps to $OUT/timelines$TAG.npz (calls x blocks x 8:
entry, after the wait, K_0, K_1 + V_0, last V, end, the producer's first load issued (0 where it is
not recorded: pages gathered with cp.async), SM; the merge's blocks under
<case>_merge: entry, after the wait, loads issued, summed, LSEs landed, end, unused, SM). Needs
PyTorch and CuPy. Each stamp reads the timer before it loads the buffer's address (until
docs/performance.md v81 it read it after, so that a block's first stamp could come a global load's
latency late).
"""
import os, sys
import numpy as np
import torch
import cupy as cp
buf = torch.zeros(2 * 4096 * 8, dtype=torch.int64, device="cuda")
os.environ["FA_DIAG_TL_PTR"] = hex(buf.data_ptr())
import flashattn
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from l2_states import paged_call

stamp_src = r'''extern "C" __global__ void stamp(unsigned long long *o, int i) {
  unsigned long long t; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); o[i] = t; }'''
stamp_k = cp.RawKernel(stamp_src, "stamp")
sbuf = torch.zeros(8, dtype=torch.int64, device="cuda")
sptr = cp.from_dlpack(sbuf)
def stamp(i):
    with cp.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream):
        stamp_k((1,), (1,), (sptr, np.int32(i)))

tag = os.environ.get("TAG", "")
out = os.environ.get("OUT", "/tmp")
torch.manual_seed(0)
fill = torch.empty(512 * 2**20, dtype=torch.uint8, device="cuda")
acc = torch.empty((), dtype=torch.int64, device="cuda")
sk = 8192
q = torch.randn(1, 1, 32, 128, device="cuda", dtype=torch.bfloat16)
k = torch.randn(1, sk, 8, 128, device="cuda", dtype=torch.bfloat16)
v = torch.randn_like(k)
lens = torch.full((1,), sk, dtype=torch.int32, device="cuda")
def touch():  # fill, then one element per 64 KB of K and V (their pages' translations, ~0.1% of the bytes)
    fill.fill_(3)
    torch.sum(k.view(-1)[::32768].float()); torch.sum(v.view(-1)[::32768].float())
befores = {"fill": lambda: fill.fill_(1), "read": lambda: torch.sum(fill.view(torch.int64), dim=0, out=acc),
           "tlb": touch, "warm": lambda: torch.cuda._sleep(200000)}
dense = lambda: flashattn.flash_attn_func(q, k, v)
cases = [("dense", "fill", dense), ("dense", "read", dense), ("dense", "tlb", dense), ("dense", "warm", dense),
         ("cache", "fill", lambda: flashattn.flash_attn_with_kvcache(q, k, v, cache_seqlens=lens)),
         ("pages256", "fill", paged_call(q, k, v, 256)), ("pages16", "fill", paged_call(q, k, v, 16)),
         ("stamps", "fill", None)]
if os.environ.get("CASES"):
    cases = [c for c in cases if f"{c[0]}_{c[1]}" in os.environ["CASES"].split(",")]
reps = int(os.environ.get("REPS", "30"))
saved = {}
for name, state, fn in cases:
    before = befores[state]
    for _ in range(3):
        if fn: fn()
    rows, evt, gaps, merges, mrows = [], [], [], [], []
    for r in range(reps):
        before()
        buf.zero_()
        stamp(0)
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        if fn: fn()
        e1.record()
        stamp(1)
        torch.cuda.synchronize()
        evt.append(e0.elapsed_time(e1) * 1000)
        s = sbuf.cpu().numpy()
        a, mg = buf.view(2, 4096, 8).cpu().numpy()
        n, nm = int((a[:, 0] != 0).sum()), int((mg[:, 0] != 0).sum())
        if n:
            rows.append(a[:n].copy())
            gaps.append([a[:n, 0].min() - s[0], s[1] - a[:n, 5].max(), s[1] - s[0]])
            if nm:  # the merge's blocks: first entry after the first attention block's; release and end after the last one's end
                mrows.append(mg[:nm].copy())
                end = a[:n, 5].max()  # (merge slots: 1 release, 2 loads issued, 4 LSEs landed, 3 summed, 5 end)
                merges.append([mg[:nm, 0].min() - a[:n, 1].min(), nm] + [mg[:nm, j].max() - end for j in (1, 2, 4, 3, 5)] +
                              [np.median(mg[:nm, j]) - end for j in (1, 2, 4, 3, 5)] +
                              [len(set(mg[:nm, 7].tolist())), len(set(mg[:nm, 7].tolist()) & set(a[:n, 7].tolist()))])
        else:
            gaps.append([0, 0, s[1] - s[0]])
    g = np.median(np.array(gaps, dtype=np.float64), axis=0)
    if not rows:
        print(f"{tag} stamps alone: stamp to stamp {g[2]:.0f} ns, event {np.median(evt):.2f} us")
        continue
    saved[f"{name}_{state}"] = np.stack(rows)
    if mrows and len({m.shape for m in mrows}) == 1:
        saved[f"{name}_{state}_merge"] = np.stack(mrows)
    st = []
    for a in rows:
        t0 = a[:, 1].min()
        rel = a[:, :7].astype(np.float64) - t0
        end = rel[:, 5]
        issued = a[:, 6] != 0  # (slot 6: the producer's first load issued; not recorded for gathered pages)
        st.append([np.median(rel[:, 2]), np.median(rel[:, 3]), np.median(rel[:, 4]), np.median(end), end.max(), end.max() - np.median(end),
                   np.median(rel[issued, 6]) if issued.any() else np.nan])
    sa = np.array(st)
    issued_any = np.isfinite(sa[:, 6])  # (calls whose blocks recorded their first load)
    m = np.append(np.median(sa[:, :6], axis=0), np.median(sa[issued_any, 6]) if issued_any.any() else np.nan)
    print(f"{tag} {name:8s} {state:4s} event {np.median(evt):5.2f} us | stamp->first block {g[0]:.0f} | first load issued {m[6]:.0f} K0 {m[0]:.0f} K1V0 {m[1]:.0f} "
          f"lastV {m[2]:.0f} end med {m[3]:.0f} max {m[4]:.0f} (tail {m[5]:.0f}) | last end->stamp {g[1]:.0f} | stamp to stamp {g[2]:.0f} ns")
    if merges:
        mm = np.median(np.array(merges, dtype=np.float64), axis=0)
        print(f"{tag} {name:8s} {state:4s} merge ({mm[1]:.0f} blocks on {mm[12]:.0f} SMs, {mm[13]:.0f} of them an attention block's): "
              f"entered {mm[0]:.0f} after the first attention block's start; "
              f"after the last one's end, latest / median block: released {mm[2]:.0f} / {mm[7]:.0f}, loads issued {mm[3]:.0f} / "
              f"{mm[8]:.0f}, LSEs landed {mm[4]:.0f} / {mm[9]:.0f}, summed {mm[5]:.0f} / {mm[10]:.0f}, end {mm[6]:.0f} / {mm[11]:.0f}")
np.savez_compressed(f"{out}/timelines{tag}.npz", **saved)
