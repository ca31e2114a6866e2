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

static flashattn_status read_caps(int device, fa_device_caps *caps) {
    int count = 0;
    cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess || count == 0) {
        (void)cudaGetLastError(); /* reset the runtime's last error so the caller's next check is clean */
        return fa_fail(FLASHATTN_STATUS_NO_DEVICE, "no CUDA device available (cudaGetDeviceCount: %s)",
                       err == cudaSuccess ? "0 devices" : cudaGetErrorString(err));
    }
    if (device == -1) {
        err = cudaGetDevice(&device);
        if (err != cudaSuccess)
            return fa_fail(FLASHATTN_STATUS_CUDA_ERROR, "cudaGetDevice failed: %s",
                           cudaGetErrorString(err));
    }
    if (device < 0 || device >= count)
        return fa_fail(FLASHATTN_STATUS_NO_DEVICE, "device is %d; this machine has devices 0..%d",
                       device, count - 1);
    int smem_optin = 0;
    caps->device = device;
    const struct { enum cudaDeviceAttr attr; int *dst; const char *name; } attrs[] = {
        {cudaDevAttrComputeCapabilityMajor, &caps->cc_major, "ComputeCapabilityMajor"},
        {cudaDevAttrComputeCapabilityMinor, &caps->cc_minor, "ComputeCapabilityMinor"},
        {cudaDevAttrMultiProcessorCount, &caps->sm_count, "MultiProcessorCount"},
        {cudaDevAttrMaxSharedMemoryPerBlockOptin, &smem_optin, "MaxSharedMemoryPerBlockOptin"},
    };
    for (size_t i = 0; i < sizeof attrs / sizeof attrs[0]; ++i) {
        err = cudaDeviceGetAttribute(attrs[i].dst, attrs[i].attr, device);
        if (err != cudaSuccess)
            return fa_fail(FLASHATTN_STATUS_CUDA_ERROR, "cudaDeviceGetAttribute(%s) failed: %s",
                           attrs[i].name, cudaGetErrorString(err));
    }
    caps->smem_per_block_optin = smem_optin;
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

flashattn_status flashattn_fwd_params_init(flashattn_fwd_params *params) {
    fa_clear_error();
    if (params == NULL) return fa_fail(FLASHATTN_STATUS_NULL_POINTER, "params is NULL");
    memset(params, 0, sizeof *params);
    params->struct_size = sizeof *params;
    params->dtype = FLASHATTN_DTYPE_FLOAT16;
    params->mask = FLASHATTN_MASK_NONE;
    params->backend = FLASHATTN_BACKEND_AUTO;
    params->window_left = -1;
    params->window_right = -1;
    return FLASHATTN_STATUS_SUCCESS;
}

flashattn_status flashattn_fwd_params_set_packed_strides(flashattn_fwd_params *p) {
    fa_clear_error();
    if (p == NULL) return fa_fail(FLASHATTN_STATUS_NULL_POINTER, "params is NULL");
    p->q_head_stride = p->o_head_stride = p->head_dim;
    p->q_seq_stride = p->o_seq_stride = p->heads_q * p->head_dim;
    p->q_batch_stride = p->o_batch_stride = p->seqlen_q * p->heads_q * p->head_dim;
    p->k_head_stride = p->v_head_stride = p->head_dim;
    p->k_seq_stride = p->v_seq_stride = p->heads_kv * p->head_dim;
    p->k_batch_stride = p->v_batch_stride = p->seqlen_k * p->heads_kv * p->head_dim;
    return FLASHATTN_STATUS_SUCCESS;
}

flashattn_status flashattn_plan_info_init(flashattn_plan_info *info) {
    fa_clear_error();
    if (info == NULL) return fa_fail(FLASHATTN_STATUS_NULL_POINTER, "info is NULL");
    memset(info, 0, sizeof *info);
    info->struct_size = sizeof *info;
    return FLASHATTN_STATUS_SUCCESS;
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
    if (info->struct_size != sizeof *info)
        return fa_fail(FLASHATTN_STATUS_BAD_STRUCT_SIZE,
                       "info->struct_size is %zu; this library expects %zu "
                       "(call flashattn_plan_info_init)",
                       info->struct_size, sizeof *info);
    fa_plan plan;
    flashattn_status st = plan_for(h, p, 0, &plan);
    if (st != FLASHATTN_STATUS_SUCCESS) return st;
    fa_plan_describe(&plan, info);
    return FLASHATTN_STATUS_SUCCESS;
}

/* ---- forward --------------------------------------------------------------------------------- */

flashattn_status fa_fwd_ex(const flashattn_handle *h, const flashattn_fwd_params *p, void *workspace,
                           size_t workspace_bytes, void *stream, int ref_lowprec) {
    fa_clear_error();
    fa_plan plan;
    flashattn_status st = plan_for(h, p, ref_lowprec, &plan);
    if (st != FLASHATTN_STATUS_SUCCESS) return st;
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
