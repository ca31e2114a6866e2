/*
 * merge.cu - merges partial attention results (O_i, LSE_i), i = 0..S-1, into one, for
 * flashattn_merge and for FUSED_SM90's split-key decode. Per row (b, s, h):
 *
 *     m = max_i LSE_i,  w_i = exp(LSE_i - m),  O = sum_i w_i O_i / sum_i w_i,  LSE = m + log(sum_i w_i)
 *
 * exp/log in base e or 2 (the LSE's base). An LSE of -inf or +inf (FlashAttention-2's empty row)
 * is an empty part: its O is never used. No contributing part: O = 0, LSE = -inf. A NaN LSE makes
 * the row NaN. Parts are added in index order: deterministic.
 *
 * One thread per kVec consecutive elements of a row (4, with vector loads, when the head dim and
 * every pointer and stride allow; else 1), so the 32 lanes of a warp cover a row of 128: each part's
 * LSE is one load per thread, the same address across the row's lanes. Loads of a group of parts
 * are issued together, before their arithmetic (an empty part's O is loaded but never used); the
 * group's largest LSE comes first, then all its weights at once, and a group raising the running
 * max rescales what is summed so far.
 * Any number of parts and any head dim. FUSED_SM90's split results put a row's parts side by side
 * (fa_kernel_params.o_accum): four threads take each of their items, a quarter of its parts each.
 *
 * After a split FUSED_SM90 call the merge is launched as a programmatic dependent of the attention
 * kernel (its blocks may start once a thread of each attention block has begun its last P V) and
 * waits for it before its first load, its first row's index arithmetic done before the wait; after
 * a split FUSED call (sm_80 and newer) it is an ordinary launch.
 */
#include "fa_common.cuh"
#include "grid_stride.cuh"

