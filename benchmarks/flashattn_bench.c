/*
 * flashattn_bench.c - times libflashattn's forward pass on the GPU.
 *
 *   flashattn_bench                       the default suite: the prefill and decode shapes of the
 *                                         peer table (16k tokens per prefill, hidden 2048)
 *   flashattn_bench --suite quick         a few shapes, for a smoke test
 *   flashattn_bench --shape prefill:bf16:4:16:16:4096:4096:128:causal     one shape
 *                   (kind:dtype:batch:heads_q:heads_kv:seqlen_q:seqlen_k:head_dim:none|causal)
 *   --backend auto|fused|fused_sm90|reference   --iters N (30)   --warmup N (5)   --seed S
 *   --json FILE   --csv FILE   --no-check
 *
 * Each shape is first checked against the REFERENCE backend (max |O - O_ref|); then it is timed
 * with CUDA events around each call, the L2 cache flushed before every timed call, and reported as
 * median and p99 milliseconds. FLOPs = 4*B*Hq*Sq*Sk*D, halved for causal when Sq == Sk; decode rows
 * report K+V bytes read per second. "% peak" is against a cuBLAS bf16 GEMM (8192^3) and a
 * device-to-device copy, both measured at start-up in the same process.
 * Exit status: 0 all shapes ran and passed their check; 1 a check failed or a call errored;
 * 2 no usable GPU or bad arguments.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "fa_build_info.h"
#include "flashattn.h"

int bench_fill_normal(void *dst, int64_t n, uint64_t seed, int bf16, void *stream);
int bench_max_abs_diff(const void *a, const void *b, int64_t n, int bf16, unsigned int *out_bits, void *stream);

typedef struct shape {
    char kind[16];
    int dtype;
    int64_t b, hq, hkv, sq, sk, d;
    int causal;
} shape;

typedef struct row {
    shape s;
    char backend[16];
    char kernel[64];
    double median_ms, p99_ms, rate, pct_peak, max_err;
    int check_ok;
    int64_t mem_bytes;
} row;

#define CHECK_CUDA(call)                                                                      \
    do {                                                                                      \
        cudaError_t e_ = (call);                                                              \
        if (e_ != cudaSuccess) {                                                              \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
            exit(1);                                                                          \
        }                                                                                     \
    } while (0)

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double flops_of(const shape *s) {
    const double f = 4.0 * s->b * s->hq * (double)s->sq * s->sk * s->d;
    return (s->causal && s->sq == s->sk) ? f / 2 : f;
}

static double kv_bytes_of(const shape *s) { return 2.0 * s->b * s->hkv * (double)s->sk * s->d * 2; }

static int is_decode(const shape *s) { return strcmp(s->kind, "decode") == 0; }

/* ---- the default suite: ../shared/peers-h200.md's shapes ---------------------------------------- */
static int default_suite(shape *out, int quick) {
    int n = 0;
    if (quick) {
        const shape q[] = {{"prefill", 1, 4, 16, 16, 1024, 1024, 128, 0}, {"prefill", 1, 4, 16, 16, 1024, 1024, 128, 1},
                           {"prefill", 0, 8, 32, 32, 512, 512, 64, 1}, {"decode", 1, 16, 32, 8, 1, 8192, 128, 0}};
        memcpy(out, q, sizeof q);
        return (int)(sizeof q / sizeof q[0]);
    }
    const int64_t seqs[] = {512, 1024, 2048, 4096, 8192, 16384};
    const int64_t dims[] = {64, 128, 256};
    for (int di = 0; di < 3; ++di)
        for (int si = 0; si < 6; ++si)
            for (int c = 0; c < 2; ++c)
                out[n++] = (shape){"prefill", 1, 16384 / seqs[si], 2048 / dims[di], 2048 / dims[di], seqs[si], seqs[si], dims[di], c};
    for (int si = 0; si < 6; ++si)
        for (int c = 0; c < 2; ++c)
            out[n++] = (shape){"prefill", 0, 16384 / seqs[si], 16, 16, seqs[si], seqs[si], 128, c};
    out[n++] = (shape){"prefill-gqa", 1, 8, 32, 8, 2048, 2048, 128, 1};
    out[n++] = (shape){"prefill-gqa", 1, 2, 32, 8, 8192, 8192, 128, 1};
    const int64_t dec[][2] = {{1, 8192}, {16, 8192}, {64, 4096}, {128, 2048}, {8, 32768}, {1, 131072}};
    for (int i = 0; i < 6; ++i) out[n++] = (shape){"decode", 1, dec[i][0], 32, 8, 1, dec[i][1], 128, 0};
    return n;
}

