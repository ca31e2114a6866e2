/*
 * fused_sm90.cuh - the FUSED_SM90 forward kernel: FlashAttention on Hopper's warpgroup tensor-core
 * instructions (wgmma, sm_90a). Same contract and semantics as the portable kernel in
 * fused_fwd.cuh; a separate backend, so neither constrains the other.
 *
 * A block owns 128 query rows of one (batch, head) and has two warpgroups; warpgroup w owns rows
 * 64w..64w+63 for the whole kernel. Q, K and V live in shared memory in the layout wgmma reads
 * (rows of 64 elements = 128 bytes, 16-byte chunks XOR-swizzled by row % 8, one region per 64
 * columns of the head dim). Per visible key tile j, in each warpgroup:
 *
 *   wait for K_j (and V_{j-1}) to land; one barrier         cp.async, issued a tile ahead
 *   issue S_j = Q K_j^T                                     wgmma, A and B from shared memory
 *   issue O += P_{j-1} V_{j-1}                              wgmma, P from registers, V N-major
 *   issue the loads of K_{j+1} and V_j                      into the stages those MMAs do not read
 *   wait for S_j; softcap/ALiBi/mask; online softmax       overlaps the P V product on the tensor cores
 *   wait for P V; O *= exp2(m_old - m_new); P_j = bf16/fp16(exp2(S - m_new))
 *
 * and after the last tile O += P V once more, O /= l, LSE = (m + log2 l) ln 2. The accumulator
 * layout of wgmma m64nNk16 (per warp: rows g and g + 8 of its 16, columns 8i + 2t, +1) equals
 * mma.sync's, and so does the A-in-registers layout, so the softmax and the S -> P repacking
 * are those of the portable kernel. No atomics, fixed order: deterministic.
 */
#pragma once

#include "fused_fwd.cuh"
#include "sm90_wgmma.cuh"

namespace fa {
namespace sm90 {

template <int kHeadDim> struct cfg;
#define FA_SM90_CFG_SPEC(hd, bn, auto_min)                                                          \
    template <> struct cfg<hd> {                                                                    \
        static constexpr int block_n = bn;                                                          \
    };
FA_SM90_CONFIGS(FA_SM90_CFG_SPEC)
#undef FA_SM90_CFG_SPEC

template <int kDtype, int kHeadDim> struct traits {
    using T = typename elem<kDtype>::type;
    static constexpr int kBlockM = FA_SM90_BLOCK_M, kBlockN = cfg<kHeadDim>::block_n;
    static constexpr int kThreads = FA_SM90_THREADS;
    static constexpr int kChunks = kHeadDim / 8;          /* 16-byte chunks per row */
    static constexpr uint32_t kQBytes = kBlockM * kHeadDim * 2, kKVBytes = kBlockN * kHeadDim * 2;
    static constexpr int kSmemBytes = 1024 + (int)(kQBytes + 4 * kKVBytes);
    static_assert(kSmemBytes == (int)(1024 + 2 * kHeadDim * (kBlockM + 4 * kBlockN)), "see fa_sm90_smem_bytes");
    static_assert(kHeadDim % 64 == 0 && kBlockN % 16 == 0 && kBlockM == 128 && kThreads == 256, "tile shape");
};

/* ---- PTX wrappers -------------------------------------------------------------------------- */

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int kPending> __device__ __forceinline__ void wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}
/* Shared memory written by cp.async (the generic proxy) is read next by wgmma (the async proxy). */
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

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

/* Shared-memory matrix descriptor, 128-byte swizzle. Byte offsets: lbo between 64-column regions
 * of an N-major operand (unused, 16, for K-major), sbo between groups of 8 rows. */
__device__ __forceinline__ uint64_t smem_desc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
    return (uint64_t)((addr & 0x3FFFFu) >> 4) | ((uint64_t)(lbo >> 4) << 16) |
           ((uint64_t)(sbo >> 4) << 32) | (1ull << 62);
}

