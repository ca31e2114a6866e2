/*
 * fa_kernel_params.h - the one struct every libflashattn kernel receives (by value, as a
 * __grid_constant__ parameter), and the per-head-dim tile table of the fused kernel.
 * Plain C so that the host planner (src/, C11) and the kernels (kernels/, CUDA C++) share it.
 */
#ifndef FA_KERNEL_PARAMS_H
#define FA_KERNEL_PARAMS_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* log2(e) and ln(2): the kernels work in log2 units, with the softmax scale folded into log2(e);
 * LSE goes back to natural-log units through ln(2). */
#define FA_LOG2E 1.4426950408889634
#define FA_LN2 0.6931471805599453

/* CUDA's limit on grid y and z (the fused kernels put heads and batch there), and the grid.x of the
 * grid-stride kernels (reference pieces, split combine): plenty of blocks to fill any GPU. */
#define FA_MAX_GRID_YZ 65535
#define FA_GRID_STRIDE_MAX_BLOCKS (65535 * 16)

/* Element types, as flashattn_dtype numbers them (plan.c checks they agree). */
enum { FA_DTYPE_F16 = 0, FA_DTYPE_BF16 = 1, FA_DTYPE_F32 = 2 };

/* Visibility of key j to query i: key_lo_off <= j - i <= key_hi_off and j < seqlen_k. The host
 * folds the causal mask and the sliding window into the two offsets and clamps them to
 * [-seqlen_q, seqlen_k] so that "unbounded" needs no special case and nothing overflows int32. */
