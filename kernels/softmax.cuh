/*
 * softmax.cuh - the online softmax both fused kernels run on their score fragments, with the mask
 * that precedes it. Written once here; neither kernel has its own copy.
 *
 * A fragment is this lane's part of a 16-row x (8 kN)-key score tile in the mma/wgmma accumulator
 * layout: kN tiles of 8 keys, 4 floats each, element e of tile j at row g + 8 (e / 2) (r = e / 2
 * below), key n0 + 8 j + 2 t + (e % 2), with lane = 4 g + t. The functions take an accessor
 * at(j, e) -> float& so each kernel keeps its own register arrays. Per key tile, per row r:
 *
 *     corr = softmax_new_max(...)      m_new = max(m, rowmax(S)); corr = exp2((m - m_new) mult)
 *     sum  = softmax_exp(...)          P = exp2(S mult - m_new mult) in place, summed (kTree: pairwise)
 *     l    = l corr + sum;  O *= corr  (the kernel's, in its own order)
 *
 * and at the end softmax_inv(l) normalises O and softmax_lse gives the LSE. mult is scale * log2(e)
 * when the scale is folded into the exponent, 1 when the scores are already in log2 units (the
 * kernels apply softcap and ALiBi, fa_common.cuh's transform_raw_score, and multiply by kLog2e).
 */
#pragma once

#include "fa_common.cuh"

#include <type_traits>

