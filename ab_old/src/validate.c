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
    /* The largest element offset, and in bytes, must fit int64. */
    int64_t off = 0;
    for (int i = 0; i < 4; ++i) {
        if (!add_mul_ok(t->extent[i] - 1, t->stride[i], off, &off))
            return fa_fail(FLASHATTN_STATUS_INDEX_OVERFLOW,
                           "%s: (extent - 1) x stride overflows int64 at dimension %d (extent %lld, "
                           "stride %lld)",
                           t->name, i, (ll)t->extent[i], (ll)t->stride[i]);
    }
    if (off > INT64_MAX / 2)
        return fa_fail(FLASHATTN_STATUS_INDEX_OVERFLOW,
                       "%s: largest byte offset (2 x %lld) overflows int64", t->name, (ll)off);
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

    const tensor_desc tensors[4] = {
        {"q", p->q, {p->batch, p->seqlen_q, p->heads_q, p->head_dim},
         {p->q_batch_stride, p->q_seq_stride, p->q_head_stride, 1}},
        {"k", p->k, {p->batch, p->seqlen_k, p->heads_kv, p->head_dim},
         {p->k_batch_stride, p->k_seq_stride, p->k_head_stride, 1}},
        {"v", p->v, {p->batch, p->seqlen_k, p->heads_kv, p->head_dim},
         {p->v_batch_stride, p->v_seq_stride, p->v_head_stride, 1}},
        {"o", p->o, {p->batch, p->seqlen_q, p->heads_q, p->head_dim},
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
    /* LSE is float32 [batch, heads_q, seqlen_q], contiguous: its bytes must be addressable. */
    int64_t lse_elems = 0;
    if (p->lse != NULL && (!add_mul_ok(p->batch, p->heads_q, 0, &lse_elems) ||
                           !add_mul_ok(lse_elems, p->seqlen_q, 0, &lse_elems) ||
                           lse_elems > INT64_MAX / 4))
        return fa_fail(FLASHATTN_STATUS_INDEX_OVERFLOW,
                       "lse: batch x heads_q x seqlen_q (%lld x %lld x %lld) float32 elements overflow "
                       "int64 bytes", (ll)p->batch, (ll)p->heads_q, (ll)p->seqlen_q);
    if (p->alibi_slopes != NULL && ((uintptr_t)p->alibi_slopes) % 4 != 0)
        return fa_fail(FLASHATTN_STATUS_MISALIGNED_POINTER,
                       "alibi_slopes = %p is not aligned to its 4-byte element size",
                       (const void *)p->alibi_slopes);
    if (p->alibi_batch_stride < 0 ||
        (p->alibi_batch_stride != 0 && p->alibi_batch_stride < p->heads_q))
        return fa_fail(FLASHATTN_STATUS_BAD_STRIDE,
                       "alibi_batch_stride is %lld; it must be 0 or >= heads_q (%lld)",
                       (ll)p->alibi_batch_stride, (ll)p->heads_q);
    /* The last slope, (batch - 1) * alibi_batch_stride + heads_q - 1, in float32 bytes. */
    int64_t alibi_last = 0;
    if (p->alibi_slopes != NULL &&
        (!add_mul_ok(p->batch - 1, p->alibi_batch_stride, p->heads_q - 1, &alibi_last) ||
         alibi_last > INT64_MAX / 4))
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
