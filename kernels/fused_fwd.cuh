/*
 * fused_fwd.cuh - the FUSED forward kernel: FlashAttention-2 on tensor cores through mma.sync
 * (m16n8k16, fp16/bf16 in, fp32 accumulate) with cp.async tile loads. Runs on sm_80 and newer.
 *
 * One thread block owns kBlockM query rows of one (batch, head); each of its warps owns 16 or 32 of
 * those rows (one or two m16 tiles) for the whole kernel. Per block:
 *
 *   load Q tile                                   cp.async, once; fragments re-read per key tile
 *   for each visible key tile (kBlockN keys), K and V in one or two stages of shared memory
 *   (one: V loads during S = Q K^T, the next K during the softmax and P V):
 *       S = Q K^T                                 mma.sync, fp32, in registers (never in DRAM)
 *       S = softcap / ALiBi (if asked)            in log2 units afterwards
 *       S = mask(S)                               only on tiles that cross a mask boundary
 *       per m16 tile of the warp:
 *         m_new = max(m, rowmax(S))               online softmax, exp2 with the scale folded in
 *         P = exp2(S - m_new); l = l * c + rowsum(P); O = O * c   (c = exp2(m - m_new))
 *         O += P V                                mma.sync, P as bf16/fp16 from registers; the next
 *                                                 tile's softmax overlaps these MMAs
 *   O /= l, LSE = (m + log2 l) ln 2               one normalisation, staged through shared memory
 *
 * Tiles that no query row of the block can see are never loaded or computed. Rows that see no key
 * get O = 0 and LSE = -inf. No atomics and a fixed reduction order: results are deterministic.
 * A call with too few query tiles to fill the GPU splits each tile's keys over num_splits blocks
 * (the kSplit instantiation): each writes its normalised fp32 O and LSE to the workspace, and the
 * merge kernel (merge.cu) combines them in split order.
 *
 * Fragment layouts follow the PTX ISA's mma.m16n8k16 description (lane = 4*g + t):
 *   A (16x16): {(g, 2t..2t+1), (g+8, 2t..), (g, 2t+8..), (g+8, 2t+8..)}
 *   B (16x8):  {(k=2t..2t+1, n=g), (k=2t+8.., n=g)}      C (16x8): {(g, 2t..2t+1), (g+8, 2t..2t+1)}
 */
#pragma once

#include <math.h>

#include "softmax.cuh"

