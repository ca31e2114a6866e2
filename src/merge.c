/*
 * merge.c - flashattn_merge: validation of flashattn_merge_params (each bad input its own status and
 * a message naming the field) and the launch of the merge kernel (kernels/merge.cu).
 */
#include <string.h>

#include <cuda_runtime_api.h>

#include "internal.h"

typedef long long ll;

static const size_t fa_merge_sizes[] = {FLASHATTN_MERGE_PARAMS_SIZE_0_2, sizeof(flashattn_merge_params)};

static int merge_size_known(size_t size) { return fa_size_known(fa_merge_sizes, FA_COUNT(fa_merge_sizes), size); }

static void merge_defaults(flashattn_merge_params *p) {
    memset(p, 0, sizeof *p);
    p->struct_size = sizeof *p;
    p->dtype_parts = FLASHATTN_DTYPE_FLOAT32;
    p->dtype_out = FLASHATTN_DTYPE_FLOAT16;
    p->lse_base = FLASHATTN_LSE_NATURAL;
}

flashattn_status flashattn_merge_params_init_size(flashattn_merge_params *params, size_t struct_size) {
    fa_clear_error();
    if (params == NULL) return fa_fail(FLASHATTN_STATUS_NULL_POINTER, "params is NULL");
    if (!merge_size_known(struct_size))
        return fa_fail(FLASHATTN_STATUS_BAD_STRUCT_SIZE,
                       "struct_size is %zu; this library knows flashattn_merge_params sizes %zu (0.2.0) to %zu",
                       struct_size, (size_t)FLASHATTN_MERGE_PARAMS_SIZE_0_2, sizeof(flashattn_merge_params));
    flashattn_merge_params full;
    merge_defaults(&full);
    full.struct_size = struct_size;
    memcpy(params, &full, struct_size);
    return FLASHATTN_STATUS_SUCCESS;
}

static int elem_bytes(int32_t dtype) { return dtype == FLASHATTN_DTYPE_FLOAT32 ? 4 : 2; }

/* A tensor's end in bytes (one past its last element: extents x strides, element size) fits int64:
 * 1, else 0. */
static int extent_fits(int n, const int64_t *extent, const int64_t *stride, int elem) {
    int64_t off = 0;
    for (int i = 0; i < n; ++i) {
        if (extent[i] == 0) return 1;
        if (stride[i] != 0 && extent[i] - 1 > (INT64_MAX - off) / stride[i]) return 0;
        off += (extent[i] - 1) * stride[i];
    }
    return off <= INT64_MAX / elem - 1;
}

typedef struct merge_tensor {
    const char *name;
    const void *ptr;
    int ndim, elem;
    int64_t extent[5], stride[5];
    const char *stride_names[5];
} merge_tensor;

static flashattn_status check_merge_tensor(const merge_tensor *t, int required, int64_t rows) {
    for (int i = 0; i < t->ndim; ++i)
        if (t->stride[i] < 0)
            return fa_fail(FLASHATTN_STATUS_BAD_STRIDE, "%s is %lld; strides must be >= 0", t->stride_names[i],
                           (ll)t->stride[i]);
    int64_t numel = 1;
    for (int i = 0; i < t->ndim; ++i) numel = t->extent[i] == 0 ? 0 : numel;
    if (numel == 0) return FLASHATTN_STATUS_SUCCESS;
    if (t->ptr == NULL) {
        if (!required) return FLASHATTN_STATUS_SUCCESS;
        return fa_fail(FLASHATTN_STATUS_NULL_POINTER, "%s is NULL but the merge has %lld rows", t->name, (ll)rows);
    }
    if (((uintptr_t)t->ptr) % (uintptr_t)t->elem != 0)
        return fa_fail(FLASHATTN_STATUS_MISALIGNED_POINTER, "%s = %p is not aligned to its %d-byte element size",
                       t->name, t->ptr, t->elem);
    if (!extent_fits(t->ndim, t->extent, t->stride, t->elem))
        return fa_fail(FLASHATTN_STATUS_INDEX_OVERFLOW, "%s: extents x strides (%s, ...) overflow int64 bytes",
                       t->name, t->stride_names[0]);
    return FLASHATTN_STATUS_SUCCESS;
}

