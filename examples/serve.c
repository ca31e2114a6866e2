/* serve.c - the attention layer of a continuous-batching server over a paged KV cache, checked.
 *
 * Requests arrive at given steps, each with a prompt and a number of tokens to generate. Every step:
 * each arriving request is prefilled (its prompt's keys and values appended to the cache with
 * rotary applied, then causal attention over them); every running request decodes one token (its
 * new key and value appended, attention over its whole cache); requests that are done leave, and
 * their pages go back to the pool. One pool of 16-key pages serves every request through a block
 * table; lengths live on the device, as a server captured in a CUDA graph would keep them. The
 * "tokens" are random numbers: this is attention, not a model. Every call also runs on the
 * REFERENCE backend (which appends the same rows again) and the outputs must agree.
 * Build: cc -std=c99 serve.c $(pkg-config --cflags --libs flashattn) -lm -o serve   (or find_package)
 * Exit status: 0 success, 1 a call or the check failed, 2 no usable GPU. */
#include <math.h>
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

enum {
    PAGE = 16,                  /* keys per page */
    NUM_PAGES = 256,            /* pages in the pool (K and V each) */
    MAX_SEQS = 4,               /* requests running at once */
    MAX_LEN = 768,              /* the most keys one request may hold */
    MAX_PAGES = MAX_LEN / PAGE, /* block-table entries per request */
    HQ = 8, HKV = 2, D = 128    /* grouped-query heads, head dim */
};

struct request { int arrive, prompt, generate; };
static const struct request requests[] = {
    {0, 100, 12}, {0, 37, 20}, {2, 300, 8}, {4, 16, 15}, {6, 513, 6}, {9, 1, 10}, {10, 64, 5},
};
enum { NUM_REQUESTS = sizeof requests / sizeof requests[0] };

/* A running request: its cache length, tokens still to generate, and its pages in order. */
struct sequence { int request, len, left, npages; int32_t pages[MAX_PAGES]; };

struct server {
    flashattn_handle *h;
    cudaStream_t stream;
    flashattn_fwd_params p;             /* the fields every call shares (pools, table, tables) */
    struct sequence seqs[MAX_SEQS];
    int running[MAX_SEQS];              /* seqs[i] is in use */
    int32_t free_pages[NUM_PAGES];
    int num_free;
    void *q, *k_new, *v_new, *o, *o_ref; /* device: the step's rows */
    int32_t *table, *used;              /* device: block table rows and cache lengths of a call */
    void *ws;                           /* device workspace, grown as calls ask */
    size_t ws_bytes;
    uint32_t seed;
    int printed_plan;
};

static cudaError_t upload_random_bf16(void *dst, size_t n, uint32_t *seed);
static cudaError_t upload_rotary_tables(void *cos_dev, void *sin_dev);
static int attend(struct server *s, int batch, int rows, const int *which, const char *what);

/* Pages until sequence q holds `len` keys; 0 when the pool has run out. */
static int reserve(struct server *s, struct sequence *q, int len) {
    while (q->npages * PAGE < len) {
        if (s->num_free == 0 || q->npages == MAX_PAGES) return 0;
        q->pages[q->npages++] = s->free_pages[--s->num_free];
    }
    return 1;
}