namespace fa {
namespace {

constexpr int kMergeThreads = 128;

template <int kDtype> struct io;
template <> struct io<FA_DTYPE_F16> {
    using T = __half;
    static __device__ __forceinline__ float load(const T *p) { return __half2float(*p); }
    static __device__ __forceinline__ void store(T *p, float x) { *p = __float2half_rn(x); }
};
template <> struct io<FA_DTYPE_BF16> {
    using T = __nv_bfloat16;
    static __device__ __forceinline__ float load(const T *p) { return __bfloat162float(*p); }
    static __device__ __forceinline__ void store(T *p, float x) { *p = __float2bfloat16_rn(x); }
};
template <> struct io<FA_DTYPE_F32> {
    using T = float;
    static __device__ __forceinline__ float load(const T *p) { return *p; }
    static __device__ __forceinline__ void store(T *p, float x) { *p = x; }
};

/* kVec consecutive elements at p, as floats (kVec = 4: one 16- or 8-byte load). */
template <int kDtype, int kVec> struct vec_io {
    using T = typename io<kDtype>::T;
    static __device__ __forceinline__ void load(const T *p, float (&x)[kVec]) {
#pragma unroll
        for (int v = 0; v < kVec; ++v) x[v] = io<kDtype>::load(p + v);
    }
    static __device__ __forceinline__ void store(T *p, const float (&x)[kVec]) {
#pragma unroll
        for (int v = 0; v < kVec; ++v) io<kDtype>::store(p + v, x[v]);
    }
};
template <> struct vec_io<FA_DTYPE_F32, 4> {
    static __device__ __forceinline__ void load(const float *p, float (&x)[4]) {
        const float4 t = *reinterpret_cast<const float4 *>(p);
        x[0] = t.x, x[1] = t.y, x[2] = t.z, x[3] = t.w;
    }
    static __device__ __forceinline__ void store(float *p, const float (&x)[4]) {
        *reinterpret_cast<float4 *>(p) = make_float4(x[0], x[1], x[2], x[3]);
    }
};
template <int kDtype> struct vec16_io {
    using T = typename io<kDtype>::T;
    static __device__ __forceinline__ void load(const T *p, float (&x)[4]) {
        const uint2 t = *reinterpret_cast<const uint2 *>(p);
        const T *h = reinterpret_cast<const T *>(&t);
#pragma unroll
        for (int v = 0; v < 4; ++v) x[v] = io<kDtype>::load(h + v);
    }
    static __device__ __forceinline__ void store(T *p, const float (&x)[4]) {
        uint2 t;
        T *h = reinterpret_cast<T *>(&t);
#pragma unroll
        for (int v = 0; v < 4; ++v) io<kDtype>::store(h + v, x[v]);
        *reinterpret_cast<uint2 *>(p) = t;
    }
};
template <> struct vec_io<FA_DTYPE_F16, 4> : vec16_io<FA_DTYPE_F16> {};
template <> struct vec_io<FA_DTYPE_BF16, 4> : vec16_io<FA_DTYPE_BF16> {};

/* Parts whose loads are in flight together: a split decode's 16 parts in one round trip (each
 * group is one L2 round trip on the critical path; 4 made a batch-1 decode's merge four trips). */
constexpr int kGroup = 16;
static_assert((kGroup & (kGroup - 1)) == 0, "the group max is a tree of halves");
/* Threads an item in the merge of FUSED_SM90's split results (adjacent parts): 4 parts each per group. */
constexpr int kMergeLanes = 4;
static_assert(kGroup % kMergeLanes == 0 && 32 % kMergeLanes == 0 && kMergeThreads % kMergeLanes == 0,
              "lanes split groups and warps");

/* The addresses of item idx (a row's kVec elements from d): pure arithmetic, so a thread works its
 * first item's out before it waits for the attention kernel (32-bit divisions where the items fit). */
template <int kVec> struct merge_item {
    int64_t b, row_s; /* batch entry and position; the output row is worked out after the wait */
    int64_t row;      /* (b heads + h) seqlen + row_s */
    int h, d;
    __device__ __forceinline__ merge_item(const fa_merge_args &a, int64_t idx, int chunks, bool narrow) {
        if (narrow) {
            const uint32_t i = (uint32_t)idx, ch = (uint32_t)chunks, sl = (uint32_t)a.seqlen, hs = (uint32_t)a.heads;
            const uint32_t r = i / ch, bh = r / sl;
            d = (int)(i - r * ch) * kVec, row_s = r - bh * sl, row = r;
            b = bh / hs, h = (int)(bh - (uint32_t)b * hs);
        } else {
            const int64_t r = idx / chunks, bh = r / a.seqlen;
            d = (int)(idx - r * chunks) * kVec, row_s = r - bh * a.seqlen, row = r;
            b = bh / a.heads, h = (int)(bh - b * a.heads);
        }
    }
};

/* Where item idx reads: its row's first part's LSE and O elements (the other parts' are a part stride
 * apart each), and its row's indices for the output. Pure arithmetic from the arguments, so the
 * first item's is done before the wait. kAdjacent (row_parts): the rows are [batch][heads][seqlen],
 * row r's first part at r lse_seq_stride and r o_seq_stride. */
template <int kIn, int kVec, bool kAdjacent> struct merge_addr {
    const float *lse_row;
    const typename io<kIn>::T *o_el;
    int64_t b, s;
    int h, d;
    __device__ __forceinline__ merge_addr(const fa_merge_args &a, int64_t idx, int chunks, bool narrow) {
        const merge_item<kVec> it(a, idx, chunks, narrow);
        b = it.b, s = it.row_s, h = it.h, d = it.d;
        if constexpr (kAdjacent) {
            lse_row = a.lse_parts + it.row * a.lse_seq_stride;
            o_el = (const typename io<kIn>::T *)a.o_parts + it.row * a.o_seq_stride + d;
        } else {
            lse_row = a.lse_parts + b * a.lse_batch_stride + h * a.lse_head_stride + s * a.lse_seq_stride;
            o_el = (const typename io<kIn>::T *)a.o_parts + b * a.o_batch_stride + s * a.o_seq_stride +
                   h * a.o_head_stride + d;
        }
    }
};

/* Whether the parts are FUSED_SM90's split results' layout, which kAdjacent reads: rows dense in
 * [batch][heads][seqlen] order, a row's parts side by side (O [row][part](head_dim), LSE
 * [row][part]). */
inline bool parts_side_by_side(const fa_merge_args *a) {
    const int64_t n = a->num_parts, d = a->head_dim, sl = a->seqlen, hs = a->heads;
    return a->o_part_stride == d && a->o_seq_stride == d * n && a->o_head_stride == sl * d * n &&
           a->o_batch_stride == hs * sl * d * n && a->lse_part_stride == 1 && a->lse_seq_stride == n &&
           a->lse_head_stride == sl * n && a->lse_batch_stride == hs * sl * n;
}

/* kAdjacent: FUSED_SM90's split results (parts_side_by_side), a row's parts side by side, so that a
 * row's address is one product and its parts follow it o_part_stride (head_dim) apart. */
template <int kIn, int kOut, bool kBase2, int kVec, bool kAdjacent>
__global__ void __launch_bounds__(kMergeThreads) merge_parts(const __grid_constant__ fa_merge_args a) {
    using In = vec_io<kIn, kVec>;
    using Out = vec_io<kOut, kVec>;
    using TI = typename io<kIn>::T;
    /* Threads an item: with adjacent parts, kMergeLanes, lane q taking parts 4 q .. 4 q + 3 of each
     * group of 16 (a quarter of the loads and of the sums each), then the lanes' results combined
     * through shuffles; lane 0 stores. Otherwise one. */
    constexpr int kLanes = kAdjacent ? kMergeLanes : 1, kG = kGroup / kLanes;
    const int chunks = a.head_dim / kVec;
    const int64_t total = (int64_t)a.batch * a.heads * a.seqlen * chunks;
    const bool narrow = total <= INT32_MAX;
    int64_t idx = (int64_t)blockIdx.x * kMergeThreads + threadIdx.x;
    int q = 0; /* this thread's lane */
    if constexpr (kLanes > 1) q = (int)threadIdx.x % kLanes, idx /= kLanes;
    merge_addr<kIn, kVec, kAdjacent> r(a, idx < total ? idx : 0, chunks, narrow);
    /* The part strides and count taken before the wait, beside the first item's addresses (ptxas
     * may still read them again from the parameters, a constant-cache hit). */
    int64_t ls = a.lse_part_stride, os = a.o_part_stride;
    int n = a.num_parts;
    asm volatile("" : "+l"(ls), "+l"(os), "+r"(n));
    wait_prerequisites();
    for (bool first = true; idx < total; idx += (int64_t)gridDim.x * (kMergeThreads / kLanes), first = false) {
        if (!first) r = merge_addr<kIn, kVec, kAdjacent>(a, idx, chunks, narrow);
        int64_t out_row = r.s, out_b = r.b; /* where the row goes: [b][s], or packed row out_rows[b] + s */
        if (a.out_rows != nullptr) {
            const int64_t r0 = clamp64(a.out_rows[r.b], 0, a.total_rows);
            if (r.s >= clamp64((int64_t)a.out_rows[r.b + 1] - r0, 0, a.total_rows - r0)) continue;
            out_row = r0 + r.s, out_b = 0;
        }

        /* Per group of parts: every load first, each part's address the last one's plus the part
         * stride, or with adjacent parts u part strides from the lane's first (after a split decode
         * every instruction between the wait and the last load is on the call's critical path, run
         * once, fetched cold: docs/performance.md v74); then its
         * largest finite LSE (a tree), every part's weight relative to the running max m at once,
         * no weight waiting on the last, and the sum of the weights and the weighted O added in
         * part order. A group raising m rescales what is summed so far. An infinite LSE is an
         * empty part (its O, loaded, is never used: it may be NaN); a NaN one makes the row NaN. */
        const float *lp = r.lse_row;
        const TI *op = r.o_el;
        if constexpr (kAdjacent) lp += kG * q, op += kG * q * os;
        float m = -INFINITY, sum = 0.0f, acc[kVec];
#pragma unroll
        for (int v = 0; v < kVec; ++v) acc[v] = 0.0f;
        bool nan = false;
        for (int i0 = 0; i0 < n; i0 += kGroup) {
            float l[kG], x[kG][kVec];
            if constexpr (kAdjacent) {
#pragma unroll
                for (int u = 0; u < kG; ++u) { /* (past the last part: no load, an empty part) */
                    l[u] = -INFINITY;
                    if (i0 + kG * q + u < n) {
                        l[u] = lp[u];
                        In::load(op + u * os, x[u]);
                    }
                }
                lp += kGroup, op += kGroup * os;
            } else {
#pragma unroll
                for (int u = 0; u < kGroup; ++u) { /* (past the last part: no load, an empty part) */
                    l[u] = -INFINITY;
                    if (i0 + u < n) {
                        l[u] = *lp;
                        In::load(op, x[u]);
                        lp += ls, op += os;
                    }
                }
            }
            bool live[kG];
            float gm[kG];
#pragma unroll
            for (int u = 0; u < kG; ++u) {
                nan |= l[u] != l[u];
                live[u] = fabsf(l[u]) < INFINITY; /* finite: not empty, not NaN */
                gm[u] = live[u] ? l[u] : -INFINITY;
            }
#pragma unroll
            for (int w = kG / 2; w > 0; w /= 2) /* (kG a power of two) */
#pragma unroll
                for (int u = 0; u < kG / 2; ++u)
                    if (u < w) gm[u] = fmaxf(gm[u], gm[u + w]);
            if (gm[0] > m) { /* (from m = -inf: what is summed so far is 0, and so is the factor) */
                const float c = kBase2 ? exp2f(m - gm[0]) : expf(m - gm[0]);
                sum *= c;
#pragma unroll
                for (int v = 0; v < kVec; ++v) acc[v] *= c;
                m = gm[0];
            }
#pragma unroll
            for (int u = 0; u < kG; ++u) {
                const float w = kBase2 ? exp2f(l[u] - m) : expf(l[u] - m);
                sum += live[u] ? w : 0.0f;
#pragma unroll
                for (int v = 0; v < kVec; ++v) acc[v] = live[u] ? fmaf(w, x[u][v], acc[v]) : acc[v];
            }
        }
        if constexpr (kLanes > 1) {
            /* The lanes' (m, sum, acc) combined, xor 1 then xor 2: the same max, each side's share
             * rescaled to it (a lane with no part, m = -inf, adds nothing). Lane 0's result is
             * stored; the order of the additions is fixed, so the merge stays deterministic. */
            const unsigned lanes_mask = ((1u << kLanes) - 1u) << ((threadIdx.x % 32) & ~(kLanes - 1));
#pragma unroll
            for (int s = 1; s < kLanes; s <<= 1) {
                const float mo = __shfl_xor_sync(lanes_mask, m, s), so = __shfl_xor_sync(lanes_mask, sum, s);
                float ao[kVec];
#pragma unroll
                for (int v = 0; v < kVec; ++v) ao[v] = __shfl_xor_sync(lanes_mask, acc[v], s);
                nan |= __shfl_xor_sync(lanes_mask, (int)nan, s) != 0;
                const float mm = fmaxf(m, mo);
                const float fa = m == -INFINITY ? 0.0f : (kBase2 ? exp2f(m - mm) : expf(m - mm));
                const float fb = mo == -INFINITY ? 0.0f : (kBase2 ? exp2f(mo - mm) : expf(mo - mm));
                sum = sum * fa + so * fb;
#pragma unroll
                for (int v = 0; v < kVec; ++v) acc[v] = acc[v] * fa + ao[v] * fb;
                m = mm;
            }
            if (q != 0) continue;
        }
        typename io<kOut>::T *out = (typename io<kOut>::T *)a.o + out_b * a.out_batch_stride +
                                    out_row * a.out_seq_stride + r.h * a.out_head_stride + r.d;
        float *lse_out = (a.lse && r.d == 0) ? a.lse + out_b * a.lse_out_batch_stride + r.h * a.lse_out_head_stride +
                                                   out_row * a.lse_out_seq_stride
                                             : nullptr;
        float res[kVec];
        if (nan || m == -INFINITY) { /* NaN in, NaN out; no contributing part: O = 0, LSE = -inf */
#pragma unroll
            for (int v = 0; v < kVec; ++v) res[v] = nan ? NAN : 0.0f;
            Out::store(out, res);
            if (lse_out) *lse_out = nan ? NAN : -INFINITY;
            continue;
        }
        const float inv = 1.0f / sum;
#pragma unroll
        for (int v = 0; v < kVec; ++v) res[v] = acc[v] * inv;
        Out::store(out, res);
        if (lse_out) *lse_out = m + (kBase2 ? log2f(sum) : logf(sum));
    }
}

/* Whether every row of O_i and of the output starts on a 4-element boundary the vector loads and
 * stores can use. */
inline bool vectorizable(const fa_merge_args *a) {
    const int in = a->dtype_parts == FA_DTYPE_F32 ? 4 : 2, out = a->dtype_out == FA_DTYPE_F32 ? 4 : 2;
    const int64_t strides[] = {a->o_part_stride,   a->o_batch_stride, a->o_seq_stride,   a->o_head_stride,
                               a->out_batch_stride, a->out_seq_stride, a->out_head_stride};
    for (int64_t st : strides)
        if (st % 4 != 0) return false;
    return a->head_dim % 4 == 0 && (uintptr_t)a->o_parts % (4 * in) == 0 && (uintptr_t)a->o % (4 * out) == 0;
}

template <int kIn, int kOut, bool kBase2, int kVec> int launch_vec(const fa_merge_args *a, cudaStream_t stream) {
    const int64_t total = (int64_t)a->batch * a->heads * a->seqlen * (a->head_dim / kVec);
    const bool programmatic = a->after_split != 0;
    if (a->row_parts) { /* FUSED_SM90's split results: only the adjacent form reads them */
        if constexpr (kIn == FA_DTYPE_F32 && !kBase2)
            if (parts_side_by_side(a))
                return (int)launch_grid_stride(merge_parts<kIn, kOut, kBase2, kVec, true>, total * kMergeLanes,
                                               kMergeThreads, stream, programmatic, *a);
        return (int)cudaErrorInvalidValue;
    }
    return (int)launch_grid_stride(merge_parts<kIn, kOut, kBase2, kVec, false>, total, kMergeThreads, stream,
                                   programmatic, *a);
}

template <int kIn, int kOut> int launch(const fa_merge_args *a, cudaStream_t stream) {
    const bool vec = vectorizable(a);
    if (a->base2) return vec ? launch_vec<kIn, kOut, true, 4>(a, stream) : launch_vec<kIn, kOut, true, 1>(a, stream);
    return vec ? launch_vec<kIn, kOut, false, 4>(a, stream) : launch_vec<kIn, kOut, false, 1>(a, stream);
}

template <int kIn> int launch_in(const fa_merge_args *a, cudaStream_t stream) {
    switch (a->dtype_out) {
    case FA_DTYPE_F16: return launch<kIn, FA_DTYPE_F16>(a, stream);
    case FA_DTYPE_BF16: return launch<kIn, FA_DTYPE_BF16>(a, stream);
    case FA_DTYPE_F32: return launch<kIn, FA_DTYPE_F32>(a, stream);
    default: return (int)cudaErrorInvalidValue;
    }
}

}  // namespace
}  // namespace fa

