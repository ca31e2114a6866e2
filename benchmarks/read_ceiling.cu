// read_ceiling.cu - how fast can any kernel read a batch-1 decode's K and V under the benchmark's
// cold protocol? A batch-1 decode at 8k keys (32/8 heads, head dim 128, bf16) reads 32 MiB of K and V;
// flashattn_bench and compare_peers.py time it with the L2 overwritten before every call (a 256 MB
// memset), CUDA events around the call alone. This probe times, in the same protocol and the same
// process, interleaved round by round:
//   empty         an empty kernel of 128 blocks: the protocol's floor (event, launch, drain);
//   tma           128 blocks (8 heads x 16 key ranges of 512 keys), each reading its four 128-key K
//                 and V tiles through a tensor map like the library's (64-column boxes, 128-byte
//                 swizzle, evict-first), two stages, nothing computed: the split decode's transfer;
//   tma nohint    the same without the evict-first policy;
//   tma3          the same with three stages;
//   tma+parts     tma, each block then storing a 4 x 128 fp32 partial result and its 4 LSEs;
//   tma+release   tma+parts followed by a programmatic dependent of 32 blocks that waits for the
//                 grid and stores a constant: the kernel boundary alone;
//   tma+merge     the same dependent reading the 16 parts and merging them: the split call's shape;
//   tma+flags     tma+parts, each block then raising a flag tagged with the grid's id; 4 more blocks
//                 of the same grid (on the SMs the 128 leave idle) wait for their two K/V heads'
//                 16 flags each and merge those rows: the merge without a kernel boundary;
//   tma+flags all tma+parts and the flag, then every block waits for its K/V head's 16 flags and
//                 merges a sixteenth of the head's 4 x 128 outputs (32, one a thread);
//                 (both flag forms wait inside the grid, so they run only where the whole grid
//                 fits at once, one block an SM: 132 SMs; elsewhere an empty kernel takes their turn)
//   ldg           every SM streaming the 32 MiB through 16-byte loads (no tiles, no tensor maps);
//   library       flashattn_fwd on the same K and V (AUTO): the library's own batch-1 decode;
//   library p16, library p256   the same K and V as pools of 16- and 256-key pages, listed shuffled;
//   tma p16, tma p256   tma over those pages: each block reads its pages' table entries first (one
//                 round trip), then loads its tiles as boxes of min(page, 128) rows;
//   tma box16     tma in boxes of 16 rows (as tma p16 loads), no pages;
//   tma strided   tma with split s reading the head's tiles s, s + 16, s + 32, s + 48;
//   strided box16 both;
//   tma full, strided full   a tile as one full-width box (5-D map: 8-row groups of every column,
//                 as the library's full-width page boxes), in consecutive shares or strided;
//   tma 256B      tma with the L2 fetching 256 bytes a box row (every other map here, as the
//                 library's K and V maps, fetches 128).
// The last lines give the paged/dense ratios of the library's calls and of the bare reads, and the
// bound a paged call would reach if it cost nothing beyond its reads that the dense call does not
// (docs/performance.md v81).
// Every form is timed again with the flush done by a 256 MB read, which leaves no modified lines in
// the L2 (what writing them back costs a cold call). GB/s is K+V bytes over the median event time,
// as flashattn_bench reports decode rows. Then, on one block, a decode tile's tensor-core products in
// cycles: the library's 64-row tile against the tile transposed (keys as M, 8 query rows as N).
//
//   nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -Iinclude -Ikernels benchmarks/read_ceiling.cu \
//        -Lbuild -lflashattn -Xlinker -rpath=$PWD/build -o /tmp/read_ceiling && /tmp/read_ceiling [rounds] [iters]
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "flashattn.h"
#include "sm90_ptx.cuh"
#include "sm90_wgmma.cuh"

#define CHECK(x)                                                                                \
    do {                                                                                        \
        cudaError_t e_ = (x);                                                                   \
        if (e_ != cudaSuccess) {                                                                \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
            exit(1);                                                                            \
        }                                                                                       \
    } while (0)

