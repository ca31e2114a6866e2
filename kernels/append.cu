/*
 * append.cu - appending new keys to a KV cache, with rotary embedding, before a serving call's
 * attention (fa_append_args in fa_kernel_params.h; flashattn.h, "Serving calls", says what is
 * written where). One thread per chunk of a row: 8 elements (one 16-byte load and store per
 * tensor) when head_dim, every stride and every pointer allow it, otherwise 1. A chunk is a new
 * key's and value's, or, when Q is rotated, a chunk of the rotated copy of Q. Rotation in float32,
 * rounded once to the dtype:
 *   GPT-J (interleaved): pairs (x[2i], x[2i+1]) rotated by cos/sin[pos, i];
 *   GPT-NeoX:            pairs (x[i], x[i + rotary_dim/2]) rotated by cos/sin[pos, i];
 * columns from rotary_dim on are copied. Positions come from seqused_k on the device: nothing is
 * read on the host, so the launch can be captured in a CUDA graph.
 */
#include <cuda_runtime.h>

#include <stdint.h>
#include <string.h>

#include "fa_common.cuh"
#include "grid_stride.cuh"

namespace fa {
namespace {

constexpr int kAppendThreads = 256;

/* The raw bits of a chunk of kVec 2-byte elements. */
template <int kVec> struct chunk_bits;
template <> struct chunk_bits<8> { using type = uint4; };
template <> struct chunk_bits<1> { using type = uint16_t; };

template <int kDtype, int kVec>
__device__ __forceinline__ void load_chunk(const typename elem<kDtype>::type *p, typename elem<kDtype>::type (&v)[kVec]) {
    const typename chunk_bits<kVec>::type bits = *reinterpret_cast<const typename chunk_bits<kVec>::type *>(p);
    memcpy(v, &bits, sizeof bits);
}

template <int kDtype, int kVec>
__device__ __forceinline__ void store_chunk(typename elem<kDtype>::type *p, const typename elem<kDtype>::type (&v)[kVec]) {
    typename chunk_bits<kVec>::type bits;
    memcpy(&bits, v, sizeof bits);
    *reinterpret_cast<typename chunk_bits<kVec>::type *>(p) = bits;
}

/* Elements d0 .. d0 + kVec - 1 of row x (head_dim contiguous), already loaded into v, rotated in
 * place at table row `pos`. A partner outside the chunk is read from x. Every element's table
 * entries (and partner) are read before any is used: the loads go out together. */
template <int kDtype, int kVec>
__device__ __forceinline__ void rotate_chunk(const fa_append_args &a, const typename elem<kDtype>::type *x, int d0,
                                             int64_t pos, typename elem<kDtype>::type (&v)[kVec]) {
    using E = elem<kDtype>;
    using T = typename E::type;
    if (d0 >= a.rotary_dim) return;
    const int half = a.rotary_dim / 2;
    const int64_t row = pos < 0 ? 0 : (pos >= a.seqlen_ro ? a.seqlen_ro - 1 : pos); /* clamped: never outside the tables */
    const T *cos_row = (const T *)a.cos + row * half, *sin_row = (const T *)a.sin + row * half;
    T in[kVec], c[kVec], s[kVec], other[kVec];
    float sign[kVec];
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
        in[j] = c[j] = s[j] = other[j] = v[j];
        const int d = d0 + j;
        int i, partner;
        if (a.interleaved) {
            i = d / 2, partner = d ^ 1, sign[j] = (d & 1) ? 1.0f : -1.0f;
        } else {
            i = d < half ? d : d - half, partner = d < half ? d + half : d - half, sign[j] = d < half ? -1.0f : 1.0f;
        }
        if (d < a.rotary_dim) { /* (columns from rotary_dim on are copied) */
            c[j] = cos_row[i], s[j] = sin_row[i];
            /* d0 is a multiple of kVec, so an interleaved partner lies in the chunk when kVec is even. */
            if constexpr (kVec % 2 == 0) other[j] = a.interleaved ? v[j ^ 1] : x[partner];
            else other[j] = x[partner];
        }
    }
#pragma unroll
    for (int j = 0; j < kVec; ++j)
        if (d0 + j < a.rotary_dim)
            v[j] = E::from_float(fmaf(E::to_float(in[j]), E::to_float(c[j]), sign[j] * E::to_float(other[j]) * E::to_float(s[j])));
}

/* Lets the kernel enqueued after this one, when it is a programmatic dependent (FUSED_SM90's
 * attention kernel), be scheduled now; it still waits for this grid to finish before it reads
 * anything. Nothing before sm_90. */
__device__ __forceinline__ void let_dependents_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

template <int kDtype, int kVec, class Index>
__global__ void __launch_bounds__(kAppendThreads) append_kernel(const __grid_constant__ fa_append_args a) {
    using T = typename elem<kDtype>::type;
    /* (a.programmatic) the stream's previous kernel done and its writes visible before any read
     * here; then the attention kernel may be scheduled (its blocks wait in turn for this grid) */
    wait_prerequisites();
    let_dependents_launch();
    /* Index: uint32_t where every chunk number fits (launch), else int64_t. A 64-bit division is
     * a subroutine of some hundred instructions, and a thread's first load waits for four of them. */
    const Index chunks = (Index)(a.head_dim / kVec); /* per row */
    const Index n_kv = (Index)((int64_t)a.batch * a.seqlen_new * a.heads_kv * chunks);
    const Index n_q = a.q_out ? (Index)((int64_t)a.batch * a.seqlen_q * a.heads_q * chunks) : 0;
    for (Index x = (Index)blockIdx.x * blockDim.x + threadIdx.x; x < n_kv + n_q; x += (Index)gridDim.x * blockDim.x) {
        T v[kVec];
        if (x < n_kv) {
            Index r = x / chunks;
            const int d0 = (int)(x - r * chunks) * kVec;
            const int h = (int)(r % (Index)a.heads_kv);
            r /= (Index)a.heads_kv;
            const int i = (int)(r % (Index)a.seqlen_new), b = (int)(r / (Index)a.seqlen_new);
            /* The new row's chunks and the sequence's page list are read with its length, not
             * after it: one round trip to memory less before the stores. */
            const T *kn = (const T *)a.k_new + b * a.k_new_stride[0] + i * a.k_new_stride[1] + h * a.k_new_stride[2];
            const T *vn = (const T *)a.v_new + b * a.v_new_stride[0] + i * a.v_new_stride[1] + h * a.v_new_stride[2];
            T vv[kVec];
            load_chunk<kDtype, kVec>(vn + d0, vv);
            load_chunk<kDtype, kVec>(kn + d0, v);
            int64_t first = 0;
            int32_t count = 0;
            if (a.block_table) page_list(a.kv_indptr, a.block_table_stride, a.pages_per_seq, a.num_page_indices, b, first, count);
            const int64_t pos = (int64_t)a.seqused_k[b] + i;
            if (pos < 0 || pos >= a.seqlen_cap) continue; /* past the cache's capacity: not written */
            int64_t outer = b, row = pos;
            if (a.block_table) {
                if (pos / a.page_size >= count) continue; /* past the sequence's pages */
                const int page = a.block_table[first + pos / a.page_size];
                if (page < 0 || page >= a.num_pages) continue;
                outer = page, row = pos % a.page_size;
            } else if (a.kv_batch_idx) {
                outer = a.kv_batch_idx[b];
                if (outer < 0 || outer >= a.kv_batch) continue;
            }
            T *kc = (T *)a.k_cache + outer * a.k_stride[0] + row * a.k_stride[1] + h * a.k_stride[2];
            T *vc = (T *)a.v_cache + outer * a.v_stride[0] + row * a.v_stride[1] + h * a.v_stride[2];
            store_chunk<kDtype, kVec>(vc + d0, vv);
            if (a.cos) rotate_chunk<kDtype, kVec>(a, kn, d0, pos, v);
            store_chunk<kDtype, kVec>(kc + d0, v);
        } else {
            const Index y = x - n_kv;
            Index r = y / chunks;
            const int d0 = (int)(y - r * chunks) * kVec;
            const int h = (int)(r % (Index)a.heads_q);
            r /= (Index)a.heads_q;
            const int i = (int)(r % (Index)a.seqlen_q), b = (int)(r / (Index)a.seqlen_q);
            const T *q = (const T *)a.q + b * a.q_stride[0] + i * a.q_stride[1] + h * a.q_stride[2];
            load_chunk<kDtype, kVec>(q + d0, v);
            const int64_t pos = (int64_t)a.seqused_k[b] + (a.q_at_cache_len ? 0 : i);
            rotate_chunk<kDtype, kVec>(a, q, d0, pos, v);
            store_chunk<kDtype, kVec>((T *)a.q_out + (int64_t)y * kVec, v);
        }
    }
}

/* Whether every row the kernel touches can move as 16-byte chunks. */
bool vectorisable(const fa_append_args *a) {
    constexpr int kV = 8;
    if (a->head_dim % kV != 0) return false;
    const void *ptrs[] = {a->k_new, a->v_new, a->k_cache, a->v_cache, a->q_out ? a->q : nullptr, a->q_out};
    for (const void *p : ptrs)
        if ((uintptr_t)p % 16 != 0) return false;
    for (int s = 0; s < 3; ++s) {
        if (a->k_new_stride[s] % kV || a->v_new_stride[s] % kV || a->k_stride[s] % kV || a->v_stride[s] % kV) return false;
        if (a->q_out && a->q_stride[s] % kV) return false;
    }
    return true;
}

template <int kDtype, int kVec> cudaError_t launch(const fa_append_args *a, cudaStream_t s) {
    const int64_t chunks = a->head_dim / kVec;
    const int64_t total = (int64_t)a->batch * a->seqlen_new * a->heads_kv * chunks +
                          (a->q_out ? (int64_t)a->batch * a->seqlen_q * a->heads_q * chunks : 0);
    if (total == 0) return cudaSuccess;
    /* 32-bit chunk numbers where the last one a thread can reach (below total + the grid's stride) fits */
    const int64_t stride = grid_stride_blocks(total, kAppendThreads) * kAppendThreads;
    if (total + stride <= (int64_t)UINT32_MAX)
        return launch_grid_stride(append_kernel<kDtype, kVec, uint32_t>, total, kAppendThreads, s, a->programmatic != 0, *a);
    return launch_grid_stride(append_kernel<kDtype, kVec, int64_t>, total, kAppendThreads, s, a->programmatic != 0, *a);
}

}  // namespace
}  // namespace fa

extern "C" __attribute__((visibility("hidden"))) int fa_append_launch(const fa_append_args *a, void *stream) {
    const cudaStream_t s = (cudaStream_t)stream;
    const bool vec = fa::vectorisable(a);
    if (a->dtype == FA_DTYPE_BF16)
        return (int)(vec ? fa::launch<FA_DTYPE_BF16, 8>(a, s) : fa::launch<FA_DTYPE_BF16, 1>(a, s));
    return (int)(vec ? fa::launch<FA_DTYPE_F16, 8>(a, s) : fa::launch<FA_DTYPE_F16, 1>(a, s));
}