/* Validates the caller's params (read into *p with defaults past their struct_size) and fills *a. */
static flashattn_status merge_validate(const flashattn_merge_params *caller, fa_merge_args *a) {
    if (caller == NULL) return fa_fail(FLASHATTN_STATUS_NULL_POINTER, "params is NULL");
    if (!merge_size_known(caller->struct_size))
        return fa_fail(FLASHATTN_STATUS_BAD_STRUCT_SIZE,
                       "params->struct_size is %zu; this library knows flashattn_merge_params sizes %zu (0.2.0) "
                       "to %zu (call flashattn_merge_params_init)",
                       caller->struct_size, (size_t)FLASHATTN_MERGE_PARAMS_SIZE_0_2, sizeof(flashattn_merge_params));
    flashattn_merge_params p;
    merge_defaults(&p);
    memcpy(&p, caller, caller->struct_size);
    if (p.reserved0 != 0)
        return fa_fail(FLASHATTN_STATUS_BAD_STRUCT_SIZE, "params->reserved0 is %d; it must be 0", (int)p.reserved0);
    const struct { const char *name; int32_t value; } dtypes[2] = {{"dtype_parts", p.dtype_parts},
                                                                   {"dtype_out", p.dtype_out}};
    for (int i = 0; i < 2; ++i)
        if (dtypes[i].value < FLASHATTN_DTYPE_FLOAT16 || dtypes[i].value > FLASHATTN_DTYPE_FLOAT32)
            return fa_fail(FLASHATTN_STATUS_BAD_DTYPE, "%s is %d; expected 0 (float16), 1 (bfloat16) or 2 (float32)",
                           dtypes[i].name, (int)dtypes[i].value);
    if (p.lse_base != FLASHATTN_LSE_NATURAL && p.lse_base != FLASHATTN_LSE_BASE2)
        return fa_fail(FLASHATTN_STATUS_BAD_LSE_BASE, "lse_base is %d; expected 0 (natural) or 1 (base 2)",
                       (int)p.lse_base);
    const struct { const char *name; int64_t value, min; } dims[] = {
        {"num_parts", p.num_parts, 1}, {"batch", p.batch, 1}, {"seqlen", p.seqlen, 0},
        {"heads", p.heads, 1},         {"head_dim", p.head_dim, 1},
    };
    for (size_t i = 0; i < sizeof dims / sizeof dims[0]; ++i)
        if (dims[i].value < dims[i].min || dims[i].value > INT32_MAX)
            return fa_fail(FLASHATTN_STATUS_BAD_SHAPE, "%s is %lld; it must be in %lld..%d", dims[i].name,
                           (ll)dims[i].value, (ll)dims[i].min, INT32_MAX);
    /* Each is below 2^31, so the first product fits; the kernel indexes elements in int64. */
    if (p.batch * p.seqlen > INT64_MAX / p.heads || p.batch * p.seqlen * p.heads > INT64_MAX / p.head_dim)
        return fa_fail(FLASHATTN_STATUS_INDEX_OVERFLOW,
                       "batch x seqlen x heads x head_dim (%lld x %lld x %lld x %lld) overflows int64",
                       (ll)p.batch, (ll)p.seqlen, (ll)p.heads, (ll)p.head_dim);
    const merge_tensor tensors[4] = {
        {"o_parts", p.o_parts, 5, elem_bytes(p.dtype_parts),
         {p.num_parts, p.batch, p.seqlen, p.heads, p.head_dim},
         {p.o_part_stride, p.o_batch_stride, p.o_seq_stride, p.o_head_stride, 1},
         {"o_part_stride", "o_batch_stride", "o_seq_stride", "o_head_stride", "head_dim"}},
        {"lse_parts", p.lse_parts, 4, 4, {p.num_parts, p.batch, p.heads, p.seqlen},
         {p.lse_part_stride, p.lse_batch_stride, p.lse_head_stride, p.lse_seq_stride},
         {"lse_part_stride", "lse_batch_stride", "lse_head_stride", "lse_seq_stride"}},
        {"o", p.o, 4, elem_bytes(p.dtype_out), {p.batch, p.seqlen, p.heads, p.head_dim},
         {p.out_batch_stride, p.out_seq_stride, p.out_head_stride, 1},
         {"out_batch_stride", "out_seq_stride", "out_head_stride", "head_dim"}},
        {"lse", p.lse, 3, 4, {p.batch, p.heads, p.seqlen},
         {p.lse_out_batch_stride, p.lse_out_head_stride, p.lse_out_seq_stride},
         {"lse_out_batch_stride", "lse_out_head_stride", "lse_out_seq_stride"}},
    };
    for (int i = 0; i < 4; ++i) {
        const flashattn_status st = check_merge_tensor(&tensors[i], i < 3, p.batch * p.seqlen * p.heads);
        if (st != FLASHATTN_STATUS_SUCCESS) return st;
    }
    memset(a, 0, sizeof *a);
    a->o_parts = p.o_parts, a->lse_parts = p.lse_parts, a->o = p.o, a->lse = p.lse;
    a->o_part_stride = p.o_part_stride, a->o_batch_stride = p.o_batch_stride;
    a->o_seq_stride = p.o_seq_stride, a->o_head_stride = p.o_head_stride;
    a->lse_part_stride = p.lse_part_stride, a->lse_batch_stride = p.lse_batch_stride;
    a->lse_head_stride = p.lse_head_stride, a->lse_seq_stride = p.lse_seq_stride;
    a->out_batch_stride = p.out_batch_stride, a->out_seq_stride = p.out_seq_stride;
    a->out_head_stride = p.out_head_stride;
    a->lse_out_batch_stride = p.lse_out_batch_stride, a->lse_out_head_stride = p.lse_out_head_stride;
    a->lse_out_seq_stride = p.lse_out_seq_stride;
    a->num_parts = (int32_t)p.num_parts, a->batch = (int32_t)p.batch, a->seqlen = (int32_t)p.seqlen;
    a->heads = (int32_t)p.heads, a->head_dim = (int32_t)p.head_dim;
    a->dtype_parts = p.dtype_parts, a->dtype_out = p.dtype_out, a->base2 = p.lse_base == FLASHATTN_LSE_BASE2;
    return FLASHATTN_STATUS_SUCCESS;
}

