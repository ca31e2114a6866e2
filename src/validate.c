/*
 * validate.c - every check on a flashattn_fwd_params that needs no device. Each bad input gets its
 * own status and a message naming the field and its value; nothing is dereferenced.
 */
#include <float.h>
#include <math.h>

#include "internal.h"

typedef long long ll;

/* a * b + c without overflow, for non-negative a, b, c; returns 0 on overflow. */
static int add_mul_ok(int64_t a, int64_t b, int64_t c, int64_t *out) {
    if (b != 0 && a > (INT64_MAX - c) / b) return 0;
    *out = a * b + c;
    return 1;
}

typedef struct tensor_desc {
    const char *name;
    const void *ptr;
    int64_t extent[4];  /* batch, seq, heads, head_dim */
    int64_t stride[4];  /* batch, seq, heads, 1 */
} tensor_desc;

static const char *const stride_names[3] = {"batch_stride", "seq_stride", "head_stride"};

static flashattn_status check_tensor(const tensor_desc *t) {
    int64_t numel = 1;
    for (int i = 0; i < 4; ++i) numel = (t->extent[i] == 0) ? 0 : numel;
    for (int i = 0; i < 3; ++i)
        if (t->stride[i] < 0)
            return fa_fail(FLASHATTN_STATUS_BAD_STRIDE, "%s_%s is %lld; strides must be >= 0",
                           t->name, stride_names[i], (ll)t->stride[i]);
    if (numel == 0) return FLASHATTN_STATUS_SUCCESS;
    if (t->ptr == NULL)
        return fa_fail(FLASHATTN_STATUS_NULL_POINTER, "%s is NULL but the tensor has %lldx%lldx%lldx%lld elements",
                       t->name, (ll)t->extent[0], (ll)t->extent[1], (ll)t->extent[2],
                       (ll)t->extent[3]);
    if (((uintptr_t)t->ptr) % 2 != 0)
        return fa_fail(FLASHATTN_STATUS_MISALIGNED_POINTER,
                       "%s = %p is not aligned to its 2-byte element size", t->name, t->ptr);
    /* The largest element offset must fit int64, and so must the tensor's end in bytes (one past
     * its last element: 2 x (offset + 1)). */
    int64_t off = 0;
    for (int i = 0; i < 4; ++i) {
        if (!add_mul_ok(t->extent[i] - 1, t->stride[i], off, &off))
            return fa_fail(FLASHATTN_STATUS_INDEX_OVERFLOW,
                           "%s: (extent - 1) x stride overflows int64 at dimension %d (extent %lld, "
                           "stride %lld)",
                           t->name, i, (ll)t->extent[i], (ll)t->stride[i]);
    }
    if (off >= INT64_MAX / 2)
        return fa_fail(FLASHATTN_STATUS_INDEX_OVERFLOW,
                       "%s: the tensor's end in bytes (2 x (%lld + 1)) overflows int64", t->name, (ll)off);
    return FLASHATTN_STATUS_SUCCESS;
}

/* The output must not have two elements at one address: sort its dimensions of extent > 1 by
 * stride; each stride must be at least the span of all the dimensions below it. */
static flashattn_status check_no_self_overlap(const tensor_desc *t) {
    int64_t ext[4], str[4];
    int n = 0;
    for (int i = 0; i < 4; ++i) {
        if (t->extent[i] == 0) return FLASHATTN_STATUS_SUCCESS;
        if (t->extent[i] > 1) {
            ext[n] = t->extent[i];
            str[n] = t->stride[i];
            ++n;
        }
    }
    for (int i = 1; i < n; ++i)
        for (int j = i; j > 0 && str[j] < str[j - 1]; --j) {
            int64_t te = ext[j], ts = str[j];
            ext[j] = ext[j - 1], str[j] = str[j - 1];
            ext[j - 1] = te, str[j - 1] = ts;
        }
    int64_t span = 1; /* elements covered by the dimensions already placed */
    for (int i = 0; i < n; ++i) {
        if (str[i] < span)
            return fa_fail(FLASHATTN_STATUS_BAD_STRIDE,
                           "%s strides (batch %lld, seq %lld, head %lld, head_dim 1) make distinct "
                           "elements share an address; the output must not overlap itself",
                           t->name, (ll)t->stride[0], (ll)t->stride[1], (ll)t->stride[2]);
        span = str[i] * ext[i]; /* cannot overflow: check_tensor bounded (ext-1)*str */
    }
    return FLASHATTN_STATUS_SUCCESS;
}