namespace fa {

template <int kHeadDim> struct fused_cfg;
#define FA_CFG_SPEC(hd, bm, bn, w, st)                                                 \
    template <> struct fused_cfg<hd> {                                                     \
        static constexpr int block_m = bm, block_n = bn, warps = w, stages = st;           \
    };
FA_FUSED_CONFIGS(FA_CFG_SPEC)
#undef FA_CFG_SPEC

/* ---- PTX wrappers (sm_80: cp.async, ldmatrix, mma.sync) ----------------------------------- */

/* 16-byte async copy; src_bytes = 0 zero-fills the destination without reading src. */
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void *src, bool valid) {
    const int src_bytes = valid ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
                 "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int kPending> __device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

template <int kDtype>
__device__ __forceinline__ void mma_16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                          uint32_t b1) {
    if constexpr (kDtype == 1) {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
            "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    } else {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
            "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
}

/* O += P V over one 16-key step kk of P (its A fragment `a`), for every pair of O's 8-column tiles:
 * V's rows 16 kk.. from the stage at sV (a lane's ldsm_lane), read transposed. */
template <int kDtype, int kOTiles, class Lane>
__device__ __forceinline__ void mma_pv_step(float (&o)[kOTiles][4], const uint32_t (&a)[4], const Lane &sV, int kk) {
#pragma unroll
    for (int dn = 0; dn < kOTiles / 2; ++dn) {
        uint32_t vb[4];
        ldmatrix_x4_trans(vb, sV.at(kk * 16, dn));
        mma_16816<kDtype>(o[2 * dn], a, vb[0], vb[1]);
        mma_16816<kDtype>(o[2 * dn + 1], a, vb[2], vb[3]);
    }
}

/* ---- the kernel ---------------------------------------------------------------------------- */

template <int kDtype, int kHeadDim>
struct fused_traits {
    using cfg = fused_cfg<kHeadDim>;
    using T = typename elem<kDtype>::type;
    static constexpr int kBlockM = cfg::block_m, kBlockN = cfg::block_n, kWarps = cfg::warps;
    static constexpr int kStages = cfg::stages; /* K/V stages: 2 (double-buffered) or 1 */
    static constexpr int kThreads = 32 * kWarps;
    static constexpr int kMTiles = kBlockM / (16 * kWarps); /* m16 tiles (query rows / 16) per warp */
    /* A tile's rows in two planes (fa_kernel_params.h): A, the first kWA columns (whole 128-byte
     * lines a row), then B, the last kWB (64 bytes a row, or none). */
    static constexpr int kWA = FA_SMEM_PLANE_A(kHeadDim), kWB = kHeadDim - kWA;
    static constexpr int kStride = kHeadDim; /* elements a row over both planes */
    static constexpr int kChunks = kHeadDim / 8;          /* 16-byte chunks per row */
    static constexpr int kKSteps = kHeadDim / 16;         /* k16 steps of Q K^T */
    static constexpr int kSTiles = kBlockN / 8;           /* n8 tiles of S per m16 tile */
    static constexpr int kOTiles = kHeadDim / 8;          /* n8 tiles of O per m16 tile */
    static constexpr int kPSteps = kBlockN / 16;          /* k16 steps of P V */
    static constexpr int kSmemBytes = (kBlockM + 2 * kStages * kBlockN) * kStride * 2;
    static constexpr int kMinBlocks = FA_FUSED_MIN_BLOCKS(kWarps); /* (why: fa_kernel_params.h) */
    static_assert(kMTiles >= 1 && kBlockM == 16 * kMTiles * kWarps, "a warp owns 16 * kMTiles rows");
    static_assert(kHeadDim % 16 == 0 && kBlockN % 16 == 0, "tile shapes must be multiples of 16");
    static_assert(kStages == 1 || kStages == 2, "one or two K/V stages");
    static_assert(kWB == 0 || kWB == 32, "plane B: none or 32 columns");
    /* ldsm_lane's XOR addressing needs every tile (Q, each K and V stage) and its plane B to start
     * on a 128-byte line of the 128-byte aligned shared memory: plane A's rows are whole lines, and
     * so is a tile's plane B (kBlockM rows of 64 bytes are, kBlockM being even), so every tile is. */
    static_assert((kWA * 2) % 128 == 0 && (kBlockN * kWB * 2) % 128 == 0, "planes of whole 128-byte lines");
    /* Byte offset of 16-byte chunk ch of row r in a tile of kRows rows: plane A's chunk c of row r
     * at c ^ (r & 7) within its 128-byte line, plane B's at c ^ ((r >> 1) & 3) within its 64 bytes
     * (two rows a line). */
    template <int kRows> static __device__ __forceinline__ uint32_t chunk_off(int r, int ch) {
        if (kWB == 0 || ch < kWA / 8) return (uint32_t)((r * kWA + 8 * (ch ^ (r & 7))) * 2);
        return (uint32_t)((kRows * kWA + r * kWB + 8 * ((ch - kWA / 8) ^ ((r >> 1) & 3))) * 2);
    }
};

/* A lane's ldmatrix addresses in a tile of kRows rows: the lane reads row `row` (of 16, plus a
 * multiple of 8) of the 16x16 blocks and their chunk 2 c + hi (c: the block's chunk pair, hi: the
 * lane's 16-byte half). In plane A the chunk sits at (2 c + hi) ^ (row & 7) within its 128-byte
 * line; with the tile 128-byte aligned, that is the address of chunk pair 0 XOR 16 (2 c & 7): one
 * LOP3, shared by every block row (and hoisted where registers allow), the rest an immediate. In
 * plane B, within its 64 bytes: pair 0's address XOR 16 (2 c & 3). */
template <typename Tr, int kRows> struct ldsm_lane {
    uint32_t base;   /* plane A's chunk pair 0 for this lane */
    uint32_t base_b; /* plane B's chunk pair 0 for this lane (unused without plane B) */
    /* row0: the rows before the lane's 16 (a multiple of 16) */
    __device__ __forceinline__ ldsm_lane(uint32_t tile, int row0, int row, int hi) {
        base = tile + (uint32_t)(row0 * Tr::kWA * 2) + (uint32_t)(row * Tr::kWA * 2 + 16 * ((row & 7) ^ hi));
        base_b = tile + (uint32_t)((kRows * Tr::kWA + row0 * Tr::kWB) * 2) +
                 (uint32_t)(row * Tr::kWB * 2 + 16 * (((row >> 1) & 3) ^ hi));
    }
    /* rows `rows` further down (a multiple of 8), chunk pair c (both compile-time at every use) */
    __device__ __forceinline__ uint32_t at(int rows, int c) const {
        if (Tr::kWB == 0 || 2 * c < Tr::kWA / 8)
            return (base ^ (uint32_t)((2 * c & 7) * 16)) + (uint32_t)(rows * Tr::kWA * 2 + (2 * c & ~7) * 16);
        const int cb = 2 * c - Tr::kWA / 8; /* the pair's first chunk in plane B: 0 or 2 */
        return (base_b ^ (uint32_t)(cb * 16)) + (uint32_t)(rows * Tr::kWB * 2);
    }
};

/* Async copy of rows [row0, row0 + kRows) of a [seq, head_dim] slice into shared memory; rows past
 * `rows_valid` and columns past `head_dim` are zero-filled so they contribute nothing. */
template <typename Tr, int kRows>
__device__ __forceinline__ void load_tile(typename Tr::T *dst, const typename Tr::T *src,
                                          int64_t row_stride, int row0, int rows_valid,
                                          int head_dim) {
    /* kTpr threads share a row (the largest power of two dividing its chunks), each taking every
     * kTpr-th chunk; a pass covers kRowsPerPass rows. A thread's (row, chunk) pairs are constants
     * relative to row0: one global address per call, then fixed steps, and no per-row multiply. */
    constexpr int kChunks = Tr::kChunks;
    constexpr int kTpr = (kChunks & -kChunks) < 32 ? (kChunks & -kChunks) : 32;
    constexpr int kCpt = kChunks / kTpr; /* chunks per thread per row */
    constexpr int kRowsPerPass = Tr::kThreads / kTpr;
    constexpr int kPasses = (kRows + kRowsPerPass - 1) / kRowsPerPass;
    static_assert(Tr::kThreads % kTpr == 0 && kChunks % kTpr == 0, "threads per row");
    const int r0 = (int)threadIdx.x / kTpr, c0 = (int)threadIdx.x % kTpr;
    const typename Tr::T *g = src + (int64_t)(row0 + r0) * row_stride + c0 * 8;
    const int64_t step = (int64_t)kRowsPerPass * row_stride;
    const uint32_t s0 = smem_u32(dst);
#pragma unroll
    for (int i = 0; i < kPasses; ++i) {
        if (kRows % kRowsPerPass == 0 || r0 + i * kRowsPerPass < kRows) {
            const bool row_ok = row0 + r0 + i * kRowsPerPass < rows_valid;
#pragma unroll
            for (int j = 0; j < kCpt; ++j) {
                const bool valid = row_ok && (c0 + j * kTpr) * 8 < head_dim;
                cp_async_16(s0 + Tr::template chunk_off<kRows>(r0 + i * kRowsPerPass, c0 + j * kTpr),
                            valid ? g + j * kTpr * 8 : src, valid);
            }
        }
        g += step;
    }
}

/* Where a block's K and V rows come from. A dense call: one [seq, head_dim] slice each (rows at a
 * fixed stride from a base). A serving call: the same for packed or indexed K/V, or, with a block
 * table, row j of the sequence at row j % page_size of page table[j / page_size] of the pools. Rows
 * past rows_valid (and pages outside the pools) are zero-filled. */
template <typename Tr> struct dense_kv {
    const fa_kernel_params &p;
    const typename Tr::T *k, *v;
    __device__ __forceinline__ void load_k(typename Tr::T *sk, int row0) const {
        load_tile<Tr, Tr::kBlockN>(sk, k, p.k_seq_stride, row0, p.seqlen_k, p.head_dim);
    }
    __device__ __forceinline__ void load_v(typename Tr::T *sv, int row0) const {
        load_tile<Tr, Tr::kBlockN>(sv, v, p.v_seq_stride, row0, p.seqlen_k, p.head_dim);
    }
    __device__ __forceinline__ void load(typename Tr::T *sk, typename Tr::T *sv, int row0) const {
        load_k(sk, row0);
        load_v(sv, row0);
    }
};

template <typename Tr> struct serving_kv {
    const typename Tr::T *k, *v;  /* this KV head's base (packed / indexed: the sequence's too) */
    int64_t k_stride, v_stride;   /* between rows of a page (or of the slice) */
    int64_t k_page, v_page;       /* between pages */
    const int32_t *table;         /* the sequence's page list (block-table row); NULL: not paged */
    int pages;                    /* entries of that list that belong to the sequence */
    int page_size, num_pages, rows_valid, head_dim;
    /* K's rows into sk, V's into sv (kK, kV: which of the two), sharing the page lookups. */
    template <bool kK, bool kV>
    __device__ __forceinline__ void load_rows(typename Tr::T *sk, typename Tr::T *sv, int row0) const {
        if (table == nullptr) { /* packed or indexed rows: a strided slice, as in a dense call */
            if (kK) load_tile<Tr, Tr::kBlockN>(sk, k, k_stride, row0, rows_valid, head_dim);
            if (kV) load_tile<Tr, Tr::kBlockN>(sv, v, v_stride, row0, rows_valid, head_dim);
            return;
        }
        constexpr int kTotal = Tr::kBlockN * Tr::kChunks;
        constexpr int kIters = (kTotal + Tr::kThreads - 1) / Tr::kThreads;
        const uint32_t kb = smem_u32(sk), vb = smem_u32(sv);
#pragma unroll
        for (int i = 0; i < kIters; ++i) {
            const int c = (int)threadIdx.x + i * Tr::kThreads;
            if (kTotal % Tr::kThreads == 0 || c < kTotal) {
                const int r = c / Tr::kChunks, ch = c % Tr::kChunks, j = row0 + r;
                bool valid = j < rows_valid && ch * 8 < head_dim;
                int64_t page = 0, in_page = j;
                if (valid) {
                    const int pi = j / page_size;
                    page = pi < pages ? table[pi] : -1;
                    in_page = j - pi * page_size;
                    valid = page >= 0 && page < num_pages;
                }
                const uint32_t soff = Tr::template chunk_off<Tr::kBlockN>(r, ch);
                const typename Tr::T *gk = valid ? k + page * k_page + in_page * k_stride + ch * 8 : k;
                const typename Tr::T *gv = valid ? v + page * v_page + in_page * v_stride + ch * 8 : v;
                if (kK) cp_async_16(kb + soff, gk, valid);
                if (kV) cp_async_16(vb + soff, gv, valid);
            }
        }
    }
    __device__ __forceinline__ void load_k(typename Tr::T *sk, int row0) const { load_rows<true, false>(sk, sk, row0); }
    __device__ __forceinline__ void load_v(typename Tr::T *sv, int row0) const { load_rows<false, true>(sv, sv, row0); }
    __device__ __forceinline__ void load(typename Tr::T *sk, typename Tr::T *sv, int row0) const {
        load_rows<true, true>(sk, sv, row0);
    }
};

/* Where one block's inputs and outputs are. A dense call: the kernel parameters say it all. */
template <typename Tr> struct dense_ctx {
    using T = typename Tr::T;
    const fa_kernel_params &p;
    __device__ __forceinline__ const fa_kernel_params &bounds() const { return p; }
    __device__ __forceinline__ bool beyond(int) const { return false; }
    __device__ __forceinline__ const T *q(int b, int h) const {
        return (const T *)p.q + b * p.q_batch_stride + h * p.q_head_stride;
    }
    __device__ __forceinline__ dense_kv<Tr> kv(int b, int hk) const {
        const T *kg = (const T *)p.k + b * p.k_batch_stride + hk * p.k_head_stride;
        const T *vg = (const T *)p.v + b * p.v_batch_stride + hk * p.v_head_stride;
        return dense_kv<Tr>{p, kg, vg};
    }
    __device__ __forceinline__ T *o(int b, int h) const { return (T *)p.o + b * p.o_batch_stride + h * p.o_head_stride; }
    __device__ __forceinline__ float *lse(int b, int h) const {
        return p.lse ? p.lse + ((int64_t)b * p.heads_q + h) * p.seqlen_q : nullptr;
    }
    static constexpr int64_t lse_stride() { return 1; } /* between the LSEs of consecutive rows */
};

/* A serving call: sequence b's counts and rows, read once from the device arrays (serving_seq). */
template <typename Tr> struct serving_ctx {
    using T = typename Tr::T;
    const fa_kernel_params &p;
    fa_seq s;
    __device__ __forceinline__ const fa_seq &bounds() const { return s; }
    /* Query tiles past the sequence's queries do nothing (the grid covers the capacity). */
    __device__ __forceinline__ bool beyond(int m0) const { return m0 >= s.seqlen_q; }
    __device__ __forceinline__ int64_t q_batch(int b) const { return p.cu_seqlens_q != nullptr ? 0 : b; }
    /* A packed Q's rows with q_group_rows: rows of the tile are the group's heads (q_seq_stride). */
    __device__ __forceinline__ bool group_rows() const { return p.q_group_rows > 1; }
    __device__ __forceinline__ const T *q(int b, int h) const {
        return (const T *)p.q + q_batch(b) * p.q_batch_stride + s.q_row0 * (group_rows() ? p.q_row0_stride : p.q_seq_stride) +
               h * p.q_head_stride;
    }
    __device__ __forceinline__ serving_kv<Tr> kv(int b, int hk) const {
        /* Paged: the pools' page stride is the batch stride. Packed: the sequence's first row. */
        const bool paged = p.block_table != nullptr;
        const int64_t kvb = paged ? 0 : s.kv_b;
        serving_kv<Tr> kv;
        kv.k = (const T *)p.k + kvb * p.k_batch_stride + s.k_row0 * p.k_seq_stride + hk * p.k_head_stride;
        kv.v = (const T *)p.v + kvb * p.v_batch_stride + s.k_row0 * p.v_seq_stride + hk * p.v_head_stride;
        kv.k_stride = p.k_seq_stride, kv.v_stride = p.v_seq_stride;
        kv.k_page = p.k_batch_stride, kv.v_page = p.v_batch_stride;
        kv.table = paged ? p.block_table + s.page0 : nullptr;
        kv.pages = s.pages;
        kv.page_size = p.page_size, kv.num_pages = p.num_pages;
        kv.rows_valid = s.kv_valid ? s.seqlen_k : 0;
        kv.head_dim = p.head_dim;
        return kv;
    }
    __device__ __forceinline__ T *o(int b, int h) const {
        return (T *)p.o + q_batch(b) * p.o_batch_stride + s.q_row0 * (group_rows() ? p.o_row0_stride : p.o_seq_stride) +
               h * p.o_head_stride;
    }
    /* LSE [heads_q, total_q] for a packed Q (KV head h's first query head's row with q_group_rows),
     * else [batch, heads_q, seqlen_q]. */
    __device__ __forceinline__ float *lse(int b, int h) const {
        if (p.lse == nullptr) return nullptr;
        if (p.cu_seqlens_q == nullptr) return p.lse + ((int64_t)b * p.heads_q + h) * p.seqlen_q;
        return p.lse + (int64_t)h * (group_rows() ? p.q_group_rows : 1) * p.total_q + s.q_row0;
    }
    __device__ __forceinline__ int64_t lse_stride() const { return group_rows() ? p.total_q : 1; }
};

/* A barrier of the whole block. kAligned: every thread reaches it at the same instruction
 * (__syncthreads, bar.sync). Otherwise warps may wait at different instructions of barrier 0 (the
 * unaligned barrier.sync 0), as the rowless warps of the kIdleWarps kernel do. */
template <bool kAligned> __device__ __forceinline__ void block_barrier() {
    if constexpr (kAligned)
        __syncthreads();
    else
        asm volatile("barrier.sync 0;\n" ::: "memory");
}

/* One block's work: kBlockM query rows (query tile blockIdx.x, heaviest first) of one (batch entry,
 * head); ctx says where its inputs and outputs are (dense_ctx or serving_ctx). kTransform: softcap
 * and/or ALiBi present. kSplit: the call splits each tile's keys num_splits ways (blockIdx.x =
 * query tile x num_splits + split); this block writes its split's partial result. kIdleWarps
 * (p.idle_warps > 0): where the block's rows all lie in its first 16, every warp takes its share of
 * each key tile over those rows and warp 0 merges the shares (warp_keys); otherwise a warp whose
 * rows all lie past the block's last query runs a key loop of the loads, waits and barriers alone,
 * and writes nothing. */
template <int kDtype, int kHeadDim, bool kTransform, bool kSplit, bool kIdleWarps, class Ctx>
__device__ __forceinline__ void fused_fwd_block(const fa_kernel_params &p, const Ctx &ctx) {
    using Tr = fused_traits<kDtype, kHeadDim>;
    using T = typename Tr::T;
    constexpr int kBlockM = Tr::kBlockM, kBlockN = Tr::kBlockN, kStride = Tr::kStride;
    constexpr int kMT = Tr::kMTiles;

    extern __shared__ __align__(128) unsigned char smem_raw[];
    T *sQ = reinterpret_cast<T *>(smem_raw);
    T *sK = sQ + kBlockM * kStride;               /* kStages stages */
    T *sV = sK + Tr::kStages * kBlockN * kStride; /* kStages stages */

    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int g = lane / 4, t = lane % 4;
    /* Heaviest (latest, for causal) query tiles first: they start while the grid fills. A split
     * call has num_splits blocks per query tile, each over its share of the tile's keys. */
    const int m_block = p.num_m_blocks - 1 - (kSplit ? (int)blockIdx.x / p.num_splits : (int)blockIdx.x);
    const int h = blockIdx.y, b = blockIdx.z, hk = h / p.head_group;
    const auto &bnd = ctx.bounds();
    const int m0 = m_block * kBlockM;
    if (ctx.beyond(m0)) return;
    const int row_last = min(m0 + kBlockM, bnd.seqlen_q) - 1;
    const int warp_row0 = m0 + warp * 16 * kMT; /* first query row of this warp */

    const T *qg = ctx.q(b, h);
    const auto kv = ctx.kv(b, hk);
    T *og = ctx.o(b, h);
    float *lse = ctx.lse(b, h);

    /* Keys any row of this block can see: [key_lo, key_hi), in key tiles; this split's share of
     * them: tiles [tile_begin, tile_begin + n_tiles). */
    const int key_lo = max(0, m0 + bnd.key_lo_off);
    const int key_hi = min(bnd.seqlen_k, row_last + bnd.key_hi_off + 1);
    /* This split's slot of row m0 + r in the partial results ([split][batch][heads_q][seqlen_q]);
     * recomputed where used, so nothing of it stays live through the main loop. */
    auto part_row0 = [&]() {
        return (((int64_t)((int)blockIdx.x % p.num_splits) * p.batch + b) * p.heads_q + h) * p.seqlen_q + m0;
    };
    int tile_begin = 0, n_tiles = 0;
    if constexpr (kSplit) {
        if (key_hi > key_lo) {
            const int tile_first = key_lo / kBlockN;
            const int tiles_all = (key_hi + kBlockN - 1) / kBlockN - tile_first;
            const int per_split = (tiles_all + p.num_splits - 1) / p.num_splits, split = (int)blockIdx.x % p.num_splits;
            tile_begin = tile_first + split * per_split;
            n_tiles = max(0, min(per_split, tiles_all - split * per_split));
        }
        if (n_tiles == 0) { /* no key in this split: an empty part (LSE = -inf; O unread) */
            for (int r = threadIdx.x; r < kBlockM; r += Tr::kThreads)
                if (m0 + r < bnd.seqlen_q) p.lse_accum[part_row0() + r] = -INFINITY;
            return;
        }
    }
    if (!kSplit && key_hi <= key_lo) { /* no row sees a key: O = 0, LSE = -inf */
        for (int c = threadIdx.x; c < kBlockM * Tr::kChunks; c += Tr::kThreads) {
            const int r = c / Tr::kChunks, ch = c % Tr::kChunks;
            if (m0 + r < bnd.seqlen_q && ch * 8 < p.head_dim)
                *reinterpret_cast<uint4 *>(og + (int64_t)(m0 + r) * p.o_seq_stride + ch * 8) =
                    make_uint4(0, 0, 0, 0);
        }
        if (lse)
            for (int r = threadIdx.x; r < kBlockM; r += Tr::kThreads)
                if (m0 + r < bnd.seqlen_q) lse[(m0 + r) * ctx.lse_stride()] = -INFINITY;
        return;
    }
    if constexpr (!kSplit) {
        tile_begin = key_lo / kBlockN;
        n_tiles = (key_hi + kBlockN - 1) / kBlockN - tile_begin;
    }
    /* Prologue. Two stages: Q and the first key tile in group 0, the second key tile in group 1.
     * One stage: Q and the first tile's K (its V loads at the top of the loop). */
    load_tile<Tr, kBlockM>(sQ, qg, p.q_seq_stride, m0, bnd.seqlen_q, p.head_dim);
    if constexpr (Tr::kStages == 2) {
        kv.load(sK, sV, tile_begin * kBlockN);
        cp_async_commit();
        if (n_tiles > 1) kv.load(sK + kBlockN * kStride, sV + kBlockN * kStride, (tile_begin + 1) * kBlockN);
        cp_async_commit();
    } else {
        kv.load_k(sK, tile_begin * kBlockN);
        cp_async_commit();
    }

    /* Softcap and ALiBi need the score in natural units; without them the scale is folded into
     * the exp2 argument (one FFMA per element). */
    const float mult = kTransform ? 1.0f : p.scale_log2;
    /* At head dims 160 and 192 (64x64 tiles, 16 rows a warp), O *= corr is 80-96 multiplications a
     * thread a key tile: raise the running max only past a slack and skip them where no row of the
     * warp raised it (as FUSED_SM90 does at 192 and 256). Measured 1.00-1.06x there with FUSED
     * forced; at 256 (registers at their cap) 0.94-0.96x, so that kernel keeps the plain loop
     * (docs/performance.md v27). */
    constexpr bool kLazyMax = kHeadDim == 160 || kHeadDim == 192;
    const float slope = kTransform ? alibi_slope(p, b, h) : 0.0f;

    float o_acc[kMT][Tr::kOTiles][4];
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
        for (int j = 0; j < Tr::kOTiles; ++j) o_acc[mt][j][0] = o_acc[mt][j][1] = o_acc[mt][j][2] = o_acc[mt][j][3] = 0.0f;
    /* Rows g and g + 8 of each m16 tile: running max (raw units, times mult gives log2 units) and
     * this thread's partial row sums (quad-reduced once, at the end). */
    float row_max[kMT][2], row_sum[kMT][2];
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) row_max[mt][0] = row_max[mt][1] = -INFINITY, row_sum[mt][0] = row_sum[mt][1] = 0.0f;

    /* Each lane's ldmatrix row and 16-byte half inside a 16x16 block (ldsm_lane; the layouts in
     * the header). */
    const int a_row = (lane % 8) + 8 * ((lane / 8) % 2), a_hi = lane / 16;   /* Q (A) and V (trans) */
    const int kb_row = (lane % 8) + 8 * (lane / 16), kb_hi = (lane / 8) % 2; /* K (B) */
    const ldsm_lane<Tr, kBlockM> sQ_warp(smem_u32(sQ), warp * 16 * kMT, a_row, a_hi);

    /* kIdleWarps, and every row of the block in its first 16 (a decode's group of at most 16 query
     * heads, or at most 16 queries): the warps split each key tile instead, kBlockN / kWarps keys a
     * warp, all over those 16 rows, each with its own running max and sum; at the end the others
     * hand their O, max and sum to warp 0 through the K/V stages, and warp 0 merges and stores.
     * One warp's chain of products and exponentials a key tile bounded such decodes (one m16 tile
     * of 4 real rows among 32, or 16, a warp). */
    const bool warp_keys = kIdleWarps && bnd.seqlen_q - m0 <= 16;
    /* kIdleWarps otherwise: this warp has no query row (the same for all its lanes). It loads its
     * share of every tile and meets the others at each barrier, at instructions of its own (so
     * every barrier of this kernel is the unaligned one). */
    bool idle = kIdleWarps && !warp_keys && warp_row0 >= bnd.seqlen_q;
    constexpr bool kAligned = !kIdleWarps;
    if constexpr (kIdleWarps) {
        if (warp_keys) {
            constexpr int kWN = kBlockN / Tr::kWarps, kWS = kWN / 8, kWP = kWN / 16;
            static_assert(kWN % 16 == 0, "a warp's share of a key tile: whole k16 steps");
            const ldsm_lane<Tr, kBlockM> sQ_rows(smem_u32(sQ), 0, a_row, a_hi); /* rows 0-15, every warp */
            const int kw0 = warp * kWN;                   /* this warp's keys in a tile */
            for (int it = 0; it < n_tiles; ++it) {
                const int stage = Tr::kStages == 2 ? (it & 1) : 0;
                const int n0 = (tile_begin + it) * kBlockN;
                if constexpr (Tr::kStages == 2) {
                    cp_async_wait<1>();
                    block_barrier<kAligned>();
                } else {
                    cp_async_wait<0>();
                    block_barrier<kAligned>();
                    kv.load_v(sV, n0);
                    cp_async_commit();
                }
                const ldsm_lane<Tr, kBlockN> sK_st(smem_u32(sK + stage * kBlockN * kStride), kw0, kb_row, kb_hi);
                const ldsm_lane<Tr, kBlockN> sV_st(smem_u32(sV + stage * kBlockN * kStride), kw0, a_row, a_hi);
                float s[kWS][4];
#pragma unroll
                for (int j = 0; j < kWS; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
#pragma unroll
                for (int ks = 0; ks < Tr::kKSteps; ++ks) {
                    uint32_t a[4];
                    ldmatrix_x4(a, sQ_rows.at(0, ks));
#pragma unroll
                    for (int nb = 0; nb < kWS / 2; ++nb) {
                        uint32_t kb[4];
                        ldmatrix_x4(kb, sK_st.at(nb * 16, ks));
                        mma_16816<kDtype>(s[2 * nb], a, kb[0], kb[1]);
                        mma_16816<kDtype>(s[2 * nb + 1], a, kb[2], kb[3]);
                    }
                }
                auto s_at = [&s](int j, int e) -> float & { return s[j][e]; };
                auto row_at = [&](int r) { return m0 + g + 8 * r; };
                if constexpr (kTransform) {
#pragma unroll
                    for (int j = 0; j < kWS; ++j)
#pragma unroll
                        for (int e = 0; e < 4; ++e)
                            s[j][e] = kLog2e * transform_raw_score(p, bnd, s[j][e], slope, m0 + g + 8 * (e / 2),
                                                                   n0 + kw0 + 8 * j + 2 * t + (e % 2));
                }
                if (FA_TILE_NEEDS_MASK(bnd, n0, kBlockN, m0, row_last))
                    mask_scores_keywise<kWS>(s_at, bnd, row_at, n0 + kw0, t);
                if constexpr (Tr::kStages == 1) {
                    cp_async_wait<0>();
                    block_barrier<kAligned>();
                    if (it + 1 < n_tiles) kv.load_k(sK, n0 + kBlockN);
                    cp_async_commit();
                }
                auto o_at = [&o_acc](int j, int e) -> float & { return o_acc[0][j][e]; };
#pragma unroll
                for (int r = 0; r < 2; ++r) {
                    float m_scaled;
                    const float corr = softmax_new_max<kWS>(s_at, r, row_max[0][r], mult, m_scaled);
                    rescale_row<Tr::kOTiles>(o_at, r, corr);
                    row_sum[0][r] = softmax_exp<kWS>(s_at, r, mult, m_scaled, row_sum[0][r] * corr);
                }
#pragma unroll
                for (int kk = 0; kk < kWP; ++kk) {
                    uint32_t a[4];
                    pack_p<kDtype>(s_at, kk, a);
                    mma_pv_step<kDtype>(o_acc[0], a, sV_st, kk);
                }
                if constexpr (Tr::kStages == 2) {
                    block_barrier<kAligned>();
                    if (it + 2 < n_tiles)
                        kv.load(sK + stage * kBlockN * kStride, sV + stage * kBlockN * kStride, n0 + 2 * kBlockN);
                    cp_async_commit();
                }
            }
        }
    }
    if (idle) {
        for (int it = 0; it < n_tiles; ++it) {
            const int n0 = (tile_begin + it) * kBlockN;
            if constexpr (Tr::kStages == 2) {
                cp_async_wait<1>();
                block_barrier<kAligned>();
                block_barrier<kAligned>();
                if (it + 2 < n_tiles) {
                    const int stage = it & 1;
                    kv.load(sK + stage * kBlockN * kStride, sV + stage * kBlockN * kStride, n0 + 2 * kBlockN);
                }
                cp_async_commit();
            } else {
                cp_async_wait<0>();
                block_barrier<kAligned>();
                kv.load_v(sV, n0);
                cp_async_commit();
                cp_async_wait<0>();
                block_barrier<kAligned>();
                if (it + 1 < n_tiles) kv.load_k(sK, n0 + kBlockN);
                cp_async_commit();
            }
        }
    }
    const int n_compute = idle || warp_keys ? 0 : n_tiles; /* the key loop of the warps with rows */
    for (int it = 0; it < n_compute; ++it) {
        const int stage = Tr::kStages == 2 ? (it & 1) : 0;
        const int n0 = (tile_begin + it) * kBlockN;
        if constexpr (Tr::kStages == 2) {
            cp_async_wait<1>();         /* tile `it` (and Q) have landed for this thread ... */
            block_barrier<kAligned>(); /* ... and for every thread */
        } else {
            cp_async_wait<0>();         /* K of tile `it` (and Q) have landed for this thread ... */
            block_barrier<kAligned>(); /* ... and for every thread, and every warp is done with V of tile it - 1 */
            kv.load_v(sV, n0);
            cp_async_commit();
        }
        const ldsm_lane<Tr, kBlockN> sK_st(smem_u32(sK + stage * kBlockN * kStride), 0, kb_row, kb_hi);
        const ldsm_lane<Tr, kBlockN> sV_st(smem_u32(sV + stage * kBlockN * kStride), 0, a_row, a_hi);

        /* S = Q K^T for this warp's rows x kBlockN keys; each K fragment feeds every m16 tile. */
        float s[kMT][Tr::kSTiles][4];
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
            for (int j = 0; j < Tr::kSTiles; ++j) s[mt][j][0] = s[mt][j][1] = s[mt][j][2] = s[mt][j][3] = 0.0f;
#pragma unroll
        for (int ks = 0; ks < Tr::kKSteps; ++ks) {
            uint32_t a[kMT][4];
#pragma unroll
            for (int mt = 0; mt < kMT; ++mt)
                ldmatrix_x4(a[mt], sQ_warp.at(mt * 16, ks));
#pragma unroll
            for (int nb = 0; nb < Tr::kSTiles / 2; ++nb) {
                uint32_t kb[4];
                ldmatrix_x4(kb, sK_st.at(nb * 16, ks));
#pragma unroll
                for (int mt = 0; mt < kMT; ++mt) {
                    mma_16816<kDtype>(s[mt][2 * nb], a[mt], kb[0], kb[1]);
                    mma_16816<kDtype>(s[mt][2 * nb + 1], a[mt], kb[2], kb[3]);
                }
            }
        }

        /* Softcap/ALiBi, then -inf for hidden keys, only on tiles that cross a boundary of the
         * visible band or the end of the keys. */
        auto s_of = [&](int mt) { return [&s, mt](int j, int e) -> float & { return s[mt][j][e]; }; };
        auto row_of = [&](int mt) {
            const int row0 = warp_row0 + 16 * mt + g;
            return [row0](int r) { return row0 + 8 * r; };
        };
        if constexpr (kTransform) {
#pragma unroll
            for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
                for (int j = 0; j < Tr::kSTiles; ++j)
#pragma unroll
                    for (int e = 0; e < 4; ++e)
                        s[mt][j][e] = kLog2e * transform_raw_score(p, bnd, s[mt][j][e], slope,
                                                                   warp_row0 + 16 * mt + g + 8 * (e / 2),
                                                                   n0 + 8 * j + 2 * t + (e % 2));
        }
        const bool need_mask = FA_TILE_NEEDS_MASK(bnd, n0, kBlockN, m0, row_last);
        if (need_mask) {
#pragma unroll
            for (int mt = 0; mt < kMT; ++mt) mask_scores_keywise<Tr::kSTiles>(s_of(mt), bnd, row_of(mt), n0, t);
        }

        if constexpr (Tr::kStages == 1) {
            cp_async_wait<0>();         /* V of tile `it` has landed for this thread ... */
            block_barrier<kAligned>(); /* ... and for every thread, and every warp is done with K of tile it */
            if (it + 1 < n_tiles) kv.load_k(sK, n0 + kBlockN);
            cp_async_commit(); /* possibly empty: keeps the wait_group count uniform */
        }

        /* Per m16 tile: the online softmax, then O += P V. Tile mt + 1's softmax has no dependence
         * on tile mt's MMAs, so the scheduler can overlap them (at the cost of reading V fragments
         * once per m16 tile). */
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
            auto s_at = s_of(mt);
            auto o_at = [&o_acc, mt](int j, int e) -> float & { return o_acc[mt][j][e]; };
            if constexpr (kLazyMax) {
                /* the max raised only past a slack (softmax_new_max_lazy): O *= corr only where a
                 * row of the warp raised it, and not on the first key tile (O is zero) */
                float corr[2], m_scaled[2];
#pragma unroll
                for (int r = 0; r < 2; ++r)
                    corr[r] = softmax_new_max_lazy<Tr::kSTiles>(s_at, r, row_max[mt][r], mult, m_scaled[r]);
                if (__any_sync(0xffffffffu, it > 0 && (corr[0] != 1.0f || corr[1] != 1.0f))) {
#pragma unroll
                    for (int r = 0; r < 2; ++r) rescale_row<Tr::kOTiles>(o_at, r, corr[r]);
                }
#pragma unroll
                for (int r = 0; r < 2; ++r)
                    row_sum[mt][r] = softmax_exp<Tr::kSTiles>(s_at, r, mult, m_scaled[r], row_sum[mt][r] * corr[r]);
            } else {
#pragma unroll
                for (int r = 0; r < 2; ++r) {
                    float m_scaled;
                    const float corr = softmax_new_max<Tr::kSTiles>(s_at, r, row_max[mt][r], mult, m_scaled);
                    rescale_row<Tr::kOTiles>(o_at, r, corr);
                    row_sum[mt][r] = softmax_exp<Tr::kSTiles>(s_at, r, mult, m_scaled, row_sum[mt][r] * corr);
                }
            }
#pragma unroll
            for (int kk = 0; kk < Tr::kPSteps; ++kk) {
                uint32_t a[4];
                pack_p<kDtype>(s_at, kk, a);
                mma_pv_step<kDtype>(o_acc[mt], a, sV_st, kk);
            }
        }
        if constexpr (Tr::kStages == 2) {
            block_barrier<kAligned>(); /* every warp is done with this stage; refill it with tile it + 2 */
            if (it + 2 < n_tiles) {
                const int n2 = (tile_begin + it + 2) * kBlockN;
                kv.load(sK + stage * kBlockN * kStride, sV + stage * kBlockN * kStride, n2);
            }
            cp_async_commit(); /* possibly empty: keeps the wait_group count uniform */
        }
    }
    cp_async_wait<0>();

    if constexpr (kIdleWarps) {
        if (warp_keys) {
            /* Warps 1.. hand warp 0 their O fragments (lane by lane, as held) and each row's max
             * and sum, in the K/V stages (every warp is done with them after the barrier). */
            constexpr int kPartFloats = (Tr::kWarps - 1) * Tr::kOTiles * 32 * 4;
            static_assert((kPartFloats + Tr::kWarps * 16 * 2) * 4 <= 2 * Tr::kStages * kBlockN * kStride * 2,
                          "the partial results fit the K/V stages");
            float *part = reinterpret_cast<float *>(sK), *ml = part + kPartFloats;
            block_barrier<kAligned>();
            if (warp > 0) {
#pragma unroll
                for (int j = 0; j < Tr::kOTiles; ++j)
                    *reinterpret_cast<float4 *>(part + (((warp - 1) * Tr::kOTiles + j) * 32 + lane) * 4) =
                        make_float4(o_acc[0][j][0], o_acc[0][j][1], o_acc[0][j][2], o_acc[0][j][3]);
            }
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                const float l = quad_sum(row_sum[0][r]);
                if (t == 0) ml[(warp * 16 + g + 8 * r) * 2] = row_max[0][r], ml[(warp * 16 + g + 8 * r) * 2 + 1] = l;
            }
            block_barrier<kAligned>();
            idle = warp != 0; /* warp 0 stores for all */
            if (warp == 0) {
                float f[2][Tr::kWarps];
#pragma unroll
                for (int r = 0; r < 2; ++r) {
                    const int row = g + 8 * r;
                    float mx = -INFINITY;
#pragma unroll
                    for (int w = 0; w < Tr::kWarps; ++w) mx = fmaxf(mx, ml[(w * 16 + row) * 2]);
                    const float m_scaled = mx == -INFINITY ? 0.0f : mx * mult;
                    float l = 0.0f;
#pragma unroll
                    for (int w = 0; w < Tr::kWarps; ++w) {
                        f[r][w] = fast_exp2(ml[(w * 16 + row) * 2] * mult - m_scaled);
                        l += f[r][w] * ml[(w * 16 + row) * 2 + 1];
                    }
                    row_max[0][r] = mx;
                    row_sum[0][r] = t == 0 ? l : 0.0f; /* (quad-summed again below) */
                }
#pragma unroll
                for (int j = 0; j < Tr::kOTiles; ++j) {
#pragma unroll
                    for (int e = 0; e < 4; ++e) o_acc[0][j][e] *= f[e / 2][0];
#pragma unroll
                    for (int w = 1; w < Tr::kWarps; ++w) {
                        const float4 v = *reinterpret_cast<const float4 *>(part + (((w - 1) * Tr::kOTiles + j) * 32 + lane) * 4);
                        o_acc[0][j][0] = fmaf(v.x, f[0][w], o_acc[0][j][0]);
                        o_acc[0][j][1] = fmaf(v.y, f[0][w], o_acc[0][j][1]);
                        o_acc[0][j][2] = fmaf(v.z, f[1][w], o_acc[0][j][2]);
                        o_acc[0][j][3] = fmaf(v.w, f[1][w], o_acc[0][j][3]);
                    }
                }
            }
        }
    }

    /* A split's epilogue: its normalised O in fp32, straight from the registers, and its LSE. */
    if constexpr (kSplit) {
        if (idle) return;
        const int64_t row0 = part_row0();
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                const float l = quad_sum(row_sum[mt][r]);
                const float inv = softmax_inv(l);
                const int row_local = (warp * kMT + mt) * 16 + g + 8 * r;
                if (m0 + row_local >= bnd.seqlen_q) continue;
                float *dst = p.o_accum + (row0 + row_local) * p.head_dim;
#pragma unroll
                for (int j = 0; j < Tr::kOTiles; ++j)
                    if (8 * j + 2 * t < p.head_dim) /* head_dim is a multiple of 8: both or neither */
                        *reinterpret_cast<float2 *>(dst + 8 * j + 2 * t) =
                            make_float2(o_acc[mt][j][2 * r] * inv, o_acc[mt][j][2 * r + 1] * inv);
                if (t == 0) p.lse_accum[row0 + row_local] = softmax_lse(l, row_max[mt][r], mult);
            }
        return;
    }

    /* Epilogue: normalise, stage O through sQ (free now: every warp read its Q last before the
     * loop's last barrier), store. */
    if (!idle) {
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                const float l = quad_sum(row_sum[mt][r]);
                const float inv = softmax_inv(l);
                const int row_local = (warp * kMT + mt) * 16 + g + 8 * r;
#pragma unroll
                for (int j = 0; j < Tr::kOTiles; ++j)
                    *reinterpret_cast<uint32_t *>(smem_raw + Tr::template chunk_off<kBlockM>(row_local, j) + 4 * t) =
                        pack_pair<kDtype>(o_acc[mt][j][2 * r] * inv, o_acc[mt][j][2 * r + 1] * inv);
                if (lse && t == 0 && m0 + row_local < bnd.seqlen_q)
                    lse[(m0 + row_local) * ctx.lse_stride()] = softmax_lse(l, row_max[mt][r], mult);
            }
    }
    block_barrier<kAligned>();
    for (int c = threadIdx.x; c < kBlockM * Tr::kChunks; c += Tr::kThreads) {
        const int r = c / Tr::kChunks, ch = c % Tr::kChunks;
        if (m0 + r < bnd.seqlen_q && ch * 8 < p.head_dim)
            *reinterpret_cast<uint4 *>(og + (int64_t)(m0 + r) * p.o_seq_stride + ch * 8) =
                *reinterpret_cast<const uint4 *>(smem_raw + Tr::template chunk_off<kBlockM>(r, ch));
    }
}


