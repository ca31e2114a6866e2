/*
 * plan.c - turns validated params and device caps into a plan: which backend, which kernel variant,
 * which tiles, which grid, how much workspace. Pure C: no CUDA calls, so it is unit-tested on hosts
 * without a GPU, and the workspace query, the support query and the describe query share it.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "internal.h"

typedef long long ll;

static const fa_fused_config fa_fused_configs[] = {
#define FA_CFG_ROW(hd, bm, bn, w, st) {hd, bm, bn, w, st},
    FA_FUSED_CONFIGS(FA_CFG_ROW)
#undef FA_CFG_ROW
};
#define FA_NUM_FUSED_CONFIGS ((int)(sizeof fa_fused_configs / sizeof fa_fused_configs[0]))

int fa_fused_kernel_head_dim(int64_t head_dim) {
    for (int i = 0; i < FA_NUM_FUSED_CONFIGS; ++i)
        if (head_dim <= fa_fused_configs[i].head_dim) return fa_fused_configs[i].head_dim;
    return 0;
}

const fa_fused_config *fa_fused_config_for(int kernel_head_dim) {
    for (int i = 0; i < FA_NUM_FUSED_CONFIGS; ++i)
        if (fa_fused_configs[i].head_dim == kernel_head_dim) return &fa_fused_configs[i];
    return NULL;
}

static const struct { fa_fused_config cfg; int32_t auto_min, masked_max_sq, unmasked_min_sk; } fa_sm90_configs[] = {
#define FA_SM90_ROW(hd, bn, consumers, auto_min, masked_max_sq, unmasked_min_sk) \
    {{hd, 64 * (consumers), bn, 4 * ((consumers) + 1), 0}, auto_min, masked_max_sq, unmasked_min_sk},
    FA_SM90_CONFIGS(FA_SM90_ROW)
#undef FA_SM90_ROW
};
#define FA_NUM_SM90_CONFIGS ((int)(sizeof fa_sm90_configs / sizeof fa_sm90_configs[0]))

int fa_sm90_kernel_head_dim(int64_t head_dim) {
    for (int i = 0; i < FA_NUM_SM90_CONFIGS; ++i)
        if (head_dim <= fa_sm90_configs[i].cfg.head_dim) return fa_sm90_configs[i].cfg.head_dim;
    return 0;
}

const fa_fused_config *fa_sm90_config_for(int kernel_head_dim) {
    for (int i = 0; i < FA_NUM_SM90_CONFIGS; ++i)
        if (fa_sm90_configs[i].cfg.head_dim == kernel_head_dim && fa_sm90_configs[i].masked_max_sq == 0 &&
            fa_sm90_configs[i].unmasked_min_sk == 0)
            return &fa_sm90_configs[i].cfg;
    return NULL;
}

/* The longest sequence (keys, by capacity) for which a masked serving call whose default tile has
 * three consumers takes the two-consumer tile (fa_sm90_config_for_call). */
#define FA_SERVING_TWO_CONSUMER_MAX_SK 2048

const fa_fused_config *fa_sm90_config_for_call(int kernel_head_dim, const flashattn_fwd_params *p) {
    const int masked = p->mask != FLASHATTN_MASK_NONE || p->window_left >= 0 || p->window_right >= 0;
    for (int i = 0; i < FA_NUM_SM90_CONFIGS; ++i) {
        const fa_fused_config *c = &fa_sm90_configs[i].cfg;
        const int32_t masked_max = fa_sm90_configs[i].masked_max_sq, unmasked_min = fa_sm90_configs[i].unmasked_min_sk;
        /* Decode-shaped: a few query rows per head (packed by KV group when grouped) fill less than
         * one consumer's share of the smaller tile, so the larger one only adds idle consumers. A
         * single-consumer row (64 rows) takes a grouped call (its tile packs the group's query
         * heads) only when the tile holds a KV group's rows (seqlen_q x group <= 64): otherwise its
         * tiles would read K and V more often. Calls without groups keep the two-consumer tile
         * (their many tiles run on resident blocks, where the single-consumer kernel has not been
         * tested). */
        const int64_t group = p->heads_kv > 0 && p->heads_q >= p->heads_kv ? p->heads_q / p->heads_kv : 1;
        const int fits_group =
            c->block_m > 64 || (group > 1 && group <= c->block_m && p->seqlen_q * group <= c->block_m);
        const int decode = 2 * p->seqlen_q <= c->block_m && fits_group;
        /* A row with unmasked_min_seqlen_k > 0 (the d128 176-key tile) takes no call over gathered
         * pages (page sizes TMA cannot tile): over pages of one such calls ran 0.87x on it at 4096
         * keys (4x4k 32/8 heads) and 0.86x at 8192 (1x8k 32/8), against packed K/V, caches and TMA
         * pages at 1.00-1.02x (docs/performance.md v49, v50). That tile's kernels carry no copying
         * code (traits::kMayGather), and the launcher refuses such a plan. (Splits change whether a
         * call gathers only on 64-row tiles, and no such row has unmasked_min_seqlen_k.) */
        const int gathered =
            fa_sm90_gathers_pages(p->block_table != NULL, (int)p->page_size, c->block_n, c->block_m, 1);
        /* Nor a call whose head dim the 128-key tile's shorter S serves (FA_SM90_D128_SHORT_S_HEAD_DIM:
         * 6 of its 8 k-steps at head dims up to 96, where the 176-key tile runs all 8): at 4096 to
         * 16384 keys without a mask, head dim 96 ran 1.016-1.067x and 80 1.078x on the 128-key tile
         * (docs/performance.md v54). */
        const int short_s = c->head_dim == 128 && p->head_dim <= FA_SM90_D128_SHORT_S_HEAD_DIM;
        const int wanted = (masked_max > 0 && fits_group && ((masked && p->seqlen_q <= masked_max) || decode)) ||
                           (unmasked_min > 0 && !masked && !decode && !gathered && !short_s &&
                            p->seqlen_k >= unmasked_min);
        if (c->head_dim == kernel_head_dim && wanted &&
            fa_sm90_variant_compiled(p->dtype, kernel_head_dim, c->block_n, c->block_m / 64))
            return c;
    }
    const fa_fused_config *dflt = fa_sm90_config_for(kernel_head_dim);
    /* A masked serving call (causal or a window; not decode-shaped: those took a row above) whose
     * default tile has three consumers takes the two-consumer tile of its head dim instead when its
     * sequences are at most 2048 keys long and its pages, if any, are TMA boxes: a ragged batch of
     * short sequences pads less of its tiles with 128 rows than with 192 (at head dim 64, a causal
     * mix up to 2048 keys ran 1.07x on it; equal lengths of 2048 0.94x; docs/performance.md v30).
     * Both run on resident blocks, which walk each sequence's own query tiles. */
    if (masked && dflt != NULL && dflt->block_m == 192 && fa_is_serving(p) && p->seqlen_k <= FA_SERVING_TWO_CONSUMER_MAX_SK &&
        (p->block_table == NULL || FA_SM90_TMA_PAGES((int)p->page_size, dflt->block_n)))
        for (int i = 0; i < FA_NUM_SM90_CONFIGS; ++i) {
            const fa_fused_config *c = &fa_sm90_configs[i].cfg;
            if (c->head_dim == kernel_head_dim && c->block_m == 128 && c->block_n == dflt->block_n &&
                fa_sm90_variant_compiled(p->dtype, kernel_head_dim, c->block_n, 2))
                return c;
        }
    return dflt;
}