namespace {

constexpr int kKeys = 8192, kHeadsKv = 8, kHeadsQ = 32, kHeadDim = 128, kSplits = 16, kTile = 128;
constexpr int kTilesPerBlock = kKeys / kSplits / kTile;  // 4
constexpr int kTileBytes = kTile * kHeadDim * 2;         // 32 KB (one of K or V)
constexpr int kBlocks = kHeadsKv * kSplits;              // 128
constexpr int kRowsPerHead = kHeadsQ / kHeadsKv;         // 4 query heads share a K/V head

// One block: K and V tiles of its head and key range, kStages deep, landing in shared memory and
// nothing more; with kParts, its 4 x 128 fp32 partial result and 4 LSEs stored afterwards. With
// kPage > 0, K and V are pools of kPage-key pages listed by `table` (page p of the sequence at pool
// page table[p]): the block first reads its pages' entries (one load a lane, one round trip), then
// loads each tile as boxes of min(kPage, 128) rows (maps encoded with that box).
// kBox: the box's rows where there are no pages (128, or 16 to match pages of 16); kStrided: split s
// takes the head's tiles s, s + 16, s + 32, s + 48 instead of four consecutive ones, so that at any
// moment the 16 splits read neighbouring tiles rather than addresses 1 MB apart.
// kFull: kmap and vmap are full-width maps (full_map): a tile is one box of every column, 8-row
// groups in order, so that a key's two 128-byte halves are asked for together (no pages).
// kFlags (with kParts): after its parts, a block raises its flag (flags[blockIdx.x] = the grid's id);
// then with kFlagMergers the grid's last kMergeBlocks blocks merge the parts (merge_in_grid), with
// kFlagShares every block merges a share of its head's outputs (merge_share).
constexpr int kMergeBlocks = 4, kHeadsPerMerger = kHeadsKv / kMergeBlocks;
enum { kNoFlags = 0, kFlagMergers = 1, kFlagShares = 2 };

__device__ __forceinline__ uint64_t grid_id() {
    uint64_t g;
    asm volatile("mov.u64 %0, %%gridid;\n" : "=l"(g));
    return g;
}

// One output of a split merge: the 16 parts x weighted by exp(l - max l), as bf16 (the same
// operations, in the same order, for the dependent merge and both in-grid forms).
__device__ __forceinline__ __nv_bfloat16 merged(const float (&l)[kSplits], const float (&x)[kSplits]) {
    float m = -INFINITY;
#pragma unroll
    for (int s = 0; s < kSplits; ++s) m = fmaxf(m, l[s]);
    float num = 0.f, den = 0.f;
#pragma unroll
    for (int s = 0; s < kSplits; ++s) {
        const float w = __expf(l[s] - m);
        num += w * x[s], den += w;
    }
    return __float2bfloat16(num / den);
}

// Until K/V head `head`'s 16 splits have raised their flags with this grid's id (a lane a flag), then
// the block's barrier.
__device__ __forceinline__ void wait_head_flags(const uint64_t *flags, int head) {
    if (threadIdx.x < kSplits) {
        const uint64_t tag = grid_id(), *f = flags + threadIdx.x * kHeadsKv + head;
        uint64_t v;
        do asm volatile("ld.acquire.gpu.global.u64 %0, [%1];\n" : "=l"(v) : "l"(f) : "memory");
        while (v != tag);
    }
    __syncthreads();
}

// One of the grid's merging blocks: for each of its K/V heads, wait until the head's 16 splits have
// raised their flags with this grid's id, then merge its 4 query rows as merge_parts does (one thread
// a column, every part's load issued before the sums).
__device__ __forceinline__ void merge_in_grid(const float *parts, const float *lses, const uint64_t *flags,
                                              __nv_bfloat16 *out) {
    const int merger = blockIdx.x - kBlocks;
    for (int hh = 0; hh < kHeadsPerMerger; ++hh) {
        const int head = merger * kHeadsPerMerger + hh;
        wait_head_flags(flags, head);
        float l[kRowsPerHead][kSplits], x[kRowsPerHead][kSplits];
#pragma unroll
        for (int r = 0; r < kRowsPerHead; ++r) {
            const int row = head * kRowsPerHead + r;
#pragma unroll
            for (int s = 0; s < kSplits; ++s) {
                l[r][s] = __ldcg(lses + s * kHeadsQ + row);
                x[r][s] = __ldcg(parts + (static_cast<size_t>(s) * kHeadsQ + row) * kHeadDim + threadIdx.x);
            }
        }
#pragma unroll
        for (int r = 0; r < kRowsPerHead; ++r) out[(head * kRowsPerHead + r) * kHeadDim + threadIdx.x] = merged(l[r], x[r]);
    }
}

// The distributed form: this block's share (a sixteenth) of its head's outputs, once the head's 16
// splits have raised their flags.
__device__ __forceinline__ void merge_share(const float *parts, const float *lses, const uint64_t *flags,
                                            __nv_bfloat16 *out, int head, int split) {
    wait_head_flags(flags, head);
    constexpr int kShare = kRowsPerHead * kHeadDim / kSplits; /* 32 */
    if (threadIdx.x >= kShare) return;
    const int e = split * kShare + threadIdx.x, row = head * kRowsPerHead + e / kHeadDim, col = e % kHeadDim;
    float l[kSplits], x[kSplits];
#pragma unroll
    for (int s = 0; s < kSplits; ++s) {
        l[s] = __ldcg(lses + s * kHeadsQ + row);
        x[s] = __ldcg(parts + (static_cast<size_t>(s) * kHeadsQ + row) * kHeadDim + col);
    }
    out[row * kHeadDim + col] = merged(l, x);
}

template <int kStages, bool kParts, bool kHint = true, int kPage = 0, int kBox = kTile, bool kStrided = false,
          bool kFull = false, int kFlags = kNoFlags>
__global__ void __launch_bounds__(128)
    tma_read(const __grid_constant__ CUtensorMap kmap, const __grid_constant__ CUtensorMap vmap, float *parts,
             float *lses, const int *table = nullptr, uint64_t *flags = nullptr, __nv_bfloat16 *out = nullptr) {
    using namespace fa::sm90;
    if constexpr (kFlags == kFlagMergers) {
        if (blockIdx.x >= kBlocks) {
            merge_in_grid(parts, lses, flags, out);
            return;
        }
    }
    constexpr int kBoxRows = kPage == 0 ? kBox : kPage >= kTile ? kTile : kPage;
    constexpr int kBlockPages = kPage == 0 ? 1 : kTilesPerBlock * kTile / kPage;
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    __shared__ __align__(8) uint64_t full[kStages];
    __shared__ int pages[kBlockPages];
    const uint32_t base = (static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw)) + 1023u) & ~1023u;
    const int head = blockIdx.x % kHeadsKv, split = blockIdx.x / kHeadsKv;
    const int key0 = split * kTilesPerBlock * kTile;
    if constexpr (kPage > 0) {
        if (threadIdx.x < kBlockPages) pages[threadIdx.x] = table[key0 / kPage + threadIdx.x];
    }
    auto bar = [&](int s) { return static_cast<uint32_t>(__cvta_generic_to_shared(&full[s])); };
    auto issue = [&](int t, uint64_t pol) {
        const int s = t % kStages;
        const uint32_t dst = base + s * 2 * kTileBytes;
        mbar_expect_tx(bar(s), 2 * kTileBytes);
        if constexpr (kFull) {
            const int row = kStrided ? (split + kSplits * t) * kTile : key0 + t * kTile;
            tma_load_5d_policy<kHint>(dst, &kmap, 0, 0, 0, row / 8, head, bar(s), pol);
            tma_load_5d_policy<kHint>(dst + kTileBytes, &vmap, 0, 0, 0, row / 8, head, bar(s), pol);
        } else {
            for (int j = 0; j < kTile / kBoxRows; ++j) {
                const int key = t * kTile + j * kBoxRows; /* within the block's range */
                const int row = kPage > 0  ? pages[key / kPage] * kPage + (key0 + key) % kPage
                                : kStrided ? (split + kSplits * t) * kTile + j * kBoxRows
                                           : key0 + key;
                const uint32_t at = dst + j * kBoxRows * 128;
                for (int c = 0; c < kHeadDim / 64; ++c)
                    tma_load_policy<kHint>(at + c * (kTileBytes / 2), &kmap, c * 64, row, head, 0, bar(s), pol);
                for (int c = 0; c < kHeadDim / 64; ++c)
                    tma_load_policy<kHint>(at + kTileBytes + c * (kTileBytes / 2), &vmap, c * 64, row, head, 0, bar(s),
                                           pol);
            }
        }
    };
    if (threadIdx.x == 0) {
        for (int s = 0; s < kStages; ++s) mbar_init(bar(s), 1);
        mbar_init_fence();
    }
    __syncthreads();
    float acc = 0.f;
    if (threadIdx.x == 0) {
        const uint64_t pol = l2_evict_first_policy();
        for (int t = 0; t < kStages && t < kTilesPerBlock; ++t) issue(t, pol);
        for (int t = 0; t < kTilesPerBlock; ++t) {
            mbar_wait(bar(t % kStages), (t / kStages) & 1);
            if (t + kStages < kTilesPerBlock) issue(t + kStages, pol);
        }
    }
    __syncthreads();
    // one word of each stage read back, so the loads are seen to land
    for (int s = 0; s < kStages; ++s) {
        float w;
        asm volatile("ld.shared.f32 %0, [%1];\n" : "=f"(w) : "r"(base + s * 2 * kTileBytes + threadIdx.x * 4));
        acc += w;
    }
    launch_dependents();
    if (kParts) {
        // [split][query head][d] fp32, and [split][query head] LSEs
        for (int r = 0; r < kRowsPerHead; ++r)
            parts[(static_cast<size_t>(split) * kHeadsQ + head * kRowsPerHead + r) * kHeadDim + threadIdx.x] = acc + r;
        if (threadIdx.x < kRowsPerHead) lses[split * kHeadsQ + head * kRowsPerHead + threadIdx.x] = acc * 1e-9f;
        if constexpr (kFlags != kNoFlags) { /* the block's stores, then its flag (as a grid barrier arrives) */
            __syncthreads();
            if (threadIdx.x == 0) {
                __threadfence();
                asm volatile("st.relaxed.gpu.global.u64 [%0], %1;\n" ::"l"(flags + blockIdx.x), "l"(grid_id()) : "memory");
            }
            if constexpr (kFlags == kFlagShares) merge_share(parts, lses, flags, out, head, split);
        }
    } else if (acc == 1234.5f) {
        parts[threadIdx.x] = acc;
    }
}