typedef struct fa_kernel_params {
    const void *q, *k, *v;
    void *o;
    float *lse;                 /* NULL: not written */
    const float *alibi_slopes;  /* NULL: no ALiBi */

    int64_t q_batch_stride, q_seq_stride, q_head_stride;
    int64_t k_batch_stride, k_seq_stride, k_head_stride;
    int64_t v_batch_stride, v_seq_stride, v_head_stride;
    int64_t o_batch_stride, o_seq_stride, o_head_stride;
    int64_t alibi_batch_stride;

    int32_t batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim;
    int32_t head_group;         /* heads_q / heads_kv */
    int32_t key_lo_off, key_hi_off;
    int32_t num_m_blocks;       /* fused: query tiles per (batch, head) */

    /* pack_gqa (FUSED_SM90 only): a tile holds the head_group query heads of one KV head, pack_rows
     * query positions each (rows hg * pack_rows + i), so K and V are read once per group; the grid's
     * y is then the KV head. num_splits > 1 (both fused kernels; grid x = query tiles x splits,
     * split = x % num_splits): the key range of each tile is split that many ways; each split writes
     * its normalised O (fp32) and LSE to o_accum / lse_accum, and fa_split_combine merges them.
     * FUSED: [split][batch][heads_q][seqlen_q](head_dim). FUSED_SM90: a row's splits side by side,
     * O [batch][heads_q][seqlen_q][split](head_dim), LSE [batch][heads_q][seqlen_q][split], so that
     * the merge finds a row's parts from one address. */
    int32_t pack_gqa, pack_rows, num_splits;
    float *o_accum, *lse_accum;

    float scale;                /* softmax scale (natural units) */
    float scale_log2;           /* scale * log2(e), folded once on the host */
    float softcap;              /* 0: off */
    float softcap_inv_scale;    /* scale / softcap (0 when off) */

    /* Serving calls (flashattn.h, "Serving calls"; FUSED only). serving = 0: every field below is
     * unused and seqlen_q, seqlen_k, key_lo_off and key_hi_off hold for every batch entry. serving = 1:
     * seqlen_q and seqlen_k are capacities; each sequence's counts come from the device arrays
     * (clamped to the capacities and to total_q / total_k), and its visibility offsets are folded
     * in the kernel from mask_kind and the windows, as the host folds them for dense calls. A dense
     * FUSED_SM90 decode on resident single-consumer blocks is planned as a serving call with none
     * of the arrays set: every sequence then has the capacities, seqlen_q x seqlen_k. */
    const int32_t *cu_seqlens_q, *cu_seqlens_k, *seqused_k, *block_table, *kv_batch_idx;
    int64_t block_table_stride;
    int32_t serving, page_size, num_pages, pages_per_seq, total_q, total_k, kv_batch;
    int32_t mask_kind;          /* flashattn_mask */
    int32_t window_left, window_right;  /* -1 unbounded; else clamped to <= 2^30 */
    int32_t seqused_add;        /* keys appended by this call: sequence b has seqused_k[b] + seqused_add */
    int32_t num_page_indices;   /* page lists: entries of block_table */
    const int32_t *kv_indptr, *kv_last_page_len; /* page lists (CSR): sequence b's pages from kv_indptr[b] */
    const int32_t *cache_leftpad; /* not paged: sequence b's keys start at row cache_leftpad[b] */
    /* FUSED decode over a packed Q with the grouped query heads read as rows (plan.gqa_rows with
     * cu_seqlens_q; 0 otherwise): heads_q is heads_kv, and a sequence's query (it has at most one)
     * is q_group_rows rows, one per query head of the group, q_seq_stride / o_seq_stride apart (the
     * heads' stride); its packed row starts q_row0_stride / o_row0_stride elements per row of Q / O
     * from the tensor's start, and its LSE rows are total_q apart ([heads_q, total_q]). */
    int32_t q_group_rows;
    int64_t q_row0_stride, o_row0_stride;
    /* FUSED_SM90 dense calls with many query tiles a head, the tiles differing in work (a causal
     * mask or a right window; no split, no pack_gqa): the blocks take their tiles heaviest first
     * across sections of sched_heads (batch, head) pairs (fa_sched_tile), so the last wave is not
     * one head's heaviest tiles started late, and the K/V of the heads a section runs at once stay
     * in the L2. 0: the grid order (blockIdx.x the query tile, heaviest first within each head). */
    int32_t sched_heads;
    /* FUSED_SM90 calls with more query tiles than SMs, every tile with keys, no split (dense calls
     * and serving calls on their capacities, unpacked, with two or three consumers and pages read
     * by TMA, or gathered under the rule of fa_sm90_resident_gathers; and decodes on one consumer,
     * whose tiles pack a KV head's group, pack_gqa, as serving calls, dense ones included):
     * grid_x blocks stay resident and each takes tile after tile (fa_persistent_first, then
     * fa_persistent_next), its producer loading the next tile's Q and K while the consumers finish
     * this one. 1: tiles in the grid's order, for calls with no mask (every tile the same work) or
     * a window under which every row sees a key, with too few query tiles a head for sched_heads'
     * order or a serving call's (the same work but for the tiles nearest the sequence's start);
     * 2: a causal mask with seqlen_q <= seqlen_k, a tile's work growing linearly with its query
     * position, taken in pairs of equal work. 0: one tile a block. */
    int32_t persistent;
    /* Set by the FUSED_SM90 launcher for a persistent block: O leaves shared memory by TMA stores
     * (its tensor map encoded). */
    int32_t o_tma;
    /* FUSED_SM90 serving calls over pages: 1 when the producer warpgroup gathers the pages row by
     * row with cp.async (fa_sm90_gathers_pages: page sizes TMA cannot tile, and small pages in
     * decode), 0 when TMA reads them in boxes. A block a tile only. */
    int32_t gather_pages;
    /* FUSED_SM90 serving calls whose pages TMA reads: 0 when a box holds one 64-column region of
     * its keys (head_dim / 64 copies a box of keys; K and V tiles region-major in shared memory);
     * G > 0 when one copy holds all of its keys' columns (fa_sm90_page_groups; the tiles are then
     * row-group-major: 8 keys x every region, then the next 8 keys), page p's 8-key group i being
     * group p G + i of the pool. */
    int32_t kv_page_groups;
    /* FUSED calls whose every block has warps with no query row (fa_fused_idle_warps > 0: each
     * block holds at most seqlen_q <= block_m - block_m / warps rows, a decode's grouped heads or a
     * few queries): the number of such warps a block has at least, and the kernel instantiation in
     * which they run a key loop of their own, of the K/V loads, waits and barriers only, instead of
     * computing scores and P V for rows no one stores; where a block's rows all lie in its first 16,
     * that kernel's warps split each key tile among them over those rows instead, and merge. 0
     * otherwise. */
    int32_t idle_warps;
    /* FUSED_SM90 split decode whose K/V are read once (a query tile per KV head or head, no query
     * tiling: pack_gqa or one query head a KV head) over at most three L2s of keys and values
     * (fa_sm90_kv_evict_first): 1 when the producer's loads of K and V carry an evict-first L2
     * policy (TMA boxes and pages gathered row by row with cp.async alike), else 0. */
    int32_t kv_evict_first;
} fa_kernel_params;