int fa_sm90_auto_prefers(int64_t head_dim) {
    for (int i = 0; i < FA_NUM_SM90_CONFIGS; ++i)
        if (head_dim <= fa_sm90_configs[i].cfg.head_dim) return head_dim >= fa_sm90_configs[i].auto_min;
    return 0;
}

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
static int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }
static int64_t align_up(int64_t x, int64_t a) { return (x + a - 1) / a * a; }

/* The fields from which a serving call's kernel works out each sequence's visible keys
 * (serving_seq): the mask's kind and the window. */
static void serving_visibility(const flashattn_fwd_params *p, fa_kernel_params *kp) {
    kp->mask_kind = p->mask;
    /* A window wider than any sequence pair (2^30 + 2^30 keys) is unbounded in effect. */
    kp->window_left = (int32_t)min64(p->window_left, FA_MAX_SEQLEN);
    kp->window_right = (int32_t)min64(p->window_right, FA_MAX_SEQLEN);
}

/* Fold causal mask and window into key_lo_off <= j - i <= key_hi_off, clamped (see
 * fa_kernel_params.h). */
static void visibility_offsets(const flashattn_fwd_params *p, int32_t *lo_out, int32_t *hi_out) {
    const int64_t sq = p->seqlen_q, sk = p->seqlen_k, off = sk - sq;
    int64_t lo = -sq, hi = sk;
    if (p->mask == FLASHATTN_MASK_CAUSAL_BOTTOM_RIGHT) hi = min64(hi, off);
    if (p->mask == FLASHATTN_MASK_CAUSAL_TOP_LEFT) hi = min64(hi, 0);
    if (p->window_right >= 0) hi = min64(hi, off + min64(p->window_right, sq + sk));
    if (p->window_left >= 0) lo = max64(lo, off - min64(p->window_left, sq + sk));
    lo = max64(-sq, min64(lo, sk));
    hi = max64(-sq, min64(hi, sk));
    *lo_out = (int32_t)lo;
    *hi_out = (int32_t)hi;
}

_Static_assert((int)FA_DTYPE_F16 == (int)FLASHATTN_DTYPE_FLOAT16 && (int)FA_DTYPE_BF16 == (int)FLASHATTN_DTYPE_BFLOAT16,
               "the kernels number dtypes as the public header does");

static void fill_kernel_params(const flashattn_fwd_params *p, fa_kernel_params *kp) {
    memset(kp, 0, sizeof *kp);
    kp->q = p->q, kp->k = p->k, kp->v = p->v, kp->o = p->o;
    kp->lse = p->lse;
    kp->alibi_slopes = p->alibi_slopes;
    kp->q_batch_stride = p->q_batch_stride, kp->q_seq_stride = p->q_seq_stride;
    kp->q_head_stride = p->q_head_stride;
    kp->k_batch_stride = p->k_batch_stride, kp->k_seq_stride = p->k_seq_stride;
    kp->k_head_stride = p->k_head_stride;
    kp->v_batch_stride = p->v_batch_stride, kp->v_seq_stride = p->v_seq_stride;
    kp->v_head_stride = p->v_head_stride;
    kp->o_batch_stride = p->o_batch_stride, kp->o_seq_stride = p->o_seq_stride;
    kp->o_head_stride = p->o_head_stride;
    kp->alibi_batch_stride = p->alibi_batch_stride;
    kp->batch = (int32_t)p->batch, kp->seqlen_q = (int32_t)p->seqlen_q;
    kp->seqlen_k = (int32_t)p->seqlen_k, kp->heads_q = (int32_t)p->heads_q;
    kp->heads_kv = (int32_t)p->heads_kv, kp->head_dim = (int32_t)p->head_dim;
    kp->head_group = (int32_t)(p->heads_q / p->heads_kv);
    visibility_offsets(p, &kp->key_lo_off, &kp->key_hi_off);
    kp->scale = p->softmax_scale > 0.0f ? p->softmax_scale : (float)(1.0 / sqrt((double)p->head_dim));
    kp->scale_log2 = (float)((double)kp->scale * FA_LOG2E);
    kp->softcap = p->softcap;
    kp->softcap_inv_scale = p->softcap > 0.0f ? kp->scale / p->softcap : 0.0f;
    if (fa_is_serving(p)) {
        kp->serving = 1;
        kp->cu_seqlens_q = p->cu_seqlens_q, kp->cu_seqlens_k = p->cu_seqlens_k;
        kp->seqused_k = p->seqused_k, kp->block_table = p->block_table;
        kp->kv_batch_idx = p->kv_batch_idx;
        kp->block_table_stride = p->block_table_batch_stride;
        kp->page_size = (int32_t)p->page_size, kp->num_pages = (int32_t)p->num_pages;
        kp->pages_per_seq = (int32_t)p->pages_per_seq;
        kp->total_q = (int32_t)p->total_q, kp->total_k = (int32_t)p->total_k;
        kp->kv_batch = (int32_t)p->kv_batch;
        serving_visibility(p, kp);
        kp->seqused_add = (int32_t)p->seqlen_new;
        kp->kv_indptr = p->kv_indptr, kp->kv_last_page_len = p->kv_last_page_len;
        kp->num_page_indices = (int32_t)p->num_page_indices;
        kp->cache_leftpad = p->cache_leftpad;
    }
}