void fa_outer_extents(const flashattn_fwd_params *p, int64_t *q_outer, int64_t *q_rows, int64_t *kv_outer,
                      int64_t *kv_rows) {
    *q_outer = p->cu_seqlens_q ? 1 : p->batch;
    *q_rows = p->cu_seqlens_q ? p->total_q : p->seqlen_q;
    *kv_outer = p->batch, *kv_rows = p->seqlen_k;
    if (p->block_table) *kv_outer = p->num_pages, *kv_rows = p->page_size;
    else if (p->cu_seqlens_k) *kv_outer = 1, *kv_rows = p->total_k;
    else if (p->kv_batch_idx) *kv_outer = p->kv_batch;
}

int fa_is_serving(const flashattn_fwd_params *p) {
    return p->cu_seqlens_q != NULL || p->cu_seqlens_k != NULL || p->seqused_k != NULL ||
           p->block_table != NULL || p->kv_batch_idx != NULL || p->k_new != NULL || p->cache_leftpad != NULL;
}

/* Appending new keys and the rotary tables (flashattn.h, "Serving calls"). */
static flashattn_status check_append(const flashattn_fwd_params *p) {
    if ((p->k_new == NULL) != (p->v_new == NULL))
        return fa_fail(FLASHATTN_STATUS_BAD_APPEND, "%s is NULL but %s is set; set both to append, or neither",
                       p->k_new ? "v_new" : "k_new", p->k_new ? "k_new" : "v_new");
    if (p->k_new == NULL) {
        if (p->seqlen_new != 0)
            return fa_fail(FLASHATTN_STATUS_BAD_APPEND, "seqlen_new is %lld but k_new is NULL; it must be 0",
                           (ll)p->seqlen_new);
    } else {
        if (p->seqused_k == NULL)
            return fa_fail(FLASHATTN_STATUS_BAD_APPEND,
                           "k_new is set but seqused_k is NULL; appending needs each cache's length before "
                           "the append (seqused_k)");
        if (p->cu_seqlens_q != NULL || p->cu_seqlens_k != NULL)
            return fa_fail(FLASHATTN_STATUS_BAD_APPEND,
                           "k_new is set with %s; appending takes dense Q and a dense, indexed or paged cache",
                           p->cu_seqlens_q ? "cu_seqlens_q (packed Q)" : "cu_seqlens_k (packed K/V)");
        if (p->seqlen_new < 0 || p->seqlen_new > FA_MAX_SEQLEN)
            return fa_fail(FLASHATTN_STATUS_BAD_SHAPE, "seqlen_new is %lld; it must be in 0..%lld",
                           (ll)p->seqlen_new, (ll)FA_MAX_SEQLEN);
        const tensor_desc news[2] = {
            {"k_new", p->k_new, {p->batch, p->seqlen_new, p->heads_kv, p->head_dim},
             {p->k_new_batch_stride, p->k_new_seq_stride, p->k_new_head_stride, 1}},
            {"v_new", p->v_new, {p->batch, p->seqlen_new, p->heads_kv, p->head_dim},
             {p->v_new_batch_stride, p->v_new_seq_stride, p->v_new_head_stride, 1}},
        };
        for (int i = 0; i < 2; ++i) {
            const flashattn_status st = check_tensor(&news[i]);
            if (st != FLASHATTN_STATUS_SUCCESS) return st;
        }
    }
    if ((p->rotary_cos == NULL) != (p->rotary_sin == NULL))
        return fa_fail(FLASHATTN_STATUS_BAD_ROTARY, "%s is NULL but %s is set; set both tables, or neither",
                       p->rotary_cos ? "rotary_sin" : "rotary_cos", p->rotary_cos ? "rotary_cos" : "rotary_sin");
    if (p->rotary_interleaved != 0 && p->rotary_interleaved != 1)
        return fa_fail(FLASHATTN_STATUS_BAD_ROTARY, "rotary_interleaved is %d; expected 0 or 1",
                       (int)p->rotary_interleaved);
    if (p->rotary_q_at_cache_len != 0 && p->rotary_q_at_cache_len != 1)
        return fa_fail(FLASHATTN_STATUS_BAD_ROTARY, "rotary_q_at_cache_len is %d; expected 0 or 1",
                       (int)p->rotary_q_at_cache_len);
    if (p->rotary_cos == NULL) {
        if (p->rotary_dim != 0 || p->seqlen_ro != 0)
            return fa_fail(FLASHATTN_STATUS_BAD_ROTARY, "%s is %lld but rotary_cos is NULL; it must be 0",
                           p->rotary_dim != 0 ? "rotary_dim" : "seqlen_ro",
                           (ll)(p->rotary_dim != 0 ? p->rotary_dim : p->seqlen_ro));
        return FLASHATTN_STATUS_SUCCESS;
    }
    if (p->k_new == NULL)
        return fa_fail(FLASHATTN_STATUS_BAD_ROTARY,
                       "rotary_cos is set but k_new is NULL; rotary embedding applies to appended keys "
                       "(and Q) only");
    if (p->rotary_dim < 2 || p->rotary_dim % 2 != 0 || p->rotary_dim > p->head_dim)
        return fa_fail(FLASHATTN_STATUS_BAD_ROTARY, "rotary_dim is %lld; it must be even and in 2..head_dim (%lld)",
                       (ll)p->rotary_dim, (ll)p->head_dim);
    if (p->seqlen_ro < 1 || p->seqlen_ro > INT32_MAX)
        return fa_fail(FLASHATTN_STATUS_BAD_ROTARY, "seqlen_ro is %lld; it must be in 1..%d", (ll)p->seqlen_ro,
                       INT32_MAX);
    const struct { const char *name; const void *ptr; } tables[2] = {{"rotary_cos", p->rotary_cos},
                                                                     {"rotary_sin", p->rotary_sin}};
    for (int i = 0; i < 2; ++i)
        if (((uintptr_t)tables[i].ptr) % 2 != 0)
            return fa_fail(FLASHATTN_STATUS_MISALIGNED_POINTER, "%s = %p is not aligned to its 2-byte element size",
                           tables[i].name, tables[i].ptr);
    if (p->seqlen_ro > INT64_MAX / p->rotary_dim) /* rotary_dim / 2 x 2 bytes per row */
        return fa_fail(FLASHATTN_STATUS_INDEX_OVERFLOW, "rotary tables: seqlen_ro x rotary_dim (%lld x %lld) "
                       "bytes overflow int64", (ll)p->seqlen_ro, (ll)p->rotary_dim);
    return FLASHATTN_STATUS_SUCCESS;
}

