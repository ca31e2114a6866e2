/*
 * fa_common.cuh - device helpers shared by every backend: element types and fp16/bf16 pairs, shared
 * memory addresses, the visibility rule, and the score transforms (softcap, ALiBi).
 */
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "fa_kernel_params.h"

namespace fa {

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

/* Key j is visible to query i (both in range) iff key_lo_off <= j - i <= key_hi_off. */
__device__ __forceinline__ bool visible(const fa_kernel_params &p, int i, int j) {
    const int d = j - i;
    return d >= p.key_lo_off && d <= p.key_hi_off && j < p.seqlen_k;
}

__device__ __forceinline__ float alibi_bias(const fa_kernel_params &p, float slope, int i, int j) {
    return p.alibi_slopes != nullptr ? slope * fabsf((float)(i + p.seqlen_k - p.seqlen_q - j)) : 0.0f;
}

/* Score after softcap and ALiBi, in natural units, from the already-scaled dot product (REFERENCE). */
__device__ __forceinline__ float transform_score(const fa_kernel_params &p, float s, float slope, int i,
                                                 int j) {
    if (p.softcap > 0.0f) s = p.softcap * tanhf(s / p.softcap);
    return s - alibi_bias(p, slope, i, j);
}

/* The same from the raw dot product (FUSED): the scale is folded into the softcap's divisor on the
 * host (softcap_inv_scale = scale / softcap), saving a multiply and a division per score. */
__device__ __forceinline__ float transform_raw_score(const fa_kernel_params &p, float acc, float slope,
                                                     int i, int j) {
    const float s = p.softcap > 0.0f ? p.softcap * tanhf(acc * p.softcap_inv_scale) : acc * p.scale;
    return s - alibi_bias(p, slope, i, j);
}

__device__ __forceinline__ float alibi_slope(const fa_kernel_params &p, int b, int h) {
    return p.alibi_slopes ? p.alibi_slopes[b * p.alibi_batch_stride + h] : 0.0f;
}

}  // namespace fa