#ifdef __CUDACC__
#define FA_HOST_DEVICE __host__ __device__
#else
#define FA_HOST_DEVICE
#endif

/* Persistent blocks (kp->persistent): how many work numbers there are, the ones a block takes
 * (fa_persistent_first, then fa_persistent_next), and the tile a work number stands for, over
 * `heads` tiles' heads a batch entry (fa_persistent_heads: heads_q; with pack_gqa, a decode on
 * resident blocks, planned as a serving call, whose tiles each hold a KV head's group, heads_kv).
 * persistent 1: work w is tile w of the grid order (query tile fastest, then head, then batch);
 * block i takes i, i + grid_x, ... persistent 2: first the
 * units, unit u = bh x (m / 2) + j the pair of query tiles m - 1 - j (work 2u, the heavier under
 * a causal mask) and j (work 2u + 1) of (batch, head) pair bh = batch x heads + head, m =
 * num_m_blocks: a pair's work is the same for every j, and block i takes units i, i + grid_x, ...;
 * then, when m is odd, the middle tiles (m / 2) of every bh, work 2 U + bh (U units), half a
 * unit's work each, dealt first to the blocks that took one unit fewer. Every (m_block, bh) is one
 * work number's tile (tests/test_host.cpp checks it). (The kernels pass heads_q where they can
 * have no packed tile, so that their code does not read pack_gqa.) */
static inline FA_HOST_DEVICE int32_t fa_persistent_heads(const fa_kernel_params *kp) {
    return kp->pack_gqa ? kp->heads_kv : kp->heads_q;
}
static inline FA_HOST_DEVICE int32_t fa_persistent_works(const fa_kernel_params *kp, int32_t heads) {
    const int32_t pairs = kp->batch * heads;
    return kp->num_m_blocks * pairs; /* 2 U + (m odd ? pairs : 0) = m x pairs */
}
/* The middle tiles' round after `units` units dealt one a block in turn (block i: i, i + grid,
 * ...): block `block`'s place in it, so that the blocks that took one unit fewer come first. The
 * ragged walk (fused_sm90.cuh) deals a ragged batch's middle tiles by the same rule. (A macro:
 * the expression as the kernels have always compiled it.) */
#define FA_MIDDLE_TILE_TURN(block, units, grid) (((block) - (units) % (grid) + (grid)) % (grid))
/* A block's first work number, and the one after `work` (>= fa_persistent_works: none left). */
static inline FA_HOST_DEVICE int32_t fa_persistent_first(const fa_kernel_params *kp, int32_t heads, int32_t block,
                                                         int32_t grid) {
    const int32_t units = kp->num_m_blocks / 2 * (kp->batch * heads);
    if (kp->persistent != 2 || block < units) return kp->persistent != 2 ? block : 2 * block;
    return 2 * units + FA_MIDDLE_TILE_TURN(block, units, grid);
}
static inline FA_HOST_DEVICE int32_t fa_persistent_next(const fa_kernel_params *kp, int32_t heads, int32_t work,
                                                        int32_t block, int32_t grid) {
    if (kp->persistent != 2) return work + grid;
    const int32_t units2 = 2 * (kp->num_m_blocks / 2 * (kp->batch * heads));
    if (work >= units2) return work + grid;              /* the middle tiles */
    work = (work & 1) ? work - 1 + 2 * grid : work + 1; /* the unit's lighter tile, or the block's next unit */
    if (work < units2) return work;
    /* past the units: the middle tiles, the first of them to the blocks that took one unit fewer */
    return units2 + FA_MIDDLE_TILE_TURN(block, units2 / 2, grid);
}
static inline FA_HOST_DEVICE void fa_persistent_tile(const fa_kernel_params *kp, int32_t heads, int32_t work,
                                                     int32_t *m_block, int32_t *bh) {
    const int32_t m = kp->num_m_blocks;
    if (kp->persistent != 2) {
        *bh = work / m, *m_block = work - *bh * m;
        return;
    }
    const int32_t half = m / 2, units = half * (kp->batch * heads);
    if (work >= 2 * units) { /* a middle tile */
        *bh = work - 2 * units, *m_block = half;
        return;
    }
    const int32_t unit = work >> 1, j = unit % half;
    *bh = unit / half;
    *m_block = (work & 1) ? j : m - 1 - j;
}
/* The work number of query tile m_block of (batch, head) pair bh: fa_persistent_tile's inverse
 * (a resident serving block that walks a ragged Q by each sequence's own tiles hands its tiles on
 * as work numbers; tests/test_host.cpp checks both directions). */