// The split merge's shape: one block a query head, one thread a column, the 16 parts weighted by
// their LSEs, written as bf16.
__global__ void __launch_bounds__(128) merge_parts(const float *parts, const float *lses, __nv_bfloat16 *out) {
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
    const int row = blockIdx.x;
    float l[kSplits], v[kSplits];
#pragma unroll
    for (int s = 0; s < kSplits; ++s) l[s] = lses[s * kHeadsQ + row];
#pragma unroll
    for (int s = 0; s < kSplits; ++s) v[s] = parts[(static_cast<size_t>(s) * kHeadsQ + row) * kHeadDim + threadIdx.x];
    out[row * kHeadDim + threadIdx.x] = merged(l, v);
}

// The merge's launch and release alone: the same grid, waiting for the attention blocks, then
// storing a constant.
__global__ void __launch_bounds__(128) merge_release_only(__nv_bfloat16 *out) {
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
    out[blockIdx.x * kHeadDim + threadIdx.x] = __float2bfloat16(1.0f);
}

// Every SM streaming the buffer in 16-byte loads, eight in flight a thread; kStream: evict-first
// (ld.global.cs), else normal loads (the read flush, whose lines must displace everything).
template <bool kStream = true>
__global__ void __launch_bounds__(256) ldg_read(const uint4 *p, size_t n, unsigned *sink) {
    unsigned x = 0;
    const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
    size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    for (; i + 7 * stride < n; i += 8 * stride) {
        uint4 r[8];
#pragma unroll
        for (int u = 0; u < 8; ++u) r[u] = kStream ? __ldcs(p + i + u * stride) : __ldcg(p + i + u * stride);
#pragma unroll
        for (int u = 0; u < 8; ++u) x ^= r[u].x ^ r[u].y ^ r[u].z ^ r[u].w;
    }
    for (; i < n; i += stride) {
        const uint4 r = kStream ? __ldcs(p + i) : __ldcg(p + i);
        x ^= r.x ^ r.y ^ r.z ^ r.w;
    }
    if (x == 0x9e3779b9u) sink[0] = x;
}

__global__ void empty_kernel() {}