static int parse_shape(const char *text, shape *s) {
    char kind[16], dt[8], mask[8];
    long long b, hq, hkv, sq, sk, d;
    if (sscanf(text, "%15[^:]:%7[^:]:%lld:%lld:%lld:%lld:%lld:%lld:%7s", kind, dt, &b, &hq, &hkv, &sq, &sk, &d, mask) != 9)
        return 0;
    memset(s, 0, sizeof *s);
    snprintf(s->kind, sizeof s->kind, "%s", kind);
    s->dtype = strcmp(dt, "fp16") == 0 ? 0 : 1;
    s->b = b, s->hq = hq, s->hkv = hkv, s->sq = sq, s->sk = sk, s->d = d;
    s->causal = strcmp(mask, "causal") == 0;
    return 1;
}

/* ---- ceilings ---------------------------------------------------------------------------------- */
static double time_median_ms(void (*fn)(void *), void *arg, int iters) {
    cudaEvent_t a, b;
    double *t = malloc(sizeof(double) * iters);
    CHECK_CUDA(cudaEventCreate(&a));
    CHECK_CUDA(cudaEventCreate(&b));
    for (int i = 0; i < 3; ++i) fn(arg);
    for (int i = 0; i < iters; ++i) {
        float ms;
        CHECK_CUDA(cudaEventRecord(a, 0));
        fn(arg);
        CHECK_CUDA(cudaEventRecord(b, 0));
        CHECK_CUDA(cudaEventSynchronize(b));
        CHECK_CUDA(cudaEventElapsedTime(&ms, a, b));
        t[i] = ms;
    }
    qsort(t, iters, sizeof(double), cmp_double);
    const double med = t[iters / 2];
    free(t);
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    return med;
}

typedef struct gemm_args { cublasHandle_t h; void *a, *b, *c; int n; } gemm_args;
static void run_gemm(void *p) {
    gemm_args *g = p;
    const float one = 1.0f, zero = 0.0f;
    if (cublasGemmEx(g->h, CUBLAS_OP_N, CUBLAS_OP_N, g->n, g->n, g->n, &one, g->a, CUDA_R_16BF, g->n, g->b,
                     CUDA_R_16BF, g->n, &zero, g->c, CUDA_R_16BF, g->n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) !=
        CUBLAS_STATUS_SUCCESS) {
        fprintf(stderr, "cublasGemmEx failed\n");
        exit(1);
    }
}
typedef struct copy_args { void *dst, *src; size_t bytes; } copy_args;
static void run_copy(void *p) {
    copy_args *c = p;
    CHECK_CUDA(cudaMemcpyAsync(c->dst, c->src, c->bytes, cudaMemcpyDeviceToDevice, 0));
}

static void measure_ceilings(double *gemm_tflops, double *copy_gbps) {
    gemm_args g = {0};
    g.n = 8192;
    const size_t bytes = (size_t)g.n * g.n * 2;
    CHECK_CUDA(cudaMalloc(&g.a, bytes));
    CHECK_CUDA(cudaMalloc(&g.b, bytes));
    CHECK_CUDA(cudaMalloc(&g.c, bytes));
    bench_fill_normal(g.a, (int64_t)g.n * g.n, 1, 1, 0);
    bench_fill_normal(g.b, (int64_t)g.n * g.n, 2, 1, 0);
    if (cublasCreate(&g.h) != CUBLAS_STATUS_SUCCESS) {
        fprintf(stderr, "cublasCreate failed\n");
        exit(1);
    }
    *gemm_tflops = 2.0 * g.n * (double)g.n * g.n / (time_median_ms(run_gemm, &g, 10) * 1e9);
    cublasDestroy(g.h);
    cudaFree(g.a), cudaFree(g.b), cudaFree(g.c);
    copy_args c = {0};
    c.bytes = (size_t)1 << 30;
    CHECK_CUDA(cudaMalloc(&c.dst, c.bytes));
    CHECK_CUDA(cudaMalloc(&c.src, c.bytes));
    CHECK_CUDA(cudaMemset(c.src, 1, c.bytes));
    *copy_gbps = 2.0 * c.bytes / (time_median_ms(run_copy, &c, 10) * 1e6);
    cudaFree(c.dst), cudaFree(c.src);
}