/* The append kernel's arguments (k_new set): the cache is the call's K and V. */
static void fill_append_args(const flashattn_fwd_params *p, fa_append_args *a) {
    memset(a, 0, sizeof *a);
    a->k_new = p->k_new, a->v_new = p->v_new, a->q = p->q, a->cos = p->rotary_cos, a->sin = p->rotary_sin;
    a->k_cache = (void *)(uintptr_t)p->k, a->v_cache = (void *)(uintptr_t)p->v; /* the cache is written */
    a->seqused_k = p->seqused_k, a->block_table = p->block_table, a->kv_batch_idx = p->kv_batch_idx;
    const int64_t strides[5][3] = {
        {p->k_new_batch_stride, p->k_new_seq_stride, p->k_new_head_stride},
        {p->v_new_batch_stride, p->v_new_seq_stride, p->v_new_head_stride},
        {p->k_batch_stride, p->k_seq_stride, p->k_head_stride},
        {p->v_batch_stride, p->v_seq_stride, p->v_head_stride},
        {p->q_batch_stride, p->q_seq_stride, p->q_head_stride},
    };
    memcpy(a->k_new_stride, strides[0], sizeof strides[0]);
    memcpy(a->v_new_stride, strides[1], sizeof strides[1]);
    memcpy(a->k_stride, strides[2], sizeof strides[2]);
    memcpy(a->v_stride, strides[3], sizeof strides[3]);
    memcpy(a->q_stride, strides[4], sizeof strides[4]);
    a->block_table_stride = p->block_table_batch_stride;
    a->kv_indptr = p->kv_indptr, a->num_page_indices = (int32_t)p->num_page_indices;
    a->pages_per_seq = (int32_t)p->pages_per_seq;
    a->batch = (int32_t)p->batch, a->seqlen_new = (int32_t)p->seqlen_new, a->seqlen_q = (int32_t)p->seqlen_q;
    a->heads_q = (int32_t)p->heads_q, a->heads_kv = (int32_t)p->heads_kv, a->head_dim = (int32_t)p->head_dim;
    a->seqlen_cap = (int32_t)p->seqlen_k, a->page_size = (int32_t)p->page_size;
    a->num_pages = (int32_t)p->num_pages, a->kv_batch = (int32_t)p->kv_batch;
    a->rotary_dim = (int32_t)p->rotary_dim, a->seqlen_ro = (int32_t)p->seqlen_ro;
    a->interleaved = p->rotary_interleaved, a->q_at_cache_len = p->rotary_q_at_cache_len;
    a->dtype = p->dtype;
}

static const char *fused_layout_reason(const char *backend, const flashattn_fwd_params *p, char *buf,
                                       size_t n);

/* The head dim rules both fused backends share: a multiple of 8, run on the compiled variant khd
 * (0: none holds it; `compiled`: whether this build has it). NULL when p meets them. */
static const char *head_dim_reason(const char *backend, const flashattn_fwd_params *p, int khd,
                                   int compiled, const char *build_hint, char *buf, size_t n) {
    if (p->head_dim % 8 != 0) {
        snprintf(buf, n, "the %s backend needs head_dim to be a multiple of 8 (got %lld)", backend,
                 (ll)p->head_dim);
        return buf;
    }
    if (khd == 0 || !compiled) {
        snprintf(buf, n, "the %s backend has no kernel for head_dim %lld with dtype %s in this build "
                 "(kernel head dim %d; %s)", backend, (ll)p->head_dim,
                 p->dtype == FLASHATTN_DTYPE_BFLOAT16 ? "bfloat16" : "float16", khd, build_hint);
        return buf;
    }
    return NULL;
}

/* NULL when the fused kernel can run p, else the reason (written into buf). */
static const char *fused_unsupported_reason(const fa_device_caps *caps,
                                            const flashattn_fwd_params *p, char *buf, size_t n) {
    const int khd = fa_fused_kernel_head_dim(p->head_dim);
    if (head_dim_reason("fused", p, khd, fa_fused_compiled(p->dtype, khd), "FLASHATTN_HEAD_DIMS", buf, n))
        return buf;
    if (fused_layout_reason("fused", p, buf, n)) return buf;
    const fa_fused_config *cfg = fa_fused_config_for(khd);
    const int64_t smem = fa_fused_smem_bytes(cfg);
    if (smem > caps->smem_per_block_optin) {
        snprintf(buf, n, "the fused kernel for head_dim %lld (kernel head dim %d) needs %lld bytes of "
                 "shared memory; device %d allows %lld per block", (ll)p->head_dim, khd, (ll)smem,
                 caps->device, (ll)caps->smem_per_block_optin);
        return buf;
    }
    return NULL;
}

/* The pointer, stride and grid limits both fused backends share; NULL when p meets them. */
static const char *fused_layout_reason(const char *backend, const flashattn_fwd_params *p, char *buf,
                                       size_t n) {
    const void *ptrs[4] = {p->q, p->k, p->v, p->o};
    const char *names[4] = {"q", "k", "v", "o"};
    const int64_t strides[4][3] = {
        {p->q_batch_stride, p->q_seq_stride, p->q_head_stride},
        {p->k_batch_stride, p->k_seq_stride, p->k_head_stride},
        {p->v_batch_stride, p->v_seq_stride, p->v_head_stride},
        {p->o_batch_stride, p->o_seq_stride, p->o_head_stride},
    };
    for (int t = 0; t < 4; ++t) {
        if (((uintptr_t)ptrs[t]) % 16 != 0) {
            snprintf(buf, n, "the %s backend needs %s 16-byte aligned (got %p)", backend, names[t], ptrs[t]);
            return buf;
        }
        for (int s = 0; s < 3; ++s)
            if (strides[t][s] % 8 != 0) {
                snprintf(buf, n,
                         "the %s backend needs every %s stride to be a multiple of 8 elements "
                         "(got %lld, %lld, %lld)",
                         backend, names[t], (ll)strides[t][0], (ll)strides[t][1], (ll)strides[t][2]);
                return buf;
            }
    }
    if (p->heads_q > FA_MAX_GRID_YZ || p->batch > FA_MAX_GRID_YZ) {
        snprintf(buf, n, "the %s backend supports heads_q and batch up to %d (got %lld, %lld)",
                 backend, FA_MAX_GRID_YZ, (ll)p->heads_q, (ll)p->batch);
        return buf;
    }
    return NULL;
}

