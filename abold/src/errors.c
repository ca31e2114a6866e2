/* errors.c - status names, sentences, the per-thread last-error detail, version and build info. */
#include <stdarg.h>
#include <stdio.h>

#include <cuda_runtime_api.h> /* CUDART_VERSION */

#include "fa_build_info.h"
#include "internal.h"

static _Thread_local char fa_last_error_buf[512];

void fa_clear_error(void) { fa_last_error_buf[0] = '\0'; }

flashattn_status fa_fail(flashattn_status status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(fa_last_error_buf, sizeof fa_last_error_buf, fmt, ap);
    va_end(ap);
    return status;
}

const char *flashattn_last_error(void) { return fa_last_error_buf; }

typedef struct status_text {
    const char *name;
    const char *sentence;
} status_text;

static const status_text fa_status_texts[] = {
    [FLASHATTN_STATUS_SUCCESS] = {"FLASHATTN_STATUS_SUCCESS", "The call succeeded."},
    [FLASHATTN_STATUS_NULL_POINTER] = {"FLASHATTN_STATUS_NULL_POINTER",
                                       "A required pointer is NULL; pass a valid handle, params "
                                       "struct or device tensor."},
    [FLASHATTN_STATUS_MISALIGNED_POINTER] = {"FLASHATTN_STATUS_MISALIGNED_POINTER",
                                             "A pointer is not aligned: tensors must be aligned to "
                                             "their element size and the workspace to 256 bytes."},
    [FLASHATTN_STATUS_BAD_STRUCT_SIZE] = {"FLASHATTN_STATUS_BAD_STRUCT_SIZE",
                                          "The struct's size field is not one this library knows; "
                                          "initialise it with its _init function."},
    [FLASHATTN_STATUS_BAD_SHAPE] = {"FLASHATTN_STATUS_BAD_SHAPE",
                                    "A dimension is negative, zero where it must be at least 1, or "
                                    "larger than the library supports."},
    [FLASHATTN_STATUS_BAD_STRIDE] = {"FLASHATTN_STATUS_BAD_STRIDE",
                                     "A stride is negative, or the output's strides make two of its "
                                     "elements share an address."},
    [FLASHATTN_STATUS_INDEX_OVERFLOW] = {"FLASHATTN_STATUS_INDEX_OVERFLOW",
                                         "A tensor's extents times strides overflow 64-bit indexing; "
                                         "check the shape and strides."},
    [FLASHATTN_STATUS_BAD_HEAD_GROUPING] = {"FLASHATTN_STATUS_BAD_HEAD_GROUPING",
                                            "heads_q must be a multiple of heads_kv (grouped-query "
                                            "attention)."},
    [FLASHATTN_STATUS_UNSUPPORTED_HEAD_DIM] = {"FLASHATTN_STATUS_UNSUPPORTED_HEAD_DIM",
                                               "The head dimension must be between 1 and 256."},
    [FLASHATTN_STATUS_BAD_DTYPE] = {"FLASHATTN_STATUS_BAD_DTYPE",
                                    "dtype must be FLASHATTN_DTYPE_FLOAT16 or FLASHATTN_DTYPE_BFLOAT16 "
                                    "(FLASHATTN_DTYPE_FLOAT32 too, for flashattn_merge)."},
    [FLASHATTN_STATUS_BAD_SCALE] = {"FLASHATTN_STATUS_BAD_SCALE",
                                    "softmax_scale must be a positive finite number, or 0 for "
                                    "1/sqrt(head_dim)."},
    [FLASHATTN_STATUS_BAD_MASK] = {"FLASHATTN_STATUS_BAD_MASK",
                                   "mask must be a flashattn_mask value."},
    [FLASHATTN_STATUS_BAD_WINDOW] = {"FLASHATTN_STATUS_BAD_WINDOW",
                                     "window_left and window_right must be >= 0, or -1 for "
                                     "unbounded."},
    [FLASHATTN_STATUS_BAD_SOFTCAP] = {"FLASHATTN_STATUS_BAD_SOFTCAP",
                                      "softcap must be a finite number >= 0 (0 disables it)."},
    [FLASHATTN_STATUS_BAD_BACKEND] = {"FLASHATTN_STATUS_BAD_BACKEND",
                                      "backend must be a flashattn_backend value."},
    [FLASHATTN_STATUS_UNSUPPORTED] = {"FLASHATTN_STATUS_UNSUPPORTED",
                                      "The requested backend cannot run these parameters; use "
                                      "FLASHATTN_BACKEND_AUTO or see flashattn_last_error()."},
    [FLASHATTN_STATUS_WORKSPACE_TOO_SMALL] = {"FLASHATTN_STATUS_WORKSPACE_TOO_SMALL",
                                              "The workspace is smaller than "
                                              "flashattn_fwd_workspace_size() reports."},
    [FLASHATTN_STATUS_DEVICE_TOO_OLD] = {"FLASHATTN_STATUS_DEVICE_TOO_OLD",
                                         "The GPU is older than compute capability 8.0 (Ampere), "
                                         "which libflashattn requires."},
    [FLASHATTN_STATUS_WRONG_DEVICE] = {"FLASHATTN_STATUS_WRONG_DEVICE",
                                       "The calling thread's current CUDA device is not the "
                                       "handle's device; call cudaSetDevice first."},
    [FLASHATTN_STATUS_NO_DEVICE] = {"FLASHATTN_STATUS_NO_DEVICE",
                                    "No usable CUDA device: none present, no driver, or the device "
                                    "index is out of range."},
    [FLASHATTN_STATUS_CUDA_ERROR] = {"FLASHATTN_STATUS_CUDA_ERROR",
                                     "A CUDA runtime call failed; flashattn_last_error() names it "
                                     "and the CUDA error."},
    [FLASHATTN_STATUS_CUBLAS_ERROR] = {"FLASHATTN_STATUS_CUBLAS_ERROR",
                                       "A cuBLAS call failed; flashattn_last_error() names it and "
                                       "the cuBLAS status."},
    [FLASHATTN_STATUS_OUT_OF_HOST_MEMORY] = {"FLASHATTN_STATUS_OUT_OF_HOST_MEMORY",
                                             "Host memory could not be allocated for the handle."},
    [FLASHATTN_STATUS_BAD_LSE_BASE] = {"FLASHATTN_STATUS_BAD_LSE_BASE",
                                       "lse_base must be FLASHATTN_LSE_NATURAL or FLASHATTN_LSE_BASE2."},
    [FLASHATTN_STATUS_BAD_VARLEN] = {"FLASHATTN_STATUS_BAD_VARLEN",
                                     "The ragged-batch fields (cu_seqlens_q/k, total_q/k, kv_batch_idx) "
                                     "disagree; flashattn_last_error() names the field."},
    [FLASHATTN_STATUS_BAD_PAGED_KV] = {"FLASHATTN_STATUS_BAD_PAGED_KV",
                                       "The paged-KV fields (block_table, page_size, num_pages, "
                                       "pages_per_seq) are out of range or disagree with seqlen_k."},
    [FLASHATTN_STATUS_BAD_APPEND] = {"FLASHATTN_STATUS_BAD_APPEND",
                                     "The KV-append fields (k_new, v_new, seqlen_new) disagree with each "
                                     "other or with the cache's layout."},
    [FLASHATTN_STATUS_BAD_ROTARY] = {"FLASHATTN_STATUS_BAD_ROTARY",
                                     "The rotary fields (rotary_cos/sin, rotary_dim, seqlen_ro, the flags) "
                                     "are out of range or lack k_new."},
};