int main(void) {
    struct server s;
    memset(&s, 0, sizeof s);
    s.seed = 7;
    FA_OK(flashattn_handle_create(&s.h, 0));
    CUDA_OK(cudaStreamCreate(&s.stream));
    for (int i = 0; i < NUM_PAGES; ++i) s.free_pages[i] = (int32_t)((i * 97) % NUM_PAGES); /* any order */
    s.num_free = NUM_PAGES;

    const size_t page_elems = (size_t)PAGE * HKV * D, rows_q = (size_t)MAX_LEN * HQ * D;
    void *k_pool, *v_pool, *cos_t, *sin_t;
    CUDA_OK(cudaMalloc(&k_pool, 2 * NUM_PAGES * page_elems));
    CUDA_OK(cudaMalloc(&v_pool, 2 * NUM_PAGES * page_elems));
    CUDA_OK(cudaMemset(k_pool, 0, 2 * NUM_PAGES * page_elems));
    CUDA_OK(cudaMemset(v_pool, 0, 2 * NUM_PAGES * page_elems));
    CUDA_OK(cudaMalloc(&s.q, 2 * rows_q));
    CUDA_OK(cudaMalloc(&s.o, 2 * rows_q));
    CUDA_OK(cudaMalloc(&s.o_ref, 2 * rows_q));
    CUDA_OK(cudaMalloc(&s.k_new, 2 * (size_t)MAX_LEN * HKV * D));
    CUDA_OK(cudaMalloc(&s.v_new, 2 * (size_t)MAX_LEN * HKV * D));
    CUDA_OK(cudaMalloc((void **)&s.table, sizeof(int32_t) * MAX_SEQS * MAX_PAGES));
    CUDA_OK(cudaMalloc((void **)&s.used, sizeof(int32_t) * MAX_SEQS));
    CUDA_OK(cudaMalloc(&cos_t, 2 * (size_t)MAX_LEN * (D / 2)));
    CUDA_OK(cudaMalloc(&sin_t, 2 * (size_t)MAX_LEN * (D / 2)));
    CUDA_OK(upload_rotary_tables(cos_t, sin_t));

    flashattn_fwd_params *p = &s.p;
    FA_OK(flashattn_fwd_params_init(p));
    p->dtype = FLASHATTN_DTYPE_BFLOAT16;
    p->heads_q = HQ, p->heads_kv = HKV, p->head_dim = D;
    p->seqlen_k = MAX_LEN;                                /* a capacity: the lengths are on the device */
    p->mask = FLASHATTN_MASK_CAUSAL_BOTTOM_RIGHT;
    p->k = k_pool, p->v = v_pool;                         /* pools [NUM_PAGES, PAGE, HKV, D] */
    p->k_batch_stride = p->v_batch_stride = (int64_t)page_elems; /* the page stride */
    p->k_seq_stride = p->v_seq_stride = HKV * D;
    p->k_head_stride = p->v_head_stride = D;
    p->block_table = s.table, p->block_table_batch_stride = MAX_PAGES, p->pages_per_seq = MAX_PAGES;
    p->page_size = PAGE, p->num_pages = NUM_PAGES;
    p->seqused_k = s.used;                                /* keys before this call's append */
    p->k_new = s.k_new, p->v_new = s.v_new;
    p->rotary_cos = cos_t, p->rotary_sin = sin_t, p->seqlen_ro = MAX_LEN; /* a row per position */
    p->rotary_dim = D;                                    /* every column; GPT-NeoX halves (the default) */
    p->q = s.q, p->o = s.o;

    int step = 0, next = 0, done = 0, rc = 0;
    while (done < NUM_REQUESTS && rc == 0) {
        /* Arrivals: a free slot and pages for the prompt, then the prefill (a batch of one). */
        while (rc == 0 && next < NUM_REQUESTS && requests[next].arrive <= step) {
            int slot = 0;
            while (slot < MAX_SEQS && s.running[slot]) ++slot;
            if (slot == MAX_SEQS) break; /* full: it waits for a request to leave */
            struct sequence *q = &s.seqs[slot];
            memset(q, 0, sizeof *q);
            q->request = next, q->left = requests[next].generate;
            if (!reserve(&s, q, requests[next].prompt)) {
                fprintf(stderr, "the page pool ran out\n");
                return 1;
            }
            s.running[slot] = 1;
            char what[96];
            snprintf(what, sizeof what, "step %d: request %d prefills %d tokens", step, next, requests[next].prompt);
            rc = attend(&s, 1, requests[next].prompt, &slot, what);
            q->len = requests[next].prompt;
            ++next;
        }
        /* One decode token for every running request, in one call. */
        int which[MAX_SEQS], n = 0;
        for (int i = 0; i < MAX_SEQS; ++i)
            if (s.running[i] && s.seqs[i].left > 0) {
                if (!reserve(&s, &s.seqs[i], s.seqs[i].len + 1)) {
                    fprintf(stderr, "the page pool ran out\n");
                    return 1;
                }
                which[n++] = i;
            }
        if (rc == 0 && n > 0) {
            char what[96];
            snprintf(what, sizeof what, "step %d: %d requests decode", step, n);
            rc = attend(&s, n, 1, which, what);
            for (int b = 0; b < n; ++b) s.seqs[which[b]].len += 1, s.seqs[which[b]].left -= 1;
        }
        /* Departures: pages back to the pool. */
        for (int i = 0; i < MAX_SEQS; ++i)
            if (s.running[i] && s.seqs[i].left == 0) {
                printf("step %d: request %d leaves with %d keys in %d pages\n", step, s.seqs[i].request,
                       s.seqs[i].len, s.seqs[i].npages);
                while (s.seqs[i].npages > 0) s.free_pages[s.num_free++] = s.seqs[i].pages[--s.seqs[i].npages];
                s.running[i] = 0;
                ++done;
            }
        ++step;
    }
    if (rc == 0 && s.num_free != NUM_PAGES) {
        fprintf(stderr, "%d pages were not returned\n", NUM_PAGES - s.num_free);
        rc = 1;
    }
    if (rc == 0) printf("served %d requests in %d steps, every call matching REFERENCE: success\n", NUM_REQUESTS, step);

    cudaFree(s.ws); cudaFree(k_pool); cudaFree(v_pool); cudaFree(cos_t); cudaFree(sin_t);
    cudaFree(s.q); cudaFree(s.o); cudaFree(s.o_ref); cudaFree(s.k_new); cudaFree(s.v_new);
    cudaFree(s.table); cudaFree(s.used);
    CUDA_OK(cudaStreamDestroy(s.stream));
    FA_OK(flashattn_handle_destroy(s.h));
    return rc;
}