flashattn_status fa_merge_check(const flashattn_merge_params *p) {
    fa_merge_args a;
    return merge_validate(p, &a);
}

flashattn_status flashattn_merge(const flashattn_handle *h, const flashattn_merge_params *params, void *stream) {
    fa_clear_error();
    if (h == NULL) return fa_fail(FLASHATTN_STATUS_NULL_POINTER, "handle is NULL");
    fa_merge_args a;
    flashattn_status st = merge_validate(params, &a);
    if (st != FLASHATTN_STATUS_SUCCESS) return st;
    int current = -1;
    cudaError_t err = cudaGetDevice(&current);
    if (err != cudaSuccess)
        return fa_fail(FLASHATTN_STATUS_CUDA_ERROR, "cudaGetDevice failed: %s", cudaGetErrorString(err));
    if (current != h->caps.device)
        return fa_fail(FLASHATTN_STATUS_WRONG_DEVICE,
                       "the current device is %d but the handle was created for device %d", current, h->caps.device);
    const int rc = fa_merge_launch(&a, stream);
    if (rc != 0)
        return fa_fail(FLASHATTN_STATUS_CUDA_ERROR, "launching the merge kernel failed: %s",
                       cudaGetErrorString((cudaError_t)rc));
    return FLASHATTN_STATUS_SUCCESS;
}