#define FA_NUM_STATUS ((int)(sizeof fa_status_texts / sizeof fa_status_texts[0]))

const char *flashattn_status_name(flashattn_status status) {
    if ((int)status < 0 || (int)status >= FA_NUM_STATUS) return "FLASHATTN_STATUS_UNKNOWN";
    return fa_status_texts[status].name;
}

const char *flashattn_status_string(flashattn_status status) {
    if ((int)status < 0 || (int)status >= FA_NUM_STATUS)
        return "Unknown status value; the library is older than the code that produced it.";
    return fa_status_texts[status].sentence;
}

#define FA_STR2(x) #x
#define FA_STR(x) FA_STR2(x)

int flashattn_version(void) { return FLASHATTN_VERSION; }

const char *flashattn_version_string(void) {
    return FA_STR(FLASHATTN_VERSION_MAJOR) "." FA_STR(FLASHATTN_VERSION_MINOR) "." FA_STR(
        FLASHATTN_VERSION_PATCH);
}

const char *flashattn_build_info(void) {
    return "commit=" FA_BUILD_GIT_COMMIT " cuda_runtime=" FA_STR(CUDART_VERSION) " archs=" FA_BUILD_CUDA_ARCHS
           " build=" FA_BUILD_TYPE " " FA_BUILD_VARIANTS;
}