/* kTransform: softcap and/or ALiBi present. A separate instantiation keeps their registers and
 * code out of the plain kernel's main loop. kServing: a serving call (fa_kernel_params.serving),
 * each sequence's counts, offsets and rows from the device arrays; its own instantiation, so the
 * dense kernels carry none of it. kSplit: the keys are split (num_splits > 1); its own
 * instantiation too, so unsplit calls run the kernel they always did. */
template <int kDtype, int kHeadDim, bool kTransform, bool kServing, bool kSplit, bool kIdleWarps = false>
__global__ void __launch_bounds__(fused_traits<kDtype, kHeadDim>::kThreads,
                                  fused_traits<kDtype, kHeadDim>::kMinBlocks)
fused_fwd_kernel(const __grid_constant__ fa_kernel_params p) {
    using Tr = fused_traits<kDtype, kHeadDim>;
    if constexpr (!kServing)
        fused_fwd_block<kDtype, kHeadDim, kTransform, kSplit, kIdleWarps>(p, dense_ctx<Tr>{p});
    else
        fused_fwd_block<kDtype, kHeadDim, kTransform, kSplit, kIdleWarps>(
            p, serving_ctx<Tr>{p, serving_seq(p, blockIdx.z)});
}

template <int kDtype, int kHeadDim, bool kSplit> struct fused_kernels {
    using Kernel = void (*)(fa_kernel_params);
    /* The instantiation for (serving, transform), with or without idle warps. */
    template <bool kIdle> static Kernel pick(bool serving, bool transform) {
        return serving ? (transform ? fused_fwd_kernel<kDtype, kHeadDim, true, true, kSplit, kIdle>
                                    : fused_fwd_kernel<kDtype, kHeadDim, false, true, kSplit, kIdle>)
                       : (transform ? fused_fwd_kernel<kDtype, kHeadDim, true, false, kSplit, kIdle>
                                    : fused_fwd_kernel<kDtype, kHeadDim, false, false, kSplit, kIdle>);
    }
    static Kernel pick(bool serving, bool transform, bool idle) {
        return idle ? pick<true>(serving, transform) : pick<false>(serving, transform);
    }
};

