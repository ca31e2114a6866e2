/*
 * fused_sm90.cuh - the FUSED_SM90 forward kernel: FlashAttention on Hopper's tensor memory
 * accelerator (TMA) and warpgroup tensor-core instructions (wgmma), sm_90a. Same contract and
 * semantics as the portable kernel in fused_fwd.cuh; a separate backend, so neither constrains the
 * other.
 *
 * A block owns 64 x C query rows of one (batch, head) (C = 2 consumer warpgroups at head dims 128
 * and 256, 3 at 64; the table in fa_kernel_params.h) and has C + 1 warpgroups:
 *   producer (warpgroup 0, one thread): TMA loads of Q once, then of K_j and V_j into two stages
 *     each, as the consumers free them. Each load completes on a "full" mbarrier; each stage is
 *     handed back on an "empty" mbarrier. It keeps 24 registers (setmaxnreg) so that the consumers
 *     can have 240 (C = 2) or 160 (C = 3).
 *   consumers (warpgroups 1..C): 64 query rows each, for the whole kernel. Per key tile j:
 *
 *     wait until K_j (and V_{j-1}) are in shared memory
 *     take the tensor-core turn (named barriers; the consumers go round in turn, so one's
 *       softmax runs while another's matrix products do)
 *     issue S_j = Q K_j^T                                  wgmma, A and B from shared memory
 *     issue O += P_{j-1} V_{j-1}                           wgmma, P from registers, V N-major
 *     pass the turn
 *     wait for S_j; hand back K_j; softcap/ALiBi/mask; online softmax (exp2, scale folded)
 *     wait for P V; hand back V_{j-1}; O *= exp2(m_old - m_new); P_j = bf16/fp16(exp2(S - m_new))
 *
 *   and after the last tile O += P V once more, O /= l, LSE = (m + log2 l) ln 2; O is staged
 *   through the consumer's own rows of the Q tile and stored with 16-byte writes.
 *
 * Shared-memory tiles are rows of 64 elements (128 bytes), 16-byte chunks XOR-swizzled by row % 8,
 * one region per 64 columns of the head dim: the layout TMA writes with 128-byte swizzling and
 * wgmma reads through its descriptors. Rows past the sequence and columns past head_dim are zeros
 * (TMA fills out-of-bounds elements with zero). The accumulator layout of wgmma m64nNk16 (per warp:
 * rows g and g + 8 of its 16, columns 8i + 2t, +1) equals mma.sync's, and so does the
 * A-in-registers layout, so the softmax and the S -> P repacking are those of the portable kernel.
 * No atomics, fixed order: deterministic.
 */
#pragma once

#include <cuda.h>
#include <cudaTypedefs.h>

#include "fused_fwd.cuh"
#include "sm90_wgmma.cuh"