/* Byte offset of element chunk `ch` (8 elements) of row r in a swizzled [kRows x kHeadDim] tile. */
template <int kRows>
__device__ __forceinline__ uint32_t swz_off(int r, int ch) {
    return (uint32_t)((ch / 8) * (kRows * 128) + r * 128 + (((ch % 8) ^ (r % 8)) << 4));
}

/* Async copy of rows [row0, row0 + kRows) of a [seq, head_dim] slice into a swizzled tile; rows
 * past rows_valid and columns past head_dim are zero-filled. */
template <typename Tr, int kRows>
__device__ __forceinline__ void load_tile_swz(uint32_t dst, const typename Tr::T *src, int64_t row_stride,
                                              int row0, int rows_valid, int head_dim) {
    constexpr int kTotal = kRows * Tr::kChunks;
    static_assert(kTotal % Tr::kThreads == 0, "whole rounds of 16-byte copies");
    const typename Tr::T *src_row0 = src + (int64_t)row0 * row_stride;
#pragma unroll
    for (int i = 0; i < kTotal / Tr::kThreads; ++i) {
        const int c = (int)threadIdx.x + i * Tr::kThreads;
        const int r = c / Tr::kChunks, ch = c % Tr::kChunks;
        const bool valid = (row0 + r < rows_valid) && (ch * 8 < head_dim);
        const typename Tr::T *g = valid ? src_row0 + (int64_t)r * row_stride + ch * 8 : src;
        cp_async_16(dst + swz_off<kRows>(r, ch), g, valid);
    }
}

template <int kDtype, int kHeadDim, bool kTransform>
__global__ void __launch_bounds__(FA_SM90_THREADS, 1) fused_sm90_kernel(const __grid_constant__ fa_kernel_params p) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
    using Tr = traits<kDtype, kHeadDim>;
    using T = typename Tr::T;
    constexpr int kBlockM = Tr::kBlockM, kBlockN = Tr::kBlockN;
    constexpr int kSN = kBlockN / 2, kON = kHeadDim / 2; /* accumulator floats per thread */
    constexpr float kLn2 = 0.6931471805599453f, kLog2e = 1.4426950408889634f;

    extern __shared__ __align__(1024) unsigned char smem_raw[];
    const uint32_t raw = smem_u32(smem_raw);
    const uint32_t sQ = (raw + 1023u) & ~1023u;
    const uint32_t sK = sQ + Tr::kQBytes;       /* 2 stages */
    const uint32_t sV = sK + 2 * Tr::kKVBytes;  /* 2 stages */

    const int tid = threadIdx.x, wg = tid / 128, lane = tid % 32;
    const int g = lane / 4, t = lane % 4;
    const int m_block = p.num_m_blocks - 1 - (int)blockIdx.x; /* heaviest query tiles first */
    const int h = blockIdx.y, b = blockIdx.z, hk = h / p.head_group;
    const int m0 = m_block * kBlockM;
    const int row_last = min(m0 + kBlockM, p.seqlen_q) - 1;
    const int row0 = m0 + wg * 64 + ((tid % 128) / 32) * 16 + g; /* this thread's rows: row0, row0 + 8 */

    const T *qg = (const T *)p.q + b * p.q_batch_stride + h * p.q_head_stride;
    const T *kg = (const T *)p.k + b * p.k_batch_stride + hk * p.k_head_stride;
    const T *vg = (const T *)p.v + b * p.v_batch_stride + hk * p.v_head_stride;
    T *og = (T *)p.o + b * p.o_batch_stride + h * p.o_head_stride;
    float *lse = p.lse ? p.lse + ((int64_t)b * p.heads_q + h) * p.seqlen_q : nullptr;

    const int key_lo = max(0, m0 + p.key_lo_off);
    const int key_hi = min(p.seqlen_k, row_last + p.key_hi_off + 1);
    if (key_hi <= key_lo) { /* no row sees a key: O = 0, LSE = -inf */
        for (int c = tid; c < kBlockM * Tr::kChunks; c += Tr::kThreads) {
            const int r = c / Tr::kChunks, ch = c % Tr::kChunks;
            if (m0 + r < p.seqlen_q && ch * 8 < p.head_dim)
                *reinterpret_cast<uint4 *>(og + (int64_t)(m0 + r) * p.o_seq_stride + ch * 8) = make_uint4(0, 0, 0, 0);
        }
        if (lse)
            for (int r = tid; r < kBlockM; r += Tr::kThreads)
                if (m0 + r < p.seqlen_q) lse[m0 + r] = -INFINITY;
        return;
    }
    const int tile_begin = key_lo / kBlockN;
    const int n_tiles = (key_hi + kBlockN - 1) / kBlockN - tile_begin;

    load_tile_swz<Tr, kBlockM>(sQ, qg, p.q_seq_stride, m0, p.seqlen_q, p.head_dim);
    load_tile_swz<Tr, kBlockN>(sK, kg, p.k_seq_stride, tile_begin * kBlockN, p.seqlen_k, p.head_dim);
    cp_async_commit();

    const float mult = kTransform ? 1.0f : p.scale_log2;
    const float slope = kTransform ? alibi_slope(p, b, h) : 0.0f;

    float o[kON], s[kSN];
    uint32_t pf[kBlockN / 16][4];
