/*
 * api.c - the exported entry points: handle lifetime, params helpers, the planning queries and the
 * forward call. Each entry point clears the thread's last error, and every failure sets it.
 */
#include <stdlib.h>
#include <string.h>

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "internal.h"

/* ---- handle ---------------------------------------------------------------------------------- */

/* Why there is no usable device, in words a person with no GPU, or no driver, can act on. */
static flashattn_status no_device(cudaError_t err) {
    int driver = 0, runtime = 0;
    (void)cudaDriverGetVersion(&driver);
    (void)cudaRuntimeGetVersion(&runtime);
    (void)cudaGetLastError(); /* reset the runtime's last error so the caller's next check is clean */
    if (err == cudaSuccess || err == cudaErrorNoDevice)
        return fa_fail(FLASHATTN_STATUS_NO_DEVICE,
                       "no CUDA device is visible (the NVIDIA driver sees no GPU%s)",
                       getenv("CUDA_VISIBLE_DEVICES") ? "; CUDA_VISIBLE_DEVICES is set" : "");
    if (driver == 0)
        return fa_fail(FLASHATTN_STATUS_NO_DEVICE,
                       "no NVIDIA driver is loaded, so this machine has no usable CUDA device "
                       "(cudaGetDeviceCount: %s)",
                       cudaGetErrorString(err));
    if (err == cudaErrorInsufficientDriver)
        return fa_fail(FLASHATTN_STATUS_NO_DEVICE,
                       "the NVIDIA driver supports CUDA %d.%d but this library was built with CUDA %d.%d; "
                       "update the driver",
                       driver / 1000, driver % 1000 / 10, runtime / 1000, runtime % 1000 / 10);
    return fa_fail(FLASHATTN_STATUS_NO_DEVICE, "no usable CUDA device (cudaGetDeviceCount: %s)",
                   cudaGetErrorString(err));
}

static flashattn_status read_caps(int device, fa_device_caps *caps) {
    int count = 0;
    cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess || count == 0) return no_device(err);
    if (device == -1) {
        err = cudaGetDevice(&device);
        if (err != cudaSuccess)
            return fa_fail(FLASHATTN_STATUS_CUDA_ERROR, "cudaGetDevice failed: %s",
                           cudaGetErrorString(err));
    }
    if (device < 0 || device >= count)
        return fa_fail(FLASHATTN_STATUS_NO_DEVICE, "device is %d; this machine has devices 0..%d",
                       device, count - 1);
    int smem_optin = 0, l2 = 0;
    caps->device = device;
    const struct { enum cudaDeviceAttr attr; int *dst; const char *name; } attrs[] = {
        {cudaDevAttrComputeCapabilityMajor, &caps->cc_major, "ComputeCapabilityMajor"},
        {cudaDevAttrComputeCapabilityMinor, &caps->cc_minor, "ComputeCapabilityMinor"},
        {cudaDevAttrMultiProcessorCount, &caps->sm_count, "MultiProcessorCount"},
        {cudaDevAttrMaxSharedMemoryPerBlockOptin, &smem_optin, "MaxSharedMemoryPerBlockOptin"},
        {cudaDevAttrL2CacheSize, &l2, "L2CacheSize"},
    };
    for (size_t i = 0; i < sizeof attrs / sizeof attrs[0]; ++i) {
        err = cudaDeviceGetAttribute(attrs[i].dst, attrs[i].attr, device);
        if (err != cudaSuccess)
            return fa_fail(FLASHATTN_STATUS_CUDA_ERROR, "cudaDeviceGetAttribute(%s) failed: %s",
                           attrs[i].name, cudaGetErrorString(err));
    }
    caps->smem_per_block_optin = smem_optin;
    caps->l2_bytes = l2;
    if (caps->cc_major < 8)
        return fa_fail(FLASHATTN_STATUS_DEVICE_TOO_OLD,
                       "device %d has compute capability %d.%d; libflashattn needs 8.0 or newer",
                       device, caps->cc_major, caps->cc_minor);
    return FLASHATTN_STATUS_SUCCESS;
}

