/*
 * fa_common.cuh - device helpers shared by every backend: element types and fp16/bf16 pairs, shared
 * memory addresses, the visibility rule, and the score transforms (softcap, ALiBi).
 */
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include <atomic>

#include "fa_kernel_params.h"

namespace fa {

/* cudaFuncSetAttribute(kernel, MaxDynamicSharedMemorySize, bytes), once per kernel and device: the
 * attribute stays set for the device's context, and setting it on every launch costs host time.
 * `done` is the kernel's own set of devices already configured (bit d; devices from 64 up are set
 * every time). Threads racing on a first launch may both set it, which is harmless. */
template <class Kernel>
inline cudaError_t set_smem_once(Kernel kernel, int bytes, std::atomic<unsigned long long> &done) {
    int dev = 0;
    cudaError_t err = cudaGetDevice(&dev);
    if (err != cudaSuccess) return err;
    const unsigned long long bit = dev < 64 ? 1ull << dev : 0;
    if (bit && (done.load(std::memory_order_acquire) & bit)) return cudaSuccess;
    err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
    if (err == cudaSuccess && bit) done.fetch_or(bit, std::memory_order_release);
    return err;
}

template <int kDtype> struct elem;
template <> struct elem<0> {
    using type = __half;
    using pair = __half2;
    static __device__ __forceinline__ float to_float(type x) { return __half2float(x); }
    static __device__ __forceinline__ type from_float(float x) { return __float2half_rn(x); }
    static __device__ __forceinline__ pair pack(float a, float b) { return __floats2half2_rn(a, b); }
};
template <> struct elem<1> {
    using type = __nv_bfloat16;
    using pair = __nv_bfloat162;
    static __device__ __forceinline__ float to_float(type x) { return __bfloat162float(x); }
    static __device__ __forceinline__ type from_float(float x) { return __float2bfloat16_rn(x); }
    static __device__ __forceinline__ pair pack(float a, float b) { return __floats2bfloat162_rn(a, b); }
};

/* The 32-bit shared-memory address of a generic pointer into shared memory. */
__device__ __forceinline__ uint32_t smem_u32(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

/* Two floats as one 32-bit fp16/bf16 pair (a before b in memory). */
template <int kDtype> __device__ __forceinline__ uint32_t pack_pair(float a, float b) {
    typename elem<kDtype>::pair v = elem<kDtype>::pack(a, b);
    return *reinterpret_cast<uint32_t *>(&v);
}

__device__ __forceinline__ int64_t clamp64(int64_t x, int64_t lo, int64_t hi) { return x < lo ? lo : (x > hi ? hi : x); }

/* Waits until the grids this one depends on programmatically (the previous kernel in the stream,
 * when this one was launched with programmatic stream serialization) have finished and their memory
 * is visible; returns at once otherwise, and compiles to nothing before sm_90. */
__device__ __forceinline__ void wait_prerequisites() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

/* A sequence's bounds: its query and key counts and its visibility offsets. A dense call's are the
 * kernel parameters' own fields (Bounds = fa_kernel_params); a serving call's are one fa_seq per
 * sequence, read from the device arrays. */
struct fa_seq {
    int32_t seqlen_q, seqlen_k, key_lo_off, key_hi_off;
    int64_t q_row0;  /* first row of the packed Q and O (0 unless cu_seqlens_q) */
    int64_t k_row0;  /* first row of the packed K and V (0 unless packed) */
    int32_t kv_b;    /* the K/V batch entry (kv_batch_idx, else the batch entry) */
    bool kv_valid;   /* false: a cache index outside the cache (its K and V read as zeros) */
    int64_t page0;   /* paged: the sequence's first entry of block_table */
    int32_t pages;   /* paged: entries of block_table from page0 that belong to the sequence */
};

/* Sequence b's page list in a block table with rows of `stride` entries, or, with kv_indptr,
 * entries kv_indptr[b] .. kv_indptr[b+1] - 1 of one list of `num_indices` (clamped to it). */
__device__ __forceinline__ void page_list(const int32_t *indptr, int64_t stride, int32_t pages_per_seq, int32_t num_indices,
                                          int b, int64_t &first, int32_t &count) {
    if (indptr == nullptr) {
        first = (int64_t)b * stride, count = pages_per_seq;
        return;
    }
    first = clamp64(indptr[b], 0, num_indices);
    count = (int32_t)clamp64((int64_t)indptr[b + 1] - first, 0, min((int64_t)pages_per_seq, num_indices - first));
}

/* Key j is visible to query i (both in range) iff key_lo_off <= j - i <= key_hi_off. */
template <class Bounds> __device__ __forceinline__ bool visible(const Bounds &p, int i, int j) {
    const int d = j - i;
    return d >= p.key_lo_off && d <= p.key_hi_off && j < p.seqlen_k;
}

template <class Bounds>
__device__ __forceinline__ float alibi_bias(const fa_kernel_params &p, const Bounds &bnd, float slope, int i, int j) {
    return p.alibi_slopes != nullptr ? slope * fabsf((float)(i + bnd.seqlen_k - bnd.seqlen_q - j)) : 0.0f;
}

/* Score after softcap and ALiBi, in natural units, from the already-scaled dot product (REFERENCE). */
template <class Bounds>
__device__ __forceinline__ float transform_score(const fa_kernel_params &p, const Bounds &bnd, float s, float slope,
                                                 int i, int j) {
    if (p.softcap > 0.0f) s = p.softcap * tanhf(s / p.softcap);
    return s - alibi_bias(p, bnd, slope, i, j);
}

/* The same from the raw dot product (FUSED): the scale is folded into the softcap's divisor on the
 * host (softcap_inv_scale = scale / softcap), saving a multiply and a division per score. */
template <class Bounds>
__device__ __forceinline__ float transform_raw_score(const fa_kernel_params &p, const Bounds &bnd, float acc,
                                                     float slope, int i, int j) {
    const float s = p.softcap > 0.0f ? p.softcap * tanhf(acc * p.softcap_inv_scale) : acc * p.scale;
    return s - alibi_bias(p, bnd, slope, i, j);
}
__device__ __forceinline__ float transform_raw_score(const fa_kernel_params &p, float acc, float slope, int i,
                                                     int j) {
    return transform_raw_score(p, p, acc, slope, i, j);
}

/* Sequence b of a serving call (p.serving): its counts from the device arrays, clamped to the
 * capacities and the packed extents (so no content makes a kernel read or write outside the
 * tensors), and its visibility offsets folded as the host folds a dense call's (plan.c). */
__device__ __forceinline__ fa_seq serving_seq(const fa_kernel_params &p, int b) {
    fa_seq s;
    int64_t sq = p.seqlen_q, q0 = 0;
    if (p.cu_seqlens_q != nullptr) { /* (with q_group_rows: one query at most, as that many rows) */
        const int64_t g = p.q_group_rows > 1 ? p.q_group_rows : 1;
        q0 = clamp64(p.cu_seqlens_q[b], 0, p.total_q);
        sq = clamp64((int64_t)p.cu_seqlens_q[b + 1] - q0, 0, min((int64_t)p.seqlen_q / g, p.total_q - q0)) * g;
    }
    const bool paged = p.block_table != nullptr;
    int64_t sk = p.seqlen_k, k0 = 0;
    if (p.cu_seqlens_k != nullptr) {
        const int64_t a = p.cu_seqlens_k[b];
        sk = (int64_t)p.cu_seqlens_k[b + 1] - a;
        if (!paged) k0 = clamp64(a, 0, p.total_k);
    }
    s.page0 = 0, s.pages = 0;
    if (paged) page_list(p.kv_indptr, p.block_table_stride, p.pages_per_seq, p.num_page_indices, b, s.page0, s.pages);
    if (p.kv_indptr != nullptr && p.cu_seqlens_k == nullptr) { /* from the page list: full pages and the last's keys */
        const int64_t last = p.kv_last_page_len ? clamp64(p.kv_last_page_len[b], 1, p.page_size) : p.page_size;
        sk = s.pages > 0 ? (int64_t)(s.pages - 1) * p.page_size + last : 0;
    }
    if (p.seqused_k != nullptr) sk = (int64_t)p.seqused_k[b] + p.seqused_add; /* + the keys this call appends */
    sk = clamp64(sk, 0, p.seqlen_k);
    if (p.cu_seqlens_k != nullptr && !paged) sk = min(sk, p.total_k - k0);
    if (p.cache_leftpad != nullptr) { /* never with pages: the keys after the padding rows */
        const int64_t pad = clamp64(p.cache_leftpad[b], 0, sk);
        k0 += pad, sk -= pad;
    }
    s.kv_b = b;
    s.kv_valid = true;
    if (p.kv_batch_idx != nullptr) {
        s.kv_b = p.kv_batch_idx[b];
        s.kv_valid = s.kv_b >= 0 && s.kv_b < p.kv_batch;
        if (!s.kv_valid) s.kv_b = 0;
    }
    const int64_t off = sk - sq;
    int64_t lo = -sq, hi = sk;
    if (p.mask_kind == 1) hi = min(hi, off);
    if (p.mask_kind == 2) hi = min(hi, (int64_t)0);
    if (p.window_right >= 0) hi = min(hi, off + p.window_right);
    if (p.window_left >= 0) lo = max(lo, off - p.window_left);
    s.seqlen_q = (int32_t)sq, s.seqlen_k = (int32_t)sk;
    s.key_lo_off = (int32_t)clamp64(lo, -sq, sk);
    s.key_hi_off = (int32_t)clamp64(hi, -sq, sk);
    s.q_row0 = q0, s.k_row0 = k0;
    return s;
}

__device__ __forceinline__ float alibi_slope(const fa_kernel_params &p, int b, int h) {
    return p.alibi_slopes ? p.alibi_slopes[b * p.alibi_batch_stride + h] : 0.0f;
}

}  // namespace fa