namespace fa {
namespace sm90 {

template <int kHeadDim, int kConsumers> struct cfg;
#define FA_SM90_CFG_SPEC(hd, bn, nc, auto_min, masked_max_sq)                                       \
    template <> struct cfg<hd, nc> {                                                                \
        static constexpr int block_n = bn;                                                          \
    };
FA_SM90_CONFIGS(FA_SM90_CFG_SPEC)
#undef FA_SM90_CFG_SPEC

template <int kDtype, int kHeadDim, int kNumConsumers> struct traits {
    using T = typename elem<kDtype>::type;
    static constexpr int kConsumers = kNumConsumers;
    static constexpr int kBlockM = 64 * kConsumers, kBlockN = cfg<kHeadDim, kConsumers>::block_n;
    static constexpr int kThreads = 128 * (kConsumers + 1);
    /* setmaxnreg: the producer keeps 24 registers, the consumers share the rest (a multiple of 8,
     * at most 240). */
    static constexpr int kConsumerShare = (65536 / 128 - 24) / kConsumers / 8 * 8;
    static constexpr int kConsumerRegs = kConsumerShare > 240 ? 240 : kConsumerShare;
    static constexpr int kChunks = kHeadDim / 8; /* 16-byte chunks per row */
    static constexpr uint32_t kQBytes = kBlockM * kHeadDim * 2, kKVBytes = kBlockN * kHeadDim * 2;
    static constexpr int kSmemBytes = 1024 + (int)(kQBytes + 4 * kKVBytes) + 128;
    static_assert(kSmemBytes == (int)(1024 + 2 * kHeadDim * (kBlockM + 4 * kBlockN) + 128), "see fa_sm90_smem_bytes");
    static_assert(kHeadDim % 64 == 0 && kBlockN % 16 == 0 && kBlockN <= 256, "tile shape");
    static_assert(kConsumers == 2 || kConsumers == 3, "one producer and two or three consumer warpgroups");
};

/* ---- PTX wrappers -------------------------------------------------------------------------- */

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int kPending> __device__ __forceinline__ void wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}

/* Pin registers that an in-flight wgmma reads or writes: the compiler may not move their other uses
 * across this point (the waits and fences above are ordered with it as volatile asm). */
template <int N> __device__ __forceinline__ void reg_fence(float (&r)[N]) {
#pragma unroll
    for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}
template <int N> __device__ __forceinline__ void reg_fence(uint32_t (&r)[N][4]) {
#pragma unroll
    for (int i = 0; i < N; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) asm volatile("" : "+r"(r[i][j])::"memory");
}

/* mbarriers (shared memory, 8 bytes each). */
__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
/* Blocks until the barrier's phase with this parity has completed. */
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
    uint32_t done = 0;
    do {
        asm volatile(
            "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
            : "=r"(done)
            : "r"(bar), "r"(parity)
            : "memory");
    } while (!done);
}

/* TMA: a box of a 4-D tensor (head dim, sequence, head, batch) into shared memory, completing on bar. */
__device__ __forceinline__ void tma_load(uint32_t dst, const CUtensorMap *map, int c0, int c1, int c2, int c3,
                                         uint32_t bar) {
    asm volatile(
        "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], [%6];\n" ::"r"(dst),
        "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar)
        : "memory");
}

/* Named barriers 1..2C (0 is __syncthreads): the C consumers' tensor-core turns, then their epilogues. */
__device__ __forceinline__ void named_sync(int id, int threads) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_arrive(int id, int threads) {
    asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

/* Shared-memory matrix descriptor, 128-byte swizzle. Byte offsets: lbo between 64-column regions
 * of an N-major operand (unused, 16, for K-major), sbo between groups of 8 rows. */
__device__ __forceinline__ uint64_t smem_desc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
    return (uint64_t)((addr & 0x3FFFFu) >> 4) | ((uint64_t)(lbo >> 4) << 16) |
           ((uint64_t)(sbo >> 4) << 32) | (1ull << 62);
}

/* Byte offset of 16-byte chunk `ch` of row r in a swizzled tile of kRows rows. */
template <int kRows> __device__ __forceinline__ uint32_t swz_off(int r, int ch) {
    return (uint32_t)((ch / 8) * (kRows * 128) + r * 128 + (((ch % 8) ^ (r % 8)) << 4));
}