// m64n8k16 bf16, A and B from shared memory, A read M-major where kTransA (V^T from V's tile).
template <bool kTransA>
__device__ __forceinline__ void wgmma_n8(float (&d)[4], uint64_t da, uint64_t db, int accumulate) {
    if constexpr (kTransA)
        asm volatile(
            "{\n.reg .pred p;\nsetp.ne.b32 p, %6, 0;\n"
            "wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 {%0, %1, %2, %3}, %4, %5, p, 1, 1, 1, 0;\n}\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "l"(da), "l"(db), "r"(accumulate));
    else
        asm volatile(
            "{\n.reg .pred p;\nsetp.ne.b32 p, %6, 0;\n"
            "wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 {%0, %1, %2, %3}, %4, %5, p, 1, 1, 0, 0;\n}\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "l"(da), "l"(db), "r"(accumulate));
}

// A decode tile's products as one warpgroup issues them, timed in cycles from the issue to the
// wait's return, over shared memory whose contents do not matter (the products' time does not
// depend on the values). Every product accumulates, so that no repetition's products are dead
// (ptxas drops products whose results a later overwrite makes unused). Head dim 128, 128 keys, bf16:
//   0  S = Q K^T as the library's decode tile computes it: 8 k-steps of m64n128k16 (64 rows, of
//      which a 32/8 decode uses 4);
//   1  P V the same way: 8 k-steps of m64n128k16, P from registers;
//   2  S^T = K Q^T, the tile transposed: 2 x 8 m64n8k16 (keys as M, 8 query rows as N);
//   3  O^T = V^T P^T: 2 x 8 m64n8k16, V^T read M-major from V's tile, P^T from shared memory;
//   4  3 with what the transposed tile adds between its products: a column max across the
//      warpgroup (shuffles, a word a warp through shared memory, a barrier), P^T stored, the
//      proxy fence and a barrier.
//   5  0 and 1 issued together, as the library's key loop issues S_j beside P V_{j-1}: a tile's
//      tensor-core time;
//   6  2 and 3 issued together, their four accumulator chains interleaved: the transposed tile's.
template <int kForm>
__global__ void __launch_bounds__(128) chain(long long *cycles, int reps, float *sink) {
    using namespace fa::sm90;
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    const uint32_t base = (static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw)) + 1023u) & ~1023u;
    const uint32_t q = base, kv = base + 16384, pt = base + 49152, red = base + 51200;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    for (int i = threadIdx.x; i < 53248 / 4; i += 128)
        asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(base + 4 * i), "r"(0x3c003c00u));
    float acc[64], acc8[2][4], o[kForm == 5 ? 64 : 1], o8[2][4];
    uint32_t pf[8][4];
    for (int i = 0; i < 64; ++i) acc[i] = 0.f;
    for (int i = 0; i < (kForm == 5 ? 64 : 1); ++i) o[i] = 0.f;
    for (int h = 0; h < 2; ++h)
        for (int i = 0; i < 4; ++i) acc8[h][i] = o8[h][i] = 0.f;
    for (int k = 0; k < 8; ++k)
        for (int i = 0; i < 4; ++i) pf[k][i] = 0x3c003c00u + threadIdx.x;
    /* One k-step of each product: S's and P V's over 16 of the head dim or of the keys (the
     * library's 64-row tile), S^T's and O^T's of the transposed tile's 64-row half h. */
    auto s_step = [&](auto &d, int ks) {
        wgmma_ss<128, 1>::run(d, smem_desc(q + (ks / 4) * 8192 + (ks % 4) * 32, 16, 1024),
                              smem_desc(kv + (ks / 4) * 16384 + (ks % 4) * 32, 16, 1024), 1);
    };
    auto pv_step = [&](auto &d, int ks) { wgmma_rs<128, 1>::run(d, pf[ks], smem_desc(kv + ks * 2048, 16384, 1024), 1); };
    auto st_step = [&](float (&d)[4], int h, int ks) {
        wgmma_n8<false>(d, smem_desc(kv + h * 8192 + (ks / 4) * 16384 + (ks % 4) * 32, 16, 1024),
                        smem_desc(q + (ks / 4) * 8192 + (ks % 4) * 32, 16, 1024), 1);
    };
    auto ot_step = [&](float (&d)[4], int h, int ks) {
        wgmma_n8<true>(d, smem_desc(kv + h * 16384 + ks * 2048, 8192, 1024),
                       smem_desc(pt + (ks / 4) * 1024 + (ks % 4) * 32, 16, 1024), 1);
    };
    fence_proxy_async_shared();
    for (int rep = 0; rep < reps; ++rep) {
        __syncthreads();
        const long long t0 = clock64();
        if constexpr (kForm == 4) {
            float m = acc8[0][0];
            m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 4));
            m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 8));
            m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 16));
            if (lane < 4)
                asm volatile("st.shared.f32 [%0], %1;\n" ::"r"(red + 16 * warp + 4 * lane), "f"(m) : "memory");
            named_sync(1, 128);
            float g = m;
            for (int w = 0; w < 4; ++w) {
                float x;
                asm volatile("ld.shared.f32 %0, [%1];\n" : "=f"(x) : "r"(red + 16 * w + 4 * (lane % 4)) : "memory");
                g = fmaxf(g, x);
            }
            for (int h = 0; h < 2; ++h) {
                const uint32_t v0 = __float_as_uint(exp2f(acc8[h][0] - g)) >> 16 |
                                    (__float_as_uint(exp2f(acc8[h][1] - g)) & 0xffff0000u);
                const uint32_t v1 = __float_as_uint(exp2f(acc8[h][2] - g)) >> 16 |
                                    (__float_as_uint(exp2f(acc8[h][3] - g)) & 0xffff0000u);
                asm volatile(
                    "st.shared.b32 [%0], %1;\n" ::"r"(pt + 1024 * h + 128 * (lane % 4) + 4 * (threadIdx.x / 4 % 32)),
                    "r"(v0)
                    : "memory");
                asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(pt + 1024 * h + 128 * (lane % 4 + 4) +
                                                               4 * (threadIdx.x / 4 % 32)),
                             "r"(v1)
                             : "memory");
            }
            fence_proxy_async_shared();
            named_sync(1, 128);
        }
        wgmma_fence();
        if constexpr (kForm == 0) {
#pragma unroll
            for (int ks = 0; ks < 8; ++ks) s_step(acc, ks);
        } else if constexpr (kForm == 1) {
#pragma unroll
            for (int ks = 0; ks < 8; ++ks) pv_step(acc, ks);
        } else if constexpr (kForm == 5) {
#pragma unroll
            for (int ks = 0; ks < 8; ++ks) s_step(acc, ks);
            wgmma_commit(); /* (as the key loop: S a group of its own, then the fence before P V) */
            wgmma_fence();
#pragma unroll
            for (int ks = 0; ks < 8; ++ks) pv_step(o, ks);
        } else if constexpr (kForm == 6) {
#pragma unroll
            for (int ks = 0; ks < 8; ++ks)
#pragma unroll
                for (int h = 0; h < 2; ++h) st_step(acc8[h], h, ks), ot_step(o8[h], h, ks);
        } else if constexpr (kForm == 2) {
#pragma unroll
            for (int ks = 0; ks < 8; ++ks)
#pragma unroll
                for (int h = 0; h < 2; ++h) st_step(acc8[h], h, ks);
        } else {
#pragma unroll
            for (int ks = 0; ks < 8; ++ks)
#pragma unroll
                for (int h = 0; h < 2; ++h) ot_step(acc8[h], h, ks);
        }
        wgmma_commit();
        wgmma_wait<0>();
        reg_fence(acc);
        reg_fence(acc8[0]);
        reg_fence(acc8[1]);
        reg_fence(o);
        reg_fence(o8[0]);
        reg_fence(o8[1]);
        const long long t1 = clock64();
        if (threadIdx.x == 0) cycles[rep] = t1 - t0;
    }
    float x = 0.f;
    for (int i = 0; i < 64; ++i) x += acc[i];
    for (int i = 0; i < (kForm == 5 ? 64 : 1); ++i) x += o[i];
    for (int h = 0; h < 2; ++h)
        for (int i = 0; i < 4; ++i) x += acc8[h][i] + o8[h][i];
    sink[threadIdx.x] = x;
}