/* NULL when the FUSED_SM90 kernel can run p on this device, else the reason (written into buf). */
static const char *sm90_unsupported_reason(const fa_device_caps *caps, const flashattn_fwd_params *p,
                                           char *buf, size_t n) {
    if (caps->cc_major != 9 || caps->cc_minor != 0) {
        snprintf(buf, n, "the fused_sm90 backend needs a compute capability 9.0 device (device %d is %d.%d)",
                 caps->device, caps->cc_major, caps->cc_minor);
        return buf;
    }
    const int khd = fa_sm90_kernel_head_dim(p->head_dim);
    const fa_fused_config *dflt = khd != 0 ? fa_sm90_config_for(khd) : NULL;
    const int compiled = dflt != NULL && fa_sm90_variant_compiled(p->dtype, khd, dflt->block_n, dflt->block_m / 64);
    if (head_dim_reason("fused_sm90", p, khd, compiled,
                        "FLASHATTN_HEAD_DIMS, and CMAKE_CUDA_ARCHITECTURES must include 90a", buf, n))
        return buf;
    if (fused_layout_reason("fused_sm90", p, buf, n)) return buf;
    /* The tensor memory accelerator takes strides of 16 bytes up to 2^40 bytes; a zero stride
     * (a broadcast dimension) only where that dimension has one element. A serving call's tensors
     * have their own outer extents (packed, page pools, an indexed cache). */
    int64_t q_batch, q_seq, kv_batch, kv_seq;
    fa_outer_extents(p, &q_batch, &q_seq, &kv_batch, &kv_seq);
    const struct { const char *name; int64_t extent, stride; } tma[] = {
        {"q_seq_stride", q_seq, p->q_seq_stride}, {"q_head_stride", p->heads_q, p->q_head_stride},
        {"q_batch_stride", q_batch, p->q_batch_stride}, {"k_seq_stride", kv_seq, p->k_seq_stride},
        {"k_head_stride", p->heads_kv, p->k_head_stride}, {"k_batch_stride", kv_batch, p->k_batch_stride},
        {"v_seq_stride", kv_seq, p->v_seq_stride}, {"v_head_stride", p->heads_kv, p->v_head_stride},
        {"v_batch_stride", kv_batch, p->v_batch_stride},
    };
    for (size_t i = 0; i < sizeof tma / sizeof tma[0]; ++i)
        if (tma[i].extent > 1 && (tma[i].stride <= 0 || tma[i].stride >= ((int64_t)1 << 39))) {
            snprintf(buf, n, "the fused_sm90 backend needs %s in [1, 2^39) elements where that "
                     "dimension has more than one element (got %lld)", tma[i].name, (ll)tma[i].stride);
            return buf;
        }
    const fa_fused_config *cfg = fa_sm90_config_for_call(khd, p);
    const int64_t smem = fa_sm90_smem_bytes(cfg->head_dim, cfg->block_m, cfg->block_n, 0, 0);
    if (smem > caps->smem_per_block_optin) {
        snprintf(buf, n, "the fused_sm90 kernel for head_dim %lld (kernel head dim %d) needs %lld bytes "
                 "of shared memory; device %d allows %lld per block", (ll)p->head_dim, khd, (ll)smem,
                 caps->device, (ll)caps->smem_per_block_optin);
        return buf;
    }
    return NULL;
}

/* *out = a * b; 0 on int64 overflow (a, b >= 0). */
static int mul_ok(int64_t a, int64_t b, int64_t *out) {
    if (a != 0 && b > INT64_MAX / a) return 0;
    *out = a * b;
    return 1;
}

/* Appends a region of n elements of `elem` bytes at *at, 256-byte aligned; 0 on overflow. */
static int add_region(int64_t *at, int64_t n, int64_t elem, int64_t *offset) {
    int64_t bytes;
    if (!mul_ok(n, elem, &bytes) || bytes > INT64_MAX / 2 - *at) return 0;
    *offset = *at;
    *at = align_up(*at + bytes, FA_WORKSPACE_ALIGN);
    return 1;
}

static int ref_layout(const flashattn_fwd_params *p, fa_ref_layout *l) {
    int64_t nbh, s_elems, v_elems, o_elems, at = 0;
    if (!mul_ok(p->batch, p->heads_q, &nbh) || !mul_ok(nbh, p->seqlen_q, &s_elems) ||
        !mul_ok(s_elems, p->seqlen_k, &s_elems) ||
        !mul_ok(p->batch * p->heads_kv, p->seqlen_k, &v_elems) ||
        !mul_ok(v_elems, p->head_dim, &v_elems) || !mul_ok(nbh, p->seqlen_q, &o_elems) ||
        !mul_ok(o_elems, p->head_dim, &o_elems))
        return 0;
    if (!add_region(&at, 6 * nbh, 8, &l->ptr_arrays) || !add_region(&at, s_elems, 4, &l->scores) ||
        !add_region(&at, v_elems, 4, &l->v_f32) || !add_region(&at, o_elems, 4, &l->o_f32) ||
        !add_region(&at, FA_CUBLAS_WORKSPACE_BYTES, 1, &l->cublas_ws))
        return 0;
    l->gathered = 0;
    if (fa_is_serving(p)) { /* dense copies of Q, K and V: o_elems and v_elems elements, 2 bytes each */
        int64_t qkv;
        if (!mul_ok(v_elems, 2, &qkv) || qkv > INT64_MAX - o_elems || !add_region(&at, o_elems + qkv, 2, &l->gathered))
            return 0;
    }
    l->total = at;
    return 1;
}

static const char *reference_unsupported_reason(const flashattn_fwd_params *p,
                                                fa_ref_layout *layout, char *buf, size_t n) {
    if (p->batch * p->heads_q > INT32_MAX) {
        snprintf(buf, n, "the reference backend needs batch x heads_q <= %d (got %lld)", INT32_MAX,
                 (ll)(p->batch * p->heads_q));
        return buf;
    }
    /* cuBLAS reads Q and K as matrices with leading dimension = seq stride (a serving call's: the
     * dense copies' heads x head_dim). */
    const int serving = fa_is_serving(p);
    const struct { const char *name; int64_t seq, stride; } lds[2] = {
        {"q_seq_stride", p->seqlen_q, serving ? p->heads_q * p->head_dim : p->q_seq_stride},
        {"k_seq_stride", p->seqlen_k, serving ? p->heads_kv * p->head_dim : p->k_seq_stride},
    };
    for (int i = 0; i < 2; ++i) {
        if (lds[i].seq > 1 && (lds[i].stride < p->head_dim || lds[i].stride > INT32_MAX)) {
            snprintf(buf, n,
                     "the reference backend (cuBLAS) needs head_dim <= %s <= %d (got %lld)",
                     lds[i].name, INT32_MAX, (ll)lds[i].stride);
            return buf;
        }
    }
    if (!ref_layout(p, layout)) {
        snprintf(buf, n, "the reference backend's workspace (float32 scores of batch x heads_q x "
                 "seqlen_q x seqlen_k = %lld x %lld x %lld x %lld) overflows int64 bytes",
                 (ll)p->batch, (ll)p->heads_q, (ll)p->seqlen_q, (ll)p->seqlen_k);
        return buf;
    }
    return NULL;
}

/* FUSED_SM90 decode-shaped calls: with few query rows per KV head (seqlen_q <= block_m / 2) and
 * grouped query heads, one tile holds the group's heads (pack_gqa), so K and V are read once per
 * group rather than once per query head. */
int fa_should_pack_gqa(int sm90, int64_t group, int64_t block_m, int64_t seqlen_q) {
    return sm90 && group > 1 && group <= block_m && seqlen_q * 2 <= block_m;
}

/* How many ways a fused kernel splits each tile's key range: when the tiles (ctas) are too few to
 * fill the GPU's `slots` (resident blocks: SMs x blocks an SM holds at once), as many as fit in one
 * wave of them (rounded down), at least 2 key tiles per split and at most FA_MAX_SPLITS; 1 (no
 * split) otherwise. */
int64_t fa_num_splits(int64_t slots, int64_t ctas, int64_t key_tiles) {
    if (ctas <= 0 || ctas >= slots) return 1;
    const int64_t splits = min64(slots / ctas, min64(key_tiles / 2, FA_MAX_SPLITS));
    return splits < 2 ? 1 : splits;
}

