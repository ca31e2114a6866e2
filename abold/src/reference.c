/*
 * reference.c - the REFERENCE backend: cuBLAS GEMMs around the softmax kernel of
 * kernels/reference.cu. The cuBLAS handle is shared by every thread using the flashattn handle, so
 * binding it to the caller's stream and workspace, and enqueueing, happen under the handle's lock.
 */
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "internal.h"

#define FA_CUDA_TRY(call)                                                                         \
    do {                                                                                          \
        int fa_err_ = (call);                                                                     \
        if (fa_err_ != 0) {                                                                       \
            st = fa_fail(FLASHATTN_STATUS_CUDA_ERROR, "%s failed: %s", #call,                     \
                         cudaGetErrorString((cudaError_t)fa_err_));                               \
            goto done;                                                                            \
        }                                                                                         \
    } while (0)

#define FA_CUBLAS_TRY(call)                                                                       \
    do {                                                                                          \
        cublasStatus_t fa_cst_ = (call);                                                          \
        if (fa_cst_ != CUBLAS_STATUS_SUCCESS) {                                                   \
            st = fa_fail(FLASHATTN_STATUS_CUBLAS_ERROR, "%s failed: %s", #call,                   \
                         cublasGetStatusString(fa_cst_));                                         \
            goto done;                                                                            \
        }                                                                                         \
    } while (0)

flashattn_status fa_reference_run(const flashattn_handle *h, const fa_plan *plan, const fa_kernel_params *call,
                                  void *workspace, void *stream) {
    const fa_ref_layout *l = &plan->ref;
    char *ws = (char *)workspace;
    /* A serving call: each sequence's Q, K and V gathered into dense [batch, capacity] copies (zeros
     * past its counts), then the dense pipeline below on them; the softmax takes each sequence's
     * counts and mask, and the store writes only its rows (kernels/reference.cu). */
    fa_kernel_params dense = *call;
    const fa_kernel_params *kp = call;
    if (call->serving) {
        const int rc = fa_ref_gather(call, plan->dtype, ws + l->gathered, &dense, stream);
        if (rc != 0)
            return fa_fail(FLASHATTN_STATUS_CUDA_ERROR, "fa_ref_gather failed: %s", cudaGetErrorString((cudaError_t)rc));
        kp = &dense;
    }
    void **ptrs = (void **)(ws + l->ptr_arrays);
    float *scores = (float *)(ws + l->scores);
    float *v_f32 = (float *)(ws + l->v_f32);
    float *o_f32 = (float *)(ws + l->o_f32);
    const int64_t nbh = (int64_t)kp->batch * kp->heads_q;
    const cudaDataType_t in_type = plan->dtype == FLASHATTN_DTYPE_BFLOAT16 ? CUDA_R_16BF : CUDA_R_16F;
    const int sq = kp->seqlen_q, sk = kp->seqlen_k, d = kp->head_dim;
    /* cuBLAS sees Q and K as column-major D x S matrices with leading dimension = seq stride. */
    const int ldq = sq > 1 ? (int)kp->q_seq_stride : d;
    const int ldk = sk > 1 ? (int)kp->k_seq_stride : d;
    const float zero = 0.0f, one = 1.0f, scale = kp->scale;
    cublasHandle_t cb = (cublasHandle_t)h->cublas;
    cudaStream_t s = (cudaStream_t)stream;
    flashattn_status st = FLASHATTN_STATUS_SUCCESS;

    if (pthread_mutex_lock((pthread_mutex_t *)&h->cublas_lock) != 0)
        return fa_fail(FLASHATTN_STATUS_CUDA_ERROR, "locking the handle's cuBLAS lock failed");
    /* cublasSetStream resets the workspace, so bind the workspace second. */
    FA_CUBLAS_TRY(cublasSetStream(cb, s));
    FA_CUBLAS_TRY(cublasSetWorkspace(cb, ws + l->cublas_ws, (size_t)FA_CUBLAS_WORKSPACE_BYTES));
    FA_CUDA_TRY(fa_ref_prepare(kp, plan->dtype, ptrs, scores, v_f32, o_f32, stream));
    if (sk > 0) {
        /* S^T (Sk x Sq, column-major) = scale * K (Sk x D) * Q^T (D x Sq). */
        FA_CUBLAS_TRY(cublasGemmBatchedEx(cb, CUBLAS_OP_T, CUBLAS_OP_N, sk, sq, d, &scale,
                                          (const void *const *)(ptrs + 0 * nbh), in_type, ldk,
                                          (const void *const *)(ptrs + 1 * nbh), in_type, ldq, &zero,
                                          (void *const *)(ptrs + 2 * nbh), CUDA_R_32F, sk, (int)nbh,
                                          CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    }
    FA_CUDA_TRY(fa_ref_softmax(kp, plan->dtype, plan->ref_lowprec, scores, plan->grid_x, stream));
    if (sk > 0) {
        /* O^T (D x Sq) = V^T (D x Sk) * P^T (Sk x Sq), all fp32. */
        FA_CUBLAS_TRY(cublasGemmBatchedEx(cb, CUBLAS_OP_N, CUBLAS_OP_N, d, sq, sk, &one,
                                          (const void *const *)(ptrs + 3 * nbh), CUDA_R_32F, d,
                                          (const void *const *)(ptrs + 4 * nbh), CUDA_R_32F, sk,
                                          &zero, (void *const *)(ptrs + 5 * nbh), CUDA_R_32F, d,
                                          (int)nbh, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    } else {
        FA_CUDA_TRY(cudaMemsetAsync(o_f32, 0, (size_t)(nbh * sq * d) * sizeof(float), s));
    }
    FA_CUDA_TRY(fa_ref_store_o(kp, plan->dtype, o_f32, stream));
done:
    pthread_mutex_unlock((pthread_mutex_t *)&h->cublas_lock);
    return st;
}