/* ---- helpers --------------------------------------------------------------------------------- */

/* One call for `batch` requests (seqs[which[b]]), `rows` new tokens each: fresh queries, keys and
 * values for them, their block-table rows and lengths uploaded, then the call on AUTO and on
 * REFERENCE; 0 when every output element agrees within a few bfloat16 ulps (NaN never agrees). */
static int attend(struct server *s, int batch, int rows, const int *which, const char *what) {
    int32_t table[MAX_SEQS * MAX_PAGES], used[MAX_SEQS];
    for (int b = 0; b < batch; ++b) {
        const struct sequence *q = &s->seqs[which[b]];
        for (int j = 0; j < MAX_PAGES; ++j) table[b * MAX_PAGES + j] = j < q->npages ? q->pages[j] : -1;
        used[b] = q->len;
    }
    CUDA_OK(cudaMemcpy(s->table, table, sizeof(int32_t) * batch * MAX_PAGES, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(s->used, used, sizeof(int32_t) * batch, cudaMemcpyHostToDevice));
    const size_t nq = (size_t)batch * rows * HQ * D, nkv = (size_t)batch * rows * HKV * D;
    CUDA_OK(upload_random_bf16(s->q, nq, &s->seed));
    CUDA_OK(upload_random_bf16(s->k_new, nkv, &s->seed));
    CUDA_OK(upload_random_bf16(s->v_new, nkv, &s->seed));

    flashattn_fwd_params p = s->p;                          /* Q, O, K_new, V_new: [batch, rows, H, D] */
    p.batch = batch, p.seqlen_q = rows, p.seqlen_new = rows;
    p.q_head_stride = p.o_head_stride = D;
    p.q_seq_stride = p.o_seq_stride = HQ * D;
    p.q_batch_stride = p.o_batch_stride = (int64_t)rows * HQ * D;
    p.k_new_head_stride = p.v_new_head_stride = D;
    p.k_new_seq_stride = p.v_new_seq_stride = HKV * D;
    p.k_new_batch_stride = p.v_new_batch_stride = (int64_t)rows * HKV * D;
    flashattn_fwd_params r = p;
    r.backend = FLASHATTN_BACKEND_REFERENCE;
    r.o = s->o_ref;
    for (int pass = 0; pass < 2; ++pass) {
        const flashattn_fwd_params *call = pass == 0 ? &p : &r;
        size_t need;
        FA_OK(flashattn_fwd_workspace_size(s->h, call, &need));
        if (need > s->ws_bytes) {
            CUDA_OK(cudaStreamSynchronize(s->stream));     /* the old one may still be in use */
            cudaFree(s->ws);
            CUDA_OK(cudaMalloc(&s->ws, need));
            s->ws_bytes = need;
        }
        FA_OK(flashattn_fwd(s->h, call, s->ws, s->ws_bytes, s->stream));
    }
    if (!s->printed_plan && rows == 1) {                  /* what a decode step runs */
        flashattn_plan_info info;
        FA_OK(flashattn_plan_info_init(&info));
        FA_OK(flashattn_fwd_plan(s->h, &p, &info));
        printf("decode: %s\n", info.description);
        s->printed_plan = 1;
    }
    uint16_t *out = malloc(2 * nq), *ref = malloc(2 * nq);
    cudaError_t e = out != NULL && ref != NULL ? cudaSuccess : cudaErrorMemoryAllocation;
    if (e == cudaSuccess) e = cudaMemcpyAsync(out, s->o, 2 * nq, cudaMemcpyDeviceToHost, s->stream);
    if (e == cudaSuccess) e = cudaMemcpyAsync(ref, s->o_ref, 2 * nq, cudaMemcpyDeviceToHost, s->stream);
    if (e == cudaSuccess) e = cudaStreamSynchronize(s->stream);
    if (e != cudaSuccess) {
        fprintf(stderr, "%s: copying the outputs back: %s\n", what, cudaGetErrorString(e));
        free(out);
        free(ref);
        return 1;
    }
    float err = 0.0f;
    for (size_t i = 0; i < nq; ++i) {
        uint32_t a = (uint32_t)out[i] << 16, b = (uint32_t)ref[i] << 16;
        float fa, fb;
        memcpy(&fa, &a, 4);
        memcpy(&fb, &b, 4);
        const float e = fabsf(fa - fb);
        if (err == err && (e > err || e != e)) err = e;     /* a NaN, once seen, stays */
    }
    free(out);
    free(ref);
    const int ok = err <= 3e-2f;
    printf("%s: max |O - O_reference| = %.2e%s\n", what, err, ok ? "" : ": FAILED");
    return ok ? 0 : 1;
}

static uint16_t to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)((u + 0x7FFF + ((u >> 16) & 1)) >> 16); /* round to nearest even */
}