flashattn_status flashattn_handle_create(flashattn_handle **handle, int device) {
    fa_clear_error();
    if (handle == NULL) return fa_fail(FLASHATTN_STATUS_NULL_POINTER, "handle (the output) is NULL");
    *handle = NULL;
    fa_device_caps caps;
    memset(&caps, 0, sizeof caps);
    flashattn_status st = read_caps(device, &caps);
    if (st != FLASHATTN_STATUS_SUCCESS) return st;

    flashattn_handle *h = (flashattn_handle *)calloc(1, sizeof *h);
    if (h == NULL)
        return fa_fail(FLASHATTN_STATUS_OUT_OF_HOST_MEMORY, "calloc(%zu) failed", sizeof *h);
    h->caps = caps;
    if (pthread_mutex_init(&h->cublas_lock, NULL) != 0) {
        free(h);
        return fa_fail(FLASHATTN_STATUS_OUT_OF_HOST_MEMORY, "pthread_mutex_init failed");
    }
    /* cublasCreate binds to the current device: switch to ours and back. */
    int prev = 0;
    cudaError_t err = cudaGetDevice(&prev);
    if (err == cudaSuccess) err = cudaSetDevice(caps.device);
    if (err != cudaSuccess) {
        pthread_mutex_destroy(&h->cublas_lock);
        free(h);
        return fa_fail(FLASHATTN_STATUS_CUDA_ERROR, "selecting device %d failed: %s", caps.device,
                       cudaGetErrorString(err));
    }
    cublasHandle_t cb = NULL;
    cublasStatus_t cst = cublasCreate(&cb);
    if (cst == CUBLAS_STATUS_SUCCESS) cst = cublasSetMathMode(cb, CUBLAS_DEFAULT_MATH);
    err = cudaSetDevice(prev);
    if (cst != CUBLAS_STATUS_SUCCESS || err != cudaSuccess) {
        if (cb) cublasDestroy(cb);
        pthread_mutex_destroy(&h->cublas_lock);
        free(h);
        if (cst != CUBLAS_STATUS_SUCCESS)
            return fa_fail(FLASHATTN_STATUS_CUBLAS_ERROR, "cublasCreate failed: %s",
                           cublasGetStatusString(cst));
        return fa_fail(FLASHATTN_STATUS_CUDA_ERROR, "restoring device %d failed: %s", prev,
                       cudaGetErrorString(err));
    }
    h->cublas = cb;
    *handle = h;
    return FLASHATTN_STATUS_SUCCESS;
}

flashattn_status flashattn_handle_destroy(flashattn_handle *handle) {
    fa_clear_error();
    if (handle == NULL) return FLASHATTN_STATUS_SUCCESS;
    cublasStatus_t cst = cublasDestroy((cublasHandle_t)handle->cublas);
    pthread_mutex_destroy(&handle->cublas_lock);
    free(handle);
    if (cst != CUBLAS_STATUS_SUCCESS)
        return fa_fail(FLASHATTN_STATUS_CUBLAS_ERROR, "cublasDestroy failed: %s",
                       cublasGetStatusString(cst));
    return FLASHATTN_STATUS_SUCCESS;
}

flashattn_status flashattn_handle_device(const flashattn_handle *handle, int *device) {
    fa_clear_error();
    if (handle == NULL) return fa_fail(FLASHATTN_STATUS_NULL_POINTER, "handle is NULL");
    if (device == NULL) return fa_fail(FLASHATTN_STATUS_NULL_POINTER, "device (the output) is NULL");
    *device = handle->caps.device;
    return FLASHATTN_STATUS_SUCCESS;
}

/* ---- params ---------------------------------------------------------------------------------- */

/* The released sizes of each growable struct, oldest first; the last is this library's own. */
static const size_t fa_params_sizes[] = {FLASHATTN_FWD_PARAMS_SIZE_0_1, FLASHATTN_FWD_PARAMS_SIZE_0_3,
                                         FLASHATTN_FWD_PARAMS_SIZE_0_4};
_Static_assert(sizeof(flashattn_fwd_params) == FLASHATTN_FWD_PARAMS_SIZE_0_4,
               "a new field needs a new released size in fa_params_sizes");