/* The FUSED blocks an SM of this device holds at once: its registers' limit (FA_FUSED_MIN_BLOCKS),
 * or fewer where the shared memory holds fewer (an SM has 1 KB more than a block may opt in to, and
 * each block takes 1 KB of it for the system). FUSED_SM90 runs one block an SM. */
int64_t fa_fused_blocks_per_sm(const fa_device_caps *caps, const fa_fused_config *cfg) {
    const int64_t by_smem = (caps->smem_per_block_optin + 1024) / (fa_fused_smem_bytes(cfg) + 1024);
    return max64(1, min64(FA_FUSED_MIN_BLOCKS(cfg->warps), by_smem));
}

/* The device's L2 in bytes, or 50 MB (the H100's and the H200's) where the driver did not say. */
static int64_t l2_bytes_or_default(const fa_device_caps *caps) {
    return caps->l2_bytes > 0 ? caps->l2_bytes : 50ll << 20;
}

/* FUSED_SM90's section of (batch, head) pairs for a dense call of at least FA_SCHED_MIN_M_BLOCKS
 * query tiles a head whose tiles differ in work (a causal mask or a right window): as many pairs as
 * keep their K and V (shared by a KV head's group) within two thirds of the L2, at least 1, at most
 * batch x heads_q; 0 (the grid order) for any other call. The blocks run each section's heaviest
 * tiles first (fa_sched_tile). In the grid order, a head's tiles run heaviest to lightest before the
 * next head's, so the last wave holds the last head's heavy tiles started late. With fewer tiles a
 * head, the grid order wins: the blocks running at once share the K and V of a few heads
 * (docs/performance.md, v13). */
int64_t fa_sched_heads(const fa_device_caps *caps, const flashattn_fwd_params *p, int64_t m_blocks) {
    if ((p->mask == FLASHATTN_MASK_NONE && p->window_right < 0) || m_blocks < FA_SCHED_MIN_M_BLOCKS) return 0;
    const int64_t l2 = l2_bytes_or_default(caps);
    const int64_t group = p->heads_kv > 0 && p->heads_q >= p->heads_kv ? p->heads_q / p->heads_kv : 1;
    /* K and V of one query head's share: 2 tensors x seqlen_k x head_dim x 2 bytes / group */
    const int64_t kv = p->seqlen_k > 0 && p->head_dim > 0 ? (4 * p->seqlen_k * p->head_dim + group - 1) / group : 1;
    const int64_t pairs = p->batch * p->heads_q;
    return max64(1, min64(min64(pairs, INT32_MAX), l2 * 2 / 3 / kv));
}

/* FUSED_SM90 split decode (splits > 1, one query tile a KV head when the tile packs the group's
 * query heads, or a head with one query head a KV head: every K/V tile is read by one block, once)
 * over at most three L2s of keys and values: its K/V loads (TMA boxes, or pages gathered row by row)
 * carry an evict-first L2 policy, so that they give up each other's lines before any other
 * (kp.kv_evict_first). On the H200, with the L2 cold, batch 1-2 decode over 8k-32k keys ran
 * 1.04-1.10x as fast after a fill of the L2 and 1.09-1.17x after a read of it; over more bytes
 * (131k keys, or batch 8 and up, unsplit) the policy cost 3-4% after a fill and gained 0-2% after a
 * read, so those calls load as before. The price: batch 1 x 8k, whose 32 MB of K/V fit in the L2,
 * re-read with the L2 warm takes 1.17x the GPU time (fewer of the lines stay; docs/performance.md
 * v43). Pages of 1 and 16 keys, gathered: after a fill 1.06-1.11x at batch 1-2 over 8k-32k keys;
 * after a read 0.95-0.99x at batch 1 x 8k, 1.01x at batch 2; warm 0.89-0.90x at batch 1, 1.03x at
 * batch 2 (v45). */
int fa_sm90_kv_evict_first(const fa_device_caps *caps, const flashattn_fwd_params *p, int64_t splits,
                           int64_t m_blocks, int pack) {
    const double l2 = (double)l2_bytes_or_default(caps);
    const double kv_bytes = 4.0 * (double)p->batch * (double)p->heads_kv * (double)p->seqlen_k * (double)p->head_dim;
    return splits > 1 && m_blocks == 1 && (pack || p->heads_q == p->heads_kv) && kv_bytes <= 3.0 * l2;
}

/* The split partial results in the workspace: float32 O [splits, batch, heads_q, seqlen_q, head_dim],
 * then float32 LSE [splits, batch, heads_q, seqlen_q]. 0 if the size overflows int64. */
static int split_workspace(const flashattn_fwd_params *p, int64_t splits, fa_plan *plan) {
    int64_t nrows, o_elems, at = 0;
    if (!mul_ok(splits * p->batch, p->heads_q, &nrows) || !mul_ok(nrows, p->seqlen_q, &nrows) ||
        !mul_ok(nrows, p->head_dim, &o_elems) || !add_region(&at, o_elems, 4, &plan->o_accum_off) ||
        !add_region(&at, nrows, 4, &plan->lse_accum_off))
        return 0;
    plan->workspace_bytes = at;
    return 1;
}

/* The grid of a fused plan (plan->cfg set): a block per query tile (times splits), head (or KV
 * head, when packed) and batch entry. Returns 0 only if the split workspace overflows. */