extern "C" __attribute__((visibility("hidden"))) int fa_merge_launch(const fa_merge_args *a, void *stream) {
    if ((int64_t)a->batch * a->heads * a->seqlen * a->head_dim == 0) return 0;
    const cudaStream_t s = (cudaStream_t)stream;
    switch (a->dtype_parts) {
    case FA_DTYPE_F16: return fa::launch_in<FA_DTYPE_F16>(a, s);
    case FA_DTYPE_BF16: return fa::launch_in<FA_DTYPE_BF16>(a, s);
    case FA_DTYPE_F32: return fa::launch_in<FA_DTYPE_F32>(a, s);
    default: return (int)cudaErrorInvalidValue;
    }
}

/* The split partial results of a fused kernel (fa_kernel_params.o_accum / lse_accum: FUSED's laid out
 * [split][batch][heads_q][seqlen_q](head_dim), FUSED_SM90's with a row's splits side by side; fp32,
 * natural-log LSE, seqlen_q the capacity for a ragged Q) merged into O and LSE (for a ragged Q, into
 * each sequence's packed rows). */
extern "C" __attribute__((visibility("hidden"))) int fa_split_combine(const fa_kernel_params *kp, int dtype,
                                                                      int after_sm90, void *stream) {
    /* Grouped query heads read as rows (q_group_rows, FUSED's packed decode): the partial results'
     * [heads_kv][group] rows are [heads_q][1]; O's heads are q_seq_stride apart, its packed rows
     * o_row0_stride. */
    const int64_t g = kp->q_group_rows > 1 ? kp->q_group_rows : 1, d = kp->head_dim;
    const int64_t sq = g > 1 ? 1 : kp->seqlen_q, hq = kp->heads_q * g;
    fa_merge_args a = {};
    a.o_parts = kp->o_accum, a.lse_parts = kp->lse_accum, a.o = kp->o, a.lse = kp->lse;
    a.o_part_stride = kp->batch * hq * sq * d, a.o_batch_stride = hq * sq * d, a.o_head_stride = sq * d;
    a.o_seq_stride = d;
    a.lse_part_stride = kp->batch * hq * sq, a.lse_batch_stride = hq * sq, a.lse_head_stride = sq;
    a.lse_seq_stride = 1;
    if (after_sm90) { /* O [batch][heads][seqlen][split](head_dim), LSE [batch][heads][seqlen][split] */
        const int64_t s = kp->num_splits;
        a.row_parts = 1, a.o_part_stride = d;
        a.o_batch_stride = hq * sq * d * s, a.o_head_stride = sq * d * s, a.o_seq_stride = d * s;
        a.lse_part_stride = 1, a.lse_batch_stride = hq * sq * s, a.lse_head_stride = sq * s, a.lse_seq_stride = s;
    }
    a.out_batch_stride = kp->o_batch_stride, a.out_seq_stride = kp->o_seq_stride, a.out_head_stride = kp->o_head_stride;
    if (g > 1) a.out_seq_stride = kp->o_row0_stride, a.out_head_stride = kp->o_seq_stride;
    a.lse_out_batch_stride = hq * sq, a.lse_out_head_stride = sq, a.lse_out_seq_stride = 1;
    if (kp->cu_seqlens_q != nullptr) { /* ragged Q: O [total_q, heads_q, head_dim], LSE [heads_q, total_q] */
        a.out_rows = kp->cu_seqlens_q, a.total_rows = kp->total_q;
        a.lse_out_batch_stride = 0, a.lse_out_head_stride = kp->total_q;
    }
    a.num_parts = kp->num_splits, a.batch = kp->batch, a.seqlen = (int32_t)sq, a.heads = (int32_t)hq;
    a.head_dim = kp->head_dim, a.dtype_parts = FA_DTYPE_F32, a.dtype_out = dtype, a.base2 = 0;
    a.after_split = after_sm90; /* a programmatic dependent of the FUSED_SM90 kernel just enqueued */
    return fa_merge_launch(&a, stream);
}