template <int kDtype, int kHeadDim>
int launch_fused(const fa_kernel_params *kp, const fa_launch *l, void *stream) {
    using Tr = fused_traits<kDtype, kHeadDim>;
    if (l->threads != Tr::kThreads || l->smem_bytes != Tr::kSmemBytes || kp->num_splits < 1 ||
        (kp->num_splits > 1 && (kp->o_accum == nullptr || kp->lse_accum == nullptr)))
        return (int)cudaErrorInvalidConfiguration; /* planner and kernel disagree: refuse */
    const bool transform = kp->softcap > 0.0f || kp->alibi_slopes != nullptr, split = kp->num_splits > 1;
    const bool idle = kp->idle_warps > 0;
    if (idle && kp->seqlen_q > Tr::kBlockM - 16 * Tr::kMTiles)
        return (int)cudaErrorInvalidConfiguration; /* a block could fill every warp: no rowless warp */
    static std::atomic<unsigned long long> configured[16]; /* per kernel below: devices configured */
    const int which = (idle ? 8 : 0) + (split ? 4 : 0) + (kp->serving ? 2 : 0) + (transform ? 1 : 0);
    auto kernel = split ? fused_kernels<kDtype, kHeadDim, true>::pick(kp->serving, transform, idle)
                        : fused_kernels<kDtype, kHeadDim, false>::pick(kp->serving, transform, idle);
    const cudaError_t err = set_smem_once(kernel, Tr::kSmemBytes, configured[which]);
    if (err != cudaSuccess) return (int)err;
    kernel<<<dim3(l->grid_x, l->grid_y, l->grid_z), Tr::kThreads, Tr::kSmemBytes,
             (cudaStream_t)stream>>>(*kp);
    const cudaError_t launched = cudaGetLastError();
    if (launched != cudaSuccess || !split) return (int)launched;
    return fa_split_combine(kp, kDtype, 0, stream);
}

}  // namespace fa

/* One exported-to-the-library (not to users) launcher per compiled variant. */
#define FA_FUSED_INSTANCE(DTYPE, NAME, HD)                                                 \
    extern "C" __attribute__((visibility("hidden"))) int fa_fused_fwd_##NAME##_d##HD(      \
        const fa_kernel_params *kp, const fa_launch *l, void *stream) {                    \
        return fa::launch_fused<DTYPE, HD>(kp, l, stream);                                 \
    }
