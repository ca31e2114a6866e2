/* quickstart.c - causal grouped-query attention with libflashattn, every status checked.
 * Build: cc quickstart.c $(pkg-config --cflags --libs flashattn) -o quickstart   (or find_package)
 * Exit status: 0 success, 1 a call failed or the check failed, 2 no usable GPU. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>
#include <flashattn.h>

#define CUDA_OK(call) do { cudaError_t e_ = (call); if (e_ != cudaSuccess) { \
    fprintf(stderr, "%s: %s\n", #call, cudaGetErrorString(e_)); return 1; } } while (0)
#define FA_OK(call) do { flashattn_status s_ = (call); if (s_ != FLASHATTN_STATUS_SUCCESS) { \
    fprintf(stderr, "%s: %s: %s\n", #call, flashattn_status_name(s_), flashattn_last_error()); \
    return s_ == FLASHATTN_STATUS_NO_DEVICE ? 2 : 1; } } while (0)

static cudaError_t upload_random_bf16(void *dst, size_t n, uint32_t seed);     /* defined below */
static int check_against_reference(flashattn_handle *h, const flashattn_fwd_params *p, cudaStream_t s);

int main(void) {
    enum { B = 2, S = 1024, HQ = 32, HKV = 8, D = 128 };
    const size_t nq = (size_t)B * S * HQ * D, nkv = (size_t)B * S * HKV * D;

    flashattn_handle *h;
    FA_OK(flashattn_handle_create(&h, 0));                 /* once per device; thread-safe afterwards */
    cudaStream_t stream;
    CUDA_OK(cudaStreamCreate(&stream));
    void *q, *k, *v, *o;                                   /* device tensors, [B, S, H, D] bfloat16 */
    float *lse;                                            /* device, [B, HQ, S] float32 */
    CUDA_OK(cudaMalloc(&q, 2 * nq));
    CUDA_OK(cudaMalloc(&k, 2 * nkv));
    CUDA_OK(cudaMalloc(&v, 2 * nkv));
    CUDA_OK(cudaMalloc(&o, 2 * nq));
    CUDA_OK(cudaMalloc((void **)&lse, sizeof(float) * B * HQ * S));
    CUDA_OK(upload_random_bf16(q, nq, 1));
    CUDA_OK(upload_random_bf16(k, nkv, 2));
    CUDA_OK(upload_random_bf16(v, nkv, 3));

    flashattn_fwd_params p;
    FA_OK(flashattn_fwd_params_init(&p));                  /* defaults: AUTO, no mask, scale 1/sqrt(d) */
    p.dtype = FLASHATTN_DTYPE_BFLOAT16;
    p.batch = B; p.seqlen_q = S; p.seqlen_k = S;
    p.heads_q = HQ; p.heads_kv = HKV; p.head_dim = D;      /* grouped-query: 4 query heads per KV head */
    FA_OK(flashattn_fwd_params_set_packed_strides(&p));    /* [B, S, H, D] tensors; or set any strides */
    p.q = q; p.k = k; p.v = v; p.o = o;
    p.lse = lse;                                           /* optional: NULL skips it */
    p.mask = FLASHATTN_MASK_CAUSAL_BOTTOM_RIGHT;

    size_t ws_bytes;
    FA_OK(flashattn_fwd_workspace_size(h, &p, &ws_bytes)); /* often 0: REFERENCE and split decode need some */
    void *ws = NULL;
    if (ws_bytes) CUDA_OK(cudaMalloc(&ws, ws_bytes));
    FA_OK(flashattn_fwd(h, &p, ws, ws_bytes, stream));     /* asynchronous; CUDA-graph capturable */
    CUDA_OK(cudaStreamSynchronize(stream));

    flashattn_plan_info info;                              /* what ran: backend, kernel, grid, ... */
    FA_OK(flashattn_plan_info_init(&info));
    FA_OK(flashattn_fwd_plan(h, &p, &info));
    printf("libflashattn %s: %s\n", flashattn_version_string(), info.description);
    const int rc = check_against_reference(h, &p, stream); /* below: the same call on REFERENCE */

    cudaFree(ws); cudaFree(q); cudaFree(k); cudaFree(v); cudaFree(o); cudaFree(lse);
    CUDA_OK(cudaStreamDestroy(stream));
    FA_OK(flashattn_handle_destroy(h));
    return rc;
}

/* ---- helpers --------------------------------------------------------------------------------- */

static uint16_t to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)((u + 0x7FFF + ((u >> 16) & 1)) >> 16); /* round to nearest even */
}

static float from_bf16(uint16_t b) {
    const uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* n bfloat16 values uniform in [-1, 1) from a linear congruential generator, copied to dst. */
static cudaError_t upload_random_bf16(void *dst, size_t n, uint32_t seed) {
    uint16_t *host = malloc(2 * n);
    if (host == NULL) return cudaErrorMemoryAllocation;
    for (size_t i = 0; i < n; ++i) {
        seed = seed * 1664525u + 1013904223u;
        host[i] = to_bf16((float)(seed >> 8) / 8388608.0f - 1.0f);
    }
    const cudaError_t err = cudaMemcpy(dst, host, 2 * n, cudaMemcpyHostToDevice);
    free(host);
    return err;
}

/* Runs the same call on the REFERENCE backend (cuBLAS, scores in its workspace) and compares every
 * output element. 0 when they agree within a few bfloat16 ulps of |O| <= 1 (NaN never agrees);
 * otherwise the exit status. */
static int check_against_reference(flashattn_handle *h, const flashattn_fwd_params *p, cudaStream_t s) {
    const size_t n = (size_t)(p->batch * p->seqlen_q * p->heads_q * p->head_dim);
    flashattn_fwd_params r = *p;
    size_t ref_bytes;
    void *o_ref, *ws_ref;
    uint16_t *out = malloc(2 * n), *ref = malloc(2 * n);
    if (out == NULL || ref == NULL) return 1;
    r.backend = FLASHATTN_BACKEND_REFERENCE;
    r.lse = NULL;
    CUDA_OK(cudaMalloc(&o_ref, 2 * n));
    r.o = o_ref;
    FA_OK(flashattn_fwd_workspace_size(h, &r, &ref_bytes));
    CUDA_OK(cudaMalloc(&ws_ref, ref_bytes));
    FA_OK(flashattn_fwd(h, &r, ws_ref, ref_bytes, s));
    CUDA_OK(cudaMemcpyAsync(out, p->o, 2 * n, cudaMemcpyDeviceToHost, s));
    CUDA_OK(cudaMemcpyAsync(ref, o_ref, 2 * n, cudaMemcpyDeviceToHost, s));
    CUDA_OK(cudaStreamSynchronize(s));
    float err = 0.0f;
    for (size_t i = 0; i < n; ++i) {
        const float e = from_bf16(out[i]) - from_bf16(ref[i]);
        const float a = e < 0.0f ? -e : e;
        if (err == err && (a > err || a != a)) err = a;  /* a NaN, once seen, stays */
    }
    const int ok = err <= 3e-2f;
    printf("max |O - O_reference| = %.2e: %s\n", err, ok ? "success" : "FAILED");
    cudaFree(o_ref);
    cudaFree(ws_ref);
    free(out);
    free(ref);
    return ok ? 0 : 1;
}
