/*
 * flashattn_bench.c - times libflashattn's forward pass on the GPU.
 *
 *   flashattn_bench                       the default suite: the prefill and decode shapes of the
 *                                         peer table (16k tokens per prefill, hidden 2048)
 *   flashattn_bench --suite quick         a few shapes, for a smoke test
 *   flashattn_bench --suite decode        the default suite's decode shapes alone (dense and in
 *                                         pages of 1, 16, 64 and 256 keys)
 *   flashattn_bench --shape prefill:bf16:4:16:16:4096:4096:128:causal     one shape (repeatable)
 *                   (kind:dtype:batch:heads_q:heads_kv:seqlen_q:seqlen_k:head_dim:mask[:kv], kind
 *                    prefill, prefill-gqa or decode, dtype fp16 or bf16, mask none, causal,
 *                    window=L,R or causal,window=L,R: a sliding window of L keys left and R right
 *                    of the bottom-right diagonal, -1 unbounded; prefill kinds only; kv, how K and
 *                    V are laid out: dense (the default), cache (dense, with every sequence's key
 *                    count in a device array, seqused_k, as a serving call passes it) or pages=P
 *                    (a pool of pages of P keys in a shuffled order, a block table and seqused_k))
 *   --backend auto|fused|fused_sm90|reference   --iters N (30)   --warmup N (5)   --seed S (1)
 *   --json FILE   --csv FILE   --no-check   --help        (--opt VALUE and --opt=VALUE both work)
 *
 * Each shape is first checked against the REFERENCE backend (max |O - O_ref|); then it is timed
 * with CUDA events around each call, the L2 cache flushed before every timed call, and reported as
 * median and p99 milliseconds. Rows whose K and V are a cache or pages are followed, after the
 * table, by their rate over the rate of the same shape's dense row of the same run, where there is
 * one (the default suite has the decode shapes in pages of 1, 16, 64 and 256 keys).
 * FLOPs = 4*B*Hq*Sq*Sk*D, halved for causal when Sq == Sk (with a
 * window: 4*B*Hq*D times the (query, key) pairs the mask and window leave visible); decode rows
 * report K+V bytes read per second. "% peak" is against a cuBLAS bf16 GEMM (8192^3) and a
 * device-to-device copy, both measured at start-up in the same process. Inputs are drawn from the
 * seed (fixed by default, printed and recorded), so two runs see the same data.
 * Exit status: 0 every shape ran and passed its check; 1 a check failed or a call errored;
 * 2 bad arguments (the message names the option) or an output file that cannot be opened;
 * 3 no usable GPU.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <getopt.h>

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
    int window;     /* 1: window_left wl, window_right wr (-1: unbounded); 0: none */
    int64_t wl, wr;
    int64_t kv;     /* K/V layout: KV_DENSE, KV_CACHE, or >= 1: pages of that many keys */
} shape;

enum { KV_DENSE = 0, KV_CACHE = -1 };

enum { UNCHECKED = 0, CHECK_OK = 1, CHECK_FAILED = 2 };
enum { EXIT_CHECK_FAILED = 1, EXIT_USAGE = 2, EXIT_NO_DEVICE = 3 };