/* ---- one shape ---------------------------------------------------------------------------------- */
static void fill_params(flashattn_fwd_params *p, const shape *s, const void *q, const void *k, const void *v, void *o, int backend) {
    flashattn_fwd_params_init(p);
    p->dtype = s->dtype;
    p->batch = s->b, p->seqlen_q = s->sq, p->seqlen_k = s->sk, p->heads_q = s->hq, p->heads_kv = s->hkv, p->head_dim = s->d;
    flashattn_fwd_params_set_packed_strides(p);
    p->q = q, p->k = k, p->v = v, p->o = o;
    p->mask = s->causal ? FLASHATTN_MASK_CAUSAL_BOTTOM_RIGHT : FLASHATTN_MASK_NONE;
    p->backend = backend;
}

static int bench_shape(flashattn_handle *h, const shape *s, int backend, int iters, int warmup, uint64_t seed, int check,
                       void *l2_flush, size_t l2_bytes, double gemm_peak, double copy_peak, row *out) {
    memset(out, 0, sizeof *out);
    out->s = *s;
    const int64_t nq = s->b * s->sq * s->hq * s->d, nk = s->b * s->sk * s->hkv * s->d;
    void *q, *k, *v, *o, *o_ref = NULL, *ws = NULL, *ws_ref = NULL;
    CHECK_CUDA(cudaMalloc(&q, nq * 2));
    CHECK_CUDA(cudaMalloc(&k, nk * 2));
    CHECK_CUDA(cudaMalloc(&v, nk * 2));
    CHECK_CUDA(cudaMalloc(&o, nq * 2));
    bench_fill_normal(q, nq, seed * 3 + 0, s->dtype, 0);
    bench_fill_normal(k, nk, seed * 3 + 1, s->dtype, 0);
    bench_fill_normal(v, nk, seed * 3 + 2, s->dtype, 0);

    flashattn_fwd_params p;
    fill_params(&p, s, q, k, v, o, backend);
    flashattn_plan_info info;
    flashattn_plan_info_init(&info);
    size_t ws_bytes = 0;
    flashattn_status st = flashattn_fwd_plan(h, &p, &info);
    if (st == FLASHATTN_STATUS_SUCCESS) st = flashattn_fwd_workspace_size(h, &p, &ws_bytes);
    if (st != FLASHATTN_STATUS_SUCCESS) {
        fprintf(stderr, "plan failed: %s: %s\n", flashattn_status_name(st), flashattn_last_error());
        return 0;
    }
    snprintf(out->backend, sizeof out->backend, "%s",
             info.backend == FLASHATTN_BACKEND_FUSED        ? "fused"
             : info.backend == FLASHATTN_BACKEND_FUSED_SM90 ? "fused_sm90"
                                                            : "reference");
    snprintf(out->kernel, sizeof out->kernel, "%s", info.kernel_name);
    if (ws_bytes) CHECK_CUDA(cudaMalloc(&ws, ws_bytes));
    out->mem_bytes = (nq * 2 + nk * 2) * 2 + (int64_t)ws_bytes;

    /* Check against the reference backend before timing. */
    out->check_ok = 1;
    out->max_err = NAN;
    if (check) {
        flashattn_fwd_params pr;
        size_t ref_bytes = 0;
        CHECK_CUDA(cudaMalloc(&o_ref, nq * 2));
        CHECK_CUDA(cudaMemset(o, 0xff, nq * 2));
        CHECK_CUDA(cudaMemset(o_ref, 0xff, nq * 2));
        fill_params(&pr, s, q, k, v, o_ref, FLASHATTN_BACKEND_REFERENCE);
        st = flashattn_fwd_workspace_size(h, &pr, &ref_bytes);
        if (st == FLASHATTN_STATUS_SUCCESS && cudaMalloc(&ws_ref, ref_bytes) != cudaSuccess) {
            (void)cudaGetLastError();
            fprintf(stderr, "  (reference check skipped: %zu bytes of workspace unavailable)\n", ref_bytes);
            ws_ref = NULL;
        } else if (st == FLASHATTN_STATUS_SUCCESS) {
            unsigned int *d_bits, bits = 0;
            if ((st = flashattn_fwd(h, &pr, ws_ref, ref_bytes, 0)) != FLASHATTN_STATUS_SUCCESS ||
                (st = flashattn_fwd(h, &p, ws, ws_bytes, 0)) != FLASHATTN_STATUS_SUCCESS) {
                fprintf(stderr, "forward failed: %s: %s\n", flashattn_status_name(st), flashattn_last_error());
                return 0;
            }
            CHECK_CUDA(cudaMalloc((void **)&d_bits, sizeof bits));
            CHECK_CUDA(cudaMemset(d_bits, 0, sizeof bits));
            bench_max_abs_diff(o, o_ref, nq, s->dtype, d_bits, 0);
            CHECK_CUDA(cudaMemcpy(&bits, d_bits, sizeof bits, cudaMemcpyDeviceToHost));
            cudaFree(d_bits);
            float err;
            memcpy(&err, &bits, sizeof err);
            out->max_err = err;
            /* O is an average of N(0,1) values; a few output ulps is the expected disagreement. */
            out->check_ok = err <= (s->dtype == 1 ? 3e-2 : 5e-3);
        }
        if (ws_ref) cudaFree(ws_ref);
        cudaFree(o_ref);
        if (st != FLASHATTN_STATUS_SUCCESS) {
            fprintf(stderr, "reference failed: %s: %s\n", flashattn_status_name(st), flashattn_last_error());
            out->check_ok = 0;
        }
    }

    /* Time: warm-up, then each call alone between events, L2 flushed before it. */
    cudaEvent_t ev0, ev1;
    CHECK_CUDA(cudaEventCreate(&ev0));
    CHECK_CUDA(cudaEventCreate(&ev1));
    double *t = malloc(sizeof(double) * iters);
    int ok = 1;
    for (int i = 0; i < warmup + iters && ok; ++i) {
        float ms;
        CHECK_CUDA(cudaMemsetAsync(l2_flush, i & 0xff, l2_bytes, 0));
        CHECK_CUDA(cudaEventRecord(ev0, 0));
        st = flashattn_fwd(h, &p, ws, ws_bytes, 0);
        CHECK_CUDA(cudaEventRecord(ev1, 0));
        if (st != FLASHATTN_STATUS_SUCCESS) {
            fprintf(stderr, "forward failed: %s: %s\n", flashattn_status_name(st), flashattn_last_error());
            ok = 0;
            break;
        }
        CHECK_CUDA(cudaEventSynchronize(ev1));
        CHECK_CUDA(cudaEventElapsedTime(&ms, ev0, ev1));
        if (i >= warmup) t[i - warmup] = ms;
    }
    CHECK_CUDA(cudaGetLastError());
    if (ok) {
        qsort(t, iters, sizeof(double), cmp_double);
        out->median_ms = t[iters / 2];
        int p99 = (int)ceil(0.99 * iters) - 1;
        out->p99_ms = t[p99 < 0 ? 0 : p99];
        if (is_decode(s)) {
            out->rate = kv_bytes_of(s) / (out->median_ms * 1e6);
            out->pct_peak = 100.0 * out->rate / copy_peak;
        } else {
            out->rate = flops_of(s) / (out->median_ms * 1e9);
            out->pct_peak = 100.0 * out->rate / gemm_peak;
        }
    }
    free(t);
    cudaEventDestroy(ev0), cudaEventDestroy(ev1);
    cudaFree(q), cudaFree(k), cudaFree(v), cudaFree(o);
    if (ws) cudaFree(ws);
    return ok;
}