static inline FA_HOST_DEVICE int32_t fa_persistent_work(const fa_kernel_params *kp, int32_t heads, int32_t m_block,
                                                        int32_t bh) {
    const int32_t m = kp->num_m_blocks;
    if (kp->persistent != 2) return bh * m + m_block;
    const int32_t half = m / 2;
    if (m_block == half && (m & 1)) return 2 * (half * (kp->batch * heads)) + bh; /* a middle tile */
    return m_block >= m - half ? 2 * (bh * half + (m - 1 - m_block)) : 2 * (bh * half + m_block) + 1;
}

/* The tile of the block at `linear` (= x + grid_x (y + grid_y z), the order blocks are dispatched)
 * under kp->sched_heads > 0: the blocks run section by section, a section being sched_heads
 * consecutive (batch, head) pairs bh = batch * heads_q + head (the last one may hold fewer); within
 * a section, every pair's heaviest query tile first (m_block num_m_blocks - 1), then every pair's
 * next, and so on. A bijection between [0, num_m_blocks x batch x heads_q) and the (m_block, bh)
 * pairs (tests/test_host.cpp checks it). */
static inline FA_HOST_DEVICE void fa_sched_tile(const fa_kernel_params *kp, int64_t linear, int32_t *m_block,
                                                int64_t *bh) {
    const int64_t m = kp->num_m_blocks, pairs = (int64_t)kp->batch * kp->heads_q, sec = kp->sched_heads;
    const int64_t first = linear / (sec * m) * sec, rest = linear - first * m;
    const int64_t width = pairs - first < sec ? pairs - first : sec;
    *m_block = (int32_t)(m - 1 - rest / width);
    *bh = first + rest % width;
}

/* Launch shape decided by the planner; a launcher refuses one that its kernel was not built for. */
typedef struct fa_launch {
    int32_t grid_x, grid_y, grid_z, threads;
    int32_t smem_bytes;
} fa_launch;

/* Tile configuration of the fused kernel for one compiled head dim. A warp owns
 * block_m / warps query rows: 32 (two m16 tiles, so each K/V fragment read from shared memory feeds
 * two MMAs) where the O accumulator fits in registers, else 16. Shared memory holds Q and `stages`
 * stages of K and of V, rows unpadded and swizzled so that ldmatrix is bank-conflict free (the
 * layout: FA_SMEM_PLANE_A below).
 * Two stages: tile j + 2 loads while tile j is computed. One stage: V of tile j loads during S = Q K^T
 * and K of tile j + 1 during the softmax and P V, so the block needs half the K/V space and two
 * blocks fit on an SM at the large head dims. (FUSED_SM90's rows leave `stages` 0: its layout is
 * fa_sm90_smem_bytes's.) */
typedef struct fa_fused_config {
    int32_t head_dim, block_m, block_n, warps, stages;
} fa_fused_config;

/* Shared-memory tiles of the FUSED kernel: unpadded rows, in two planes so that every cp.async of a
 * 128-byte global line lands in one 128-byte line and ldmatrix reads without bank conflicts. Plane
 * A holds each row's first FA_SMEM_PLANE_A(head_dim) columns (whole 128-byte lines; chunk c of row
 * r at c ^ (r & 7) within its line); plane B, after it, the last 32 columns of head dims 32, 96 and
 * 160 (64 bytes a row, two rows a line; chunk c at c ^ ((r >> 1) & 3)). A tile is rows x head_dim
 * elements. */
