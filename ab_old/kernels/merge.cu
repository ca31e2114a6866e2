/*
 * merge.cu - merges partial attention results (O_i, LSE_i), i = 0..S-1, into one, for
 * flashattn_merge and for FUSED_SM90's split-key decode. Per row (b, s, h):
 *
 *     m = max_i LSE_i,  w_i = exp(LSE_i - m),  O = sum_i w_i O_i / sum_i w_i,  LSE = m + log(sum_i w_i)
 *
 * exp/log in base e or 2 (the LSE's base). An LSE of -inf or +inf (FlashAttention-2's empty row)
 * is an empty part: its O is never read. No contributing part: O = 0, LSE = -inf. A NaN LSE makes
 * the row NaN. Parts are added in index order: deterministic.
 *
 * One thread per output element (row, d): the threads of a row read the same LSEs (one cached load
 * each), take the max, then, part by part, the weight and that part's element of O, whose loads do
 * not wait on one another (an empty part's O is loaded but not used, never multiplied). Any number
 * of parts and any head dim; enough threads to fill the GPU even for a batch-1 decode.
 */
#include "fa_common.cuh"

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

template <int kIn, int kOut, bool kBase2>
__global__ void __launch_bounds__(kMergeThreads) merge_parts(const __grid_constant__ fa_merge_args a) {
    using In = io<kIn>;
    using Out = io<kOut>;
    const int64_t total = (int64_t)a.batch * a.heads * a.seqlen * a.head_dim;
    for (int64_t idx = (int64_t)blockIdx.x * kMergeThreads + threadIdx.x; idx < total;
         idx += (int64_t)gridDim.x * kMergeThreads) {
        const int d = (int)(idx % a.head_dim);
        const int64_t row = idx / a.head_dim;
        const int s = (int)(row % a.seqlen);
        const int64_t bh = row / a.seqlen;
        const int h = (int)(bh % a.heads), b = (int)(bh / a.heads);
        const float *lse_row = a.lse_parts + b * a.lse_batch_stride + h * a.lse_head_stride + s * a.lse_seq_stride;
        const typename In::T *o_el = (const typename In::T *)a.o_parts + b * a.o_batch_stride + s * a.o_seq_stride +
                                     h * a.o_head_stride + d;
        typename Out::T *out = (typename Out::T *)a.o + b * a.out_batch_stride + s * a.out_seq_stride +
                               h * a.out_head_stride + d;
        float *lse_out = (a.lse && d == 0) ? a.lse + b * a.lse_out_batch_stride + h * a.lse_out_head_stride +
                                                 s * a.lse_out_seq_stride
                                           : nullptr;

        /* The max over the parts (an infinite LSE is an empty part), and whether any is NaN. */
        float m = -INFINITY;
        bool nan = false;
        for (int i = 0; i < a.num_parts; ++i) {
            const float l = lse_row[i * a.lse_part_stride];
            nan |= l != l;
            if (l != INFINITY) m = fmaxf(m, l);
        }
        if (nan || m == -INFINITY) { /* NaN in, NaN out; no contributing part: O = 0, LSE = -inf */
            Out::store(out, nan ? NAN : 0.0f);
            if (lse_out) *lse_out = nan ? NAN : -INFINITY;
            continue;
        }
        float sum = 0.0f, acc = 0.0f;
        for (int i = 0; i < a.num_parts; ++i) {
            const float l = lse_row[i * a.lse_part_stride];
            /* Loaded whatever the weight: independent loads keep many in flight (a predicated load
             * measured 1269 against 1415 GB/s on a batch-1 decode). An empty part's value is
             * discarded, never multiplied; a split that saw no key leaves its O unwritten, so this
             * reads workspace nothing wrote (initcheck would say so) without using it. */
            const float x = In::load(o_el + i * a.o_part_stride);
            const float w = (l != INFINITY && l != -INFINITY) ? (kBase2 ? exp2f(l - m) : expf(l - m)) : 0.0f;
            sum += w;
            if (w > 0.0f) acc += w * x;
        }
        Out::store(out, acc * (1.0f / sum));
        if (lse_out) *lse_out = m + (kBase2 ? log2f(sum) : logf(sum));
    }
}