#pragma unroll
    for (int i = 0; i < kON; ++i) o[i] = 0.0f;
    float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.0f, 0.0f};

    /* Descriptor bases: this warpgroup's 64 rows of Q; K and V per stage. */
    const uint32_t q_wg = sQ + (uint32_t)wg * 64 * 128;

    for (int it = 0; it < n_tiles; ++it) {
        cp_async_wait<0>();  /* K_it and V_{it-1} have landed for this thread ... */
        fence_proxy_async(); /* ... are visible to the tensor cores ... */
        __syncthreads();     /* ... for every thread; and every warpgroup is past tile it - 1 */
        const int n0 = (tile_begin + it) * kBlockN;
        const uint32_t k_st = sK + (uint32_t)(it & 1) * Tr::kKVBytes;

        reg_fence(o);
        reg_fence(pf);
        wgmma_fence();
#pragma unroll
        for (int ks = 0; ks < kHeadDim / 16; ++ks) {
            const uint32_t col = (uint32_t)(ks / 4) , sub = (uint32_t)(ks % 4) * 32;
            wgmma_ss<kBlockN, kDtype>::run(s, smem_desc(q_wg + col * kBlockM * 128 + sub, 16, 1024),
                                           smem_desc(k_st + col * kBlockN * 128 + sub, 16, 1024), ks > 0);
        }
        wgmma_commit();
        if (it > 0) {
            const uint32_t v_st = sV + (uint32_t)((it - 1) & 1) * Tr::kKVBytes;
#pragma unroll
            for (int kk = 0; kk < kBlockN / 16; ++kk)
                wgmma_rs<kHeadDim, kDtype>::run(o, pf[kk], smem_desc(v_st + kk * 16 * 128, kBlockN * 128, 1024), 1);
        }
        wgmma_commit(); /* empty on the first tile: "wait for all but the newest group" then always means S */
        /* K_{it+1} into the stage S_{it-1} read; V_it into the stage P V_{it-2} read. */
        if (it + 1 < n_tiles)
            load_tile_swz<Tr, kBlockN>(sK + (uint32_t)((it + 1) & 1) * Tr::kKVBytes, kg, p.k_seq_stride,
                                       n0 + kBlockN, p.seqlen_k, p.head_dim);
        load_tile_swz<Tr, kBlockN>(sV + (uint32_t)(it & 1) * Tr::kKVBytes, vg, p.v_seq_stride, n0, p.seqlen_k,
                                   p.head_dim);
        cp_async_commit();

        wgmma_wait<1>();
        reg_fence(s);

        if constexpr (kTransform) {
#pragma unroll
            for (int i = 0; i < kSN; ++i)
                s[i] = kLog2e * transform_raw_score(p, s[i], slope, row0 + 8 * ((i % 4) / 2),
                                                    n0 + 8 * (i / 4) + 2 * t + (i % 2));
        }
        const bool need_mask = n0 < row_last + p.key_lo_off || n0 + kBlockN - 1 > m0 + p.key_hi_off ||
                               n0 + kBlockN > p.seqlen_k;
        if (need_mask) {
#pragma unroll
            for (int i = 0; i < kSN; ++i)
                if (!visible(p, row0 + 8 * ((i % 4) / 2), n0 + 8 * (i / 4) + 2 * t + (i % 2))) s[i] = -INFINITY;
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

        wgmma_wait<0>(); /* P V_{it-1} is done with O and with pf */
        reg_fence(o);
        reg_fence(pf);
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

    /* The last tile's P V. */
    cp_async_wait<0>();
    fence_proxy_async();
    __syncthreads();
    {
        const uint32_t v_st = sV + (uint32_t)((n_tiles - 1) & 1) * Tr::kKVBytes;
        reg_fence(o);
        reg_fence(pf);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < kBlockN / 16; ++kk)
            wgmma_rs<kHeadDim, kDtype>::run(o, pf[kk], smem_desc(v_st + kk * 16 * 128, kBlockN * 128, 1024), 1);
        wgmma_commit();
        wgmma_wait<0>();
        reg_fence(o);
    }
    __syncthreads(); /* every warpgroup is done reading K and V: stage O there */

    /* Epilogue: normalise, stage O through shared memory (rows padded by 8 elements), store. */
    constexpr int kOStride = kHeadDim + 8;
    static_assert(kBlockM * kOStride * 2 <= (int)(4 * Tr::kKVBytes), "O staging fits in the K/V stages");
    T *sO = reinterpret_cast<T *>(smem_raw + (sK - raw));
    const int row_local = row0 - m0;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const float l = quad_sum(row_sum[r]);
        const float inv = l > 0.0f ? 1.0f / l : 0.0f;
#pragma unroll
        for (int j = 0; j < kHeadDim / 8; ++j)
            *reinterpret_cast<uint32_t *>(sO + (row_local + 8 * r) * kOStride + 8 * j + 2 * t) =
                pack_pair<kDtype>(o[4 * j + 2 * r] * inv, o[4 * j + 2 * r + 1] * inv);
        if (lse && t == 0 && row0 + 8 * r < p.seqlen_q)
            lse[row0 + 8 * r] = l > 0.0f ? (row_max[r] * mult + __log2f(l)) * kLn2 : -INFINITY;
    }
    __syncthreads();
    for (int c = tid; c < kBlockM * Tr::kChunks; c += Tr::kThreads) {
        const int r = c / Tr::kChunks, ch = c % Tr::kChunks;
        if (m0 + r < p.seqlen_q && ch * 8 < p.head_dim)
            *reinterpret_cast<uint4 *>(og + (int64_t)(m0 + r) * p.o_seq_stride + ch * 8) =
                *reinterpret_cast<const uint4 *>(sO + r * kOStride + ch * 8);
    }