static const size_t fa_plan_info_sizes[] = {FLASHATTN_PLAN_INFO_SIZE_0_1, sizeof(flashattn_plan_info)};

int fa_size_known(const size_t *sizes, size_t n, size_t size) {
    for (size_t i = 0; i < n; ++i)
        if (sizes[i] == size) return 1;
    return 0;
}

int fa_fwd_params_size_known(size_t size) { return fa_size_known(fa_params_sizes, FA_COUNT(fa_params_sizes), size); }
int fa_plan_info_size_known(size_t size) {
    return fa_size_known(fa_plan_info_sizes, FA_COUNT(fa_plan_info_sizes), size);
}

void fa_fwd_params_defaults(flashattn_fwd_params *p) {
    memset(p, 0, sizeof *p);
    p->struct_size = sizeof *p;
    p->dtype = FLASHATTN_DTYPE_FLOAT16;
    p->mask = FLASHATTN_MASK_NONE;
    p->backend = FLASHATTN_BACKEND_AUTO;
    p->window_left = -1;
    p->window_right = -1;
}

flashattn_status flashattn_fwd_params_init_size(flashattn_fwd_params *params, size_t struct_size) {
    fa_clear_error();
    if (params == NULL) return fa_fail(FLASHATTN_STATUS_NULL_POINTER, "params is NULL");
    if (!fa_fwd_params_size_known(struct_size))
        return fa_fail(FLASHATTN_STATUS_BAD_STRUCT_SIZE,
                       "struct_size is %zu; this library knows flashattn_fwd_params sizes %zu (0.1.0) "
                       "to %zu", struct_size, (size_t)FLASHATTN_FWD_PARAMS_SIZE_0_1,
                       sizeof(flashattn_fwd_params));
    flashattn_fwd_params full;
    fa_fwd_params_defaults(&full);
    full.struct_size = struct_size;
    memcpy(params, &full, struct_size);
    return FLASHATTN_STATUS_SUCCESS;
}

/* The exported 0.1.0 entry point (the header's macro of the same name calls _init_size). */
flashattn_status(flashattn_fwd_params_init)(flashattn_fwd_params *params) {
    return flashattn_fwd_params_init_size(params, FLASHATTN_FWD_PARAMS_SIZE_0_1);
}

flashattn_status fa_fwd_params_load(const flashattn_fwd_params *p, flashattn_fwd_params *full) {
    if (p == NULL) return fa_fail(FLASHATTN_STATUS_NULL_POINTER, "params is NULL");
    if (!fa_fwd_params_size_known(p->struct_size))
        return fa_fail(FLASHATTN_STATUS_BAD_STRUCT_SIZE,
                       "params->struct_size is %zu; this library knows flashattn_fwd_params sizes %zu "
                       "(0.1.0) to %zu (call flashattn_fwd_params_init)",
                       p->struct_size, (size_t)FLASHATTN_FWD_PARAMS_SIZE_0_1,
                       sizeof(flashattn_fwd_params));
    fa_fwd_params_defaults(full);
    memcpy(full, p, p->struct_size); /* the fields the caller knows; defaults for the rest */
    full->struct_size = sizeof *full;
    return FLASHATTN_STATUS_SUCCESS;
}

/* a * b for a, b >= 0; 0 on int64 overflow. */
static int mul_fits(int64_t a, int64_t b, int64_t *out) {
    if (a != 0 && b > INT64_MAX / a) return 0;
    *out = a * b;
    return 1;
}