template <int kIn, int kOut> int launch(const fa_merge_args *a, dim3 grid, cudaStream_t stream) {
    if (a->base2)
        merge_parts<kIn, kOut, true><<<grid, kMergeThreads, 0, stream>>>(*a);
    else
        merge_parts<kIn, kOut, false><<<grid, kMergeThreads, 0, stream>>>(*a);
    return (int)cudaGetLastError();
}

template <int kIn> int launch_in(const fa_merge_args *a, dim3 grid, cudaStream_t stream) {
    switch (a->dtype_out) {
    case FA_DTYPE_F16: return launch<kIn, FA_DTYPE_F16>(a, grid, stream);
    case FA_DTYPE_BF16: return launch<kIn, FA_DTYPE_BF16>(a, grid, stream);
    case FA_DTYPE_F32: return launch<kIn, FA_DTYPE_F32>(a, grid, stream);
    default: return (int)cudaErrorInvalidValue;
    }
}

}  // namespace
}  // namespace fa

extern "C" __attribute__((visibility("hidden"))) int fa_merge_launch(const fa_merge_args *a, void *stream) {
    const int64_t total = (int64_t)a->batch * a->heads * a->seqlen * a->head_dim;
    if (total == 0) return 0;
    const int64_t blocks = (total + fa::kMergeThreads - 1) / fa::kMergeThreads;
    const dim3 grid((unsigned)(blocks < FA_GRID_STRIDE_MAX_BLOCKS ? blocks : FA_GRID_STRIDE_MAX_BLOCKS));
    const cudaStream_t s = (cudaStream_t)stream;
    switch (a->dtype_parts) {
    case FA_DTYPE_F16: return fa::launch_in<FA_DTYPE_F16>(a, grid, s);
    case FA_DTYPE_BF16: return fa::launch_in<FA_DTYPE_BF16>(a, grid, s);
    case FA_DTYPE_F32: return fa::launch_in<FA_DTYPE_F32>(a, grid, s);
    default: return (int)cudaErrorInvalidValue;
    }
}

/* The split partial results of FUSED_SM90 (fa_kernel_params.o_accum / lse_accum, laid out
 * [split][batch][heads_q][seqlen_q](head_dim), fp32, natural-log LSE) merged into O and LSE. */
extern "C" __attribute__((visibility("hidden"))) int fa_split_combine(const fa_kernel_params *kp, int dtype,
                                                                      void *stream) {
    const int64_t sq = kp->seqlen_q, hq = kp->heads_q, d = kp->head_dim;
    fa_merge_args a = {};
    a.o_parts = kp->o_accum, a.lse_parts = kp->lse_accum, a.o = kp->o, a.lse = kp->lse;
    a.o_part_stride = kp->batch * hq * sq * d, a.o_batch_stride = hq * sq * d, a.o_head_stride = sq * d;
    a.o_seq_stride = d;
    a.lse_part_stride = kp->batch * hq * sq, a.lse_batch_stride = hq * sq, a.lse_head_stride = sq;
    a.lse_seq_stride = 1;
    a.out_batch_stride = kp->o_batch_stride, a.out_seq_stride = kp->o_seq_stride, a.out_head_stride = kp->o_head_stride;
    a.lse_out_batch_stride = hq * sq, a.lse_out_head_stride = sq, a.lse_out_seq_stride = 1;
    a.num_parts = kp->num_splits, a.batch = kp->batch, a.seqlen = kp->seqlen_q, a.heads = kp->heads_q;
    a.head_dim = kp->head_dim, a.dtype_parts = FA_DTYPE_F32, a.dtype_out = dtype, a.base2 = 0;
    return fa_merge_launch(&a, stream);
}