template <int kDtype, int kHeadDim, int kConsumers, bool kTransform>
__global__ void __launch_bounds__(128 * (kConsumers + 1), 1)
fused_sm90_kernel(const __grid_constant__ fa_kernel_params p, const __grid_constant__ CUtensorMap tm_q,
                  const __grid_constant__ CUtensorMap tm_k, const __grid_constant__ CUtensorMap tm_v) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
    using Tr = traits<kDtype, kHeadDim, kConsumers>;
    using T = typename Tr::T;
    constexpr int kBlockM = Tr::kBlockM, kBlockN = Tr::kBlockN;
    constexpr int kSN = kBlockN / 2, kON = kHeadDim / 2; /* accumulator floats per thread */
    constexpr int kCB = kHeadDim / 64;                   /* 64-column regions of a tile */
    constexpr int kNC = Tr::kConsumers;
    constexpr float kLn2 = 0.6931471805599453f, kLog2e = 1.4426950408889634f;

    extern __shared__ __align__(1024) unsigned char smem_raw[];
    const uint32_t raw = smem_u32(smem_raw);
    const uint32_t sQ = (raw + 1023u) & ~1023u;
    const uint32_t sK = sQ + Tr::kQBytes;      /* 2 stages */
    const uint32_t sV = sK + 2 * Tr::kKVBytes; /* 2 stages */
    const uint32_t bar_q = sV + 2 * Tr::kKVBytes;
    const uint32_t full_k = bar_q + 8, full_v = bar_q + 24, empty_k = bar_q + 40, empty_v = bar_q + 56; /* [2] each */

    /* The tile: query positions [m0, m0 + rows_per_head) of `heads` query heads starting at h0 (one
     * head, or with pack_gqa the head_group heads of KV head hk); tile row r is head h0 + r / rows_per_head,
     * position m0 + r % rows_per_head. Split `split` of num_splits takes its share of the key tiles. */
    const int tid = threadIdx.x, wg = tid / 128, lane = tid % 32;
    const int split = (int)blockIdx.x % p.num_splits;
    const int m_block = p.num_m_blocks - 1 - (int)blockIdx.x / p.num_splits; /* heaviest tiles first */
    const int b = blockIdx.z;
    const int heads = p.pack_gqa ? p.head_group : 1;
    const int rows_per_head = p.pack_gqa ? p.pack_rows : kBlockM;
    const int hk = p.pack_gqa ? (int)blockIdx.y : (int)blockIdx.y / p.head_group;
    const int h0 = p.pack_gqa ? hk * p.head_group : (int)blockIdx.y;
    const int m0 = m_block * rows_per_head;
    const int row_last = min(m0 + rows_per_head, p.seqlen_q) - 1;
    const bool partial = p.num_splits > 1;

    /* Where tile row r goes: false if it is padding (no such head or position). */
    auto row_target = [&](int r, int &head, int &pos) {
        const int hg = r / rows_per_head;
        head = h0 + hg, pos = m0 + r % rows_per_head;
        return hg < heads && pos < p.seqlen_q;
    };
    auto lse_slot = [&](int head, int pos) -> float * {
        const int64_t bhq = (int64_t)b * p.heads_q + head;
        if (partial) return p.lse_accum + ((int64_t)split * p.batch * p.heads_q + bhq) * p.seqlen_q + pos;
        return p.lse ? p.lse + bhq * p.seqlen_q + pos : nullptr;
    };

    const int key_lo = max(0, m0 + p.key_lo_off);
    const int key_hi = min(p.seqlen_k, row_last + p.key_hi_off + 1);
    const int tile_first = key_lo / kBlockN;
    const int tiles_all = key_hi > key_lo ? (key_hi + kBlockN - 1) / kBlockN - tile_first : 0;
    const int tiles_per_split = (tiles_all + p.num_splits - 1) / p.num_splits;
    const int tile_begin = tile_first + split * tiles_per_split;
    const int n_tiles = max(0, min(tiles_per_split, tiles_all - split * tiles_per_split));
    if (n_tiles == 0) { /* no row sees a key in this split: O = 0, LSE = -inf (a split writes only its LSE) */
        for (int i = tid; i < kBlockM * Tr::kChunks; i += Tr::kThreads) {
            const int r = i / Tr::kChunks, ch = i % Tr::kChunks;
            int head, pos;
            if (!partial && row_target(r, head, pos) && ch * 8 < p.head_dim)
                *reinterpret_cast<uint4 *>((T *)p.o + b * p.o_batch_stride + head * p.o_head_stride +
                                           (int64_t)pos * p.o_seq_stride + ch * 8) = make_uint4(0, 0, 0, 0);
        }
        for (int r = tid; r < kBlockM; r += Tr::kThreads) {
            int head, pos;
            if (row_target(r, head, pos))
                if (float *l = lse_slot(head, pos)) *l = -INFINITY;
        }
        return;
    }

    if (tid == 0) {
        mbar_init(bar_q, 1);
#pragma unroll
        for (int st = 0; st < 2; ++st) {
            mbar_init(full_k + 8 * st, 1);
            mbar_init(full_v + 8 * st, 1);
            mbar_init(empty_k + 8 * st, 4 * kNC); /* one arrival per consumer warp */
            mbar_init(empty_v + 8 * st, 4 * kNC);
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();

    if (wg == 0) {
        /* ---- producer ---- */
        asm volatile("setmaxnreg.dec.sync.aligned.u32 24;\n");
        if (tid == 0) {
            mbar_expect_tx(bar_q, (uint32_t)(kCB * 128 * rows_per_head * heads));
#pragma unroll
            for (int cb = 0; cb < kCB; ++cb) tma_load(sQ + cb * kBlockM * 128, &tm_q, cb * 64, m0, h0, b, bar_q);
            auto load_kv = [&](const CUtensorMap *map, uint32_t dst, uint32_t full, int tile) {
                mbar_expect_tx(full, Tr::kKVBytes);
#pragma unroll
                for (int cb = 0; cb < kCB; ++cb)
                    tma_load(dst + cb * kBlockN * 128, map, cb * 64, (tile_begin + tile) * kBlockN, hk, b, full);
            };
            load_kv(&tm_k, sK, full_k, 0);
            for (int j = 0; j < n_tiles; ++j) {
                /* K_{j+1} once S_{j-1} is done with its stage; V_j once P V_{j-2} is done with its. */
                if (j + 1 < n_tiles) {
                    const int st = (j + 1) & 1;
                    if (j + 1 >= 2) mbar_wait(empty_k + 8 * st, ((j - 1) >> 1) & 1);
                    load_kv(&tm_k, sK + st * Tr::kKVBytes, full_k + 8 * st, j + 1);
                }
                const int st = j & 1;
                if (j >= 2) mbar_wait(empty_v + 8 * st, ((j - 2) >> 1) & 1);
                load_kv(&tm_v, sV + st * Tr::kKVBytes, full_v + 8 * st, j);
            }
        }
        return;
    }

    /* ---- consumers ---- */
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(Tr::kConsumerRegs));
    const int c = wg - 1; /* consumer index: tile rows 64c..64c+63 */
    const int g = lane / 4, t = lane % 4;
    const int trow = c * 64 + ((tid % 128) / 32) * 16 + g; /* this thread's tile rows: trow, trow + 8 */
    int head_r[2], pos_r[2];
    bool valid_r[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) valid_r[r] = row_target(trow + 8 * r, head_r[r], pos_r[r]);
    const float mult = kTransform ? 1.0f : p.scale_log2;
    float slope_r[2] = {0.0f, 0.0f};
    if constexpr (kTransform) {
#pragma unroll
        for (int r = 0; r < 2; ++r) slope_r[r] = valid_r[r] ? alibi_slope(p, b, head_r[r]) : 0.0f;
    }

    float o[kON], s[kSN];
    uint32_t pf[kBlockN / 16][4];
#pragma unroll
    for (int i = 0; i < kON; ++i) o[i] = 0.0f;
    float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.0f, 0.0f};
    const uint32_t q_wg = sQ + (uint32_t)c * 64 * 128; /* this consumer's 64 rows of Q */

    mbar_wait(bar_q, 0);
    /* Turns go round: consumer c waits on barrier 1 + c and then passes to c + 1 (mod kNC); the
     * last one starts the round by passing to consumer 0. */
    const int my_turn = 1 + c, next_turn = 1 + (c + 1) % kNC;
    if (c == kNC - 1) named_arrive(1, 256);

    for (int it = 0; it < n_tiles; ++it) {
        const int n0 = (tile_begin + it) * kBlockN;
        const int st = it & 1;
        mbar_wait(full_k + 8 * st, (it >> 1) & 1);
        if (it > 0) mbar_wait(full_v + 8 * (st ^ 1), ((it - 1) >> 1) & 1);
        const uint32_t k_st = sK + (uint32_t)st * Tr::kKVBytes;

        named_sync(my_turn, 256); /* our turn on the tensor cores */
        reg_fence(o);
        reg_fence(pf);
        wgmma_fence();
#pragma unroll
        for (int ks = 0; ks < kHeadDim / 16; ++ks) {
            const uint32_t col = (uint32_t)(ks / 4), sub = (uint32_t)(ks % 4) * 32;
            wgmma_ss<kBlockN, kDtype>::run(s, smem_desc(q_wg + col * kBlockM * 128 + sub, 16, 1024),
                                           smem_desc(k_st + col * kBlockN * 128 + sub, 16, 1024), ks > 0);
        }
        wgmma_commit();
        if (it > 0) {
            const uint32_t v_st = sV + (uint32_t)(st ^ 1) * Tr::kKVBytes;
            wgmma_fence(); /* P and O were written by ordinary instructions since the last one */
#pragma unroll
            for (int kk = 0; kk < kBlockN / 16; ++kk)
                wgmma_rs<kHeadDim, kDtype>::run(o, pf[kk], smem_desc(v_st + kk * 16 * 128, kBlockN * 128, 1024), 1);
        }
        wgmma_commit(); /* empty on the first tile: "all but the newest group" then always means S */
        named_arrive(next_turn, 256); /* the next consumer's turn */

        wgmma_wait<1>();
        reg_fence(s);
        if (lane == 0) mbar_arrive(empty_k + 8 * st); /* this warp is done with K_it */

        if constexpr (kTransform) {
#pragma unroll
            for (int i = 0; i < kSN; ++i) {
                const int r = (i % 4) / 2;
                s[i] = kLog2e * transform_raw_score(p, s[i], slope_r[r], pos_r[r], n0 + 8 * (i / 4) + 2 * t + (i % 2));
            }
        }
        const bool need_mask = n0 < row_last + p.key_lo_off || n0 + kBlockN - 1 > m0 + p.key_hi_off ||
                               n0 + kBlockN > p.seqlen_k;
        if (need_mask) {
#pragma unroll
            for (int i = 0; i < kSN; ++i)
                if (!visible(p, pos_r[(i % 4) / 2], n0 + 8 * (i / 4) + 2 * t + (i % 2))) s[i] = -INFINITY;
        }

        float corr[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            float mx = row_max[r];
#pragma unroll
            for (int j = 0; j < kBlockN / 8; ++j) mx = fmaxf(mx, fmaxf(s[4 * j + 2 * r], s[4 * j + 2 * r + 1]));
            mx = quad_max(mx);
            const float m_scaled = (mx == -INFINITY) ? 0.0f : mx * mult;
            corr[r] = fast_exp2(row_max[r] * mult - m_scaled);
            row_max[r] = mx;
            float sum = 0.0f;
#pragma unroll
            for (int j = 0; j < kBlockN / 8; ++j) {
                s[4 * j + 2 * r] = fast_exp2(fmaf(s[4 * j + 2 * r], mult, -m_scaled));
                s[4 * j + 2 * r + 1] = fast_exp2(fmaf(s[4 * j + 2 * r + 1], mult, -m_scaled));
                sum += s[4 * j + 2 * r] + s[4 * j + 2 * r + 1];
            }
            row_sum[r] = row_sum[r] * corr[r] + sum;
        }

        wgmma_wait<0>(); /* P V_{it-1} is done with O, pf and V_{it-1} */
        reg_fence(o);
        reg_fence(pf);
        if (it > 0 && lane == 0) mbar_arrive(empty_v + 8 * (st ^ 1));
#pragma unroll
        for (int j = 0; j < kHeadDim / 8; ++j) {
            o[4 * j] *= corr[0], o[4 * j + 1] *= corr[0];
            o[4 * j + 2] *= corr[1], o[4 * j + 3] *= corr[1];
        }
#pragma unroll
        for (int kk = 0; kk < kBlockN / 16; ++kk) {
            pf[kk][0] = pack_pair<kDtype>(s[8 * kk + 0], s[8 * kk + 1]);
            pf[kk][1] = pack_pair<kDtype>(s[8 * kk + 2], s[8 * kk + 3]);
            pf[kk][2] = pack_pair<kDtype>(s[8 * kk + 4], s[8 * kk + 5]);
            pf[kk][3] = pack_pair<kDtype>(s[8 * kk + 6], s[8 * kk + 7]);
        }
    }

    /* The last tile's P V (the stage needs no handing back: nothing more is loaded). */
    {
        const int st = (n_tiles - 1) & 1;
        mbar_wait(full_v + 8 * st, ((n_tiles - 1) >> 1) & 1);
        const uint32_t v_st = sV + (uint32_t)st * Tr::kKVBytes;
        named_sync(my_turn, 256);
        reg_fence(o);
        reg_fence(pf);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < kBlockN / 16; ++kk)
            wgmma_rs<kHeadDim, kDtype>::run(o, pf[kk], smem_desc(v_st + kk * 16 * 128, kBlockN * 128, 1024), 1);
        wgmma_commit();
        if (c != kNC - 1) named_arrive(next_turn, 256); /* nobody waits for consumer 0 again */
        wgmma_wait<0>();
        reg_fence(o);
    }

    float inv_r[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const float l = quad_sum(row_sum[r]);
        inv_r[r] = l > 0.0f ? 1.0f / l : 0.0f;
        if (valid_r[r] && t == 0)
            if (float *ls = lse_slot(head_r[r], pos_r[r]))
                *ls = l > 0.0f ? (row_max[r] * mult + __log2f(l)) * kLn2 : -INFINITY;
    }
    if (partial) { /* this split's normalised O, fp32, straight from the registers */
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            if (!valid_r[r]) continue;
            float *dst = p.o_accum + (((int64_t)split * p.batch * p.heads_q + (int64_t)b * p.heads_q + head_r[r]) *
                                          p.seqlen_q + pos_r[r]) * p.head_dim;
#pragma unroll
            for (int j = 0; j < kHeadDim / 8; ++j)
                if (8 * j + 2 * t < p.head_dim) /* head_dim is a multiple of 8: both or neither */
                    *reinterpret_cast<float2 *>(dst + 8 * j + 2 * t) =
                        make_float2(o[4 * j + 2 * r] * inv_r[r], o[4 * j + 2 * r + 1] * inv_r[r]);
        }
        return;
    }

    /* Epilogue: normalise; stage O (swizzled, conflict-free) in this consumer's own 64 rows of the Q
     * tile, which only its finished S products read; store rows with 16-byte writes. */