#endif
}

template <int kDtype, int kHeadDim>
int launch(const fa_kernel_params *kp, const fa_launch *l, void *stream) {
    using Tr = traits<kDtype, kHeadDim>;
    if (l->threads != Tr::kThreads || l->smem_bytes != Tr::kSmemBytes)
        return (int)cudaErrorInvalidConfiguration; /* planner and kernel disagree: refuse */
    const bool transform = kp->softcap > 0.0f || kp->alibi_slopes != nullptr;
    auto kernel = transform ? fused_sm90_kernel<kDtype, kHeadDim, true> : fused_sm90_kernel<kDtype, kHeadDim, false>;
    cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Tr::kSmemBytes);
    if (err != cudaSuccess) return (int)err;
    kernel<<<dim3(l->grid_x, l->grid_y, l->grid_z), Tr::kThreads, Tr::kSmemBytes, (cudaStream_t)stream>>>(*kp);
    return (int)cudaGetLastError();
}

}  // namespace sm90
}  // namespace fa

#define FA_SM90_INSTANCE(DTYPE, NAME, HD)                                                  \
    extern "C" __attribute__((visibility("hidden"))) int fa_sm90_fwd_##NAME##_d##HD(       \
        const fa_kernel_params *kp, const fa_launch *l, void *stream) {                    \
        return fa::sm90::launch<DTYPE, HD>(kp, l, stream);                                 \
    }