static int fused_grid_plan(const fa_device_caps *caps, const flashattn_fwd_params *p, int sm90,
                           int no_split, fa_plan *plan) {
    const int64_t group = p->heads_q / p->heads_kv;
    const int64_t block_m = plan->cfg.block_m;
    const int pack = fa_should_pack_gqa(sm90, group, block_m, p->seqlen_q);
    const int64_t rows = pack ? block_m / group : block_m;
    const int64_t mblocks = (p->seqlen_q + rows - 1) / rows;
    plan->kp.pack_gqa = pack;
    plan->kp.pack_rows = (int32_t)rows;
    plan->kp.num_m_blocks = (int32_t)mblocks;
    plan->grid_y = (int32_t)(pack ? p->heads_kv : p->heads_q);
    plan->grid_z = (int32_t)p->batch;
    const int64_t ctas = mblocks * plan->grid_y * p->batch;
    const int64_t key_tiles = (p->seqlen_k + plan->cfg.block_n - 1) / plan->cfg.block_n;
    /* A ragged Q splits as a dense one of its capacities: the partial results are [batch,
     * seqlen_q] by capacity, and the combine writes each sequence's packed rows. */
    const int64_t slots = sm90 ? caps->sm_count : caps->sm_count * fa_fused_blocks_per_sm(caps, &plan->cfg);
    const int64_t splits = no_split ? 1 : fa_num_splits(slots, ctas, key_tiles);
    plan->kp.num_splits = (int32_t)splits;
    plan->kp.kv_evict_first = sm90 && fa_sm90_kv_evict_first(caps, p, splits, mblocks, pack);
    plan->grid_x = (int32_t)(mblocks * splits);
    const int serving = fa_is_serving(p);
    const int gathered = sm90 && fa_sm90_gathers_pages(p->block_table != NULL, (int)p->page_size, plan->cfg.block_n,
                                                       plan->cfg.block_m, (int)splits);
    plan->kp.gather_pages = gathered;
    /* TMA pages in one box of every column where the pool's layout allows it (fa_sm90_page_groups) */
    plan->kp.kv_page_groups =
        sm90 && serving && p->block_table != NULL && !gathered
            ? fa_sm90_page_groups((int)p->head_dim, plan->cfg.head_dim, (int)p->page_size, p->num_pages,
                                  p->k_batch_stride, p->k_seq_stride, p->v_batch_stride, p->v_seq_stride)
            : 0;
    /* A dense decode whose single consumer's tile packs a KV head's query heads goes on resident
     * blocks as a serving call of full sequences (kp.serving with none of the device arrays: every
     * sequence seqlen_q queries over seqlen_k keys, the mask and window the call's), since only the
     * serving kernel is compiled for such blocks. */
    const int dense_packed = sm90 && !serving && pack && plan->cfg.block_m == 64;
    const int as_serving = serving || dense_packed;
    /* (packed tiles take resident blocks only as a serving decode on one consumer, and that tile
     * only packed: the launcher's rule) */
    if (sm90 && splits == 1 && pack == (as_serving && plan->cfg.block_m == 64)) {
        /* More tiles than SMs, every tile with keys to see, and work that is the same for every tile
         * (no mask), or grows linearly with its query position (a causal mask, seqlen_q <= seqlen_k;
         * taken in pairs of equal work), or is bounded by a window (the same for every tile but the
         * first few, those nearer the sequence's start; in the grid's order): resident blocks, at
         * most one an SM (below), take tile after tile (kp.persistent, fa_persistent_first /
         * fa_persistent_next). A window under which some row sees no key keeps a block a tile. A
         * serving call is planned on its capacities: its blocks skip the tiles past a sequence's
         * queries, and write the answer of tiles that see no key; pages gathered with cp.async go on
         * resident blocks under a causal mask (pairs) where the block has a warp for the tile records
         * besides its copies (fa_sm90_resident_gathers: two consumers, two Q buffers), and keep a
         * block a tile elsewhere (their producer is then the whole warpgroup, for one tile), as does
         * a single consumer's tile where its pages are gathered. Over pages of
         * one, resident blocks made causal prefill 1.05x (head dim 128) and 1.20x (64) as fast, an
         * unmasked call 0.96x (docs/performance.md v36). A serving decode on one consumer (its
         * tiles a KV head's packed query heads) with more tiles than SMs goes on resident blocks
         * too: a block's producer reads the next tile's sequence and issues its first K and V while
         * the consumer finishes the last one, instead of a new block starting from its counts
         * (docs/performance.md v62); and so does a dense decode on that tile (v63). */
        const int64_t smem = fa_sm90_smem_bytes(plan->cfg.head_dim, plan->cfg.block_m, plan->cfg.block_n, 1, as_serving);
        /* Every row i sees keys [i + lo, i + hi] of [0, seqlen_k): some, for every i, exactly when
         * lo <= hi, hi >= 0 (the first row) and lo <= seqlen_k - seqlen_q (the last). */
        const int32_t lo = plan->kp.key_lo_off, hi = plan->kp.key_hi_off;
        const int every_row_sees_keys = p->seqlen_k > 0 && lo <= hi && hi >= 0 && lo <= p->seqlen_k - p->seqlen_q;
        const int windowed = p->window_left >= 0 || p->window_right >= 0;
        /* A window with enough query tiles a head for sched_heads' order keeps a block a tile: its
         * blocks then take the heaviest tiles first across sections of heads (the grid order cost
         * head dim 256 12% at 8192 tokens and a window of 4096; docs/performance.md v24). */
        const int window_in_grid_order = as_serving || fa_sched_heads(caps, p, mblocks) == 0;
        int kind = !every_row_sees_keys             ? 0
                   : windowed                       ? window_in_grid_order
                   : p->mask == FLASHATTN_MASK_NONE ? 1
                   : p->seqlen_q <= p->seqlen_k     ? 2
                                                    : 0;
        /* (gathered pages: resident blocks for causal pairs alone, where the block can gather) */
        if (gathered && (kind != 2 || !fa_sm90_resident_gathers((int)plan->cfg.head_dim, (int)plan->cfg.block_m,
                                                                  (int)plan->cfg.block_n)))
            kind = 0;
        /* Pairs: m / 2 units a head, and with m odd its middle tile alone (fa_persistent_tile):
         * no more blocks than units and middle tiles, so that every block has work. */
        const int64_t takers = kind == 2 ? (mblocks / 2 + mblocks % 2) * plan->grid_y * p->batch : ctas;
        if (kind && ctas > caps->sm_count && ctas <= INT32_MAX - caps->sm_count &&
            smem <= caps->smem_per_block_optin) {
            plan->kp.persistent = kind;
            /* One block an SM; for a packed decode (every tile the same bytes to read, the call
             * bound by memory) as few blocks as take its tiles in as many rounds, so that no few
             * blocks read a last round alone: 136 tiles (17 sequences x 8 KV heads) on 68 blocks
             * of two tiles, not 4 of 132 blocks reading a second one while 128 SMs idle (1.28x as
             * fast at 17 x 8k keys, 1.01x at 64 x 4k). A call that appends keeps one block an SM:
             * its attention after the append read 0.4-0.7% slower on the balanced rounds, in four
             * A/B passes (docs/performance.md v65). */
            const int64_t rounds = (takers + caps->sm_count - 1) / caps->sm_count;
            const int balanced = pack && p->k_new == NULL;
            plan->grid_x = (int32_t)(balanced ? (takers + rounds - 1) / rounds : min64(caps->sm_count, takers));
            plan->grid_y = plan->grid_z = 1;
            plan->smem_bytes = (int32_t)smem;
            if (dense_packed) plan->kp.serving = 1, serving_visibility(p, &plan->kp);
        } else if (!as_serving) {
            plan->kp.sched_heads = (int32_t)fa_sched_heads(caps, p, mblocks);
        }
    }
    return splits > 1 ? split_workspace(p, splits, plan) : 1;
}