flashattn_status flashattn_fwd_params_set_packed_strides(flashattn_fwd_params *p) {
    fa_clear_error();
    flashattn_fwd_params full;
    flashattn_status st = fa_fwd_params_load(p, &full);
    if (st != FLASHATTN_STATUS_SUCCESS) return st;
    const struct { const char *name; int64_t value; } dims[] = {
        {"batch", full.batch},     {"seqlen_q", full.seqlen_q}, {"seqlen_k", full.seqlen_k},
        {"heads_q", full.heads_q}, {"heads_kv", full.heads_kv}, {"head_dim", full.head_dim},
    };
    for (size_t i = 0; i < FA_COUNT(dims); ++i)
        if (dims[i].value < 0)
            return fa_fail(FLASHATTN_STATUS_BAD_SHAPE, "%s is %lld; it must be >= 0 to derive strides",
                           dims[i].name, (long long)dims[i].value);
    int64_t q_seq, q_batch, kv_seq, kv_batch;
    if (!mul_fits(full.heads_q, full.head_dim, &q_seq) || !mul_fits(full.seqlen_q, q_seq, &q_batch))
        return fa_fail(FLASHATTN_STATUS_INDEX_OVERFLOW,
                       "seqlen_q x heads_q x head_dim (%lld x %lld x %lld) overflows int64",
                       (long long)full.seqlen_q, (long long)full.heads_q, (long long)full.head_dim);
    if (!mul_fits(full.heads_kv, full.head_dim, &kv_seq) || !mul_fits(full.seqlen_k, kv_seq, &kv_batch))
        return fa_fail(FLASHATTN_STATUS_INDEX_OVERFLOW,
                       "seqlen_k x heads_kv x head_dim (%lld x %lld x %lld) overflows int64",
                       (long long)full.seqlen_k, (long long)full.heads_kv, (long long)full.head_dim);
    p->q_head_stride = p->o_head_stride = full.head_dim;
    p->q_seq_stride = p->o_seq_stride = q_seq;
    p->q_batch_stride = p->o_batch_stride = q_batch;
    p->k_head_stride = p->v_head_stride = full.head_dim;
    p->k_seq_stride = p->v_seq_stride = kv_seq;
    p->k_batch_stride = p->v_batch_stride = kv_batch;
    return FLASHATTN_STATUS_SUCCESS;
}

flashattn_status flashattn_plan_info_init_size(flashattn_plan_info *info, size_t struct_size) {
    fa_clear_error();
    if (info == NULL) return fa_fail(FLASHATTN_STATUS_NULL_POINTER, "info is NULL");
    if (!fa_plan_info_size_known(struct_size))
        return fa_fail(FLASHATTN_STATUS_BAD_STRUCT_SIZE,
                       "struct_size is %zu; this library knows flashattn_plan_info sizes %zu (0.1.0) "
                       "to %zu", struct_size, (size_t)FLASHATTN_PLAN_INFO_SIZE_0_1,
                       sizeof(flashattn_plan_info));
    memset(info, 0, struct_size);
    info->struct_size = struct_size;
    return FLASHATTN_STATUS_SUCCESS;
}

flashattn_status(flashattn_plan_info_init)(flashattn_plan_info *info) {
    return flashattn_plan_info_init_size(info, FLASHATTN_PLAN_INFO_SIZE_0_1);
}

/* ---- queries --------------------------------------------------------------------------------- */

static flashattn_status plan_for(const flashattn_handle *h, const flashattn_fwd_params *p,
                                 int ref_lowprec, fa_plan *plan) {
    if (h == NULL) return fa_fail(FLASHATTN_STATUS_NULL_POINTER, "handle is NULL");
    return fa_plan_make(&h->caps, p, ref_lowprec, plan);
}

flashattn_status fa_workspace_size_ex(const flashattn_handle *h, const flashattn_fwd_params *p,
                                      int ref_lowprec, size_t *bytes) {
    fa_clear_error();
    if (bytes == NULL) return fa_fail(FLASHATTN_STATUS_NULL_POINTER, "bytes (the output) is NULL");
    fa_plan plan;
    flashattn_status st = plan_for(h, p, ref_lowprec, &plan);
    if (st != FLASHATTN_STATUS_SUCCESS) return st;
    *bytes = (size_t)plan.workspace_bytes;
    return FLASHATTN_STATUS_SUCCESS;
}

flashattn_status flashattn_fwd_workspace_size(const flashattn_handle *h,
                                              const flashattn_fwd_params *p, size_t *bytes) {
    return fa_workspace_size_ex(h, p, 0, bytes);
}