PFN_cuTensorMapEncodeTiled_v12000 encoder() {
    void *f = nullptr;
    cudaDriverEntryPointQueryResult q;
    CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &q));
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f);
}

// A bf16 map of `rank` dimensions over ptr (128-byte swizzle, no out-of-bounds fill); exits if the
// driver refuses it.
template <int kRank>
CUtensorMap encode_map(void *ptr, const cuuint64_t (&dims)[kRank], const cuuint64_t (&strides)[kRank - 1],
                       const cuuint32_t (&box)[kRank], CUtensorMapL2promotion promo) {
    static const PFN_cuTensorMapEncodeTiled_v12000 encode = encoder();
    CUtensorMap m;
    cuuint32_t es[kRank];
    for (int i = 0; i < kRank; ++i) es[i] = 1;
    const CUresult r = encode(&m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, kRank, ptr, dims, strides, box, es,
                              CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, promo,
                              CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS) {
        fprintf(stderr, "cuTensorMapEncodeTiled (%d-D): %d\n", kRank, static_cast<int>(r));
        exit(1);
    }
    return m;
}

// [1, keys, heads, 128] bf16 in boxes of 64 columns x box_rows keys x 1 head.
CUtensorMap kv_map(void *ptr, int box_rows = kTile, CUtensorMapL2promotion promo = CU_TENSOR_MAP_L2_PROMOTION_L2_128B) {
    return encode_map<4>(ptr, {kHeadDim, kKeys, kHeadsKv, 1}, {kHeadsKv * kHeadDim * 2, kHeadDim * 2, 16},
                         {64, static_cast<cuuint32_t>(box_rows), 1, 1}, promo);
}

// The same tensor as 5-D (64 columns, 8 rows, 2 regions of 64 columns, 8-row groups, heads) in
// boxes of a whole 128-key tile: 64 x 8 x 2 x 16 x 1 (the library's full-width page boxes' form).
CUtensorMap full_map(void *ptr) {
    return encode_map<5>(ptr, {64, 8, kHeadDim / 64, kKeys / 8, kHeadsKv},
                         {kHeadsKv * kHeadDim * 2, 128, 8 * kHeadsKv * kHeadDim * 2, kHeadDim * 2},
                         {64, 8, kHeadDim / 64, kTile / 8, 1}, CU_TENSOR_MAP_L2_PROMOTION_L2_128B);
}

}  // namespace