/* FUSED decode with grouped query heads: with one query row per sequence, the group's query heads
 * can be read as the positions of one head (Q and O's head stride becomes the position stride), so
 * one tile holds the whole group and K and V are read once per KV head instead of once per query
 * head (FlashAttention-2 does the same for decode). The LSE layout [batch, heads_q, 1] is
 * [batch, heads_kv, group] already. Exact only where no row's visible keys or bias depend on its
 * position: one query, no top-left causal mask (bottom-right with one query hides nothing), no left
 * window, no ALiBi; and not with rotary tables (the rotated copy of Q has strides of its own). A
 * packed Q (seqlen_q = 1 as the capacity) is re-read the same way, with packed_gqa_rows' fields.
 * Writes the re-read params into *rows and returns 1, else returns 0. */
static int fused_gqa_rows(const flashattn_fwd_params *p, flashattn_fwd_params *rows) {
    const int64_t group = p->heads_kv > 0 ? p->heads_q / p->heads_kv : 0;
    if (p->seqlen_q != 1 || group < 2 || p->mask == FLASHATTN_MASK_CAUSAL_TOP_LEFT ||
        p->window_left >= 0 || p->alibi_slopes != NULL || p->rotary_cos != NULL)
        return 0;
    /* The group's head strides become the new heads' (strides are non-negative). Where validation
     * bounded the tensor's extents they fit; an empty tensor (a packed Q of no rows) may have any
     * strides, none of them read, and such a call is not re-read. */
    if (p->q_head_stride > INT64_MAX / group || p->o_head_stride > INT64_MAX / group) return 0;
    *rows = *p;
    rows->seqlen_q = group, rows->heads_q = p->heads_kv, rows->mask = FLASHATTN_MASK_NONE;
    rows->window_right = -1; /* with one query, bottom-right: never narrower than the keys */
    rows->q_seq_stride = p->q_head_stride, rows->q_head_stride = group * p->q_head_stride;
    rows->o_seq_stride = p->o_head_stride, rows->o_head_stride = group * p->o_head_stride;
    return 1;
}

/* A packed Q (max_seqlen_q = 1: each sequence has no query or one) read as fused_gqa_rows reads a
 * dense one: the kernel takes each sequence's query as `group` rows (kp.q_group_rows), its packed
 * row from the real row strides, its LSE rows [heads_q, total_q] total_q apart. */
static void packed_gqa_rows(const flashattn_fwd_params *p, fa_kernel_params *kp) {
    if (p->cu_seqlens_q == NULL) return;
    kp->q_group_rows = (int32_t)(p->heads_q / p->heads_kv);
    kp->q_row0_stride = p->q_seq_stride, kp->o_row0_stride = p->o_seq_stride;
}

flashattn_status fa_plan_make(const fa_device_caps *caps, const flashattn_fwd_params *p,
                              int options, fa_plan *out) {
    flashattn_fwd_params full; /* the caller's fields, with defaults for any it does not know */
    flashattn_status st = fa_validate_load(p, &full);
    if (st != FLASHATTN_STATUS_SUCCESS) return st;
    p = &full;
    if (caps->cc_major < 8)
        return fa_fail(FLASHATTN_STATUS_DEVICE_TOO_OLD,
                       "device %d has compute capability %d.%d; libflashattn needs 8.0 or newer",
                       caps->device, caps->cc_major, caps->cc_minor);

    fa_plan plan;
    memset(&plan, 0, sizeof plan);
    plan.dtype = p->dtype;
    plan.ref_lowprec = (options & FA_PLAN_REF_LOWPREC) != 0;
    fill_kernel_params(p, &plan.kp);

    char why_fused[256], why_sm90[256], why_ref[256];
    const char *no_fused = fused_unsupported_reason(caps, p, why_fused, sizeof why_fused);
    const char *no_sm90 = sm90_unsupported_reason(caps, p, why_sm90, sizeof why_sm90);
    const char *no_ref = reference_unsupported_reason(p, &plan.ref, why_ref, sizeof why_ref);

    int backend = p->backend;
    if (backend == FLASHATTN_BACKEND_AUTO) {
        if (!no_sm90 && (no_fused || fa_sm90_auto_prefers(p->head_dim)))
            backend = FLASHATTN_BACKEND_FUSED_SM90;
        else if (!no_fused)
            backend = FLASHATTN_BACKEND_FUSED;
        else if (!no_ref)
            backend = FLASHATTN_BACKEND_REFERENCE;
        else
            return fa_fail(FLASHATTN_STATUS_UNSUPPORTED, "no backend can run this call: %s; %s%s%s",
                           no_fused, no_ref, caps->cc_major == 9 && caps->cc_minor == 0 ? "; " : "",
                           caps->cc_major == 9 && caps->cc_minor == 0 ? no_sm90 : "");
    } else if (backend == FLASHATTN_BACKEND_FUSED && no_fused) {
        return fa_fail(FLASHATTN_STATUS_UNSUPPORTED, "%s", no_fused);
    } else if (backend == FLASHATTN_BACKEND_FUSED_SM90 && no_sm90) {
        return fa_fail(FLASHATTN_STATUS_UNSUPPORTED, "%s", no_sm90);
    } else if (backend == FLASHATTN_BACKEND_REFERENCE && no_ref) {
        return fa_fail(FLASHATTN_STATUS_UNSUPPORTED, "%s", no_ref);
    }
    plan.backend = backend;
    /* No queries: nothing to do, unless keys are appended (the cache is still written). */
    plan.noop = (p->seqlen_q == 0 && p->k_new == NULL);

    flashattn_fwd_params gqa_rows;
    const flashattn_fwd_params *pk = p; /* what the attention kernel runs (p, or p re-read) */
    if (backend == FLASHATTN_BACKEND_FUSED && fused_gqa_rows(p, &gqa_rows)) {
        plan.gqa_rows = 1;
        pk = &gqa_rows;
        fill_kernel_params(pk, &plan.kp);
        packed_gqa_rows(p, &plan.kp);
    }
    if (backend == FLASHATTN_BACKEND_FUSED || backend == FLASHATTN_BACKEND_FUSED_SM90) {
        const int sm90 = backend == FLASHATTN_BACKEND_FUSED_SM90;
        plan.cfg = sm90 ? *fa_sm90_config_for_call(fa_sm90_kernel_head_dim(p->head_dim), p)
                        : *fa_fused_config_for(fa_fused_kernel_head_dim(p->head_dim));
        plan.threads = 32 * plan.cfg.warps;
        plan.smem_bytes = sm90 ? fa_sm90_smem_bytes(plan.cfg.head_dim, plan.cfg.block_m, plan.cfg.block_n, 0, 0)
                               : fa_fused_smem_bytes(&plan.cfg);
        if (!fused_grid_plan(caps, pk, sm90, (options & FA_PLAN_NO_SPLIT) != 0, &plan))
            return fa_fail(FLASHATTN_STATUS_INDEX_OVERFLOW,
                           "the split-key workspace (float32 partial O of splits x batch x heads_q x "
                           "seqlen_q x head_dim = %d x %lld x %lld x %lld x %lld) overflows int64 bytes",
                           plan.kp.num_splits, (ll)p->batch, (ll)p->heads_q, (ll)p->seqlen_q,
                           (ll)p->head_dim);
        /* FUSED blocks with rowless warps (a decode's grouped heads, a few queries): those warps
         * skip the matrix products in the instantiation that has them (or, where a block's rows
         * fit in 16, all its warps share each key tile's products over those rows). */
        if (!sm90) plan.kp.idle_warps = fa_fused_idle_warps(&plan.cfg, plan.kp.seqlen_q);
    } else {
        const int64_t rows = p->batch * p->heads_q * p->seqlen_q;
        plan.grid_x = (int32_t)min64(rows, FA_GRID_STRIDE_MAX_BLOCKS);
        plan.grid_y = plan.grid_z = 1;
        plan.threads = 256;
        plan.smem_bytes = 0;
        plan.workspace_bytes = plan.noop ? 0 : plan.ref.total;
    }
    if (plan.noop) plan.workspace_bytes = 0;
    if (p->k_new != NULL) {
        plan.append = 1;
        fill_append_args(p, &plan.app);
        /* Rotated Q, [batch, seqlen_q, heads_q, head_dim] in dtype, after the split regions. */
        int64_t at = align_up(plan.workspace_bytes, FA_WORKSPACE_ALIGN), q_elems;
        if (p->rotary_cos != NULL && p->seqlen_q > 0) {
            if (!mul_ok(p->batch * p->heads_q, p->seqlen_q, &q_elems) || !mul_ok(q_elems, p->head_dim, &q_elems) ||
                !add_region(&at, q_elems, 2, &plan.q_rot_off))
                return fa_fail(FLASHATTN_STATUS_INDEX_OVERFLOW,
                               "the rotated copy of q (batch x seqlen_q x heads_q x head_dim = %lld x %lld x %lld "
                               "x %lld) overflows int64 bytes in the workspace",
                               (ll)p->batch, (ll)p->seqlen_q, (ll)p->heads_q, (ll)p->head_dim);
            plan.workspace_bytes = at;
        }
    }
    *out = plan;
    return FLASHATTN_STATUS_SUCCESS;
}

