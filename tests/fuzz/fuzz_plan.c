/*
 * fuzz_plan.c - a libFuzzer target over everything the host side of libflashattn does with untrusted
 * input: struct sizes, validation, planning and the three planning queries, on synthetic devices (no
 * GPU). Built with clang and ASan/UBSan by scripts/fuzz.sh; any sanitizer report or broken
 * invariant aborts. The invariants:
 *   - the three queries agree on the status, and the plan and workspace queries on the bytes;
 *   - a refusal has a status the header lists and a message naming an argument;
 *   - an accepted call has a launchable plan: grid within CUDA's limits, shared memory within the
 *     device's, workspace sane, every tensor extent (in bytes) and every folded scale finite;
 *   - flashattn_fwd_params_set_packed_strides and the _init_size functions never overflow and
 *     never write past the size they are given;
 *   - an accepted call with a reserved field set (within its struct_size) is refused as
 *     BAD_STRUCT_SIZE, naming the field, its outputs untouched.
 */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* The fuzzer only plans and validates: flashattn_fwd and flashattn_merge (which would reach the
 * kernels) are never called, so the launchers are not linked. Reaching these is a bug in the fuzzer. */
flashattn_status fa_dispatch(const flashattn_handle *h, const fa_plan *plan, void *workspace, void *stream) {
    (void)h, (void)plan, (void)workspace, (void)stream;
    abort();
}
int fa_merge_launch(const fa_merge_args *a, void *stream) {
    (void)a, (void)stream;
    abort();
}

typedef struct input {
    const uint8_t *data;
    size_t size;
} input;

static uint64_t take(input *in, int bytes) {
    uint64_t v = 0;
    for (int i = 0; i < bytes; ++i) {
        v = (v << 8) | (in->size ? *in->data : 0);
        if (in->size) ++in->data, --in->size;
    }
    return v;
}

/* A dimension, stride or window: mostly small and plausible, sometimes at the edges of int32/int64. */
static int64_t pick_i64(input *in) {
    switch (take(in, 1) % 10) {
    case 0: case 1: case 2: return (int64_t)take(in, 1);
    case 3: return (int64_t)take(in, 2);
    case 4: return -(int64_t)(take(in, 1) % 3);
    case 5: { const int e = (int)(take(in, 1) % 63); return ((int64_t)1 << e) + (int64_t)(take(in, 1) % 3) - 1; }
    case 6: return INT32_MAX - (int64_t)(take(in, 1) % 3) + 1;
    case 7: return INT64_MAX - (int64_t)take(in, 1);
    case 8: return (int64_t)take(in, 4);
    default: return (int64_t)take(in, 8);
    }
}

static float pick_float(input *in) {
    static const float edges[] = {0.0f, 0.125f, 1.0f, 30.0f, 1e-39f, 2e-39f, 1e38f, 2.4e38f, 3.4e38f, -1.0f};
    const uint64_t mode = take(in, 1);
    if (mode % 4 == 0) {
        const uint32_t bits = (uint32_t)take(in, 4);
        float f;
        memcpy(&f, &bits, sizeof f);
        return f;
    }
    return edges[mode % (sizeof edges / sizeof edges[0])];
}

/* A fake device address: aligned, NULL, or off by a few bytes (never dereferenced). */
static uintptr_t pick_ptr(input *in, uintptr_t base) {
    const uint64_t mode = take(in, 1);
    if (mode % 8 == 0) return 0;
    if (mode % 8 == 1) return base + (uintptr_t)(take(in, 1) % 16);
    return base;
}

static const fa_device_caps devices[] = {
    {0, 9, 0, 132, 232448}, /* H200 */
    {0, 8, 0, 108, 166912}, /* A100 */
    {0, 8, 9, 142, 101376}, /* L40S */
    {0, 8, 6, 84, 101376},  /* A10 */
    {0, 7, 5, 40, 65536},   /* T4: too old */
    {0, 9, 0, 1, 49152},    /* a tiny Hopper */
};