/* The serving fields (see "Serving calls" in flashattn.h): each bad combination named. */
static flashattn_status check_serving(const flashattn_fwd_params *p) {
    const struct { const char *name; const int32_t *ptr; } arrays[] = {
        {"cu_seqlens_q", p->cu_seqlens_q}, {"cu_seqlens_k", p->cu_seqlens_k},
        {"seqused_k", p->seqused_k},       {"block_table", p->block_table},
        {"kv_batch_idx", p->kv_batch_idx}, {"cache_leftpad", p->cache_leftpad},
    };
    for (size_t i = 0; i < FA_COUNT(arrays); ++i)
        if (((uintptr_t)arrays[i].ptr) % 4 != 0)
            return fa_fail(FLASHATTN_STATUS_MISALIGNED_POINTER,
                           "%s = %p is not aligned to its 4-byte element size", arrays[i].name,
                           (const void *)arrays[i].ptr);
    const int paged = p->block_table != NULL;
    /* Packed Q / packed K: the row counts, and no batch stride. */
    const struct {
        const char *array, *total_name, *t1, *t2;
        int packed, has_array;
        int64_t total, stride1, stride2;
    } packs[2] = {
        {"cu_seqlens_q", "total_q", "q_batch_stride", "o_batch_stride", p->cu_seqlens_q != NULL,
         p->cu_seqlens_q != NULL, p->total_q, p->q_batch_stride, p->o_batch_stride},
        {"cu_seqlens_k", "total_k", "k_batch_stride", "v_batch_stride",
         p->cu_seqlens_k != NULL && !paged, p->cu_seqlens_k != NULL, p->total_k, p->k_batch_stride,
         p->v_batch_stride},
    };
    for (int i = 0; i < 2; ++i) {
        if (!packs[i].packed) {
            if (packs[i].total != 0)
                return fa_fail(FLASHATTN_STATUS_BAD_VARLEN,
                               "%s is %lld but %s; it must be 0 unless %s packs the tensor",
                               packs[i].total_name, (ll)packs[i].total,
                               packs[i].has_array ? "K and V are paged (block_table is set)"
                                                  : (i == 0 ? "cu_seqlens_q is NULL" : "cu_seqlens_k is NULL"),
                               packs[i].array);
            continue;
        }
        if (packs[i].total < 0 || packs[i].total > INT32_MAX)
            return fa_fail(FLASHATTN_STATUS_BAD_SHAPE, "%s is %lld; it must be in 0..%d (int32 offsets)",
                           packs[i].total_name, (ll)packs[i].total, INT32_MAX);
        if (packs[i].stride1 != 0 || packs[i].stride2 != 0)
            return fa_fail(FLASHATTN_STATUS_BAD_VARLEN,
                           "%s is %lld and %s %lld; with %s the tensors are packed [%s, heads, head_dim] "
                           "and both must be 0",
                           packs[i].t1, (ll)packs[i].stride1, packs[i].t2, (ll)packs[i].stride2,
                           packs[i].array, packs[i].total_name);
    }
    if (p->kv_batch_idx == NULL && p->kv_batch != 0)
        return fa_fail(FLASHATTN_STATUS_BAD_VARLEN, "kv_batch is %lld but kv_batch_idx is NULL; it must be 0",
                       (ll)p->kv_batch);
    if (p->kv_batch_idx != NULL) {
        if (paged || p->cu_seqlens_k != NULL)
            return fa_fail(FLASHATTN_STATUS_BAD_VARLEN,
                           "kv_batch_idx indexes a dense [kv_batch, seqlen_k, heads_kv, head_dim] cache; "
                           "it cannot be combined with %s",
                           paged ? "block_table (paged K/V)" : "cu_seqlens_k (packed K/V)");
        if (p->kv_batch < 1 || p->kv_batch > INT32_MAX)
            return fa_fail(FLASHATTN_STATUS_BAD_VARLEN, "kv_batch is %lld; with kv_batch_idx it must be in 1..%d",
                           (ll)p->kv_batch, INT32_MAX);
    }
    if (p->cache_leftpad != NULL && paged)
        return fa_fail(FLASHATTN_STATUS_BAD_PAGED_KV,
                       "cache_leftpad is set with block_table: left padding applies to dense, indexed or "
                       "packed K/V, not to pages (give each sequence its pages from its first key instead)");
    if (p->reserved1 != 0)
        return fa_fail(FLASHATTN_STATUS_BAD_STRUCT_SIZE,
                       "params->reserved1 is %d; it must be 0 (call flashattn_fwd_params_init)", (int)p->reserved1);
    const struct { const char *name; const int32_t *ptr; } lists[] = {
        {"kv_indptr", p->kv_indptr}, {"kv_last_page_len", p->kv_last_page_len}};
    for (size_t i = 0; i < FA_COUNT(lists); ++i)
        if (((uintptr_t)lists[i].ptr) % 4 != 0)
            return fa_fail(FLASHATTN_STATUS_MISALIGNED_POINTER, "%s = %p is not aligned to its 4-byte element size",
                           lists[i].name, (const void *)lists[i].ptr);
    if (p->kv_indptr == NULL && (p->kv_last_page_len != NULL || p->num_page_indices != 0))
        return fa_fail(FLASHATTN_STATUS_BAD_PAGED_KV, "%s is set but kv_indptr is NULL; page lists need kv_indptr",
                       p->kv_last_page_len != NULL ? "kv_last_page_len" : "num_page_indices");
    if (p->kv_indptr != NULL) {
        if (!paged)
            return fa_fail(FLASHATTN_STATUS_BAD_PAGED_KV,
                           "kv_indptr is set but block_table is NULL; the page lists index block_table");
        if (p->block_table_batch_stride != 0)
            return fa_fail(FLASHATTN_STATUS_BAD_PAGED_KV,
                           "block_table_batch_stride is %lld with kv_indptr; page lists have no row stride (0)",
                           (ll)p->block_table_batch_stride);
        if (p->num_page_indices < 1 || p->num_page_indices > INT32_MAX)
            return fa_fail(FLASHATTN_STATUS_BAD_PAGED_KV, "num_page_indices is %lld; with kv_indptr it must be in 1..%d",
                           (ll)p->num_page_indices, INT32_MAX);
    }
    if (!paged) {
        const struct { const char *name; int64_t value; } pg[] = {
            {"page_size", p->page_size}, {"num_pages", p->num_pages},
            {"pages_per_seq", p->pages_per_seq}, {"block_table_batch_stride", p->block_table_batch_stride},
        };
        for (size_t i = 0; i < FA_COUNT(pg); ++i)
            if (pg[i].value != 0)
                return fa_fail(FLASHATTN_STATUS_BAD_PAGED_KV, "%s is %lld but block_table is NULL; it must be 0",
                               pg[i].name, (ll)pg[i].value);
        return FLASHATTN_STATUS_SUCCESS;
    }
    const struct { const char *name; int64_t value, max; } pg[] = {
        {"page_size", p->page_size, FA_MAX_SEQLEN},
        {"num_pages", p->num_pages, INT32_MAX},
        {"pages_per_seq", p->pages_per_seq, INT32_MAX},
    };
    for (size_t i = 0; i < FA_COUNT(pg); ++i)
        if (pg[i].value < 1 || pg[i].value > pg[i].max)
            return fa_fail(FLASHATTN_STATUS_BAD_PAGED_KV, "%s is %lld; with block_table it must be in 1..%lld",
                           pg[i].name, (ll)pg[i].value, (ll)pg[i].max);
    if (p->kv_indptr == NULL &&
        (p->block_table_batch_stride < 0 || (p->batch > 1 && p->block_table_batch_stride < p->pages_per_seq)))
        return fa_fail(FLASHATTN_STATUS_BAD_PAGED_KV,
                       "block_table_batch_stride is %lld; it must be >= pages_per_seq (%lld)",
                       (ll)p->block_table_batch_stride, (ll)p->pages_per_seq);
    int64_t last = 0;
    /* (the last entry's index below INT64_MAX / 4, so that its end, (last + 1) x 4 bytes, fits) */
    if (!add_mul_ok(p->batch - 1, p->block_table_batch_stride, p->pages_per_seq - 1, &last) || last >= INT64_MAX / 4)
        return fa_fail(FLASHATTN_STATUS_INDEX_OVERFLOW,
                       "block_table: (batch - 1) x block_table_batch_stride + pages_per_seq (%lld x %lld + %lld) "
                       "int32 elements overflow int64 bytes",
                       (ll)(p->batch - 1), (ll)p->block_table_batch_stride, (ll)p->pages_per_seq);
    if (p->seqlen_k > p->pages_per_seq * p->page_size) /* both <= 2^31: no overflow */
        return fa_fail(FLASHATTN_STATUS_BAD_PAGED_KV,
                       "seqlen_k (the key capacity) is %lld but a block-table row holds pages_per_seq x "
                       "page_size = %lld x %lld = %lld keys",
                       (ll)p->seqlen_k, (ll)p->pages_per_seq, (ll)p->page_size,
                       (ll)(p->pages_per_seq * p->page_size));
    return FLASHATTN_STATUS_SUCCESS;
}