static void usage(void) {
    fprintf(stderr,
            "usage: flashattn_bench [--suite default|quick] [--shape kind:dtype:b:hq:hkv:sq:sk:d:none|causal]\n"
            "                       [--backend auto|fused|fused_sm90|reference] [--iters N] [--warmup N] [--seed S]\n"
            "                       [--json FILE] [--csv FILE] [--no-check]\n");
}

int main(int argc, char **argv) {
    int backend = FLASHATTN_BACKEND_AUTO, iters = 30, warmup = 5, check = 1, quick = 0, have_shape = 0;
    uint64_t seed = (uint64_t)time(NULL);
    const char *json_path = NULL, *csv_path = NULL;
    shape one;
    for (int i = 1; i < argc; ++i) {
        const char *a = argv[i], *next = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--backend") && next) {
            ++i;
            if (!strcmp(next, "auto")) backend = FLASHATTN_BACKEND_AUTO;
            else if (!strcmp(next, "fused")) backend = FLASHATTN_BACKEND_FUSED;
            else if (!strcmp(next, "fused_sm90")) backend = FLASHATTN_BACKEND_FUSED_SM90;
            else if (!strcmp(next, "reference")) backend = FLASHATTN_BACKEND_REFERENCE;
            else { usage(); return 2; }
        } else if (!strcmp(a, "--suite") && next) {
            ++i;
            quick = !strcmp(next, "quick");
        } else if (!strcmp(a, "--shape") && next) {
            ++i;
            if (!parse_shape(next, &one)) { usage(); return 2; }
            have_shape = 1;
        } else if (!strcmp(a, "--iters") && next) { iters = atoi(argv[++i]); if (iters < 1) iters = 1; }
        else if (!strcmp(a, "--warmup") && next) warmup = atoi(argv[++i]);
        else if (!strcmp(a, "--seed") && next) seed = strtoull(argv[++i], NULL, 10);
        else if (!strcmp(a, "--json") && next) json_path = argv[++i];
        else if (!strcmp(a, "--csv") && next) csv_path = argv[++i];
        else if (!strcmp(a, "--no-check")) check = 0;
        else if (!strcmp(a, "--help") || !strcmp(a, "-h")) { usage(); return 0; }
        else { usage(); return 2; }
    }

    flashattn_handle *h = NULL;
    flashattn_status st = flashattn_handle_create(&h, 0);
    if (st != FLASHATTN_STATUS_SUCCESS) {
        fprintf(stderr, "flashattn_bench: no usable GPU: %s (%s)\n", flashattn_status_name(st), flashattn_last_error());
        return 2;
    }
    struct cudaDeviceProp prop;
    int driver = 0, runtime = 0;
    CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
    CHECK_CUDA(cudaDriverGetVersion(&driver));
    CHECK_CUDA(cudaRuntimeGetVersion(&runtime));
    double gemm_peak, copy_peak;
    measure_ceilings(&gemm_peak, &copy_peak);
    printf("# %s (%d SMs), driver %d, runtime %d, libflashattn %s (%s, %s), seed %llu\n", prop.name,
           prop.multiProcessorCount, driver, runtime, flashattn_version_string(), FA_BUILD_GIT_COMMIT, FA_BUILD_TYPE,
           (unsigned long long)seed);
    printf("# ceilings measured now: bf16 GEMM 8192^3 %.0f TFLOP/s, device copy %.0f GB/s\n", gemm_peak, copy_peak);

    shape shapes[128];
    const int n = have_shape ? 1 : default_suite(shapes, quick);
    if (have_shape) shapes[0] = one;
    row *rows = calloc(n, sizeof(row));
    const size_t l2_bytes = (size_t)256 << 20; /* > 4x the H200's 60 MB L2 */
    void *l2;
    CHECK_CUDA(cudaMalloc(&l2, l2_bytes));

    int failures = 0;
    for (int i = 0; i < n; ++i) {
        const shape *s = &shapes[i];
        fprintf(stderr, "[%d/%d] %s %s %lldx%lld/%lld sq=%lld sk=%lld d=%lld %s\n", i + 1, n, s->kind, s->dtype ? "bf16" : "fp16",
                (long long)s->b, (long long)s->hq, (long long)s->hkv, (long long)s->sq, (long long)s->sk, (long long)s->d,
                s->causal ? "causal" : "none");
        if (!bench_shape(h, s, backend, iters, warmup, seed + i, check, l2, l2_bytes, gemm_peak, copy_peak, &rows[i]) ||
            !rows[i].check_ok)
            ++failures;
    }

    printf("%-11s %-5s %-9s %6s %6s %3s %-7s %-9s %9s %9s %12s %7s %9s %9s %s\n", "kind", "dtype", "b x hq/hkv", "sq", "sk", "d",
           "mask", "backend", "median_ms", "p99_ms", "rate", "%peak", "max_err", "mem_MiB", "check");
    for (int i = 0; i < n; ++i) {
        const row *r = &rows[i];
        char bh[32], rate[32];
        snprintf(bh, sizeof bh, "%lldx%lld/%lld", (long long)r->s.b, (long long)r->s.hq, (long long)r->s.hkv);
        snprintf(rate, sizeof rate, is_decode(&r->s) ? "%.0f GB/s" : "%.1f TFLOP/s", r->rate);
        printf("%-11s %-5s %-9s %6lld %6lld %3lld %-7s %-9s %9.4f %9.4f %12s %6.1f%% %9.2e %9.1f %s\n", r->s.kind,
               r->s.dtype ? "bf16" : "fp16", bh, (long long)r->s.sq, (long long)r->s.sk, (long long)r->s.d,
               r->s.causal ? "causal" : "none", r->backend, r->median_ms, r->p99_ms, rate, r->pct_peak, r->max_err,
               r->mem_bytes / 1048576.0, r->check_ok ? "ok" : "FAIL");
    }
    printf("%d shapes, %d failed\n", n, failures);

    if (json_path) {
        FILE *f = fopen(json_path, "w");
        if (!f) { fprintf(stderr, "cannot write %s\n", json_path); return 1; }
        fprintf(f, "{\"gpu\": \"%s\", \"sms\": %d, \"driver\": %d, \"runtime\": %d, \"library\": \"%s\", \"commit\": \"%s\", "
                   "\"build_type\": \"%s\", \"cuda_archs\": \"%s\", \"seed\": %llu, \"iters\": %d, \"warmup\": %d, "
                   "\"gemm_bf16_tflops\": %.1f, \"copy_gbps\": %.1f, \"rows\": [\n",
                prop.name, prop.multiProcessorCount, driver, runtime, flashattn_version_string(), FA_BUILD_GIT_COMMIT,
                FA_BUILD_TYPE, FA_BUILD_CUDA_ARCHS, (unsigned long long)seed, iters, warmup, gemm_peak, copy_peak);
        for (int i = 0; i < n; ++i) {
            const row *r = &rows[i];
            fprintf(f, "  {\"kind\": \"%s\", \"dtype\": \"%s\", \"b\": %lld, \"hq\": %lld, \"hkv\": %lld, \"sq\": %lld, \"sk\": %lld, "
                       "\"d\": %lld, \"causal\": %s, \"seed\": %llu, \"backend\": \"%s\", \"kernel\": \"%s\", \"median_ms\": %.5f, "
                       "\"p99_ms\": %.5f, \"%s\": %.2f, \"pct_peak\": %.2f, \"max_err\": %.3e, \"mem_bytes\": %lld, \"check\": %s}%s\n",
                    r->s.kind, r->s.dtype ? "bfloat16" : "float16", (long long)r->s.b, (long long)r->s.hq, (long long)r->s.hkv,
                    (long long)r->s.sq, (long long)r->s.sk, (long long)r->s.d, r->s.causal ? "true" : "false",
                    (unsigned long long)(seed + i), r->backend, r->kernel, r->median_ms, r->p99_ms,
                    is_decode(&r->s) ? "gbps" : "tflops", r->rate, r->pct_peak, isnan(r->max_err) ? -1.0 : r->max_err,
                    (long long)r->mem_bytes, r->check_ok ? "true" : "false", i + 1 < n ? "," : "");
        }
        fprintf(f, "]}\n");
        fclose(f);
    }
    if (csv_path) {
        FILE *f = fopen(csv_path, "w");
        if (!f) { fprintf(stderr, "cannot write %s\n", csv_path); return 1; }
        fprintf(f, "kind,dtype,b,hq,hkv,sq,sk,d,causal,backend,kernel,median_ms,p99_ms,rate,rate_unit,pct_peak,max_err,mem_bytes,check,gpu,commit,seed\n");
        for (int i = 0; i < n; ++i) {
            const row *r = &rows[i];
            fprintf(f, "%s,%s,%lld,%lld,%lld,%lld,%lld,%lld,%d,%s,%s,%.5f,%.5f,%.2f,%s,%.2f,%.3e,%lld,%s,%s,%s,%llu\n", r->s.kind,
                    r->s.dtype ? "bfloat16" : "float16", (long long)r->s.b, (long long)r->s.hq, (long long)r->s.hkv,
                    (long long)r->s.sq, (long long)r->s.sk, (long long)r->s.d, r->s.causal, r->backend, r->kernel, r->median_ms,
                    r->p99_ms, r->rate, is_decode(&r->s) ? "GB/s" : "TFLOP/s", r->pct_peak, r->max_err, (long long)r->mem_bytes,
                    r->check_ok ? "ok" : "FAIL", prop.name, FA_BUILD_GIT_COMMIT, (unsigned long long)(seed + i));
        }
        fclose(f);
    }
    free(rows);
    cudaFree(l2);
    flashattn_handle_destroy(h);
    return failures ? 1 : 0;
}