#define CHECK(cond, ...)                                                                       \
    do {                                                                                       \
        if (!(cond)) {                                                                         \
            fprintf(stderr, "invariant broken: %s: ", #cond);                                  \
            fprintf(stderr, __VA_ARGS__);                                                      \
            fprintf(stderr, "\n");                                                             \
            abort();                                                                           \
        }                                                                                      \
    } while (0)

/* Every refusal names what is wrong: a field, a tensor, or the object at fault. */
static int names_an_argument(const char *m) {
    static const char *const words[] = {
        "struct_size", "reserved0", "dtype", "mask", "backend", "batch", "seqlen_q", "seqlen_k", "heads_q",
        "heads_kv", "head_dim", "stride", "q ", "k ", "v ", "o ", "q:", "k:", "v:", "o:", "q =", "k =", "v =",
        "o =", "lse", "softmax_scale", "softcap", "window_left", "window_right", "alibi", "handle", "params",
        "info", "bytes", "device", "heads", "num_parts", "seqlen", "o_parts", "cu_seqlens", "total_q", "total_k",
        "seqused_k", "block_table", "page_size", "num_pages", "pages_per_seq", "kv_batch", "k_new", "v_new",
        "seqlen_new", "rotary", "kv_indptr", "kv_last_page_len", "num_page_indices", "reserved1", "cache_leftpad",
    };
    for (size_t i = 0; i < sizeof words / sizeof words[0]; ++i)
        if (strstr(m, words[i])) return 1;
    return 0;
}

/* The byte extent of a tensor, exactly (no overflow possible in 128 bits). */
static __int128 extent_bytes(int64_t b, int64_t s, int64_t h, int64_t d, int64_t bs, int64_t ss, int64_t hs, int elem) {
    if (b == 0 || s == 0 || h == 0 || d == 0) return 0;
    return ((__int128)(b - 1) * bs + (__int128)(s - 1) * ss + (__int128)(h - 1) * hs + d) * elem;
}

/* An _init_size call on buf (n bytes, all 0xA5 before it) with size `want`: accepted only for a
 * size in `sizes` (0-terminated), nothing written on a refusal, nothing past `want` ever. */
static void check_init_size(const char *what, flashattn_status st, const unsigned char *buf, size_t n, size_t want,
                            const size_t *sizes) {
    if (st == FLASHATTN_STATUS_SUCCESS) {
        int known = 0;
        for (const size_t *z = sizes; *z; ++z) known |= *z == want;
        CHECK(known, "%s accepted size %zu", what, want);
    } else {
        CHECK(buf[0] == 0xA5, "%s wrote on failure", what);
    }
    for (size_t i = want; i < n; ++i) CHECK(buf[i] == 0xA5, "%s wrote byte %zu of %zu", what, i, want);
}

static void check_plan(const fa_device_caps *caps, const flashattn_fwd_params *p) {
    fa_plan plan;
    flashattn_fwd_params full;
    if (fa_plan_make(caps, p, 0, &plan) != FLASHATTN_STATUS_SUCCESS) return;
    CHECK(fa_fwd_params_load(p, &full) == FLASHATTN_STATUS_SUCCESS, "load after a successful plan");
    CHECK(plan.backend >= FLASHATTN_BACKEND_REFERENCE && plan.backend <= FLASHATTN_BACKEND_FUSED_SM90, "backend %d",
          plan.backend);
    if (!plan.noop && full.seqlen_q > 0) { /* (an append with no queries launches only the append) */
        CHECK(plan.grid_x >= 1 && plan.grid_y >= 1 && plan.grid_z >= 1, "grid (%d,%d,%d)", plan.grid_x, plan.grid_y,
              plan.grid_z);
        CHECK(plan.grid_y <= 65535 && plan.grid_z <= 65535, "grid (%d,%d,%d)", plan.grid_x, plan.grid_y, plan.grid_z);
        CHECK(plan.threads >= 32 && plan.threads <= 1024, "threads %d", plan.threads);
    }
    CHECK(plan.smem_bytes >= 0 && plan.smem_bytes <= caps->smem_per_block_optin, "smem %lld",
          (long long)plan.smem_bytes);
    CHECK(plan.workspace_bytes >= 0 && plan.workspace_bytes <= INT64_MAX / 2, "workspace %lld",
          (long long)plan.workspace_bytes);
    CHECK(isfinite(plan.kp.scale) && plan.kp.scale > 0 && isfinite(plan.kp.scale_log2), "scale %g", plan.kp.scale);
    CHECK(isfinite(plan.kp.softcap_inv_scale) && isfinite(plan.kp.softcap * 1.4426950408889634), "softcap %g",
          plan.kp.softcap);
    const __int128 max = INT64_MAX;
    /* Serving layouts (flashattn.h, "Serving calls"): packed Q/O, packed K/V, page pools, a cache. */
    const int64_t qo = full.cu_seqlens_q ? 1 : full.batch, qr = full.cu_seqlens_q ? full.total_q : full.seqlen_q;
    int64_t ko = full.batch, kr = full.seqlen_k;
    if (full.block_table) ko = full.num_pages, kr = full.page_size;
    else if (full.cu_seqlens_k) ko = 1, kr = full.total_k;
    else if (full.kv_batch_idx) ko = full.kv_batch;
    const int serving_call = full.cu_seqlens_q || full.cu_seqlens_k || full.seqused_k || full.block_table ||
                             full.kv_batch_idx || full.k_new || full.cache_leftpad;
    /* a dense decode on resident single-consumer blocks runs as a serving call of full sequences */
    const int dense_resident = !serving_call && plan.backend == FLASHATTN_BACKEND_FUSED_SM90 &&
                               plan.kp.persistent && plan.kp.pack_gqa && plan.cfg.block_m == 64;
    CHECK(plan.kp.serving == (serving_call || dense_resident), "serving flag");
    if (plan.kp.serving && !plan.gqa_rows) /* (the mask and window from which serving_seq works out each
                                            * sequence's keys; FUSED's gqa rows read the call as unmasked) */
        CHECK(plan.kp.mask_kind == full.mask &&
                  plan.kp.window_left == (full.window_left < FA_MAX_SEQLEN ? full.window_left : FA_MAX_SEQLEN) &&
                  plan.kp.window_right == (full.window_right < FA_MAX_SEQLEN ? full.window_right : FA_MAX_SEQLEN),
              "serving visibility: mask %d (call %d), window %d %d", (int)plan.kp.mask_kind, (int)full.mask,
              (int)plan.kp.window_left, (int)plan.kp.window_right);
    CHECK(!full.cache_leftpad || !full.block_table, "leftpad with pages");
    if (full.k_new) {
        CHECK(plan.append && full.seqused_k && !full.cu_seqlens_q && !full.cu_seqlens_k, "append fields");
        CHECK(extent_bytes(full.batch, full.seqlen_new, full.heads_kv, full.head_dim, full.k_new_batch_stride,
                           full.k_new_seq_stride, full.k_new_head_stride, 2) <= max, "k_new extent");
        if (full.rotary_cos && full.seqlen_q > 0)
            CHECK(plan.q_rot_off >= 0 && plan.q_rot_off % 256 == 0 &&
                  (__int128)plan.q_rot_off + (__int128)full.batch * full.seqlen_q * full.heads_q * full.head_dim * 2 <=
                      plan.workspace_bytes, "rotated q region");
    }
    if (plan.kp.serving && plan.backend == FLASHATTN_BACKEND_REFERENCE && !plan.noop)
        CHECK(plan.ref.gathered > 0 && plan.ref.gathered <= plan.ref.total && plan.ref.total <= plan.workspace_bytes,
              "reference gather region");
    if (full.block_table) {
        CHECK(full.page_size >= 1 && full.num_pages >= 1 && full.pages_per_seq >= 1 &&
              full.seqlen_k <= full.pages_per_seq * full.page_size, "paged fields");
        CHECK(((__int128)(full.batch - 1) * full.block_table_batch_stride + full.pages_per_seq) * 4 <= max,
              "block table extent");
    }
    CHECK(extent_bytes(qo, qr, full.heads_q, full.head_dim, full.q_batch_stride, full.q_seq_stride,
                       full.q_head_stride, 2) <= max, "q extent");
    CHECK(extent_bytes(ko, kr, full.heads_kv, full.head_dim, full.k_batch_stride,
                       full.k_seq_stride, full.k_head_stride, 2) <= max, "k extent");
    CHECK(extent_bytes(ko, kr, full.heads_kv, full.head_dim, full.v_batch_stride,
                       full.v_seq_stride, full.v_head_stride, 2) <= max, "v extent");
    CHECK(extent_bytes(qo, qr, full.heads_q, full.head_dim, full.o_batch_stride, full.o_seq_stride,
                       full.o_head_stride, 2) <= max, "o extent");
    if (full.lse) CHECK((__int128)qo * full.heads_q * qr * 4 <= max, "lse extent");
    if (full.alibi_slopes)
        CHECK(((__int128)(full.batch - 1) * full.alibi_batch_stride + full.heads_q) * 4 <= max, "alibi extent");
    if (plan.gqa_rows) /* FUSED decode: a group's query heads as one head's rows, only where exact */
        CHECK(plan.backend == FLASHATTN_BACKEND_FUSED && full.seqlen_q == 1 && full.heads_q > full.heads_kv &&
                  plan.kp.seqlen_q == full.heads_q / full.heads_kv && plan.kp.heads_q == full.heads_kv &&
                  plan.kp.head_group == 1 && full.mask != FLASHATTN_MASK_CAUSAL_TOP_LEFT && full.window_left < 0 &&
                  !full.alibi_slopes && !full.rotary_cos &&
                  plan.kp.q_group_rows == (full.cu_seqlens_q ? full.heads_q / full.heads_kv : 0),
              "gqa rows");
    else
        CHECK(plan.kp.seqlen_q == full.seqlen_q && plan.kp.heads_q == full.heads_q && plan.kp.q_group_rows == 0,
              "int32 kernel dims");
    CHECK(plan.kp.seqlen_k == full.seqlen_k && plan.kp.batch == full.batch, "int32 kernel dims");
    /* gathered pages on resident blocks: causal pairs, where the resident serving block can copy
     * them (fa_sm90_resident_gathers: two consumers, two Q buffers) */
    const int resident_gather = plan.kp.persistent == 2 && plan.kp.serving && plan.kp.gather_pages &&
                                fa_sm90_resident_gathers(plan.cfg.head_dim, plan.cfg.block_m, plan.cfg.block_n);
    if (plan.kp.persistent) { /* resident blocks: FUSED_SM90's unsplit calls whose every row sees a key
                               * (at the capacities for serving ones: two or three consumers, K/V gathered
                               * only as resident_gather says; or one consumer whose tiles pack a KV head's
                               * query heads, a decode planned as a serving call, dense ones included, over
                               * pages TMA reads where paged) */
        const int32_t heads = fa_persistent_heads(&plan.kp); /* (packed: KV heads) */
        const int64_t tiles = (int64_t)plan.kp.num_m_blocks * plan.kp.batch * heads;
        const int windowed = full.window_left >= 0 || full.window_right >= 0;
        const int64_t units =
            plan.kp.persistent == 2 ? (int64_t)((plan.kp.num_m_blocks + 1) / 2) * plan.kp.batch * heads : tiles;
        /* one block an SM (or a unit, when fewer); a packed decode that appends nothing: as few blocks as
         * take its units in as many rounds */
        const int64_t rounds = (units + caps->sm_count - 1) / caps->sm_count;
        const int64_t blocks = plan.kp.pack_gqa && full.k_new == NULL ? (units + rounds - 1) / rounds
                               : units < caps->sm_count                ? units
                                                                       : caps->sm_count;
        /* every block has work: its first work number is a tile */
        if (plan.grid_x > 0 && tiles <= INT32_MAX) {
            const int32_t last = fa_persistent_first(&plan.kp, heads, plan.grid_x - 1, plan.grid_x);
            CHECK(last >= 0 && last < fa_persistent_works(&plan.kp, heads), "the last persistent block has no work");
            int32_t m_block = -1, bh = -1; /* its tile's work number back (the ragged walks hand tiles on so) */
            fa_persistent_tile(&plan.kp, heads, last, &m_block, &bh);
            CHECK(fa_persistent_work(&plan.kp, heads, m_block, bh) == last, "fa_persistent_work inverts fa_persistent_tile");
        }
        CHECK(plan.backend == FLASHATTN_BACKEND_FUSED_SM90 &&
                  (!plan.kp.serving ||
                   (plan.cfg.block_m != 64 ? !plan.kp.pack_gqa && (!plan.kp.gather_pages || resident_gather)
                                           : plan.kp.pack_gqa && !plan.kp.gather_pages)) &&
                  (plan.kp.serving || !plan.kp.pack_gqa) &&
                  plan.kp.num_splits == 1 && plan.kp.sched_heads == 0 && full.seqlen_k > 0 &&
                  /* a window: too few query tiles a head for the heaviest-first order (or serving) */
                  (!windowed || plan.kp.serving || fa_sched_heads(caps, &full, plan.kp.num_m_blocks) == 0) &&
                  /* every row i sees keys [i + lo, i + hi] of [0, seqlen_k): some, for every i */
                  plan.kp.key_lo_off <= plan.kp.key_hi_off && plan.kp.key_hi_off >= 0 &&
                  plan.kp.key_lo_off <= full.seqlen_k - full.seqlen_q && plan.grid_y == 1 && plan.grid_z == 1 &&
                  tiles > caps->sm_count && tiles + caps->sm_count <= INT32_MAX &&
                  plan.grid_x == blocks &&
                  (plan.kp.persistent == 1 ? full.mask == FLASHATTN_MASK_NONE || windowed
                                           : plan.kp.persistent == 2 && full.mask != FLASHATTN_MASK_NONE && !windowed &&
                                                 full.seqlen_q <= full.seqlen_k),
              "persistent plan");
    }
    /* FUSED_SM90's page path is the planner's, and the launcher's own answer must agree (it refuses
     * a plan otherwise); gathered pages run on resident blocks only as resident_gather says. */
    CHECK(plan.kp.gather_pages == (plan.backend == FLASHATTN_BACKEND_FUSED_SM90 &&
                                   fa_sm90_gathers_pages(plan.kp.serving && plan.kp.block_table != NULL, plan.kp.page_size,
                                                         plan.cfg.block_n, plan.cfg.block_m, plan.kp.num_splits)) &&
              !(plan.kp.gather_pages && plan.kp.persistent && !resident_gather),
          "gather_pages %d", plan.kp.gather_pages);
    /* Full-width page boxes: the launcher's own answer (it refuses a plan otherwise), TMA pages only,
     * a kernel head dim of several 64-column regions equal to the call's, and every group index the
     * kernel forms (page x G + i, any page of the pool) in int32 */
    CHECK(plan.kp.kv_page_groups ==
              (plan.backend == FLASHATTN_BACKEND_FUSED_SM90 && plan.kp.serving && plan.kp.block_table != NULL &&
                       !plan.kp.gather_pages
                   ? fa_sm90_page_groups(plan.kp.head_dim, plan.cfg.head_dim, plan.kp.page_size, plan.kp.num_pages,
                                         plan.kp.k_batch_stride, plan.kp.k_seq_stride, plan.kp.v_batch_stride,
                                         plan.kp.v_seq_stride)
                   : 0),
          "kv_page_groups %d disagrees with the launcher's", (int)plan.kp.kv_page_groups);
    if (plan.kp.kv_page_groups != 0) {
        const int64_t g = plan.kp.kv_page_groups;
        CHECK(plan.backend == FLASHATTN_BACKEND_FUSED_SM90 && plan.kp.serving && plan.kp.block_table != NULL &&
                  !plan.kp.gather_pages && plan.kp.head_dim == plan.cfg.head_dim && plan.cfg.head_dim % 64 == 0 &&
                  plan.cfg.head_dim > 64 && plan.kp.page_size % 8 == 0 && g >= plan.kp.page_size / 8 &&
                  plan.kp.k_batch_stride == 8 * g * plan.kp.k_seq_stride &&
                  plan.kp.v_batch_stride == plan.kp.k_batch_stride && plan.kp.v_seq_stride == plan.kp.k_seq_stride &&
                  g * plan.kp.num_pages <= INT32_MAX,
              "kv_page_groups %lld", (long long)g);
    }
    if (plan.backend == FLASHATTN_BACKEND_FUSED_SM90 && plan.cfg.head_dim == 128 && plan.cfg.block_n == 176)
        /* the wide key tile: unmasked calls over TMA-read K/V whose head dim needs all of S's k-steps */
        CHECK(full.mask == FLASHATTN_MASK_NONE && full.window_left < 0 && full.window_right < 0 &&
                  !plan.kp.gather_pages && full.head_dim > FA_SM90_D128_SHORT_S_HEAD_DIM,
              "176-key tile at head dim %lld", (long long)full.head_dim);
    if (plan.backend == FLASHATTN_BACKEND_FUSED_SM90 && plan.cfg.block_m == 64) /* the single-consumer tile: */
        CHECK(plan.kp.pack_gqa && (!plan.kp.persistent || (plan.kp.serving && !plan.kp.gather_pages)),
              "single-consumer tile: packed groups only, resident only in a serving call over TMA's loads"); /* grouped decode */
    if (plan.kp.sched_heads != 0) /* heaviest-first sections: FUSED_SM90's unsplit, unpacked dense calls */
        CHECK(plan.backend == FLASHATTN_BACKEND_FUSED_SM90 && !plan.kp.serving && plan.kp.num_splits == 1 &&
                  !plan.kp.pack_gqa && plan.kp.sched_heads >= 1 &&
                  plan.kp.sched_heads <= (int64_t)plan.kp.batch * plan.kp.heads_q &&
                  (int64_t)plan.grid_x * plan.grid_y * plan.grid_z ==
                      (int64_t)plan.kp.num_m_blocks * plan.kp.batch * plan.kp.heads_q,
              "heaviest-first order");
    if (plan.kp.num_splits > 1) { /* the partial results fit the workspace; without splitting, none needed for them */
        CHECK(plan.backend != FLASHATTN_BACKEND_REFERENCE && plan.o_accum_off >= 0 &&
                  plan.lse_accum_off > plan.o_accum_off && plan.lse_accum_off < plan.workspace_bytes,
              "split regions");
        fa_plan unsplit;
        CHECK(fa_plan_make(caps, p, FA_PLAN_NO_SPLIT, &unsplit) == FLASHATTN_STATUS_SUCCESS &&
                  unsplit.kp.num_splits == 1 && unsplit.workspace_bytes < plan.workspace_bytes,
              "the unsplit plan");
    }
}

/* How often each status came back (printed at exit): a fuzzer that never plans successfully tests
 * little, so scripts/fuzz.sh shows this. */
static unsigned long status_counts[32];

static void print_status_counts(void) {
    fprintf(stderr, "statuses:");
    for (int i = 0; i < 32; ++i)
        if (status_counts[i]) fprintf(stderr, " %s=%lu", flashattn_status_name((flashattn_status)i), status_counts[i]);
    fprintf(stderr, "\n");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static int registered;
    if (!registered) registered = 1, atexit(print_status_counts);
    input in = {data, size};
    const fa_device_caps *caps = &devices[take(&in, 1) % (sizeof devices / sizeof devices[0])];
    flashattn_handle h;
    memset(&h, 0, sizeof h);
    h.caps = *caps;

    flashattn_fwd_params p;
    flashattn_fwd_params_init(&p);
    p.dtype = (int32_t)(take(&in, 1) % 4) - 1 + 1;  /* 0..3: two valid */
    p.mask = (int32_t)(take(&in, 1) % 5) - 1;       /* -1..3 */
    p.backend = (int32_t)(take(&in, 1) % 6) - 1;    /* -1..4 */
    p.reserved0 = take(&in, 1) % 32 == 0;
    p.batch = pick_i64(&in), p.seqlen_q = pick_i64(&in), p.seqlen_k = pick_i64(&in);
    p.heads_q = pick_i64(&in), p.heads_kv = pick_i64(&in), p.head_dim = pick_i64(&in);
    flashattn_fwd_params_set_packed_strides(&p); /* may refuse: then the strides stay 0 */
    int64_t *strides[12] = {&p.q_batch_stride, &p.q_seq_stride, &p.q_head_stride, &p.k_batch_stride,
                            &p.k_seq_stride,   &p.k_head_stride, &p.v_batch_stride, &p.v_seq_stride,
                            &p.v_head_stride,  &p.o_batch_stride, &p.o_seq_stride, &p.o_head_stride};
    const uint64_t override = take(&in, 2);
    for (int i = 0; i < 12; ++i)
        if (override >> i & 1) *strides[i] = pick_i64(&in);
    p.q = (const void *)pick_ptr(&in, 0x10000000);
    p.k = (const void *)pick_ptr(&in, 0x20000000);
    p.v = (const void *)pick_ptr(&in, 0x30000000);
    p.o = (void *)pick_ptr(&in, 0x40000000);
    p.lse = (float *)pick_ptr(&in, 0x50000000);
    p.alibi_slopes = take(&in, 1) % 2 ? (const float *)pick_ptr(&in, 0x60000000) : NULL;
    p.alibi_batch_stride = take(&in, 1) % 2 ? pick_i64(&in) : 0;
    p.softmax_scale = pick_float(&in);
    p.softcap = take(&in, 1) % 2 ? pick_float(&in) : 0.0f;
    p.window_left = take(&in, 1) % 2 ? pick_i64(&in) : -1;
    p.window_right = take(&in, 1) % 2 ? pick_i64(&in) : -1;
    /* The serving fields, in about half the inputs: each array set, NULL or misaligned, the counts
     * and the page geometry from the same edge values as the shapes. */
    if (take(&in, 1) % 2) {
        const uint64_t which = take(&in, 1);
        if (which & 1) p.cu_seqlens_q = (const int32_t *)pick_ptr(&in, 0x70000000), p.total_q = pick_i64(&in);
        if (which & 2) p.cu_seqlens_k = (const int32_t *)pick_ptr(&in, 0x71000000), p.total_k = pick_i64(&in);
        if (which & 4) p.seqused_k = (const int32_t *)pick_ptr(&in, 0x72000000);
        if (which & 8) {
            p.block_table = (const int32_t *)pick_ptr(&in, 0x73000000);
            p.page_size = pick_i64(&in), p.num_pages = pick_i64(&in), p.pages_per_seq = pick_i64(&in);
            p.block_table_batch_stride = pick_i64(&in);
            if (take(&in, 1) % 2) {
                p.kv_indptr = (const int32_t *)pick_ptr(&in, 0x79000000);
                p.kv_last_page_len = take(&in, 1) % 2 ? (const int32_t *)pick_ptr(&in, 0x7a000000) : NULL;
                p.num_page_indices = pick_i64(&in);
                if (take(&in, 1) % 2) p.block_table_batch_stride = 0;
            }
        }
        if (which & 16) p.kv_batch_idx = (const int32_t *)pick_ptr(&in, 0x74000000), p.kv_batch = pick_i64(&in);
        if ((which & 24) == 24 || take(&in, 1) % 4 == 0) p.cache_leftpad = (const int32_t *)pick_ptr(&in, 0x7b000000);
        if (which & 32) p.q_batch_stride = p.o_batch_stride = 0;
        if (which & 64) p.k_batch_stride = p.v_batch_stride = 0;
        if (which & 128) {
            p.k_new = (const void *)pick_ptr(&in, 0x75000000), p.v_new = (const void *)pick_ptr(&in, 0x76000000);
            p.seqlen_new = pick_i64(&in);
            p.k_new_batch_stride = p.v_new_batch_stride = pick_i64(&in);
            p.k_new_seq_stride = p.v_new_seq_stride = pick_i64(&in);
            p.k_new_head_stride = p.v_new_head_stride = pick_i64(&in);
            if (take(&in, 1) % 2) {
                p.rotary_cos = (const void *)pick_ptr(&in, 0x77000000), p.rotary_sin = (const void *)pick_ptr(&in, 0x78000000);
                p.rotary_dim = pick_i64(&in), p.seqlen_ro = pick_i64(&in);
                p.rotary_interleaved = (int32_t)(take(&in, 1) % 3), p.rotary_q_at_cache_len = (int32_t)(take(&in, 1) % 3);
            }
        }
    }
    const uint64_t size_mode = take(&in, 1) % 16;
    if (size_mode == 0) p.struct_size = FLASHATTN_FWD_PARAMS_SIZE_0_1;
    else if (size_mode == 2) p.struct_size = FLASHATTN_FWD_PARAMS_SIZE_0_3;
    else if (size_mode == 1) p.struct_size = (size_t)take(&in, 2);

    size_t bytes = 12345;
    flashattn_plan_info info;
    flashattn_plan_info_init(&info);
    const flashattn_status st_ws = flashattn_fwd_workspace_size(&h, &p, &bytes);
    const flashattn_status st_sup = flashattn_fwd_supported(&h, &p);
    const flashattn_status st = flashattn_fwd_plan(&h, &p, &info);
    CHECK(st_ws == st && st_sup == st, "statuses %d %d %d", st_ws, st_sup, st);
    ++status_counts[(unsigned)st % 32];
    CHECK(st >= FLASHATTN_STATUS_SUCCESS && st <= FLASHATTN_STATUS_UNSUPPORTED || st == FLASHATTN_STATUS_DEVICE_TOO_OLD ||
              st == FLASHATTN_STATUS_BAD_VARLEN || st == FLASHATTN_STATUS_BAD_PAGED_KV ||
              st == FLASHATTN_STATUS_BAD_APPEND || st == FLASHATTN_STATUS_BAD_ROTARY,
          "a planning query returned %s", flashattn_status_name(st));
    if (st != FLASHATTN_STATUS_SUCCESS) {
        const char *m = flashattn_last_error();
        CHECK(m[0] != '\0' && names_an_argument(m), "%s: '%s'", flashattn_status_name(st), m);
        CHECK(bytes == 12345, "the workspace query wrote its output on failure");
    } else {
        CHECK((int64_t)bytes == info.workspace_bytes, "workspace %zu vs plan %lld", bytes,
              (long long)info.workspace_bytes);
        CHECK(info.struct_size == sizeof info && memchr(info.description, '\0', sizeof info.description) != NULL,
              "plan info");
        check_plan(caps, &p);
    }

    /* flashattn_merge's validation on the rest of the input: a status the header lists, and a
     * message naming a field on every refusal. */
    flashattn_merge_params mp;
    flashattn_merge_params_init(&mp);
    mp.dtype_parts = (int32_t)(take(&in, 1) % 5) - 1, mp.dtype_out = (int32_t)(take(&in, 1) % 5) - 1;
    mp.lse_base = (int32_t)(take(&in, 1) % 4) - 1;
    mp.num_parts = pick_i64(&in), mp.batch = pick_i64(&in), mp.seqlen = pick_i64(&in);
    mp.heads = pick_i64(&in), mp.head_dim = pick_i64(&in);
    int64_t *mstrides[15] = {&mp.o_part_stride, &mp.o_batch_stride, &mp.o_seq_stride, &mp.o_head_stride,
                             &mp.lse_part_stride, &mp.lse_batch_stride, &mp.lse_head_stride, &mp.lse_seq_stride,
                             &mp.out_batch_stride, &mp.out_seq_stride, &mp.out_head_stride,
                             &mp.lse_out_batch_stride, &mp.lse_out_head_stride, &mp.lse_out_seq_stride, NULL};
    for (int i = 0; mstrides[i]; ++i) *mstrides[i] = pick_i64(&in);
    mp.o_parts = (const void *)pick_ptr(&in, 0x10000000);
    mp.lse_parts = (const float *)pick_ptr(&in, 0x20000000);
    mp.o = (void *)pick_ptr(&in, 0x30000000);
    mp.lse = (float *)pick_ptr(&in, 0x40000000);
    if (take(&in, 1) % 16 == 0) mp.struct_size = (size_t)take(&in, 2);
    const flashattn_status mst = fa_merge_check(&mp);
    CHECK(mst >= FLASHATTN_STATUS_SUCCESS && mst <= FLASHATTN_STATUS_BAD_LSE_BASE && mst != FLASHATTN_STATUS_UNSUPPORTED,
          "merge validation returned %s", flashattn_status_name(mst));
    if (mst != FLASHATTN_STATUS_SUCCESS)
        CHECK(names_an_argument(flashattn_last_error()), "merge %s: '%s'", flashattn_status_name(mst),
              flashattn_last_error());

    /* The _init_size functions write exactly the size they are given, or nothing. */
    unsigned char buf[2 * sizeof(flashattn_fwd_params) + 64];
    const size_t fwd_sizes[] = {FLASHATTN_FWD_PARAMS_SIZE_0_1, FLASHATTN_FWD_PARAMS_SIZE_0_3, sizeof(flashattn_fwd_params), 0};
    const size_t merge_sizes[] = {FLASHATTN_MERGE_PARAMS_SIZE_0_2, sizeof(flashattn_merge_params), 0};
    const size_t info_sizes[] = {FLASHATTN_PLAN_INFO_SIZE_0_1, sizeof(flashattn_plan_info), 0};
    size_t want = (size_t)take(&in, 2) % sizeof buf;
    memset(buf, 0xA5, sizeof buf);
    check_init_size("flashattn_fwd_params_init_size", flashattn_fwd_params_init_size((flashattn_fwd_params *)buf, want),
                    buf, sizeof buf, want, fwd_sizes);
    want = (size_t)take(&in, 2) % sizeof buf;
    memset(buf, 0xA5, sizeof buf);
    check_init_size("flashattn_merge_params_init_size",
                    flashattn_merge_params_init_size((flashattn_merge_params *)buf, want), buf, sizeof buf, want,
                    merge_sizes);
    want = (size_t)take(&in, 2) % sizeof buf;
    memset(buf, 0xA5, sizeof buf);
    check_init_size("flashattn_plan_info_init_size", flashattn_plan_info_init_size((flashattn_plan_info *)buf, want),
                    buf, sizeof buf, want, info_sizes);

    /* A reserved field set on a call that was accepted: refused as BAD_STRUCT_SIZE where the
     * caller's struct_size covers the field (and ignored where it does not), the outputs untouched. */
    const int32_t junk = (int32_t)take(&in, 4) | 1;
    if (st == FLASHATTN_STATUS_SUCCESS) {
        const size_t size = p.struct_size;
        const int covered = size >= offsetof(flashattn_fwd_params, reserved1) + sizeof p.reserved1;
        p.reserved1 = junk;
        bytes = 12345;
        const flashattn_status st_r = flashattn_fwd_workspace_size(&h, &p, &bytes);
        CHECK(st_r == (covered ? FLASHATTN_STATUS_BAD_STRUCT_SIZE : FLASHATTN_STATUS_SUCCESS),
              "reserved1 = %d with struct_size %zu: %s", (int)junk, size, flashattn_status_name(st_r));
        if (covered) CHECK(bytes == 12345 && strstr(flashattn_last_error(), "reserved1") != NULL, "reserved1 refusal");
    }
    if (mst == FLASHATTN_STATUS_SUCCESS) {
        mp.reserved0 = junk;
        CHECK(fa_merge_check(&mp) == FLASHATTN_STATUS_BAD_STRUCT_SIZE &&
                  strstr(flashattn_last_error(), "reserved0") != NULL,
              "merge reserved0 = %d: %s", (int)junk, flashattn_last_error());
    }
    return 0;
}