#define FA_SMEM_PLANE_A(head_dim) ((head_dim) / 64 * 64)

/* X(head_dim, block_m, block_n, warps, stages): the one table of tile choices; the planner expands
 * it, and CMake generates one kernel instance per row from it (cmake/variants.cmake), so they
 * cannot disagree. docs/performance.md records why. */
/*                     head_dim block_m block_n warps stages */
#define FA_FUSED_CONFIGS(X) \
    X(32, 128, 128, 4, 2)   \
    X(64, 128, 128, 4, 2)   \
    X(96, 128, 64, 4, 2)    \
    X(128, 128, 64, 4, 1)   \
    X(160, 64, 64, 4, 1)    \
    X(192, 64, 64, 4, 1)    \
    X(256, 64, 64, 4, 1)

static inline int64_t fa_fused_smem_bytes(const fa_fused_config *c) {
    const int64_t row_bytes = (int64_t)c->head_dim * 2; /* unpadded rows (FA_SMEM_PLANE_A) */
    return row_bytes * (c->block_m + 2 * (int64_t)c->stages * c->block_n);
}

/* FUSED: the warps a block has with no query row when no block holds more than `rows` query rows
 * (a warp owns block_m / warps rows): 0 when rows is 0 or exceeds a block. */
static inline int32_t fa_fused_idle_warps(const fa_fused_config *c, int64_t rows) {
    const int64_t per_warp = c->block_m / c->warps;
    if (rows <= 0 || rows > c->block_m) return 0;
    return (int32_t)(c->warps - (rows + per_warp - 1) / per_warp);
}

/* The FUSED kernel's blocks an SM keeps resident as far as registers go (its __launch_bounds__
 * minimum): two of 4 warps (255 registers a thread), so one block's softmax overlaps the other's
 * matrix products on each SM sub-partition; one of 8 warps. */
#define FA_FUSED_MIN_BLOCKS(warps) ((warps) == 4 ? 2 : 1)

/* The Hopper-native backend (FUSED_SM90, sm_90a only): a producer warpgroup loads Q, K and V with
 * the tensor memory accelerator (TMA) into 128-byte-swizzled shared memory (two stages of K and of
 * V); `consumers` warpgroups of 64 query rows each (block_m = 64 x consumers) run wgmma and the
 * softmax, taking turns on the tensor cores.
 * X(head_dim, block_n, consumers, auto_min_head_dim, masked_max_seqlen_q, unmasked_min_seqlen_k): each
 * row is a compiled variant. AUTO prefers this backend for head dims in [auto_min_head_dim, head_dim];
 * a forced FUSED_SM90 call runs any multiple of 8 up to 256 on the smallest head dim that holds it. A
 * head dim's row with both last columns 0 is its default. A row with masked_max_seqlen_q > 0
 * replaces it for causal or windowed calls with seqlen_q <= masked_max_seqlen_q, and for
 * decode-shaped calls (2 x seqlen_q <= its block_m); a row with unmasked_min_seqlen_k > 0, for calls
 * with no mask and no window, not decode-shaped, with seqlen_k >= unmasked_min_seqlen_k (long key
 * loops, where wider key tiles pay; never over gathered pages, nor at the head dims
 * FA_SM90_D128_SHORT_S_HEAD_DIM names: plan.c, docs/performance.md v50 and v54).
 * docs/performance.md records the measurements behind each choice. */
/*                     head_dim block_n consumers auto_min_head_dim masked_max_seqlen_q unmasked_min_seqlen_k */
#define FA_SM90_CONFIGS(X)         \
    X(64, 128, 3, 33, 0, 0)        \
    X(64, 192, 1, 33, 1, 0)        \
    X(64, 128, 2, 33, 1024, 0)     \
    X(128, 128, 2, 65, 0, 0)       \
    X(128, 176, 2, 65, 0, 4096)    \
    X(128, 128, 1, 65, 1, 0)       \
    X(192, 112, 2, 129, 0, 0)      \
    X(256, 80, 2, 193, 0, 0)

