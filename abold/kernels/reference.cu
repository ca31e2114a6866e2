/*
 * reference.cu - the kernels of the REFERENCE backend, which src/reference.c strings together with
 * two cuBLAS GEMMs:
 *
 *   S[b,h]  = scale * Q[b,:,h,:] K[b,:,h/g,:]^T        cuBLAS, fp32 out     [B*Hq, Sq, Sk]
 *   P       = softmax(mask(alibi(softcap(S))))          fa_ref_softmax, in place, LSE out
 *   O[b,h]  = P V_f32[b,h/g]                            cuBLAS SGEMM (fp32)  [B*Hq, Sq, D]
 *   O       = round(O_f32)                              fa_ref_store_o, any O strides
 *
 * Everything after the first GEMM is fp32 (V is widened exactly), so this backend is the
 * high-precision oracle the fused kernels are checked against. With `lowprec` the softmax rounds S
 * and P to the input dtype: plain low-precision attention, the baseline of FlashAttention's error rule.
 */
#include <math.h>

#include "fa_common.cuh"

namespace fa {
namespace {

constexpr int kRefThreads = 256;

__global__ void ref_fill_pointers(const __grid_constant__ fa_kernel_params p, int elem_bytes,
                                  void **ptrs, float *scores, float *v_f32, float *o_f32) {
    const int64_t nbh = (int64_t)p.batch * p.heads_q;
    for (int64_t z = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; z < nbh;
         z += (int64_t)gridDim.x * blockDim.x) {
        const int64_t b = z / p.heads_q, h = z % p.heads_q, hk = h / p.head_group;
        ptrs[0 * nbh + z] = (char *)p.k + (b * p.k_batch_stride + hk * p.k_head_stride) * elem_bytes;
        ptrs[1 * nbh + z] = (char *)p.q + (b * p.q_batch_stride + h * p.q_head_stride) * elem_bytes;
        ptrs[2 * nbh + z] = scores + z * p.seqlen_q * p.seqlen_k;
        ptrs[3 * nbh + z] = v_f32 + (b * p.heads_kv + hk) * p.seqlen_k * p.head_dim;
        ptrs[4 * nbh + z] = scores + z * p.seqlen_q * p.seqlen_k;
        ptrs[5 * nbh + z] = o_f32 + z * p.seqlen_q * p.head_dim;
    }
}

template <int kDtype>
__global__ void ref_widen_v(const __grid_constant__ fa_kernel_params p, float *v_f32) {
    using T = typename elem<kDtype>::type;
    const int64_t n = (int64_t)p.batch * p.heads_kv * p.seqlen_k * p.head_dim;
    for (int64_t x = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; x < n;
         x += (int64_t)gridDim.x * blockDim.x) {
        const int64_t d = x % p.head_dim, j = (x / p.head_dim) % p.seqlen_k;
        const int64_t bh = x / ((int64_t)p.head_dim * p.seqlen_k);
        const int64_t hk = bh % p.heads_kv, b = bh / p.heads_kv;
        const T *v = (const T *)p.v + b * p.v_batch_stride + j * p.v_seq_stride + hk * p.v_head_stride;
        v_f32[x] = elem<kDtype>::to_float(v[d]);
    }
}

template <typename Op>
__device__ float block_reduce(float x, Op op, float *scratch) {
    for (int o = 16; o > 0; o >>= 1) x = op(x, __shfl_xor_sync(0xffffffffu, x, o));
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    __syncthreads(); /* scratch may still be read from the previous reduction */
    if (lane == 0) scratch[warp] = x;
    __syncthreads();
    x = scratch[0];
    for (int w = 1; w < kRefThreads / 32; ++w) x = op(x, scratch[w]);
    return x;
}

struct max_op { __device__ float operator()(float a, float b) const { return fmaxf(a, b); } };
struct sum_op { __device__ float operator()(float a, float b) const { return a + b; } };

/* One score row: three passes (max, sum, write) over the row in device memory; bnd gives the
 * sequence's counts and visibility offsets (the kernel parameters for a dense call). */
template <int kDtype, bool kLowprec, class Bounds>
__device__ __forceinline__ void softmax_row(const fa_kernel_params &p, const Bounds &bnd, float *row, int b, int h,
                                            int i, float *lse, float *scratch) {
    using E = elem<kDtype>;
    const float slope = alibi_slope(p, b, h);
    auto score = [&](int j) {
        float s = row[j];
        if (kLowprec) s = E::to_float(E::from_float(s));
        return transform_score(p, bnd, s, slope, i, j);
    };
    float m = -INFINITY;
    for (int j = threadIdx.x; j < p.seqlen_k; j += kRefThreads)
        if (visible(bnd, i, j)) m = fmaxf(m, score(j));
    m = block_reduce(m, max_op(), scratch);
    float l = 0.0f;
    if (m != -INFINITY)
        for (int j = threadIdx.x; j < p.seqlen_k; j += kRefThreads)
            if (visible(bnd, i, j)) l += expf(score(j) - m);
    l = block_reduce(l, sum_op(), scratch);
    /* A row that sees no key: P = 0 (so O = 0) and LSE = -inf. */
    const float inv_l = (l > 0.0f) ? 1.0f / l : 0.0f;
    for (int j = threadIdx.x; j < p.seqlen_k; j += kRefThreads) {
        float pr = visible(bnd, i, j) ? expf(score(j) - m) * inv_l : 0.0f;
        if (kLowprec) pr = E::to_float(E::from_float(pr));
        row[j] = pr;
    }
    if (threadIdx.x == 0 && lse != nullptr) *lse = (l > 0.0f) ? m + logf(l) : -INFINITY;
}

/* One block per score row. A serving call's rows take their sequence's counts, mask and LSE slot
 * ([heads_q, total_q] for packed Q); rows past the sequence's queries get P = 0 and no LSE. */
template <int kDtype, bool kLowprec>
__global__ void __launch_bounds__(kRefThreads)
ref_softmax_rows(const __grid_constant__ fa_kernel_params p, float *scores) {
    __shared__ float scratch[kRefThreads / 32];
    const int64_t rows = (int64_t)p.batch * p.heads_q * p.seqlen_q;
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const int i = (int)(r % p.seqlen_q);
        const int64_t bh = r / p.seqlen_q;
        const int h = (int)(bh % p.heads_q), b = (int)(bh / p.heads_q);
        float *row = scores + r * p.seqlen_k;
        if (!p.serving) {
            softmax_row<kDtype, kLowprec>(p, p, row, b, h, i, p.lse ? p.lse + r : nullptr, scratch);
            continue;
        }
        const fa_seq sq = serving_seq(p, b);
        if (i >= sq.seqlen_q) {
            for (int j = threadIdx.x; j < p.seqlen_k; j += kRefThreads) row[j] = 0.0f;
            continue;
        }
        float *lse = nullptr;
        if (p.lse) lse = p.cu_seqlens_q ? p.lse + (int64_t)h * p.total_q + sq.q_row0 + i : p.lse + r;
        softmax_row<kDtype, kLowprec>(p, sq, row, b, h, i, lse, scratch);
    }
}

/* A serving call's Q, K and V, dense: element x of each copy from its sequence's rows (zeros past
 * its counts, a page outside its list or the pool, or a cache index outside the cache). */
template <int kDtype>
__global__ void ref_gather(const __grid_constant__ fa_kernel_params p, typename elem<kDtype>::type *dst) {
    using T = typename elem<kDtype>::type;
    const int64_t nq = (int64_t)p.batch * p.seqlen_q * p.heads_q * p.head_dim;
    const int64_t nk = (int64_t)p.batch * p.seqlen_k * p.heads_kv * p.head_dim;
    for (int64_t x = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; x < nq + 2 * nk;
         x += (int64_t)gridDim.x * blockDim.x) {
        const bool is_q = x < nq, is_k = !is_q && x < nq + nk;
        const int64_t y = is_q ? x : (is_k ? x - nq : x - nq - nk);
        const int heads = is_q ? p.heads_q : p.heads_kv, rows = is_q ? p.seqlen_q : p.seqlen_k;
        const int d = (int)(y % p.head_dim), h = (int)(y / p.head_dim % heads);
        const int s = (int)(y / ((int64_t)p.head_dim * heads) % rows);
        const int b = (int)(y / ((int64_t)p.head_dim * heads * rows));
        const fa_seq sq = serving_seq(p, b);
        T v = elem<kDtype>::from_float(0.0f);
        if (is_q) {
            if (s < sq.seqlen_q)
                v = ((const T *)p.q)[(p.cu_seqlens_q ? 0 : (int64_t)b * p.q_batch_stride) + (sq.q_row0 + s) * p.q_seq_stride +
                                     (int64_t)h * p.q_head_stride + d];
        } else if (s < sq.seqlen_k && sq.kv_valid) {
            const T *base = (const T *)(is_k ? p.k : p.v);
            const int64_t bs = is_k ? p.k_batch_stride : p.v_batch_stride, ss = is_k ? p.k_seq_stride : p.v_seq_stride;
            const int64_t hs = is_k ? p.k_head_stride : p.v_head_stride;
            int64_t outer = p.cu_seqlens_k ? 0 : sq.kv_b, row = sq.k_row0 + s;
            bool ok = true;
            if (p.block_table) {
                const int pi = s / p.page_size;
                const int page = pi < sq.pages ? p.block_table[sq.page0 + pi] : -1;
                ok = page >= 0 && page < p.num_pages;
                outer = page, row = s - (int64_t)pi * p.page_size;
            }
            if (ok) v = base[outer * bs + row * ss + (int64_t)h * hs + d];
        }
        dst[x] = v;
    }
}

template <int kDtype>
__global__ void ref_store_o(const __grid_constant__ fa_kernel_params p, const float *o_f32) {
    using T = typename elem<kDtype>::type;
    const int64_t n = (int64_t)p.batch * p.heads_q * p.seqlen_q * p.head_dim;
    for (int64_t x = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; x < n;
         x += (int64_t)gridDim.x * blockDim.x) {
        const int64_t d = x % p.head_dim, i = (x / p.head_dim) % p.seqlen_q;
        const int64_t bh = x / ((int64_t)p.head_dim * p.seqlen_q);
        const int64_t h = bh % p.heads_q, b = bh / p.heads_q;
        int64_t row = i, batch = b;
        if (p.serving) { /* only the sequence's rows, at its place in O */
            const fa_seq sq = serving_seq(p, (int)b);
            if (i >= sq.seqlen_q) continue;
            row = sq.q_row0 + i, batch = p.cu_seqlens_q ? 0 : b;
        }
        T *o = (T *)p.o + batch * p.o_batch_stride + row * p.o_seq_stride + h * p.o_head_stride;
        o[d] = elem<kDtype>::from_float(o_f32[x]);
    }
}

int grid_for(int64_t n, int threads) {
    const int64_t blocks = (n + threads - 1) / threads;
    return (int)(blocks < 1 ? 1 : (blocks > FA_GRID_STRIDE_MAX_BLOCKS ? FA_GRID_STRIDE_MAX_BLOCKS : blocks));
}

}  // namespace
}  // namespace fa