namespace fa {

constexpr float kLog2e = (float)FA_LOG2E;
constexpr float kLn2 = (float)FA_LN2;

/* 2^x on the special-function unit; exp2(-inf) = 0, which the online softmax relies on. */
__device__ __forceinline__ float fast_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

/* Max and sum over the 4 lanes of a quad (the lanes that share a row of an mma fragment). */
__device__ __forceinline__ float quad_max(float x) {
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
    return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
    x += __shfl_xor_sync(0xffffffffu, x, 1);
    return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

/* Whether a key tile [n0, n0 + block_n) crosses the visible band of query rows [m0, row_last] or the
 * end of the keys: only such tiles need mask_scores. A macro: as an inlined function, nvcc schedules
 * the kernels' loops differently (measured on the compiled code, not on speed). */
#define FA_TILE_NEEDS_MASK(p, n0, block_n, m0, row_last) \
    ((n0) < (row_last) + (p).key_lo_off || (n0) + (block_n) - 1 > (m0) + (p).key_hi_off || (n0) + (block_n) > (p).seqlen_k)

/* Scores of keys that a query row may not see become -inf; row(r) is the query position of this
 * lane's row r (0: g, 1: g + 8). Row i sees keys i + key_lo_off .. min(i + key_hi_off, seqlen_k - 1)
 * (visible()): each bound is taken relative to the lane's first key n0 + 2 t once per row, so that
 * an element's test is a comparison with its constant offset 8 j + e % 2; the lower bound is tested
 * only where it cuts the tile (`lower`, the same for the whole tile: a causal mask's diagonal tiles
 * have none). */
template <int kN, class At, class Row, class Bounds>
__device__ __forceinline__ void mask_scores(At at, const Bounds &p, Row row, int n0, int t, bool lower) {
    const int c0 = n0 + 2 * t;
    int hi[2], lo[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const int i = row(r);
        hi[r] = min(i + p.key_hi_off, p.seqlen_k - 1) - c0;
        lo[r] = i + p.key_lo_off - c0;
    }
    auto apply = [&](auto test_lower) {
#pragma unroll
        for (int j = 0; j < kN; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int k = 8 * j + (e % 2);
                if (k > hi[e / 2] || (decltype(test_lower)::value && k < lo[e / 2])) at(j, e) = -INFINITY;
            }
    };
    if (lower) apply(std::true_type{});
    else apply(std::false_type{});
}
/* The same mask, key by key (visible()): the portable kernel's form. That kernel's registers are at
 * their cap, and with the per-row bounds its serving variant spilled 52 bytes more and ran
 * 0.69-0.94x on ragged calls (docs/performance.md v19). */
template <int kN, class At, class Row, class Bounds>
__device__ __forceinline__ void mask_scores_keywise(At at, const Bounds &p, Row row, int n0, int t) {
#pragma unroll
    for (int j = 0; j < kN; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e)
            if (!visible(p, row(e / 2), n0 + 8 * j + 2 * t + (e % 2))) at(j, e) = -INFINITY;
}
/* Whether mask_scores must test the lower bound of a key tile from n0, for query rows up to row_last. */
#define FA_TILE_CUTS_LOW(p, n0, row_last) ((n0) < (row_last) + (p).key_lo_off)

/* Pairwise reduction of v[0..kN) into v[0] (op: max or +) in a fixed order: a chain of depth
 * log2(kN), so that a row's max and sum do not leave the warp waiting on kN dependent instructions
 * (the kTree forms below; the in-order forms fold into one chain). FUSED takes the trees at every
 * head dim, FUSED_SM90 at 128 only (docs/performance.md v47). */
template <int kN, class Op> __device__ __forceinline__ void tree_reduce(float (&v)[kN], Op op) {
#pragma unroll
    for (int w = 1; w < kN; w *= 2)
#pragma unroll
        for (int j = 0; j + w < kN; j += 2 * w) v[j] = op(v[j], v[j + w]);
}

/* The larger of row r's running max and the tile's scores in that row (raw units), over the quad. */
template <int kN, bool kTree, class At> __device__ __forceinline__ float row_tile_max(At at, int r, float row_max) {
    if constexpr (kTree) {
        float m[kN];
#pragma unroll
        for (int j = 0; j < kN; ++j) m[j] = fmaxf(at(j, 2 * r), at(j, 2 * r + 1));
        tree_reduce(m, [](float a, float b) { return fmaxf(a, b); });
        return quad_max(fmaxf(row_max, m[0]));
    } else {
        float mx = row_max;
#pragma unroll
        for (int j = 0; j < kN; ++j) mx = fmaxf(mx, fmaxf(at(j, 2 * r), at(j, 2 * r + 1)));
        return quad_max(mx);
    }
}

/* Row r's new running max (raw units) after this tile; returns the factor exp2((m_old - m_new) mult)
 * that rescales what was accumulated under the old max. m_scaled receives m_new * mult, or 0 for a
 * row that has seen no key yet (so exp2(-inf - 0) = 0, never NaN). */
template <int kN, bool kTree = true, class At>
__device__ __forceinline__ float softmax_new_max(At at, int r, float &row_max, float mult, float &m_scaled) {
    const float mx = row_tile_max<kN, kTree>(at, r, row_max);
    m_scaled = (mx == -INFINITY) ? 0.0f : mx * mult;
    const float corr = fast_exp2(row_max * mult - m_scaled);
    row_max = mx;
    return corr;
}

/* How far (log2 units) a row's running max may fall behind the tile's before it is raised:
 * softmax_new_max_lazy keeps the old max while the new one exceeds it by at most this, so that
 * P = exp2(S mult - m_scaled) stays at most 2^8 and nothing accumulated needs rescaling. */
constexpr float kMaxSlack = 8.0f;

/* softmax_new_max, raising the running max only when the tile's exceeds it by more than kMaxSlack
 * (log2 units); otherwise the max stays and the factor is exactly 1, so the caller may skip O *= corr
 * when every row of the warp keeps its max. Exact all the same: P, l and O are taken relative to
 * the same (kept) max, and the LSE adds that max back (P <= 2^8 is well inside float and fp16/bf16
 * range, whose relative precision does not depend on magnitude). A row that has seen no key (max
 * -inf) always takes the new max. */
template <int kN, bool kTree = true, class At>
__device__ __forceinline__ float softmax_new_max_lazy(At at, int r, float &row_max, float mult, float &m_scaled) {
    const float mx = row_tile_max<kN, kTree>(at, r, row_max);
    /* (false for row_max = -inf: inf or NaN is not <= the slack) */
    const bool keep = (mx - row_max) * mult <= kMaxSlack;
    const float m_new = keep ? row_max : mx;
    m_scaled = (m_new == -INFINITY) ? 0.0f : m_new * mult;
    const float corr = keep ? 1.0f : fast_exp2(row_max * mult - m_scaled);
    row_max = m_new;
    return corr;
}

/* P = exp2(S mult - m_scaled) in place for row r; returns acc plus this lane's part of the row sum:
 * each pair of keys summed, then the pairs (kTree: pairwise; otherwise onto acc in key order). */
template <int kN, bool kTree = true, class At>
__device__ __forceinline__ float softmax_exp(At at, int r, float mult, float m_scaled, float acc) {
    if constexpr (kTree) {
        float sum[kN];
#pragma unroll
        for (int j = 0; j < kN; ++j) {
            at(j, 2 * r) = fast_exp2(fmaf(at(j, 2 * r), mult, -m_scaled));
            at(j, 2 * r + 1) = fast_exp2(fmaf(at(j, 2 * r + 1), mult, -m_scaled));
            sum[j] = at(j, 2 * r) + at(j, 2 * r + 1);
        }
        tree_reduce(sum, [](float a, float b) { return a + b; });
        return acc + sum[0];
    } else {
#pragma unroll
        for (int j = 0; j < kN; ++j) {
            at(j, 2 * r) = fast_exp2(fmaf(at(j, 2 * r), mult, -m_scaled));
            at(j, 2 * r + 1) = fast_exp2(fmaf(at(j, 2 * r + 1), mult, -m_scaled));
            acc += at(j, 2 * r) + at(j, 2 * r + 1);
        }
        return acc;
    }
}

/* O *= corr for row r of an accumulator fragment of kN 8-column tiles. */
template <int kN, class At> __device__ __forceinline__ void rescale_row(At at, int r, float corr) {
#pragma unroll
    for (int j = 0; j < kN; ++j) {
        at(j, 2 * r) *= corr;
        at(j, 2 * r + 1) *= corr;
    }
}

/* P for keys 16 kk .. 16 kk + 15 as the A operand of a k16 matrix product (fp16/bf16 pairs). */
template <int kDtype, class At> __device__ __forceinline__ void pack_p(At at, int kk, uint32_t (&a)[4]) {
    a[0] = pack_pair<kDtype>(at(2 * kk, 0), at(2 * kk, 1));
    a[1] = pack_pair<kDtype>(at(2 * kk, 2), at(2 * kk, 3));
    a[2] = pack_pair<kDtype>(at(2 * kk + 1, 0), at(2 * kk + 1, 1));
    a[3] = pack_pair<kDtype>(at(2 * kk + 1, 2), at(2 * kk + 1, 3));
}

/* The end of a row: l = the quad's row sum; 1 / l scales O (0 for a row that saw no key, so O = 0). */
__device__ __forceinline__ float softmax_inv(float l) { return l > 0.0f ? 1.0f / l : 0.0f; }

/* LSE in natural-log units: (m mult + log2 l) ln 2; -inf for a row that saw no key. */
__device__ __forceinline__ float softmax_lse(float l, float row_max, float mult) {
    return l > 0.0f ? (row_max * mult + __log2f(l)) * kLn2 : -INFINITY;
}

}  // namespace fa