/* n bfloat16 values uniform in [-1, 1) from a linear congruential generator, copied to dst. */
static cudaError_t upload_random_bf16(void *dst, size_t n, uint32_t *seed) {
    uint16_t *host = malloc(2 * n);
    if (host == NULL) return cudaErrorMemoryAllocation;
    for (size_t i = 0; i < n; ++i) {
        *seed = *seed * 1664525u + 1013904223u;
        host[i] = to_bf16((float)(*seed >> 8) / 8388608.0f - 1.0f);
    }
    const cudaError_t err = cudaMemcpy(dst, host, 2 * n, cudaMemcpyHostToDevice);
    free(host);
    return err;
}

/* Rotary tables [MAX_LEN, D / 2] in bfloat16: position t, pair i at angle t / 10000^(2i / D). */
static cudaError_t upload_rotary_tables(void *cos_dev, void *sin_dev) {
    const size_t n = (size_t)MAX_LEN * (D / 2);
    uint16_t *c = malloc(2 * n), *s = malloc(2 * n);
    cudaError_t err = cudaErrorMemoryAllocation;
    if (c != NULL && s != NULL) {
        for (int t = 0; t < MAX_LEN; ++t)
            for (int i = 0; i < D / 2; ++i) {
                const double angle = t * pow(10000.0, -2.0 * i / D);
                c[(size_t)t * (D / 2) + i] = to_bf16((float)cos(angle));
                s[(size_t)t * (D / 2) + i] = to_bf16((float)sin(angle));
            }
        err = cudaMemcpy(cos_dev, c, 2 * n, cudaMemcpyHostToDevice);
        if (err == cudaSuccess) err = cudaMemcpy(sin_dev, s, 2 * n, cudaMemcpyHostToDevice);
    }
    free(c);
    free(s);
    return err;
}