typedef struct row {
    shape s;
    char backend[16];
    char kernel[64];
    double median_ms, p99_ms, rate, pct_peak, max_err;
    int check;          /* CHECK_OK, CHECK_FAILED, or UNCHECKED (--no-check, or no memory for it) */
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

/* The (query, key) pairs a windowed call leaves visible: query i sees keys [i + off - wl,
 * i + off + wr] of [0, sk) (off = sk - sq, bottom-right), no further right than i + off if causal. */
static double window_pairs(const shape *s) {
    const int64_t off = s->sk - s->sq;
    double pairs = 0;
    for (int64_t i = 0; i < s->sq; ++i) {
        int64_t lo = s->wl >= 0 ? i + off - s->wl : 0, hi = s->wr >= 0 ? i + off + s->wr : s->sk - 1;
        if (s->causal && hi > i + off) hi = i + off;
        if (lo < 0) lo = 0;
        if (hi > s->sk - 1) hi = s->sk - 1;
        if (hi >= lo) pairs += (double)(hi - lo + 1);
    }
    return pairs;
}

static double flops_of(const shape *s) {
    if (s->window) return 4.0 * s->b * s->hq * s->d * window_pairs(s);
    const double f = 4.0 * s->b * s->hq * (double)s->sq * s->sk * s->d;
    return (s->causal && s->sq == s->sk) ? f / 2 : f;
}

/* The mask field as --shape spells it. */
static const char *mask_text(const shape *s, char *buf, size_t n) {
    if (!s->window) return s->causal ? "causal" : "none";
    snprintf(buf, n, "%swindow=%lld,%lld", s->causal ? "causal," : "", (long long)s->wl, (long long)s->wr);
    return buf;
}

/* "b x hq/hkv" as the table prints it. */
static const char *heads_text(const shape *s, char *buf, size_t n) {
    snprintf(buf, n, "%lldx%lld/%lld", (long long)s->b, (long long)s->hq, (long long)s->hkv);
    return buf;
}

/* Whether two shapes differ only in how K and V are laid out (kind, dtype, sizes and mask alike). */
static int same_but_kv(const shape *a, const shape *b) {
    return !strcmp(a->kind, b->kind) && a->dtype == b->dtype && a->b == b->b && a->hq == b->hq && a->hkv == b->hkv &&
           a->sq == b->sq && a->sk == b->sk && a->d == b->d && a->causal == b->causal && a->window == b->window &&
           a->wl == b->wl && a->wr == b->wr;
}

/* The kv field as --shape spells it. */
static const char *kv_text(const shape *s, char *buf, size_t n) {
    if (s->kv == KV_DENSE) return "dense";
    if (s->kv == KV_CACHE) return "cache";
    snprintf(buf, n, "pages=%lld", (long long)s->kv);
    return buf;
}

static double kv_bytes_of(const shape *s) { return 2.0 * s->b * s->hkv * (double)s->sk * s->d * 2; }

static int is_decode(const shape *s) { return strcmp(s->kind, "decode") == 0; }

/* ---- the default suite: the peer table's shapes (docs/performance.md, benchmarks/compare_peers.py) ---- */
enum { SUITE_DEFAULT, SUITE_QUICK, SUITE_DECODE };

/* The peer table's decodes (GQA 32/8, head dim 128), each dense and over a paged cache (vLLM's 16
 * keys a page, SGLang's 1, and large pages of 64 and 256). */
static const int64_t decode_shapes[][2] = {{1, 8192}, {16, 8192}, {64, 4096}, {128, 2048}, {8, 32768}, {1, 131072}};
static const int64_t decode_pages[] = {1, 16, 64, 256};
#define N_DECODE_SHAPES (sizeof decode_shapes / sizeof decode_shapes[0])
#define N_DECODE_PAGES (sizeof decode_pages / sizeof decode_pages[0])
#define DECODE_SUITE_SIZE (N_DECODE_SHAPES * (1 + N_DECODE_PAGES))

static int decode_suite(shape *out) {
    int n = 0;
    const int64_t(*dec)[2] = decode_shapes;
    for (int i = 0; i < (int)N_DECODE_SHAPES; ++i) out[n++] = (shape){"decode", 1, dec[i][0], 32, 8, 1, dec[i][1], 128, 0};
    for (int i = 0; i < (int)N_DECODE_SHAPES; ++i)
        for (int j = 0; j < (int)N_DECODE_PAGES; ++j)
            out[n++] = (shape){"decode", 1, dec[i][0], 32, 8, 1, dec[i][1], 128, 0, .kv = decode_pages[j]};
    return n;
}

static const shape quick_suite[] = {{"prefill", 1, 4, 16, 16, 1024, 1024, 128, 0}, {"prefill", 1, 4, 16, 16, 1024, 1024, 128, 1},
                                    {"prefill", 0, 8, 32, 32, 512, 512, 64, 1}, {"decode", 1, 16, 32, 8, 1, 8192, 128, 0},
                                    {"decode", 1, 16, 32, 8, 1, 8192, 128, 0, .kv = 16}};
static const int64_t prefill_seqs[] = {512, 1024, 2048, 4096, 8192, 16384};
static const int64_t prefill_dims[] = {64, 128, 256};
#define N_PREFILL_SEQS (sizeof prefill_seqs / sizeof prefill_seqs[0])
#define N_PREFILL_DIMS (sizeof prefill_dims / sizeof prefill_dims[0])
static const shape gqa_prefills[] = {{"prefill-gqa", 1, 8, 32, 8, 2048, 2048, 128, 1}, {"prefill-gqa", 1, 2, 32, 8, 8192, 8192, 128, 1}};
#define N_GQA_PREFILLS (sizeof gqa_prefills / sizeof gqa_prefills[0])
/* What default_suite writes: bf16 at each head dim and fp16 at 128, each sequence causal and not,
 * then the GQA prefills and the decode suite. */
#define DEFAULT_SUITE_SIZE ((N_PREFILL_DIMS + 1) * N_PREFILL_SEQS * 2 + N_GQA_PREFILLS + DECODE_SUITE_SIZE)

static int default_suite(shape *out, int suite) {
    int n = 0;
    if (suite == SUITE_DECODE) return decode_suite(out);
    if (suite == SUITE_QUICK) {
        memcpy(out, quick_suite, sizeof quick_suite);
        return (int)(sizeof quick_suite / sizeof quick_suite[0]);
    }
    const int64_t *seqs = prefill_seqs, *dims = prefill_dims;
    for (int di = 0; di < (int)N_PREFILL_DIMS; ++di)
        for (int si = 0; si < (int)N_PREFILL_SEQS; ++si)
            for (int c = 0; c < 2; ++c)
                out[n++] = (shape){"prefill", 1, 16384 / seqs[si], 2048 / dims[di], 2048 / dims[di], seqs[si], seqs[si], dims[di], c};
    for (int si = 0; si < (int)N_PREFILL_SEQS; ++si)
        for (int c = 0; c < 2; ++c)
            out[n++] = (shape){"prefill", 0, 16384 / seqs[si], 16, 16, seqs[si], seqs[si], 128, c};
    for (int i = 0; i < (int)N_GQA_PREFILLS; ++i) out[n++] = gqa_prefills[i];
    return n + decode_suite(out + n);
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
    if (s->window) p->window_left = s->wl, p->window_right = s->wr;
    p->backend = backend;
}

static const char *backend_name(int backend) {
    return backend == FLASHATTN_BACKEND_FUSED        ? "fused"
           : backend == FLASHATTN_BACKEND_FUSED_SM90 ? "fused_sm90"
           : backend == FLASHATTN_BACKEND_REFERENCE  ? "reference"
                                                     : "auto";
}

/* Checks against the REFERENCE backend (sets out->check and out->max_err); 0 if a call failed. */
static int check_shape(flashattn_handle *h, const shape *s, const flashattn_fwd_params *p, void *ws,
                       size_t ws_bytes, row *out) {
    const int64_t nq = s->b * s->sq * s->hq * s->d;
    flashattn_fwd_params pr = *p;
    size_t ref_bytes = 0;
    void *o_ref = NULL, *ws_ref = NULL;
    unsigned int *d_bits = NULL, bits = 0;
    int ok = 1;
    pr.backend = FLASHATTN_BACKEND_REFERENCE;
    flashattn_status st = flashattn_fwd_workspace_size(h, &pr, &ref_bytes);
    if (st != FLASHATTN_STATUS_SUCCESS) {
        fprintf(stderr, "reference plan failed: %s: %s\n", flashattn_status_name(st), flashattn_last_error());
        out->check = CHECK_FAILED;
        return 0;
    }
    if (cudaMalloc(&o_ref, nq * 2) != cudaSuccess || cudaMalloc(&ws_ref, ref_bytes) != cudaSuccess) {
        (void)cudaGetLastError();
        fprintf(stderr, "  (not checked: %zu bytes for the reference unavailable)\n", ref_bytes + nq * 2);
        out->check = UNCHECKED;
        goto done;
    }
    pr.o = o_ref;
    CHECK_CUDA(cudaMemset(p->o, 0xff, nq * 2)); /* poisoned: NaN in both dtypes */
    CHECK_CUDA(cudaMemset(o_ref, 0xff, nq * 2));
    if ((st = flashattn_fwd(h, &pr, ws_ref, ref_bytes, 0)) != FLASHATTN_STATUS_SUCCESS ||
        (st = flashattn_fwd(h, p, ws, ws_bytes, 0)) != FLASHATTN_STATUS_SUCCESS) {
        fprintf(stderr, "forward failed: %s: %s\n", flashattn_status_name(st), flashattn_last_error());
        out->check = CHECK_FAILED;
        ok = 0;
        goto done;
    }
    CHECK_CUDA(cudaMalloc((void **)&d_bits, sizeof bits));
    CHECK_CUDA(cudaMemset(d_bits, 0, sizeof bits));
    bench_max_abs_diff(p->o, o_ref, nq, s->dtype, d_bits, 0);
    CHECK_CUDA(cudaMemcpy(&bits, d_bits, sizeof bits, cudaMemcpyDeviceToHost));
    float err;
    memcpy(&err, &bits, sizeof err);
    out->max_err = err;
    /* O is an average of N(0,1) values; a few output ulps is the expected disagreement. */
    out->check = err <= (s->dtype == 1 ? 3e-2 : 5e-3) ? CHECK_OK : CHECK_FAILED;
done:
    cudaFree(d_bits);
    cudaFree(ws_ref);
    cudaFree(o_ref);
    return ok;
}

/* A page order drawn from the seed: a permutation of 0..n-1 (splitmix64, Fisher-Yates). */
static void shuffled_pages(int32_t *order, int64_t n, uint64_t seed) {
    uint64_t x = seed ^ 0x5851f42d4c957f2dULL;
    for (int64_t i = 0; i < n; ++i) order[i] = (int32_t)i;
    for (int64_t i = n - 1; i > 0; --i) {
        uint64_t z = (x += 0x9e3779b97f4a7c15ULL);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
        z ^= z >> 31;
        const int64_t j = (int64_t)(z % (uint64_t)(i + 1));
        const int32_t tmp = order[i];
        order[i] = order[j], order[j] = tmp;
    }
}

static int bench_shape(flashattn_handle *h, const shape *s, int backend, int iters, int warmup, uint64_t seed, int check,
                       void *l2_flush, size_t l2_bytes, double gemm_peak, double copy_peak, row *out) {
    memset(out, 0, sizeof *out);
    out->s = *s;
    out->max_err = NAN;
    /* K and V: [b, sk, hkv, d], or with pages pools [b * pages_per_seq, page, hkv, d] */
    const int64_t pages_per_seq = s->kv > 0 ? (s->sk + s->kv - 1) / s->kv : 0, num_pages = s->b * pages_per_seq;
    const int64_t nq = s->b * s->sq * s->hq * s->d;
    const int64_t nk = s->kv > 0 ? num_pages * s->kv * s->hkv * s->d : s->b * s->sk * s->hkv * s->d;
    void *q = NULL, *k = NULL, *v = NULL, *o = NULL, *ws = NULL;
    int32_t *lens = NULL, *table = NULL, *host = NULL;
    double *t = NULL;
    cudaEvent_t ev0 = NULL, ev1 = NULL;
    int ok = 0;
    CHECK_CUDA(cudaMalloc(&q, nq * 2));
    CHECK_CUDA(cudaMalloc(&k, nk * 2));
    CHECK_CUDA(cudaMalloc(&v, nk * 2));
    CHECK_CUDA(cudaMalloc(&o, nq * 2));
    bench_fill_normal(q, nq, seed * 3 + 0, s->dtype, 0);
    bench_fill_normal(k, nk, seed * 3 + 1, s->dtype, 0);
    bench_fill_normal(v, nk, seed * 3 + 2, s->dtype, 0);

    flashattn_fwd_params p;
    fill_params(&p, s, q, k, v, o, backend);
    if (s->kv != KV_DENSE) {
        /* every sequence's cache full: seqused_k[b] = sk; pages listed in a shuffled order */
        const int64_t n_host = s->b > num_pages ? s->b : num_pages;
        host = malloc(sizeof(int32_t) * (size_t)n_host);
        if (host == NULL) {
            fprintf(stderr, "out of host memory for the block table\n");
            goto done;
        }
        for (int64_t i = 0; i < s->b; ++i) host[i] = (int32_t)s->sk;
        CHECK_CUDA(cudaMalloc((void **)&lens, sizeof(int32_t) * s->b));
        CHECK_CUDA(cudaMemcpy(lens, host, sizeof(int32_t) * s->b, cudaMemcpyHostToDevice));
        p.seqused_k = lens;
        if (s->kv > 0) {
            shuffled_pages(host, num_pages, seed);
            CHECK_CUDA(cudaMalloc((void **)&table, sizeof(int32_t) * num_pages));
            CHECK_CUDA(cudaMemcpy(table, host, sizeof(int32_t) * num_pages, cudaMemcpyHostToDevice));
            p.block_table = table;
            p.block_table_batch_stride = p.pages_per_seq = pages_per_seq;
            p.page_size = s->kv, p.num_pages = num_pages;
            p.k_batch_stride = p.v_batch_stride = s->kv * s->hkv * s->d; /* the page stride */
        }
    }
    flashattn_plan_info info;
    flashattn_plan_info_init(&info);
    size_t ws_bytes = 0;
    flashattn_status st = flashattn_fwd_plan(h, &p, &info);
    if (st == FLASHATTN_STATUS_SUCCESS) st = flashattn_fwd_workspace_size(h, &p, &ws_bytes);
    if (st != FLASHATTN_STATUS_SUCCESS) {
        fprintf(stderr, "plan failed: %s: %s\n", flashattn_status_name(st), flashattn_last_error());
        goto done;
    }
    snprintf(out->backend, sizeof out->backend, "%s", backend_name(info.backend));
    snprintf(out->kernel, sizeof out->kernel, "%s", info.kernel_name);
    if (ws_bytes) CHECK_CUDA(cudaMalloc(&ws, ws_bytes));
    out->mem_bytes = (nq * 2 + nk * 2) * 2 + (int64_t)ws_bytes + (s->kv != KV_DENSE ? 4 * (s->b + num_pages) : 0);

    /* Check against the reference backend before timing. */
    if (check && !check_shape(h, s, &p, ws, ws_bytes, out)) goto done;

    /* Time: warm-up, then each call alone between events, L2 flushed before it. */
    CHECK_CUDA(cudaEventCreate(&ev0));
    CHECK_CUDA(cudaEventCreate(&ev1));
    t = malloc(sizeof(double) * iters);
    if (t == NULL) goto done;
    for (int i = 0; i < warmup + iters; ++i) {
        float ms;
        CHECK_CUDA(cudaMemsetAsync(l2_flush, i & 0xff, l2_bytes, 0));
        CHECK_CUDA(cudaEventRecord(ev0, 0));
        st = flashattn_fwd(h, &p, ws, ws_bytes, 0);
        CHECK_CUDA(cudaEventRecord(ev1, 0));
        if (st != FLASHATTN_STATUS_SUCCESS) {
            fprintf(stderr, "forward failed: %s: %s\n", flashattn_status_name(st), flashattn_last_error());
            goto done;
        }
        CHECK_CUDA(cudaEventSynchronize(ev1));
        CHECK_CUDA(cudaEventElapsedTime(&ms, ev0, ev1));
        if (i >= warmup) t[i - warmup] = ms;
    }
    CHECK_CUDA(cudaGetLastError());
    qsort(t, iters, sizeof(double), cmp_double);
    out->median_ms = t[iters / 2];
    const int p99 = (int)ceil(0.99 * iters) - 1;
    out->p99_ms = t[p99 < 0 ? 0 : p99];
    if (is_decode(s)) {
        out->rate = kv_bytes_of(s) / (out->median_ms * 1e6);
        out->pct_peak = 100.0 * out->rate / copy_peak;
    } else {
        out->rate = flops_of(s) / (out->median_ms * 1e9);
        out->pct_peak = 100.0 * out->rate / gemm_peak;
    }
    ok = 1;
done:
    free(t);
    if (ev0) cudaEventDestroy(ev0);
    if (ev1) cudaEventDestroy(ev1);
    cudaFree(q), cudaFree(k), cudaFree(v), cudaFree(o), cudaFree(ws), cudaFree(lens), cudaFree(table);
    free(host);
    return ok;
}

/* ---- arguments ----------------------------------------------------------------------------------- */

static void usage(FILE *f) {
    fprintf(f,
            "usage: flashattn_bench [--suite default|quick|decode] [--shape kind:dtype:b:hq:hkv:sq:sk:d:mask[:kv]]...\n"
            "                       [--backend auto|fused|fused_sm90|reference] [--iters N] [--warmup N] [--seed S]\n"
            "                       [--json FILE] [--csv FILE] [--no-check] [--help]\n"
            "  kind prefill|prefill-gqa|decode, dtype fp16|bf16, mask none|causal|window=L,R|causal,window=L,R\n"
            "  (windows: prefill kinds, L and R >= -1, -1 unbounded); b, hq, hkv, sq, sk, d >= 1\n"
            "  kv dense (default)|cache|pages=P: K/V dense, a cache with per-sequence counts (seqused_k),\n"
            "  or a pool of pages of P keys in a shuffled order with a block table\n"
            "  exit status: 0 all shapes ran and passed, 1 a check or call failed, 2 bad arguments, 3 no usable GPU\n");
}

static int bad_arg(const char *opt, const char *value, const char *expected) {
    fprintf(stderr, "flashattn_bench: --%s '%s': expected %s\n", opt, value, expected);
    usage(stderr);
    return EXIT_USAGE;
}

/* A whole-string integer in [lo, hi]. */
static int parse_int64(const char *text, int64_t lo, int64_t hi, int64_t *out) {
    char *end;
    errno = 0;
    const long long v = strtoll(text, &end, 10);
    if (errno != 0 || end == text || *end != '\0' || v < lo || v > hi) return 0;
    *out = v;
    return 1;
}

/* NULL when text is a valid shape (written to *s), else which part is wrong (in buf). */
static const char *parse_shape(const char *text, shape *s, char *why, size_t n) {
    static const char *const names[9] = {"kind", "dtype", "b", "hq", "hkv", "sq", "sk", "d", "mask"};
    char buf[256], *fields[10], *save = NULL;
    int count = 0;
    snprintf(buf, sizeof buf, "%s", text);
    for (char *f = strtok_r(buf, ":", &save); f != NULL; f = strtok_r(NULL, ":", &save)) {
        if (count < 10) fields[count] = f;
        ++count;
    }
    if (strlen(text) >= sizeof buf || (count != 9 && count != 10)) {
        snprintf(why, n, "9 or 10 fields kind:dtype:b:hq:hkv:sq:sk:d:mask[:kv] (got %d)", count);
        return why;
    }
    memset(s, 0, sizeof *s);
    if (strcmp(fields[0], "prefill") && strcmp(fields[0], "prefill-gqa") && strcmp(fields[0], "decode")) {
        snprintf(why, n, "kind prefill, prefill-gqa or decode (got '%s')", fields[0]);
        return why;
    }
    snprintf(s->kind, sizeof s->kind, "%s", fields[0]);
    if (!strcmp(fields[1], "fp16")) s->dtype = 0;
    else if (!strcmp(fields[1], "bf16")) s->dtype = 1;
    else {
        snprintf(why, n, "dtype fp16 or bf16 (got '%s')", fields[1]);
        return why;
    }
    int64_t *dims[6] = {&s->b, &s->hq, &s->hkv, &s->sq, &s->sk, &s->d};
    for (int i = 0; i < 6; ++i)
        if (!parse_int64(fields[2 + i], 1, (int64_t)1 << 31, dims[i])) {
            snprintf(why, n, "%s an integer in 1..2^31 (got '%s')", names[2 + i], fields[2 + i]);
            return why;
        }
    const char *mask = fields[8];
    if (!strncmp(mask, "causal,", 7)) s->causal = 1, mask += 7;
    if (!strncmp(mask, "window=", 7)) {
        char lr[64], *comma;
        snprintf(lr, sizeof lr, "%s", mask + 7);
        comma = strchr(lr, ',');
        if (comma) *comma = '\0';
        if (comma == NULL || !parse_int64(lr, -1, (int64_t)1 << 31, &s->wl) ||
            !parse_int64(comma + 1, -1, (int64_t)1 << 31, &s->wr)) {
            snprintf(why, n, "window=L,R with L and R integers in -1..2^31 (got '%s')", fields[8]);
            return why;
        }
        if (!strcmp(s->kind, "decode")) {
            snprintf(why, n, "a window with kind prefill or prefill-gqa (got kind decode)");
            return why;
        }
        s->window = 1;
    } else if (!strcmp(fields[8], "causal")) {
        s->causal = 1;
    } else if (strcmp(fields[8], "none")) {
        snprintf(why, n, "mask none, causal, window=L,R or causal,window=L,R (got '%s')", fields[8]);
        return why;
    }
    if (count == 10 && strcmp(fields[9], "dense")) {
        if (!strcmp(fields[9], "cache")) {
            s->kv = KV_CACHE;
        } else if (strncmp(fields[9], "pages=", 6) || !parse_int64(fields[9] + 6, 1, (int64_t)1 << 31, &s->kv)) {
            snprintf(why, n, "kv dense, cache or pages=P with P an integer in 1..2^31 (got '%s')", fields[9]);
            return why;
        }
    }
    return NULL;
}

/* ---- output -------------------------------------------------------------------------------------- */

static void json_string(FILE *f, const char *text) {
    fputc('"', f);
    for (const unsigned char *c = (const unsigned char *)text; *c; ++c) {
        if (*c == '"' || *c == '\\') fprintf(f, "\\%c", *c);
        else if (*c < 0x20) fprintf(f, "\\u%04x", *c);
        else fputc(*c, f);
    }
    fputc('"', f);
}

/* A JSON number, or null for NaN and infinities (which JSON cannot hold). */
static void json_number(FILE *f, double x, const char *fmt) {
    if (isfinite(x)) fprintf(f, fmt, x);
    else fputs("null", f);
}

static const char *check_word(int check) {
    return check == CHECK_OK ? "ok" : check == CHECK_FAILED ? "FAIL" : "unchecked";
}

static void write_json(FILE *f, const struct cudaDeviceProp *prop, int driver, int runtime, uint64_t seed,
                       int iters, int warmup, double gemm_peak, double copy_peak, const row *rows, int n) {
    fputs("{\"gpu\": ", f);
    json_string(f, prop->name);
    fprintf(f, ", \"sms\": %d, \"driver\": %d, \"runtime\": %d, \"library\": ", prop->multiProcessorCount, driver, runtime);
    json_string(f, flashattn_version_string());
    fputs(", \"build\": ", f);
    json_string(f, flashattn_build_info());
    fputs(", \"commit\": ", f);
    json_string(f, FA_BUILD_GIT_COMMIT);
    fprintf(f, ", \"seed\": %llu, \"iters\": %d, \"warmup\": %d, \"gemm_bf16_tflops\": ", (unsigned long long)seed, iters,
            warmup);
    json_number(f, gemm_peak, "%.1f");
    fputs(", \"copy_gbps\": ", f);
    json_number(f, copy_peak, "%.1f");
    fputs(", \"rows\": [\n", f);
    for (int i = 0; i < n; ++i) {
        const row *r = &rows[i];
        char window[64] = "null", kv[32]; /* [left, right], or null */
        if (r->s.window) snprintf(window, sizeof window, "[%lld, %lld]", (long long)r->s.wl, (long long)r->s.wr);
        fputs("  {\"kind\": ", f);
        json_string(f, r->s.kind);
        fprintf(f, ", \"dtype\": \"%s\", \"b\": %lld, \"hq\": %lld, \"hkv\": %lld, \"sq\": %lld, \"sk\": %lld, \"d\": %lld, "
                   "\"causal\": %s, \"window\": %s, \"kv\": \"%s\", \"seed\": %llu, \"backend\": ",
                r->s.dtype ? "bfloat16" : "float16", (long long)r->s.b, (long long)r->s.hq, (long long)r->s.hkv,
                (long long)r->s.sq, (long long)r->s.sk, (long long)r->s.d, r->s.causal ? "true" : "false", window,
                kv_text(&r->s, kv, sizeof kv), (unsigned long long)(seed + i));
        json_string(f, r->backend);
        fputs(", \"kernel\": ", f);
        json_string(f, r->kernel);
        const double nan = NAN;
        const int ran = r->median_ms > 0;
        fputs(", \"median_ms\": ", f);
        json_number(f, ran ? r->median_ms : nan, "%.5f");
        fputs(", \"p99_ms\": ", f);
        json_number(f, ran ? r->p99_ms : nan, "%.5f");
        fprintf(f, ", \"%s\": ", is_decode(&r->s) ? "gbps" : "tflops");
        json_number(f, ran ? r->rate : nan, "%.2f");
        fputs(", \"pct_peak\": ", f);
        json_number(f, ran ? r->pct_peak : nan, "%.2f");
        fputs(", \"max_err\": ", f);
        json_number(f, r->max_err, "%.3e");
        fprintf(f, ", \"mem_bytes\": %lld, \"check\": %s}%s\n", (long long)r->mem_bytes,
                r->check == CHECK_OK ? "true" : r->check == CHECK_FAILED ? "false" : "null", i + 1 < n ? "," : "");
    }
    fputs("]}\n", f);
}

static void write_csv(FILE *f, const struct cudaDeviceProp *prop, uint64_t seed, const row *rows, int n) {
    fprintf(f, "kind,dtype,b,hq,hkv,sq,sk,d,causal,backend,kernel,median_ms,p99_ms,rate,rate_unit,pct_peak,max_err,mem_bytes,check,gpu,"
               "commit,seed,window_left,window_right,kv\n");
    for (int i = 0; i < n; ++i) {
        const row *r = &rows[i];
        char kv[32];
        fprintf(f, "%s,%s,%lld,%lld,%lld,%lld,%lld,%lld,%d,%s,%s,%.5f,%.5f,%.2f,%s,%.2f,%.3e,%lld,%s,\"%s\",%s,%llu,%lld,%lld,%s\n", r->s.kind,
                r->s.dtype ? "bfloat16" : "float16", (long long)r->s.b, (long long)r->s.hq, (long long)r->s.hkv,
                (long long)r->s.sq, (long long)r->s.sk, (long long)r->s.d, r->s.causal, r->backend, r->kernel, r->median_ms,
                r->p99_ms, r->rate, is_decode(&r->s) ? "GB/s" : "TFLOP/s", r->pct_peak, r->max_err, (long long)r->mem_bytes,
                check_word(r->check), prop->name, FA_BUILD_GIT_COMMIT, (unsigned long long)(seed + i),
                (long long)(r->s.window ? r->s.wl : -1), (long long)(r->s.window ? r->s.wr : -1), kv_text(&r->s, kv, sizeof kv));
    }
}

/* Each cache or paged row's rate over the rate of the dense row of the same shape in this run
 * (same kind, dtype, sizes and mask), where both ran: what the serving layouts cost. */
static void print_kv_ratios(const row *rows, int n) {
    int header = 0;
    for (int i = 0; i < n; ++i) {
        const row *r = &rows[i];
        if (r->s.kv == KV_DENSE || !(r->rate > 0)) continue;
        for (int j = 0; j < n; ++j) {
            if (rows[j].s.kv != KV_DENSE || !(rows[j].rate > 0) || !same_but_kv(&rows[j].s, &r->s)) continue;
            char bh[32], mask[64], kv[32];
            if (!header) printf("rate over the dense row of the same shape (this run):\n");
            header = 1;
            printf("  %-11s %-5s %-9s sq=%lld sk=%lld d=%lld %s %-9s %.3f\n", r->s.kind, r->s.dtype ? "bf16" : "fp16",
                   heads_text(&r->s, bh, sizeof bh),
                   (long long)r->s.sq, (long long)r->s.sk, (long long)r->s.d, mask_text(&r->s, mask, sizeof mask),
                   kv_text(&r->s, kv, sizeof kv), r->rate / rows[j].rate);
            break;
        }
    }
}

#define MAX_SHAPES 128
#define FA_STR_(x) #x
#define FA_STR(x) FA_STR_(x)
/* Every built-in suite fits the shape array that --shape fills. */
_Static_assert(DEFAULT_SUITE_SIZE <= MAX_SHAPES, "the default suite outgrows MAX_SHAPES");
_Static_assert(DECODE_SUITE_SIZE <= MAX_SHAPES, "the decode suite outgrows MAX_SHAPES");
_Static_assert(sizeof quick_suite / sizeof quick_suite[0] <= MAX_SHAPES, "the quick suite outgrows MAX_SHAPES");

int main(int argc, char **argv) {
    int backend = FLASHATTN_BACKEND_AUTO, check = 1, suite = SUITE_DEFAULT, n_shapes = 0;
    int64_t iters = 30, warmup = 5;
    uint64_t seed = 1;
    const char *json_path = NULL, *csv_path = NULL;
    static shape shapes[MAX_SHAPES];
    enum { OPT_SUITE = 256, OPT_SHAPE, OPT_BACKEND, OPT_ITERS, OPT_WARMUP, OPT_SEED, OPT_JSON, OPT_CSV, OPT_NO_CHECK };
    static const struct option options[] = {
        {"suite", required_argument, NULL, OPT_SUITE},     {"shape", required_argument, NULL, OPT_SHAPE},
        {"backend", required_argument, NULL, OPT_BACKEND}, {"iters", required_argument, NULL, OPT_ITERS},
        {"warmup", required_argument, NULL, OPT_WARMUP},   {"seed", required_argument, NULL, OPT_SEED},
        {"json", required_argument, NULL, OPT_JSON},       {"csv", required_argument, NULL, OPT_CSV},
        {"no-check", no_argument, NULL, OPT_NO_CHECK},     {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    opterr = 0; /* our own messages name the option */
    int c;
    char why[160];
    while ((c = getopt_long(argc, argv, "h", options, NULL)) != -1) {
        int64_t v;
        switch (c) {
        case OPT_SUITE:
            if (!strcmp(optarg, "quick")) suite = SUITE_QUICK;
            else if (!strcmp(optarg, "decode")) suite = SUITE_DECODE;
            else if (!strcmp(optarg, "default")) suite = SUITE_DEFAULT;
            else return bad_arg("suite", optarg, "default, quick or decode");
            break;
        case OPT_SHAPE:
            if (n_shapes == MAX_SHAPES) return bad_arg("shape", optarg, "at most " FA_STR(MAX_SHAPES) " --shape options");
            if (parse_shape(optarg, &shapes[n_shapes], why, sizeof why)) return bad_arg("shape", optarg, why);
            ++n_shapes;
            break;
        case OPT_BACKEND:
            if (!strcmp(optarg, "auto")) backend = FLASHATTN_BACKEND_AUTO;
            else if (!strcmp(optarg, "fused")) backend = FLASHATTN_BACKEND_FUSED;
            else if (!strcmp(optarg, "fused_sm90")) backend = FLASHATTN_BACKEND_FUSED_SM90;
            else if (!strcmp(optarg, "reference")) backend = FLASHATTN_BACKEND_REFERENCE;
            else return bad_arg("backend", optarg, "auto, fused, fused_sm90 or reference");
            break;
        case OPT_ITERS:
            if (!parse_int64(optarg, 1, 1000000, &iters)) return bad_arg("iters", optarg, "an integer in 1..1000000");
            break;
        case OPT_WARMUP:
            if (!parse_int64(optarg, 0, 1000000, &warmup)) return bad_arg("warmup", optarg, "an integer in 0..1000000");
            break;
        case OPT_SEED:
            if (!parse_int64(optarg, 0, INT64_MAX, &v)) return bad_arg("seed", optarg, "an integer in 0..2^63-1");
            seed = (uint64_t)v;
            break;
        case OPT_JSON: json_path = optarg; break;
        case OPT_CSV: csv_path = optarg; break;
        case OPT_NO_CHECK: check = 0; break;
        case 'h': usage(stdout); return 0;
        default: /* '?': unknown option or missing value */
            if (optopt != 0 && optopt < 256)
                fprintf(stderr, "flashattn_bench: unknown option '-%c'\n", optopt);
            else
                fprintf(stderr, "flashattn_bench: '%s': unknown option, or its value is missing\n", argv[optind - 1]);
            usage(stderr);
            return EXIT_USAGE;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "flashattn_bench: unexpected argument '%s'\n", argv[optind]);
        usage(stderr);
        return EXIT_USAGE;
    }
    /* Output files are opened before the run, so a bad path costs no GPU time. */
    FILE *json = NULL, *csv = NULL;
    if (json_path && !(json = fopen(json_path, "w"))) {
        fprintf(stderr, "flashattn_bench: --json '%s': cannot open for writing: %s\n", json_path, strerror(errno));
        return EXIT_USAGE;
    }
    if (csv_path && !(csv = fopen(csv_path, "w"))) {
        fprintf(stderr, "flashattn_bench: --csv '%s': cannot open for writing: %s\n", csv_path, strerror(errno));
        return EXIT_USAGE;
    }

    flashattn_handle *h = NULL;
    flashattn_status st = flashattn_handle_create(&h, 0);
    if (st != FLASHATTN_STATUS_SUCCESS) {
        fprintf(stderr, "flashattn_bench: no usable GPU: %s: %s\n", flashattn_status_name(st), flashattn_last_error());
        return st == FLASHATTN_STATUS_NO_DEVICE || st == FLASHATTN_STATUS_DEVICE_TOO_OLD ? EXIT_NO_DEVICE : EXIT_CHECK_FAILED;
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
    printf("# build: %s\n", flashattn_build_info());
    printf("# ceilings measured now: bf16 GEMM 8192^3 %.0f TFLOP/s, device copy %.0f GB/s\n", gemm_peak, copy_peak);

    const int n = n_shapes ? n_shapes : default_suite(shapes, suite);
    row *rows = calloc(n, sizeof(row));
    const size_t l2_bytes = (size_t)256 << 20; /* > 4x the H200's 60 MB L2 */
    void *l2;
    CHECK_CUDA(cudaMalloc(&l2, l2_bytes));

    int failures = 0;
    for (int i = 0; i < n; ++i) {
        const shape *s = &shapes[i];
        char bh[32], mask[64], kv[32];
        fprintf(stderr, "[%d/%d] %s %s %s sq=%lld sk=%lld d=%lld %s %s\n", i + 1, n, s->kind, s->dtype ? "bf16" : "fp16",
                heads_text(s, bh, sizeof bh), (long long)s->sq, (long long)s->sk, (long long)s->d,
                mask_text(s, mask, sizeof mask), kv_text(s, kv, sizeof kv));
        if (!bench_shape(h, s, backend, (int)iters, (int)warmup, seed + i, check, l2, l2_bytes, gemm_peak, copy_peak,
                         &rows[i]) ||
            rows[i].check == CHECK_FAILED)
            ++failures;
    }

    printf("%-11s %-5s %-9s %6s %6s %3s %-7s %-9s %-10s %9s %9s %12s %7s %9s %9s %s\n", "kind", "dtype", "b x hq/hkv", "sq", "sk",
           "d", "mask", "kv", "backend", "median_ms", "p99_ms", "rate", "%peak", "max_err", "mem_MiB", "check");
    for (int i = 0; i < n; ++i) {
        const row *r = &rows[i];
        char bh[32], rate[32], mask[64], kv[32];
        heads_text(&r->s, bh, sizeof bh);
        snprintf(rate, sizeof rate, is_decode(&r->s) ? "%.0f GB/s" : "%.1f TFLOP/s", r->rate);
        printf("%-11s %-5s %-9s %6lld %6lld %3lld %-7s %-9s %-10s %9.4f %9.4f %12s %6.1f%% %9.2e %9.1f %s\n", r->s.kind,
               r->s.dtype ? "bf16" : "fp16", bh, (long long)r->s.sq, (long long)r->s.sk, (long long)r->s.d,
               mask_text(&r->s, mask, sizeof mask), kv_text(&r->s, kv, sizeof kv), r->backend, r->median_ms, r->p99_ms, rate,
               r->pct_peak, r->max_err, r->mem_bytes / 1048576.0, check_word(r->check));
    }
    print_kv_ratios(rows, n);
    printf("%d shapes, %d failed\n", n, failures);

    int rc = failures ? EXIT_CHECK_FAILED : 0;
    if (json) {
        write_json(json, &prop, driver, runtime, seed, (int)iters, (int)warmup, gemm_peak, copy_peak, rows, n);
        if (fclose(json) != 0) {
            fprintf(stderr, "flashattn_bench: --json '%s': write failed: %s\n", json_path, strerror(errno));
            rc = EXIT_CHECK_FAILED;
        }
    }
    if (csv) {
        write_csv(csv, &prop, seed, rows, n);
        if (fclose(csv) != 0) {
            fprintf(stderr, "flashattn_bench: --csv '%s': write failed: %s\n", csv_path, strerror(errno));
            rc = EXIT_CHECK_FAILED;
        }
    }
    free(rows);
    cudaFree(l2);
    flashattn_handle_destroy(h);
    return rc;
}