#pragma unroll
    for (int r = 0; r < 2; ++r)
#pragma unroll
        for (int j = 0; j < kHeadDim / 8; ++j) {
            const uint32_t v = pack_pair<kDtype>(o[4 * j + 2 * r] * inv_r[r], o[4 * j + 2 * r + 1] * inv_r[r]);
            asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(sQ + swz_off<kBlockM>(trow + 8 * r, j) + 4 * t), "r"(v)
                         : "memory");
        }
    named_sync(1 + kNC + c, 128); /* this consumer's rows of O are staged */
    for (int i = tid % 128; i < 64 * Tr::kChunks; i += 128) {
        const int rl = c * 64 + i / Tr::kChunks, ch = i % Tr::kChunks;
        int head, pos;
        if (row_target(rl, head, pos) && ch * 8 < p.head_dim) {
            uint4 v;
            asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n"
                         : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                         : "r"(sQ + swz_off<kBlockM>(rl, ch))
                         : "memory");
            *reinterpret_cast<uint4 *>((T *)p.o + b * p.o_batch_stride + head * p.o_head_stride +
                                       (int64_t)pos * p.o_seq_stride + ch * 8) = v;
        }
    }
#endif
}

/* cuTensorMapEncodeTiled from the driver, through the runtime (no link against libcuda). */
inline PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
    static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
        void *f = nullptr;
        cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