extern "C" int fa_ref_prepare(const fa_kernel_params *kp, int dtype, void **ptr_arrays,
                              float *scores, float *v_f32, float *o_f32, void *stream) {
    cudaStream_t s = (cudaStream_t)stream;
    const int64_t nbh = (int64_t)kp->batch * kp->heads_q;
    fa::ref_fill_pointers<<<fa::grid_for(nbh, 256), 256, 0, s>>>(*kp, 2, ptr_arrays, scores, v_f32,
                                                                 o_f32);
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return (int)err;
    const int64_t nv = (int64_t)kp->batch * kp->heads_kv * kp->seqlen_k * kp->head_dim;
    if (nv > 0) {
        if (dtype == FA_DTYPE_BF16)
            fa::ref_widen_v<1><<<fa::grid_for(nv, 256), 256, 0, s>>>(*kp, v_f32);
        else
            fa::ref_widen_v<0><<<fa::grid_for(nv, 256), 256, 0, s>>>(*kp, v_f32);
        err = cudaGetLastError();
    }
    return (int)err;
}

extern "C" int fa_ref_softmax(const fa_kernel_params *kp, int dtype, int lowprec, float *scores,
                              int grid, void *stream) {
    cudaStream_t s = (cudaStream_t)stream;
    if (dtype == FA_DTYPE_BF16) {
        if (lowprec) fa::ref_softmax_rows<1, true><<<grid, fa::kRefThreads, 0, s>>>(*kp, scores);
        else fa::ref_softmax_rows<1, false><<<grid, fa::kRefThreads, 0, s>>>(*kp, scores);
    } else {
        if (lowprec) fa::ref_softmax_rows<0, true><<<grid, fa::kRefThreads, 0, s>>>(*kp, scores);
        else fa::ref_softmax_rows<0, false><<<grid, fa::kRefThreads, 0, s>>>(*kp, scores);
    }
    return (int)cudaGetLastError();
}