flashattn_status fa_validate(const flashattn_fwd_params *p) {
    flashattn_fwd_params full;
    return fa_validate_load(p, &full);
}

flashattn_status fa_validate_load(const flashattn_fwd_params *caller, flashattn_fwd_params *full) {
    flashattn_status st = fa_fwd_params_load(caller, full);
    if (st != FLASHATTN_STATUS_SUCCESS) return st;
    const flashattn_fwd_params *p = full;
    if (p->reserved0 != 0)
        return fa_fail(FLASHATTN_STATUS_BAD_STRUCT_SIZE,
                       "params->reserved0 is %d; it must be 0 (call flashattn_fwd_params_init)",
                       (int)p->reserved0);
    if (p->dtype != FLASHATTN_DTYPE_FLOAT16 && p->dtype != FLASHATTN_DTYPE_BFLOAT16)
        return fa_fail(FLASHATTN_STATUS_BAD_DTYPE, "dtype is %d; expected 0 (float16) or 1 (bfloat16)",
                       (int)p->dtype);
    if (p->mask < FLASHATTN_MASK_NONE || p->mask > FLASHATTN_MASK_CAUSAL_TOP_LEFT)
        return fa_fail(FLASHATTN_STATUS_BAD_MASK, "mask is %d; expected 0, 1 or 2", (int)p->mask);
    if (p->backend < FLASHATTN_BACKEND_AUTO || p->backend > FLASHATTN_BACKEND_FUSED_SM90)
        return fa_fail(FLASHATTN_STATUS_BAD_BACKEND, "backend is %d; expected 0, 1, 2 or 3",
                       (int)p->backend);

    const struct { const char *name; int64_t value, min, max; } dims[] = {
        {"batch", p->batch, 1, INT32_MAX},
        {"seqlen_q", p->seqlen_q, 0, FA_MAX_SEQLEN},
        {"seqlen_k", p->seqlen_k, 0, FA_MAX_SEQLEN},
        {"heads_q", p->heads_q, 1, INT32_MAX},
        {"heads_kv", p->heads_kv, 1, INT32_MAX},
        {"head_dim", p->head_dim, 1, INT64_MAX},
    };
    for (size_t i = 0; i < sizeof dims / sizeof dims[0]; ++i) {
        if (dims[i].value < dims[i].min)
            return fa_fail(FLASHATTN_STATUS_BAD_SHAPE, "%s is %lld; it must be >= %lld",
                           dims[i].name, (ll)dims[i].value, (ll)dims[i].min);
        if (dims[i].value > dims[i].max)
            return fa_fail(FLASHATTN_STATUS_BAD_SHAPE, "%s is %lld; the largest supported is %lld",
                           dims[i].name, (ll)dims[i].value, (ll)dims[i].max);
    }
    if (p->heads_q % p->heads_kv != 0)
        return fa_fail(FLASHATTN_STATUS_BAD_HEAD_GROUPING,
                       "heads_q (%lld) is not a multiple of heads_kv (%lld)", (ll)p->heads_q,
                       (ll)p->heads_kv);
    if (p->head_dim > FA_MAX_HEAD_DIM)
        return fa_fail(FLASHATTN_STATUS_UNSUPPORTED_HEAD_DIM,
                       "head_dim is %lld; supported head dims are 1..%d", (ll)p->head_dim,
                       FA_MAX_HEAD_DIM);

    st = check_serving(p);
    if (st != FLASHATTN_STATUS_SUCCESS) return st;
    st = check_append(p);
    if (st != FLASHATTN_STATUS_SUCCESS) return st;
    int64_t q_outer, q_rows, k_outer, k_rows;
    fa_outer_extents(p, &q_outer, &q_rows, &k_outer, &k_rows);
    const tensor_desc tensors[4] = {
        {"q", p->q, {q_outer, q_rows, p->heads_q, p->head_dim},
         {p->q_batch_stride, p->q_seq_stride, p->q_head_stride, 1}},
        {"k", p->k, {k_outer, k_rows, p->heads_kv, p->head_dim},
         {p->k_batch_stride, p->k_seq_stride, p->k_head_stride, 1}},
        {"v", p->v, {k_outer, k_rows, p->heads_kv, p->head_dim},
         {p->v_batch_stride, p->v_seq_stride, p->v_head_stride, 1}},
        {"o", p->o, {q_outer, q_rows, p->heads_q, p->head_dim},
         {p->o_batch_stride, p->o_seq_stride, p->o_head_stride, 1}},
    };
    for (int i = 0; i < 4; ++i) {
        st = check_tensor(&tensors[i]);
        if (st != FLASHATTN_STATUS_SUCCESS) return st;
    }
    st = check_no_self_overlap(&tensors[3]);
    if (st != FLASHATTN_STATUS_SUCCESS) return st;

    if (p->lse != NULL && ((uintptr_t)p->lse) % 4 != 0)
        return fa_fail(FLASHATTN_STATUS_MISALIGNED_POINTER,
                       "lse = %p is not aligned to its 4-byte element size", (void *)p->lse);
    /* LSE is float32 [batch, heads_q, seqlen_q] (packed: [heads_q, total_q]), contiguous: its bytes
     * must be addressable. */
    int64_t lse_elems = 0;
    if (p->lse != NULL && (!add_mul_ok(q_outer, p->heads_q, 0, &lse_elems) ||
                           !add_mul_ok(lse_elems, q_rows, 0, &lse_elems) ||
                           lse_elems > INT64_MAX / 4))
        return fa_fail(FLASHATTN_STATUS_INDEX_OVERFLOW,
                       "lse: %s x heads_q x %s (%lld x %lld x %lld) float32 elements overflow "
                       "int64 bytes", p->cu_seqlens_q ? "1" : "batch", p->cu_seqlens_q ? "total_q" : "seqlen_q",
                       (ll)q_outer, (ll)p->heads_q, (ll)q_rows);
    if (p->alibi_slopes != NULL && ((uintptr_t)p->alibi_slopes) % 4 != 0)
        return fa_fail(FLASHATTN_STATUS_MISALIGNED_POINTER,
                       "alibi_slopes = %p is not aligned to its 4-byte element size",
                       (const void *)p->alibi_slopes);
    if (p->alibi_batch_stride < 0 ||
        (p->alibi_batch_stride != 0 && p->alibi_batch_stride < p->heads_q))
        return fa_fail(FLASHATTN_STATUS_BAD_STRIDE,
                       "alibi_batch_stride is %lld; it must be 0 or >= heads_q (%lld)",
                       (ll)p->alibi_batch_stride, (ll)p->heads_q);
    /* The last slope, (batch - 1) * alibi_batch_stride + heads_q - 1: its end, (last + 1) x 4
     * bytes, must fit in int64. */
    int64_t alibi_last = 0;
    if (p->alibi_slopes != NULL &&
        (!add_mul_ok(p->batch - 1, p->alibi_batch_stride, p->heads_q - 1, &alibi_last) ||
         alibi_last >= INT64_MAX / 4))
        return fa_fail(FLASHATTN_STATUS_INDEX_OVERFLOW,
                       "alibi_slopes: (batch - 1) x alibi_batch_stride + heads_q (%lld x %lld + %lld) "
                       "float32 elements overflow int64 bytes",
                       (ll)(p->batch - 1), (ll)p->alibi_batch_stride, (ll)p->heads_q);

    if (!isfinite(p->softmax_scale) || p->softmax_scale < 0.0f)
        return fa_fail(FLASHATTN_STATUS_BAD_SCALE,
                       "softmax_scale is %g; it must be finite and > 0 (or 0 for the default)",
                       (double)p->softmax_scale);
    if (!isfinite(p->softcap) || p->softcap < 0.0f)
        return fa_fail(FLASHATTN_STATUS_BAD_SOFTCAP,
                       "softcap is %g; it must be finite and >= 0 (0 disables it)",
                       (double)p->softcap);
    /* The kernels work in log2 units with the scale folded in, in float32: scale * log2(e),
     * scale / softcap and softcap * log2(e) must all be finite floats. */
    const double scale = p->softmax_scale > 0.0f ? (double)p->softmax_scale : 1.0 / sqrt((double)p->head_dim);
    if (scale * FA_LOG2E > FLT_MAX)
        return fa_fail(FLASHATTN_STATUS_BAD_SCALE,
                       "softmax_scale is %g; scale x log2(e) must fit a float (softmax_scale <= %g)",
                       (double)p->softmax_scale, FLT_MAX / FA_LOG2E);
    if (p->softcap > 0.0f && (scale / (double)p->softcap > FLT_MAX || (double)p->softcap * FA_LOG2E > FLT_MAX))
        return fa_fail(FLASHATTN_STATUS_BAD_SOFTCAP,
                       "softcap is %g with softmax_scale %g; softmax_scale / softcap and softcap x log2(e) "
                       "must fit a float",
                       (double)p->softcap, scale);
    if (p->window_left < -1)
        return fa_fail(FLASHATTN_STATUS_BAD_WINDOW,
                       "window_left is %lld; it must be >= 0, or -1 for unbounded",
                       (ll)p->window_left);
    if (p->window_right < -1)
        return fa_fail(FLASHATTN_STATUS_BAD_WINDOW,
                       "window_right is %lld; it must be >= 0, or -1 for unbounded",
                       (ll)p->window_right);
    return FLASHATTN_STATUS_SUCCESS;
}