#if CUDART_VERSION >= 12050
        const cudaError_t err = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &q);
#else
        const cudaError_t err = cudaGetDriverEntryPoint("cuTensorMapEncodeTiled", &f, cudaEnableDefault, &q);
#endif
        return (err == cudaSuccess && q == cudaDriverEntryPointSuccess) ? (PFN_cuTensorMapEncodeTiled_v12000)f : nullptr;
    }();
    return fn;
}

/* The map of a [batch, seq, heads, head_dim] tensor (head dim contiguous) read in boxes of
 * 64 columns x box_rows positions x box_heads heads, 128-byte swizzled. Extents of 0 become 1 (such a tensor is never read). */
inline bool encode_map(CUtensorMap *map, int dtype, const void *ptr, int64_t head_dim, int64_t seq, int64_t heads,
                       int64_t batch, int64_t seq_stride, int64_t head_stride, int64_t batch_stride, int box_rows,
                       int box_heads) {
    const PFN_cuTensorMapEncodeTiled_v12000 encode = tensor_map_encoder();
    if (encode == nullptr) return false;
    const cuuint64_t dims[4] = {(cuuint64_t)head_dim, (cuuint64_t)(seq > 0 ? seq : 1), (cuuint64_t)heads,
                                (cuuint64_t)batch};
    const int64_t raw[3] = {seq_stride, head_stride, batch_stride};
    cuuint64_t strides[3];
    for (int i = 0; i < 3; ++i) /* a one-element dimension's stride is never used; keep it legal */
        strides[i] = (cuuint64_t)(dims[i + 1] > 1 ? raw[i] * 2 : 16);
    const cuuint32_t box[4] = {64, (cuuint32_t)box_rows, (cuuint32_t)box_heads, 1};
    const cuuint32_t elem_strides[4] = {1, 1, 1, 1};
    const CUresult r = encode(map, dtype == 1 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 4,
                              const_cast<void *>(ptr), dims, strides, box, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                              CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                              CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    return r == CUDA_SUCCESS;
}

template <int kDtype, int kHeadDim, int kConsumers>
int launch(const fa_kernel_params *kp, const fa_launch *l, void *stream) {
    using Tr = traits<kDtype, kHeadDim, kConsumers>;
    if (l->threads != Tr::kThreads || l->smem_bytes != Tr::kSmemBytes ||
        (kp->pack_gqa && (kp->pack_rows < 1 || kp->pack_rows * kp->head_group > Tr::kBlockM)) ||
        (kp->num_splits > 1 && (kp->o_accum == nullptr || kp->lse_accum == nullptr)))
        return (int)cudaErrorInvalidConfiguration; /* planner and kernel disagree: refuse */
    CUtensorMap tq, tk, tv;
    /* Q in boxes of one head x 128 positions, or (pack_gqa) head_group heads x pack_rows positions. */
    const int q_rows = kp->pack_gqa ? kp->pack_rows : Tr::kBlockM, q_heads = kp->pack_gqa ? kp->head_group : 1;
    if (!encode_map(&tq, kDtype, kp->q, kp->head_dim, kp->seqlen_q, kp->heads_q, kp->batch, kp->q_seq_stride,
                    kp->q_head_stride, kp->q_batch_stride, q_rows, q_heads) ||
        !encode_map(&tk, kDtype, kp->k, kp->head_dim, kp->seqlen_k, kp->heads_kv, kp->batch, kp->k_seq_stride,
                    kp->k_head_stride, kp->k_batch_stride, Tr::kBlockN, 1) ||
        !encode_map(&tv, kDtype, kp->v, kp->head_dim, kp->seqlen_k, kp->heads_kv, kp->batch, kp->v_seq_stride,
                    kp->v_head_stride, kp->v_batch_stride, Tr::kBlockN, 1))
        return (int)cudaErrorInvalidValue; /* the planner checked the limits; not expected */
    const bool transform = kp->softcap > 0.0f || kp->alibi_slopes != nullptr;
    auto kernel = transform ? fused_sm90_kernel<kDtype, kHeadDim, kConsumers, true>
                            : fused_sm90_kernel<kDtype, kHeadDim, kConsumers, false>;
    cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Tr::kSmemBytes);
    if (err != cudaSuccess) return (int)err;
    kernel<<<dim3(l->grid_x, l->grid_y, l->grid_z), Tr::kThreads, Tr::kSmemBytes, (cudaStream_t)stream>>>(*kp, tq, tk,
                                                                                                         tv);
    err = cudaGetLastError();
    if (err != cudaSuccess || kp->num_splits <= 1) return (int)err;
    return fa_split_combine(kp, kDtype, stream);
}

}  // namespace sm90
}  // namespace fa

#define FA_SM90_INSTANCE(DTYPE, NAME, HD, NC)                                              \
    extern "C" __attribute__((visibility("hidden"))) int fa_sm90_fwd_##NAME##_d##HD##_c##NC( \
        const fa_kernel_params *kp, const fa_launch *l, void *stream) {                    \
        return fa::sm90::launch<DTYPE, HD, NC>(kp, l, stream);                             \
    }