int main(int argc, char **argv) {
    const int rounds = argc > 1 ? atoi(argv[1]) : 3, iters = argc > 2 ? atoi(argv[2]) : 50, warm = 5;
    const size_t kv_elems = static_cast<size_t>(kKeys) * kHeadsKv * kHeadDim, kv_bytes = 2 * kv_elems * 2;
    const size_t l2_bytes = static_cast<size_t>(256) << 20;
    void *k, *v, *q, *o, *flush, *kv;
    float *parts, *lses;
    uint64_t *flags;
    unsigned *sink;
    // K and V adjacent in one allocation, so that the ldg reader streams the same bytes
    CHECK(cudaMalloc(&kv, kv_bytes));
    k = kv, v = static_cast<char *>(kv) + kv_bytes / 2;
    CHECK(cudaMalloc(&q, kHeadsQ * kHeadDim * 2));
    CHECK(cudaMalloc(&o, kHeadsQ * kHeadDim * 2));
    CHECK(cudaMalloc(&flush, l2_bytes));
    CHECK(cudaMalloc(&parts, sizeof(float) * kSplits * kHeadsQ * kHeadDim));
    CHECK(cudaMalloc(&lses, sizeof(float) * kSplits * kHeadsQ));
    CHECK(cudaMalloc(&sink, 64));
    CHECK(cudaMalloc(&flags, sizeof(uint64_t) * kBlocks));
    CHECK(cudaMemset(flags, 0, sizeof(uint64_t) * kBlocks));
    // small bf16 values (0x3c00..0x3cff: about 0.0078-0.0156), so that the library's softmax is tame
    std::vector<uint16_t> h(kv_elems * 2);
    for (size_t i = 0; i < h.size(); ++i) h[i] = static_cast<uint16_t>(0x3c00 + (i * 2654435761u >> 24));
    CHECK(cudaMemcpy(kv, h.data(), kv_bytes, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(q, h.data(), kHeadsQ * kHeadDim * 2, cudaMemcpyHostToDevice));
    const CUtensorMap kmap = kv_map(k), vmap = kv_map(v), kmap16 = kv_map(k, 16), vmap16 = kv_map(v, 16);
    const CUtensorMap kfull = full_map(k), vfull = full_map(v);
    const CUtensorMap k256 = kv_map(k, kTile, CU_TENSOR_MAP_L2_PROMOTION_L2_256B),
                      v256 = kv_map(v, kTile, CU_TENSOR_MAP_L2_PROMOTION_L2_256B);
    const int smem2 = 2 * 2 * kTileBytes + 1024, smem3 = 3 * 2 * kTileBytes + 1024;
    CHECK(cudaFuncSetAttribute(tma_read<2, false>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem2));
    CHECK(cudaFuncSetAttribute(tma_read<2, true>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem2));
    CHECK(cudaFuncSetAttribute(tma_read<3, false>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem3));
    int sms = 0;
    CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));

    const bool flags_fit = sms >= kBlocks + kMergeBlocks; /* (the flag forms' grids resident at once) */

    flashattn_handle *fh = nullptr;
    if (flashattn_handle_create(&fh, 0) != FLASHATTN_STATUS_SUCCESS) {
        fprintf(stderr, "flashattn_handle_create: %s\n", flashattn_last_error());
        return 1;
    }
    flashattn_fwd_params p;
    flashattn_fwd_params_init(&p);
    p.dtype = 1;
    p.batch = 1, p.seqlen_q = 1, p.seqlen_k = kKeys, p.heads_q = kHeadsQ, p.heads_kv = kHeadsKv, p.head_dim = kHeadDim;
    flashattn_fwd_params_set_packed_strides(&p);
    p.q = q, p.k = k, p.v = v, p.o = o;
    size_t ws_bytes = 0;
    void *ws = nullptr;
    if (flashattn_fwd_workspace_size(fh, &p, &ws_bytes) != FLASHATTN_STATUS_SUCCESS) {
        fprintf(stderr, "flashattn_fwd_workspace_size: %s\n", flashattn_last_error());
        return 1;
    }
    if (ws_bytes) CHECK(cudaMalloc(&ws, ws_bytes));

    // The library over the same K and V as pages (pools [pages, page, 8, 128]: the same bytes), the
    // pages listed shuffled, every key used.
    int32_t *lens = nullptr, *table = nullptr;
    CHECK(cudaMalloc(&lens, sizeof(int32_t)));
    CHECK(cudaMalloc(&table, sizeof(int32_t) * kKeys));
    const int32_t n_keys = kKeys;
    CHECK(cudaMemcpy(lens, &n_keys, sizeof n_keys, cudaMemcpyHostToDevice));
    auto paged = [&](int page) {
        const int pages = kKeys / page;
        std::vector<int32_t> order(pages);
        for (int i = 0; i < pages; ++i) order[i] = i;
        uint64_t x = 0x2545f4914f6cdd1dull + page;
        for (int i = pages - 1; i > 0; --i) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            std::swap(order[i], order[x % (i + 1)]);
        }
        CHECK(cudaMemcpy(table + (page == 16 ? 0 : kKeys / 2), order.data(), sizeof(int32_t) * pages,
                         cudaMemcpyHostToDevice));
        flashattn_fwd_params pp = p;
        pp.seqused_k = lens;
        pp.block_table = table + (page == 16 ? 0 : kKeys / 2);
        pp.block_table_batch_stride = pp.pages_per_seq = pages;
        pp.page_size = page, pp.num_pages = pages;
        pp.k_batch_stride = pp.v_batch_stride = static_cast<int64_t>(page) * kHeadsKv * kHeadDim;
        return pp;
    };
    const flashattn_fwd_params p16 = paged(16), p256 = paged(256);
    size_t ws16 = 0, ws256 = 0;
    if (flashattn_fwd_workspace_size(fh, &p16, &ws16) != FLASHATTN_STATUS_SUCCESS ||
        flashattn_fwd_workspace_size(fh, &p256, &ws256) != FLASHATTN_STATUS_SUCCESS || ws16 > ws_bytes ||
        ws256 > ws_bytes) {
        fprintf(stderr, "paged workspace: %s\n", flashattn_last_error());
        return 1;
    }

    struct Form {
        const char *name;
        std::vector<double> t, t_read;  // after the memset; after a read of the flush buffer instead
    };
    std::vector<Form> forms = {
        {"empty", {}, {}},     {"tma", {}, {}},          {"tma nohint", {}, {}},   {"tma3", {}, {}},
        {"tma+parts", {}, {}}, {"tma+release", {}, {}},  {"tma+merge", {}, {}},    {"ldg", {}, {}},
        {"library", {}, {}},   {"library p16", {}, {}},  {"library p256", {}, {}}, {"tma p16", {}, {}},
        {"tma p256", {}, {}},  {"tma box16", {}, {}},    {"tma strided", {}, {}},  {"strided box16", {}, {}},
        {"tma full", {}, {}},  {"strided full", {}, {}}, {"tma 256B", {}, {}},    {"tma+flags", {}, {}},
        {"tma+flags all", {}, {}}};
    // the merge's grid, launched as a programmatic dependent of the attention's
    cudaLaunchAttribute pdl_attr = {};
    pdl_attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    pdl_attr.val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(kHeadsQ), cfg.blockDim = dim3(kHeadDim), cfg.attrs = &pdl_attr, cfg.numAttrs = 1;
    auto call = [&](const flashattn_fwd_params &pp) {
        if (flashattn_fwd(fh, &pp, ws, ws_bytes, 0) != FLASHATTN_STATUS_SUCCESS) {
            fprintf(stderr, "flashattn_fwd: %s\n", flashattn_last_error());
            exit(1);
        }
    };
    auto enqueue = [&](int f) {
        switch (f) {
            case 0:
                empty_kernel<<<kBlocks, 128>>>();
                break;
            case 1:
                tma_read<2, false><<<kBlocks, 128, smem2>>>(kmap, vmap, parts, lses);
                break;
            case 2:
                tma_read<2, false, false><<<kBlocks, 128, smem2>>>(kmap, vmap, parts, lses);
                break;
            case 3:
                tma_read<3, false><<<kBlocks, 128, smem3>>>(kmap, vmap, parts, lses);
                break;
            case 4:
                tma_read<2, true><<<kBlocks, 128, smem2>>>(kmap, vmap, parts, lses);
                break;
            case 5: {
                tma_read<2, true><<<kBlocks, 128, smem2>>>(kmap, vmap, parts, lses);
                CHECK(cudaLaunchKernelEx(&cfg, merge_release_only, static_cast<__nv_bfloat16 *>(o)));
                break;
            }
            case 6: {
                tma_read<2, true><<<kBlocks, 128, smem2>>>(kmap, vmap, parts, lses);
                CHECK(cudaLaunchKernelEx(&cfg, merge_parts, static_cast<const float *>(parts),
                                         static_cast<const float *>(lses), static_cast<__nv_bfloat16 *>(o)));
                break;
            }
            case 7:
                ldg_read<<<sms * 4, 256>>>(static_cast<const uint4 *>(kv), kv_bytes / 16, sink);
                break;
            case 8:
                call(p);
                break;
            case 9:
                call(p16);
                break;
            case 10:
                call(p256);
                break;
            case 11:
                tma_read<2, false, true, 16><<<kBlocks, 128, smem2>>>(kmap16, vmap16, parts, lses, table);
                break;
            case 12:
                tma_read<2, false, true, 256><<<kBlocks, 128, smem2>>>(kmap, vmap, parts, lses, table + kKeys / 2);
                break;
            case 13:
                tma_read<2, false, true, 0, 16><<<kBlocks, 128, smem2>>>(kmap16, vmap16, parts, lses);
                break;
            case 14:
                tma_read<2, false, true, 0, kTile, true><<<kBlocks, 128, smem2>>>(kmap, vmap, parts, lses);
                break;
            case 15:
                tma_read<2, false, true, 0, 16, true><<<kBlocks, 128, smem2>>>(kmap16, vmap16, parts, lses);
                break;
            case 16:
                tma_read<2, false, true, 0, kTile, false, true><<<kBlocks, 128, smem2>>>(kfull, vfull, parts, lses);
                break;
            case 17:
                tma_read<2, false, true, 0, kTile, true, true><<<kBlocks, 128, smem2>>>(kfull, vfull, parts, lses);
                break;
            case 18:
                tma_read<2, false><<<kBlocks, 128, smem2>>>(k256, v256, parts, lses);
                break;
            case 19:
            case 20:
                if (!flags_fit) {
                    empty_kernel<<<1, 32>>>();
                    break;
                }
                if (f == 19)
                    tma_read<2, true, true, 0, kTile, false, false, kFlagMergers><<<kBlocks + kMergeBlocks, 128, smem2>>>(
                        kmap, vmap, parts, lses, nullptr, flags, static_cast<__nv_bfloat16 *>(o));
                else
                    tma_read<2, true, true, 0, kTile, false, false, kFlagShares><<<kBlocks, 128, smem2>>>(
                        kmap, vmap, parts, lses, nullptr, flags, static_cast<__nv_bfloat16 *>(o));
                break;
        }
        CHECK(cudaGetLastError());
    };
    CHECK(cudaFuncSetAttribute(tma_read<2, false, false>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem2));
    CHECK(cudaFuncSetAttribute(tma_read<2, false, true, 16>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem2));
    CHECK(cudaFuncSetAttribute(tma_read<2, false, true, 256>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem2));
    CHECK(cudaFuncSetAttribute(tma_read<2, false, true, 0, 16>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem2));
    CHECK(cudaFuncSetAttribute(tma_read<2, false, true, 0, kTile, true>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               smem2));
    CHECK(cudaFuncSetAttribute(tma_read<2, false, true, 0, 16, true>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               smem2));
    CHECK(cudaFuncSetAttribute(tma_read<2, false, true, 0, kTile, false, true>,
                               cudaFuncAttributeMaxDynamicSharedMemorySize, smem2));
    CHECK(cudaFuncSetAttribute(tma_read<2, false, true, 0, kTile, true, true>,
                               cudaFuncAttributeMaxDynamicSharedMemorySize, smem2));
    CHECK(cudaFuncSetAttribute(tma_read<2, true, true, 0, kTile, false, false, kFlagMergers>,
                               cudaFuncAttributeMaxDynamicSharedMemorySize, smem2));
    CHECK(cudaFuncSetAttribute(tma_read<2, true, true, 0, kTile, false, false, kFlagShares>,
                               cudaFuncAttributeMaxDynamicSharedMemorySize, smem2));
    cudaEvent_t e0, e1;
    CHECK(cudaEventCreate(&e0));
    CHECK(cudaEventCreate(&e1));
    // (read_flush: the flush buffer read by every SM instead of written, so that the L2 holds no
    // modified lines when the call starts)
    for (int read_flush = 0; read_flush < 2; ++read_flush)
        for (int r = 0; r < rounds; ++r)
            for (int f = 0; f < static_cast<int>(forms.size()); ++f)
                for (int i = 0; i < warm + iters; ++i) {
                    if (read_flush)
                        ldg_read<false><<<sms * 4, 256>>>(static_cast<const uint4 *>(flush), l2_bytes / 16, sink);
                    else
                        CHECK(cudaMemsetAsync(flush, i & 0xff, l2_bytes, 0));
                    CHECK(cudaEventRecord(e0, 0));
                    enqueue(f);
                    CHECK(cudaEventRecord(e1, 0));
                    CHECK(cudaEventSynchronize(e1));
                    float ms;
                    CHECK(cudaEventElapsedTime(&ms, e0, e1));
                    if (i >= warm) (read_flush ? forms[f].t_read : forms[f].t).push_back(ms * 1e3);
                }
    CHECK(cudaDeviceSynchronize());
    cudaDeviceProp prop;
    CHECK(cudaGetDeviceProperties(&prop, 0));
    printf(
        "read_ceiling: %s, %d SMs; 1 x 32/8 heads, 8192 keys, d128 bf16: %zu bytes of K+V; "
        "%d rounds x %d calls, the L2 flushed before each by a 256 MB memset (the benchmarks' "
        "protocol) or by a 256 MB read\n",
        prop.name, sms, kv_bytes, rounds, iters);
    printf("%-13s %9s %9s %9s %9s | %9s %9s\n", "form", "p10 us", "median us", "p90 us", "GB/s", "read: us", "GB/s");
    auto med = [](std::vector<double> &t) {
        std::sort(t.begin(), t.end());
        return t[t.size() / 2];
    };
    for (auto &f : forms) {
        const double m = med(f.t), mr = med(f.t_read);
        printf("%-13s %9.2f %9.2f %9.2f %9.1f | %9.2f %9.1f\n", f.name, f.t[f.t.size() / 10], m,
               f.t[f.t.size() * 9 / 10], kv_bytes / (m * 1e3), mr, kv_bytes / (mr * 1e3));
    }
    printf("pages/dense (memset protocol): library p16 %.3f, p256 %.3f; bare tma p16 %.3f, p256 %.3f\n",
           med(forms[8].t) / med(forms[9].t), med(forms[8].t) / med(forms[10].t), med(forms[1].t) / med(forms[11].t),
           med(forms[1].t) / med(forms[12].t));
    if (!flags_fit) printf("tma+flags, tma+flags all: not run (%d SMs; they need %d resident blocks)\n", sms, kBlocks + kMergeBlocks);
    else printf("the merge in the grid against the dependent merge (tma+merge): merging blocks (tma+flags) %+.2f us, "
           "every block a share (tma+flags all) %+.2f us; their cost over tma+parts: %+.2f, %+.2f, the dependent's %+.2f us\n",
           med(forms[19].t) - med(forms[6].t), med(forms[20].t) - med(forms[6].t), med(forms[19].t) - med(forms[4].t),
           med(forms[20].t) - med(forms[4].t), med(forms[6].t) - med(forms[4].t));
    if (flags_fit) { /* the in-grid merges' outputs beside the dependent merge's (the same parts): bit-identical expected */
        std::vector<uint16_t> ref(kHeadsQ * kHeadDim), got(kHeadsQ * kHeadDim);
        const int cmp[3] = {6, 19, 20};
        int differ[3] = {0, 0, 0};
        for (int c = 0; c < 3; ++c) {
            CHECK(cudaMemset(o, 0xff, kHeadsQ * kHeadDim * 2));
            enqueue(cmp[c]);
            CHECK(cudaDeviceSynchronize());
            CHECK(cudaMemcpy(c == 0 ? ref.data() : got.data(), o, kHeadsQ * kHeadDim * 2, cudaMemcpyDeviceToHost));
            if (c > 0)
                for (int i = 0; i < kHeadsQ * kHeadDim; ++i) differ[c] += got[i] != ref[i];
        }
        printf("outputs differing from tma+merge's (of %d): tma+flags %d, tma+flags all %d\n", kHeadsQ * kHeadDim,
               differ[1], differ[2]);
    }
    // A paged call with no cost of its own beyond its reads: the dense call's costs beyond its
    // strided read (the library's order) added to the bare reads over the shuffled pages.
    const double own = med(forms[8].t) - med(forms[14].t);
    printf("paged bound (the library's dense call over the bare paged read plus its costs beyond the strided read, "
           "%.2f us): p16 %.3f, p256 %.3f\n",
           own, med(forms[8].t) / (med(forms[11].t) + own), med(forms[8].t) / (med(forms[12].t) + own));

    // The decode tile's products (one block, one warpgroup), cycles from issue to completion.
    constexpr int kReps = 200;
    long long *cyc;
    float *csink;
    CHECK(cudaMalloc(&cyc, sizeof(long long) * kReps));
    CHECK(cudaMalloc(&csink, sizeof(float) * 128));
    const int chain_smem = 53248 + 1024;
    void (*chains[7])(long long *, int, float *) = {chain<0>, chain<1>, chain<2>, chain<3>,
                                                    chain<4>, chain<5>, chain<6>};
    const char *chain_names[7] = {"S = Q K^T, m64n128k16 x 8", "P V, m64n128k16 x 8 (P in registers)",
                                  "S^T = K Q^T, m64n8k16 x 16", "O^T = V^T P^T, m64n8k16 x 16",
                                  "O^T with the column max and P^T's store before it",
                                  "S and P V issued together (a key loop's tile)",
                                  "S^T and O^T issued together, 4 chains interleaved"};
    int clock_khz = 0;
    CHECK(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0));
    printf(
        "\ndecode tile products, head dim 128, 128 keys (one warpgroup; cycles issue to completion, "
        "median of %d; us at %.2f GHz)\n",
        kReps, clock_khz * 1e-6);
    for (int f = 0; f < 7; ++f) {
        CHECK(cudaFuncSetAttribute(chains[f], cudaFuncAttributeMaxDynamicSharedMemorySize, chain_smem));
        chains[f]<<<1, 128, chain_smem>>>(cyc, kReps, csink);
        CHECK(cudaGetLastError());
        std::vector<long long> c(kReps);
        CHECK(cudaMemcpy(c.data(), cyc, sizeof(long long) * kReps, cudaMemcpyDeviceToHost));
        std::sort(c.begin() + 10, c.end());
        const long long med = c[10 + (kReps - 10) / 2];
        printf("  %-52s %6lld cycles  %5.3f us\n", chain_names[f], med, med / (clock_khz * 1e3) * 1e6);
    }
    flashattn_handle_destroy(fh);
    return 0;
}