void fa_plan_describe(const fa_plan *plan, flashattn_plan_info *info) {
    const size_t size = info->struct_size;
    memset(info, 0, sizeof *info);
    info->struct_size = size;
    info->backend = plan->backend;
    info->workspace_bytes = plan->workspace_bytes;
    info->shared_mem_bytes = plan->smem_bytes;
    info->num_warps = plan->threads / 32;
    info->grid_x = plan->grid_x, info->grid_y = plan->grid_y, info->grid_z = plan->grid_z;
    info->num_splits = plan->kp.num_splits > 1 ? plan->kp.num_splits : 1;
    const char *dt = plan->dtype == FLASHATTN_DTYPE_BFLOAT16 ? "bf16" : "fp16";
    const char *bname = "REFERENCE";
    if (plan->backend == FLASHATTN_BACKEND_FUSED || plan->backend == FLASHATTN_BACKEND_FUSED_SM90) {
        const int sm90 = plan->backend == FLASHATTN_BACKEND_FUSED_SM90;
        bname = sm90 ? "FUSED_SM90" : "FUSED";
        info->block_m = plan->cfg.block_m;
        info->block_n = plan->cfg.block_n;
        info->kernel_head_dim = plan->cfg.head_dim;
        snprintf(info->kernel_name, sizeof info->kernel_name, "%s_%s_d%d_m%d_n%d_w%d",
                 sm90 ? "fused_sm90" : "fused_fwd", dt, plan->cfg.head_dim, plan->cfg.block_m,
                 plan->cfg.block_n, plan->cfg.warps);
    } else {
        info->block_m = 1;
        info->block_n = 0;
        info->kernel_head_dim = plan->kp.head_dim;
        snprintf(info->kernel_name, sizeof info->kernel_name, "reference_cublas_%s_softmax_f32", dt);
    }
    /* A serving call's paths: packed Q/K, per-sequence key counts, pages (read by TMA boxes or
     * gathered row by row), an indexed cache, left padding, an append with or without rotary. */
    char serving[96] = "";
    const fa_kernel_params *kp = &plan->kp;
    if (kp->serving) {
        char paged[32] = "";
        if (kp->block_table) {
            const int tma = plan->backend == FLASHATTN_BACKEND_FUSED_SM90 && !kp->gather_pages;
            snprintf(paged, sizeof paged, " paged=%d:%s", kp->page_size,
                     !tma ? "gather" : kp->kv_page_groups > 0 ? "tma_full" : "tma");
        }
        snprintf(serving, sizeof serving, "%s%s%s%s%s%s%s", kp->cu_seqlens_q ? " packed_q" : "",
                 kp->cu_seqlens_k && !kp->block_table ? " packed_kv" : "", kp->seqused_k ? " seqused_k" : "", paged,
                 kp->kv_batch_idx ? " kv_batch_idx" : "", kp->cache_leftpad ? " leftpad" : "",
                 plan->append ? (plan->app.cos ? " append+rotary" : " append") : "");
    }
    /* How the blocks take their tiles: heaviest first across sections of this many (batch, head)
     * pairs, or resident blocks (in pairs of tiles under a causal mask). */
    char order[32] = "";
    if (kp->sched_heads > 0) snprintf(order, sizeof order, " heaviest_first=%d", kp->sched_heads);
    if (kp->persistent) snprintf(order, sizeof order, " persistent%s", kp->persistent == 2 ? "=pairs" : "");
    if (kp->idle_warps > 0) snprintf(order, sizeof order, " idle_warps=%d", kp->idle_warps);
    if (kp->kv_evict_first) snprintf(order + strlen(order), sizeof order - strlen(order), " kv_evict_first");
    const char *tiles = plan->noop           ? " (no-op: seqlen_q=0)"
                        : plan->kp.pack_gqa  ? " gqa_packed"
                        : plan->gqa_rows     ? " gqa_rows"
                                             : "";
    const int n = snprintf(info->description, sizeof info->description,
                           "backend=%s kernel=%s grid=(%d,%d,%d) threads=%d smem=%lld splits=%d workspace=%lld%s%s%s",
                           bname, info->kernel_name, info->grid_x, info->grid_y, info->grid_z, plan->threads,
                           (ll)plan->smem_bytes, info->num_splits, (ll)plan->workspace_bytes, tiles, serving, order);
    /* A line that does not fit (a serving call with many paths) leaves out the figures that have
     * fields of their own (threads, smem, workspace) rather than lose its last words. */
    if (n >= (int)sizeof info->description)
        snprintf(info->description, sizeof info->description, "backend=%s kernel=%s grid=(%d,%d,%d) splits=%d%s%s%s",
                 bname, info->kernel_name, info->grid_x, info->grid_y, info->grid_z, info->num_splits, tiles, serving,
                 order);
}
