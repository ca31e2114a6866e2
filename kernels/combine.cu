/*
 * combine.cu - merges the partial results of a FUSED_SM90 call whose key range was split
 * (fa_kernel_params.num_splits > 1). Split s wrote, for each query row, its own softmax-normalised
 * O_s (fp32) and LSE_s; the row's result is
 *
 *     m = max_s LSE_s,  w_s = exp(LSE_s - m),  O = sum_s w_s O_s / sum_s w_s,  LSE = m + log(sum_s w_s)
 *
 * in a fixed order (deterministic). A row that no split saw (every LSE_s = -inf) gets O = 0 and
 * LSE = -inf; O_s of such a split is never read. One warp per row; lanes stride the head dim.
 */
#include "fa_common.cuh"

namespace fa {
namespace {

constexpr int kCombineWarps = 8;

template <int kDtype>
__global__ void __launch_bounds__(kCombineWarps * 32) split_combine(const __grid_constant__ fa_kernel_params p) {
    using E = elem<kDtype>;
    const int64_t rows = (int64_t)p.batch * p.heads_q * p.seqlen_q;
    const int64_t split_rows = rows; /* rows per split in lse_accum, and in o_accum times head_dim */
    const int lane = threadIdx.x % 32;
    for (int64_t row = (int64_t)blockIdx.x * kCombineWarps + threadIdx.x / 32; row < rows;
         row += (int64_t)gridDim.x * kCombineWarps) {
        float m = -INFINITY;
        for (int s = 0; s < p.num_splits; ++s) m = fmaxf(m, p.lse_accum[s * split_rows + row]);
        const int pos = (int)(row % p.seqlen_q);
        const int64_t bh = row / p.seqlen_q;
        const int head = (int)(bh % p.heads_q), b = (int)(bh / p.heads_q);
        typename E::type *o = (typename E::type *)p.o + b * p.o_batch_stride + head * p.o_head_stride +
                              (int64_t)pos * p.o_seq_stride;
        if (m == -INFINITY) {
            for (int d = lane; d < p.head_dim; d += 32) o[d] = E::from_float(0.0f);
            if (p.lse && lane == 0) p.lse[row] = -INFINITY;
            continue;
        }
        float sum = 0.0f;
        for (int s = 0; s < p.num_splits; ++s) sum += expf(p.lse_accum[s * split_rows + row] - m);
        const float inv = 1.0f / sum;
        for (int d = lane; d < p.head_dim; d += 32) {
            float acc = 0.0f;
            for (int s = 0; s < p.num_splits; ++s) {
                const float w = expf(p.lse_accum[s * split_rows + row] - m);
                if (w > 0.0f) acc += w * p.o_accum[(s * split_rows + row) * p.head_dim + d];
            }
            o[d] = E::from_float(acc * inv);
        }
        if (p.lse && lane == 0) p.lse[row] = m + logf(sum);
    }
}

}  // namespace
}  // namespace fa

extern "C" __attribute__((visibility("hidden"))) int fa_split_combine(const fa_kernel_params *kp, int dtype,
                                                                      void *stream) {
    const int64_t rows = (int64_t)kp->batch * kp->heads_q * kp->seqlen_q;
    const int64_t blocks = (rows + fa::kCombineWarps - 1) / fa::kCombineWarps;
    const dim3 grid((unsigned)(blocks < FA_GRID_STRIDE_MAX_BLOCKS ? blocks : FA_GRID_STRIDE_MAX_BLOCKS));
    if (dtype == FA_DTYPE_BF16)
        fa::split_combine<1><<<grid, fa::kCombineWarps * 32, 0, (cudaStream_t)stream>>>(*kp);
    else
        fa::split_combine<0><<<grid, fa::kCombineWarps * 32, 0, (cudaStream_t)stream>>>(*kp);
    return (int)cudaGetLastError();
}