flashattn_status flashattn_fwd_supported(const flashattn_handle *h, const flashattn_fwd_params *p) {
    fa_clear_error();
    fa_plan plan;
    return plan_for(h, p, 0, &plan);
}

flashattn_status flashattn_fwd_plan(const flashattn_handle *h, const flashattn_fwd_params *p,
                                    flashattn_plan_info *info) {
    fa_clear_error();
    if (info == NULL) return fa_fail(FLASHATTN_STATUS_NULL_POINTER, "info (the output) is NULL");
    const size_t size = info->struct_size;
    if (!fa_plan_info_size_known(size))
        return fa_fail(FLASHATTN_STATUS_BAD_STRUCT_SIZE,
                       "info->struct_size is %zu; this library knows flashattn_plan_info sizes %zu "
                       "(0.1.0) to %zu (call flashattn_plan_info_init)",
                       size, (size_t)FLASHATTN_PLAN_INFO_SIZE_0_1, sizeof *info);
    fa_plan plan;
    flashattn_status st = plan_for(h, p, 0, &plan);
    if (st != FLASHATTN_STATUS_SUCCESS) return st;
    flashattn_plan_info full;
    full.struct_size = sizeof full;
    fa_plan_describe(&plan, &full);
    full.struct_size = size;
    memcpy(info, &full, size); /* only the fields the caller's layout has */
    return FLASHATTN_STATUS_SUCCESS;
}

/* ---- forward --------------------------------------------------------------------------------- */

flashattn_status fa_fwd_ex(const flashattn_handle *h, const flashattn_fwd_params *p, void *workspace,
                           size_t workspace_bytes, void *stream, int ref_lowprec) {
    fa_clear_error();
    fa_plan plan;
    flashattn_status st = plan_for(h, p, ref_lowprec, &plan);
    if (st != FLASHATTN_STATUS_SUCCESS) return st;
    /* FUSED needed no workspace before 0.4.0: given less than its split asks for, it runs unsplit. */
    if (plan.backend == FLASHATTN_BACKEND_FUSED && plan.kp.num_splits > 1 &&
        (workspace == NULL || (uint64_t)workspace_bytes < (uint64_t)plan.workspace_bytes)) {
        st = plan_for(h, p, ref_lowprec | FA_PLAN_NO_SPLIT, &plan);
        if (st != FLASHATTN_STATUS_SUCCESS) return st;
    }
    if (plan.workspace_bytes > 0) {
        if (workspace == NULL)
            return fa_fail(FLASHATTN_STATUS_NULL_POINTER,
                           "workspace is NULL; this call needs %lld bytes",
                           (long long)plan.workspace_bytes);
        if (((uintptr_t)workspace) % FA_WORKSPACE_ALIGN != 0)
            return fa_fail(FLASHATTN_STATUS_MISALIGNED_POINTER,
                           "workspace = %p is not %d-byte aligned", workspace, FA_WORKSPACE_ALIGN);
        if ((uint64_t)workspace_bytes < (uint64_t)plan.workspace_bytes)
            return fa_fail(FLASHATTN_STATUS_WORKSPACE_TOO_SMALL,
                           "workspace_bytes is %zu; this call needs %lld", workspace_bytes,
                           (long long)plan.workspace_bytes);
    }
    int current = -1;
    cudaError_t err = cudaGetDevice(&current);
    if (err != cudaSuccess)
        return fa_fail(FLASHATTN_STATUS_CUDA_ERROR, "cudaGetDevice failed: %s",
                       cudaGetErrorString(err));
    if (current != h->caps.device)
        return fa_fail(FLASHATTN_STATUS_WRONG_DEVICE,
                       "the current device is %d but the handle was created for device %d", current,
                       h->caps.device);
    if (plan.noop) return FLASHATTN_STATUS_SUCCESS;
    return fa_dispatch(h, &plan, workspace, stream);
}

flashattn_status flashattn_fwd(const flashattn_handle *h, const flashattn_fwd_params *p,
                               void *workspace, size_t workspace_bytes, void *stream) {
    return fa_fwd_ex(h, p, workspace, workspace_bytes, stream, 0);
}
