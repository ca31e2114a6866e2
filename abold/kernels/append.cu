/*
 * append.cu - appending new keys to a KV cache, with rotary embedding, before a serving call's
 * attention (fa_append_args in fa_kernel_params.h; flashattn.h, "Serving calls", says what is
 * written where). One thread per output element: a new key's or value's, and, when Q is rotated,
 * each element of the rotated copy of Q. Rotation in float32, rounded once to the dtype:
 *   GPT-J (interleaved): pairs (x[2i], x[2i+1]) rotated by cos/sin[pos, i];
 *   GPT-NeoX:            pairs (x[i], x[i + rotary_dim/2]) rotated by cos/sin[pos, i];
 * columns from rotary_dim on are copied. Positions come from seqused_k on the device: nothing is
 * read on the host, so the launch can be captured in a CUDA graph.
 */
#include <cuda_runtime.h>

#include "fa_common.cuh"

namespace fa {
namespace {

constexpr int kAppendThreads = 256;

/* Element d of row x (head_dim contiguous) after rotation at table row `pos`. */
template <int kDtype>
__device__ __forceinline__ typename elem<kDtype>::type rotated(const fa_append_args &a, const typename elem<kDtype>::type *x,
                                                              int d, int64_t pos) {
    using E = elem<kDtype>;
    using T = typename E::type;
    if (d >= a.rotary_dim) return x[d];
    const float v = E::to_float(x[d]);
    const int half = a.rotary_dim / 2;
    const int64_t row = pos < 0 ? 0 : (pos >= a.seqlen_ro ? a.seqlen_ro - 1 : pos); /* clamped: never outside the tables */
    int i, partner;
    float sign;
    if (a.interleaved) {
        i = d / 2, partner = d ^ 1, sign = (d & 1) ? 1.0f : -1.0f;
    } else {
        i = d < half ? d : d - half, partner = d < half ? d + half : d - half, sign = d < half ? -1.0f : 1.0f;
    }
    const float c = E::to_float(((const T *)a.cos)[(int64_t)row * half + i]);
    const float s = E::to_float(((const T *)a.sin)[(int64_t)row * half + i]);
    return E::from_float(fmaf(v, c, sign * E::to_float(x[partner]) * s));
}

template <int kDtype>
__global__ void __launch_bounds__(kAppendThreads) append_kernel(const __grid_constant__ fa_append_args a) {
    using T = typename elem<kDtype>::type;
    const int64_t n_kv = (int64_t)a.batch * a.seqlen_new * a.heads_kv * a.head_dim;
    const int64_t n_q = a.q_out ? (int64_t)a.batch * a.seqlen_q * a.heads_q * a.head_dim : 0;
    for (int64_t x = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; x < n_kv + n_q; x += (int64_t)gridDim.x * blockDim.x) {
        if (x < n_kv) {
            const int d = (int)(x % a.head_dim);
            int64_t r = x / a.head_dim;
            const int h = (int)(r % a.heads_kv);
            r /= a.heads_kv;
            const int i = (int)(r % a.seqlen_new), b = (int)(r / a.seqlen_new);
            const int64_t pos = (int64_t)a.seqused_k[b] + i;
            if (pos < 0 || pos >= a.seqlen_cap) continue; /* past the cache's capacity: not written */
            int64_t outer = b, row = pos;
            if (a.block_table) {
                int64_t first;
                int32_t count;
                page_list(a.kv_indptr, a.block_table_stride, a.pages_per_seq, a.num_page_indices, b, first, count);
                if (pos / a.page_size >= count) continue; /* past the sequence's pages */
                const int page = a.block_table[first + pos / a.page_size];
                if (page < 0 || page >= a.num_pages) continue;
                outer = page, row = pos % a.page_size;
            } else if (a.kv_batch_idx) {
                outer = a.kv_batch_idx[b];
                if (outer < 0 || outer >= a.kv_batch) continue;
            }
            const T *kn = (const T *)a.k_new + b * a.k_new_stride[0] + i * a.k_new_stride[1] + h * a.k_new_stride[2];
            const T *vn = (const T *)a.v_new + b * a.v_new_stride[0] + i * a.v_new_stride[1] + h * a.v_new_stride[2];
            T *kc = (T *)a.k_cache + outer * a.k_stride[0] + row * a.k_stride[1] + h * a.k_stride[2];
            T *vc = (T *)a.v_cache + outer * a.v_stride[0] + row * a.v_stride[1] + h * a.v_stride[2];
            kc[d] = a.cos ? rotated<kDtype>(a, kn, d, pos) : kn[d];
            vc[d] = vn[d];
        } else {
            const int64_t y = x - n_kv;
            const int d = (int)(y % a.head_dim);
            int64_t r = y / a.head_dim;
            const int h = (int)(r % a.heads_q);
            r /= a.heads_q;
            const int i = (int)(r % a.seqlen_q), b = (int)(r / a.seqlen_q);
            const int64_t pos = (int64_t)a.seqused_k[b] + (a.q_at_cache_len ? 0 : i);
            const T *q = (const T *)a.q + b * a.q_stride[0] + i * a.q_stride[1] + h * a.q_stride[2];
            ((T *)a.q_out)[y] = rotated<kDtype>(a, q, d, pos);
        }
    }
}

}  // namespace
}  // namespace fa

extern "C" __attribute__((visibility("hidden"))) int fa_append_launch(const fa_append_args *a, void *stream) {
    const int64_t total = (int64_t)a->batch * a->seqlen_new * a->heads_kv * a->head_dim +
                          (a->q_out ? (int64_t)a->batch * a->seqlen_q * a->heads_q * a->head_dim : 0);
    if (total == 0) return 0;
    const int64_t blocks = (total + fa::kAppendThreads - 1) / fa::kAppendThreads;
    const dim3 grid((unsigned)(blocks < FA_GRID_STRIDE_MAX_BLOCKS ? blocks : FA_GRID_STRIDE_MAX_BLOCKS));
    const cudaStream_t s = (cudaStream_t)stream;
    if (a->dtype == FA_DTYPE_BF16)
        fa::append_kernel<FA_DTYPE_BF16><<<grid, fa::kAppendThreads, 0, s>>>(*a);
    else
        fa::append_kernel<FA_DTYPE_F16><<<grid, fa::kAppendThreads, 0, s>>>(*a);
    return (int)cudaGetLastError();
}