extern "C" int fa_ref_store_o(const fa_kernel_params *kp, int dtype, const float *o_f32,
                              void *stream) {
    cudaStream_t s = (cudaStream_t)stream;
    const int64_t n = (int64_t)kp->batch * kp->heads_q * kp->seqlen_q * kp->head_dim;
    if (dtype == FA_DTYPE_BF16)
        fa::ref_store_o<1><<<fa::grid_for(n, 256), 256, 0, s>>>(*kp, o_f32);
    else
        fa::ref_store_o<0><<<fa::grid_for(n, 256), 256, 0, s>>>(*kp, o_f32);
    return (int)cudaGetLastError();
}

extern "C" int fa_ref_gather(const fa_kernel_params *kp, int dtype, void *dst, fa_kernel_params *dense,
                             void *stream) {
    const int64_t nq = (int64_t)kp->batch * kp->seqlen_q * kp->heads_q * kp->head_dim;
    const int64_t nk = (int64_t)kp->batch * kp->seqlen_k * kp->heads_kv * kp->head_dim;
    cudaStream_t s = (cudaStream_t)stream;
    if (nq + 2 * nk > 0) {
        if (dtype == FA_DTYPE_BF16)
            fa::ref_gather<1><<<fa::grid_for(nq + 2 * nk, 256), 256, 0, s>>>(*kp, (__nv_bfloat16 *)dst);
        else
            fa::ref_gather<0><<<fa::grid_for(nq + 2 * nk, 256), 256, 0, s>>>(*kp, (__half *)dst);
        const cudaError_t err = cudaGetLastError();
        if (err != cudaSuccess) return (int)err;
    }
    *dense = *kp;
    char *base = (char *)dst;
    dense->q = base, dense->k = base + 2 * nq, dense->v = base + 2 * (nq + nk);
    dense->q_head_stride = dense->k_head_stride = dense->v_head_stride = kp->head_dim;
    dense->q_seq_stride = (int64_t)kp->heads_q * kp->head_dim;
    dense->q_batch_stride = dense->q_seq_stride * kp->seqlen_q;
    dense->k_seq_stride = dense->v_seq_stride = (int64_t)kp->heads_kv * kp->head_dim;
    dense->k_batch_stride = dense->v_batch_stride = dense->k_seq_stride * kp->seqlen_k;
    return 0;
}