/* The largest head dim whose S = Q K^T the head dim 128 kernels with 128-key tiles issue in fewer
 * k-steps (FA_SM90_D128_SHORT_S_HEAD_DIM / 16 of 8: Q's and K's columns past the head dim are
 * zero-filled, and their steps would add nothing). The 176-key kernel has no such loop, so the
 * planner keeps these head dims on 128-key tiles at every length (docs/performance.md v54). */
#define FA_SM90_D128_SHORT_S_HEAD_DIM 96

/* FUSED_SM90 reads a serving call's pages with the tensor memory accelerator in boxes of
 * gcd(page_size, block_n) keys (each box lies within one page and a key tile is a whole number of
 * boxes) when that is a multiple of the 8-row swizzle atom; other page sizes are gathered with
 * cp.async. Shared by the planner (C), the launcher and the kernel (device code). */
static inline FA_HOST_DEVICE int fa_sm90_page_box(int page_size, int block_n) {
    int a = page_size, b = block_n;
    while (b != 0) {
        const int r = a % b;
        a = b, b = r;
    }
    return a;
}
#define FA_SM90_TMA_PAGES(page_size, block_n) (fa_sm90_page_box((page_size), (block_n)) % 8 == 0)
/* Whether FUSED_SM90 gathers a call's K/V pages (a block table set) with cp.async rather than read
 * them by TMA (the planner's kp.gather_pages): the page sizes TMA cannot tile, and, in a decode
 * (single-consumer tiles, block_m 64), pages of boxes of 8 keys (16 boxes a 128-key tile for K and
 * again for V), which TMA reads at about its per-box cost while the producer warpgroup's 128
 * threads copy them at once (docs/performance.md v26), and every page size when the keys are split
 * (blocks of a few key tiles each, whose first tile's latency the gather shortens: v70). */
static inline FA_HOST_DEVICE int fa_sm90_gathers_pages(int paged, int page_size, int block_n, int block_m,
                                                       int splits) {
    if (!paged) return 0;
    if (!FA_SM90_TMA_PAGES(page_size, block_n)) return 1;
    return block_m == 64 && (splits > 1 || fa_sm90_page_box(page_size, block_n) <= 8);
}

/* Full-width page boxes (kp.kv_page_groups): a TMA box over a page's keys can hold every column of
 * them, not 64, when the kernel's tile is wider than one 64-column region and has exactly the call's
 * head dim (no zero-filled columns past it), K and V are laid out alike, and a page starts a whole
 * number G of 8-row groups after the one before (page_stride = 8 G row_stride: a pool [pages, page,
 * heads, dim], [pages, heads, page, dim], or K and V as the halves of one pool). The map is then
 * 5-dimensional (64 columns, 8 rows, regions, 8-row groups of the pool, heads) and a box of
 * gcd(page_size, block_n) keys is one copy where it was head_dim / 64. Returns G, or 0 where the
 * pages keep their per-region boxes. Strides in elements; page_stride is the batch stride of a
 * paged call. */
static inline FA_HOST_DEVICE int32_t fa_sm90_page_groups(int head_dim, int kernel_head_dim, int page_size,
                                                         int64_t num_pages, int64_t k_page_stride,
                                                         int64_t k_row_stride, int64_t v_page_stride,
                                                         int64_t v_row_stride) {
    if (kernel_head_dim <= 64 || kernel_head_dim % 64 != 0 || head_dim != kernel_head_dim || page_size % 8 != 0 ||
        num_pages < 1 || k_row_stride <= 0 || k_row_stride > INT64_MAX / 8 || k_page_stride != v_page_stride ||
        k_row_stride != v_row_stride || k_page_stride % (8 * k_row_stride) != 0)
        return 0;
    const int64_t g = k_page_stride / (8 * k_row_stride);
    /* the kernel's group index p G + i stays below 2^31 (and the map's extent below 2^32) */
    if (g < page_size / 8 || g > (int64_t)INT32_MAX / num_pages) return 0;
    return (int32_t)g;
}

/* The shared memory a Hopper block may opt in to (227 KB). */
#define FA_SM90_SMEM_MAX 232448

static inline int64_t fa_sm90_smem_bytes(int head_dim, int block_m, int block_n, int persistent, int serving) {
    /* Q, two stages of K, two of V, 128 bytes of barriers, plus 1 KB to align the base to the
     * 1024-byte swizzle atom; and for a persistent block, where it fits, a tile of O of Q's size for
     * the epilogue, so that the next tile's Q can load while this one's O is stored; and where that
     * fits too, a second tile of Q, so that the next tile's Q loads while this one is computed (a
     * serving block's with 128 bytes more of barriers: two 64-byte tile records). A persistent
     * serving block with neither has 128 bytes more of barriers too: its second consumer's Q pair
     * after the tile record (each consumer's rows of Q refilled alone). */
    const int64_t base = 1024 + 2 * (int64_t)head_dim * (block_m + 4 * (int64_t)block_n) + 128;
    const int64_t q = 2 * (int64_t)head_dim * block_m, two_q = 2 * q + (serving ? 128 : 0);
    if (!persistent) return base;
    if (base + q > FA_SM90_SMEM_MAX) return base + (serving ? 128 : 0);
    return base + two_q <= FA_SM90_SMEM_MAX ? base + two_q : base + q;
}

/* Whether a resident (persistent) serving block of this tile may gather its pages (page sizes the
 * tensor-map boxes cannot tile): two consumers (128 query rows) and room for two Q buffers, so that
 * its producer warpgroup has a warp for the tile records and Q (Tr::kTwoRecords), which copies its
 * share of K and V beside the other three once it has posted a tile's record (head dims 64 and 128
 * on 128-key tiles). Other tiles with gathered pages take a block a tile; the planner puts them on
 * resident blocks under a causal mask alone. The planner's rule: the kernel's traits state the same
 * (kGathersResident), and the launcher refuses a plan they do not allow. (Two Q buffers: the
 * persistent serving block is a block a tile's size plus two Q tiles and the records' 128 bytes,
 * fa_sm90_smem_bytes.) */
static inline int fa_sm90_resident_gathers(int head_dim, int block_m, int block_n) {
    const int64_t tile = fa_sm90_smem_bytes(head_dim, block_m, block_n, 0, 1);
    const int64_t resident = fa_sm90_smem_bytes(head_dim, block_m, block_n, 1, 1);
    return block_m == 128 && resident == tile + 4 * (int64_t)head_dim * block_m + 128;
}

/* Kernel launchers (the .cu files under kernels/). Each returns a cudaError_t value (0 = cudaSuccess) and enqueues
 * on `stream` (a cudaStream_t). */
typedef int (*fa_fused_launcher)(const fa_kernel_params *kp, const fa_launch *launch, void *stream);

/* What the merge kernel (kernels/merge.cu) reads and writes: num_parts partial results (O in
 * dtype_parts, LSE float32) of [batch, seqlen, heads, head_dim] rows, merged into O (dtype_out) and
 * LSE (may be NULL). Element strides; LSE in base 2 when base2. Serves flashattn_merge and the
 * split-key combine of FUSED_SM90. */
typedef struct fa_merge_args {
    const void *o_parts;
    const float *lse_parts;
    void *o;
    float *lse;
    int64_t o_part_stride, o_batch_stride, o_seq_stride, o_head_stride;
    int64_t lse_part_stride, lse_batch_stride, lse_head_stride, lse_seq_stride;
    int64_t out_batch_stride, out_seq_stride, out_head_stride;
    int64_t lse_out_batch_stride, lse_out_head_stride, lse_out_seq_stride;
    int32_t num_parts, batch, seqlen, heads, head_dim;
    int32_t dtype_parts, dtype_out, base2;
    int32_t after_split;  /* launched right after a split FUSED_SM90 kernel, as its programmatic
                             dependent (that kernel signals it with griddepcontrol.launch_dependents);
                             0 after FUSED's (an ordinary launch) */
    /* Packed output rows (the split combine of a ragged-Q call; NULL otherwise): batch entry b's rows
     * are out_rows[b] .. out_rows[b + 1] - 1 of total_rows (clamped as serving_seq clamps them, at
     * most seqlen), row s at O + (out_rows[b] + s) out_seq_stride and LSE + (out_rows[b] + s)
     * lse_out_seq_stride (the batch strides unused); rows past the entry's count are not written. */
    const int32_t *out_rows;
    int64_t total_rows;
    /* 1: FUSED_SM90's split results, a row's parts side by side (O [row][part](head_dim), LSE
     * [row][part]; merge.cu's parts_side_by_side); 0: flashattn_merge's strides, any layout. */
    int32_t row_parts;
} fa_merge_args;

/* Appending new keys to a cache and rotary embedding (kernels/append.cu), before the attention of a
 * serving call: key i of sequence b (k_new, rotated) and its value go to cache position
 * seqused_k[b] + i (dense entry b, cache entry kv_batch_idx[b], or through the block table); when
 * q_out is set, Q rotated into it ([batch, seqlen_q, heads_q, head_dim], contiguous). Strides in
 * elements: [0] batch (pages, for a paged cache), [1] sequence, [2] head. */
typedef struct fa_append_args {
    const void *k_new, *v_new, *q, *cos, *sin;
    void *k_cache, *v_cache, *q_out;
    const int32_t *seqused_k, *block_table, *kv_batch_idx;
    int64_t k_new_stride[3], v_new_stride[3], k_stride[3], v_stride[3], q_stride[3];
    int64_t block_table_stride;
    const int32_t *kv_indptr;   /* page lists: sequence b's pages from block_table[kv_indptr[b]] */
    int32_t num_page_indices, pages_per_seq;
    int32_t batch, seqlen_new, seqlen_q, heads_q, heads_kv, head_dim;
    int32_t seqlen_cap, page_size, num_pages, kv_batch;
    int32_t rotary_dim, seqlen_ro, interleaved, q_at_cache_len, dtype;
    /* Launch the append as a programmatic dependent of the stream's previous kernel, and let the
     * next (FUSED_SM90's attention kernel, itself a programmatic dependent) be scheduled as soon
     * as the append starts: both still wait (griddepcontrol.wait) for the grid before them to
     * finish before they touch memory, so the stream's order holds; the launches overlap. Set by
     * the dispatcher for FUSED_SM90 calls (sm_90) only. */
    int32_t programmatic;
} fa_append_args;

/* Enqueues the append (and the rotation of Q); returns a cudaError_t value. */
int fa_append_launch(const fa_append_args *a, void *stream);

/* Enqueues the merge; returns a cudaError_t value. */
int fa_merge_launch(const fa_merge_args *a, void *stream);

/* Merges the num_splits partial results of a split fused call into O and LSE (through
 * fa_merge_launch, kernels/merge.cu). after_sm90: the split kernel was FUSED_SM90's, which lets the
 * merge start early as its programmatic dependent. */
int fa_split_combine(const fa_kernel_params *kp, int dtype, int after_sm90, void *stream);

/* REFERENCE backend pieces (kernels/reference.cu). dtype: 0 float16, 1 bfloat16. `lowprec` rounds
 * scores and probabilities to dtype (plain low-precision attention, the tests' baseline). */
int fa_ref_prepare(const fa_kernel_params *kp, int dtype, void **ptr_arrays, float *scores,
                   float *v_f32, float *o_f32, void *stream);
int fa_ref_softmax(const fa_kernel_params *kp, int dtype, int lowprec, float *scores, int grid,
                   void *stream);
int fa_ref_store_o(const fa_kernel_params *kp, int dtype, const float *o_f32, void *stream);
/* A serving call's Q, K and V gathered into `dst` (dense [batch, seqlen_q, heads_q, head_dim] Q,
 * then [batch, seqlen_k, heads_kv, head_dim] K and V, zeros past each sequence's counts); *dense
 * receives kp with q, k, v and their strides pointing there (its serving fields kept, so the
 * softmax and the store still take each sequence's counts and rows from them). */
int fa_ref_gather(const fa_kernel_params *kp, int dtype, void *dst, fa_kernel_params *dense, void *stream);

#ifdef __cplusplus
}
#endif

#endif /* FA_KERNEL_PARAMS_H */
