/*
 * flashattn.h - the public C API of libflashattn.
 *
 * libflashattn computes exact scaled-dot-product attention on NVIDIA GPUs (sm_80 and newer):
 *
 *     O = softmax(scale * Q K^T  [softcap] [+ ALiBi] [+ mask]) V
 *
 * the FlashAttention way: tiles of Q, K and V in on-chip memory, an online softmax, and no score
 * matrix in device memory (the FUSED backend on sm_80 and newer, the FUSED_SM90 backend on Hopper).
 * A REFERENCE backend built on cuBLAS computes the same
 * function with the score matrix materialised in the caller's workspace; it is the oracle the fused
 * kernels are checked against.
 *
 * This header is C99 and C++ clean and is the whole API; every function is documented where it is
 * declared. Conventions that hold for every function below:
 *
 *   - Every function returns a flashattn_status (except the version and string functions). On any
 *     status other than FLASHATTN_STATUS_SUCCESS, flashattn_last_error() on the same thread returns a
 *     sentence naming the argument and the value at fault, and no output has been touched.
 *   - Tensors are device pointers. Shapes are in elements; strides are int64 counts of elements, not
 *     bytes. The head dimension is always contiguous (stride 1).
 *   - Nothing in the library allocates device memory, synchronises the device, prints or exits, except
 *     flashattn_handle_create and flashattn_handle_destroy, which say what they do.
 *   - Thread safety: a handle may be used by any number of host threads at once. The per-thread last
 *     error is thread-local.
 */
#ifndef FLASHATTN_H
#define FLASHATTN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32)
#define FLASHATTN_API
#else
#define FLASHATTN_API __attribute__((visibility("default")))
#endif

/* ---------------------------------------------------------------------------------------------
 * Version
 * ------------------------------------------------------------------------------------------- */

#define FLASHATTN_VERSION_MAJOR 0
#define FLASHATTN_VERSION_MINOR 4
#define FLASHATTN_VERSION_PATCH 0
/* MAJOR * 10000 + MINOR * 100 + PATCH, comparable with flashattn_version(). */
#define FLASHATTN_VERSION \
    (FLASHATTN_VERSION_MAJOR * 10000 + FLASHATTN_VERSION_MINOR * 100 + FLASHATTN_VERSION_PATCH)

/* The version of the library actually loaded, encoded as FLASHATTN_VERSION is. The ABI only grows
 * within a major version, so a program runs against any library at least as new as the header it
 * was compiled with: check flashattn_version() >= FLASHATTN_VERSION. Never fails. */
FLASHATTN_API int flashattn_version(void);

/* The loaded library's version as "MAJOR.MINOR.PATCH"; a static string, never NULL. */
FLASHATTN_API const char *flashattn_version_string(void);

/* One line describing how the loaded library was built, for bug reports and diagnostics: the
 * source commit, the CUDA runtime it was built against, the CUDA architectures, and the compiled
 * kernel variants of each fused backend, e.g.
 * "commit=1a2b3c4d5e6f cuda_runtime=13000 archs=80;90a fused=fp16:32,64,...;bf16:... fused_sm90=...".
 * A static string, never NULL. Needs no device. (Added in 0.2.0.) */
FLASHATTN_API const char *flashattn_build_info(void);

/* ---------------------------------------------------------------------------------------------
 * Status codes. Values are part of the ABI: they are never renumbered and new ones are appended.
 * ------------------------------------------------------------------------------------------- */

typedef enum flashattn_status {
    FLASHATTN_STATUS_SUCCESS = 0,
    FLASHATTN_STATUS_NULL_POINTER = 1,          /* a required pointer argument or field is NULL */
    FLASHATTN_STATUS_MISALIGNED_POINTER = 2,    /* a pointer is not aligned to its element size
                                                   (256 bytes for the workspace) */
    FLASHATTN_STATUS_BAD_STRUCT_SIZE = 3,       /* struct_size is not one this library knows */
    FLASHATTN_STATUS_BAD_SHAPE = 4,             /* a dimension is negative, zero where it must not
                                                   be, or too large */
    FLASHATTN_STATUS_BAD_STRIDE = 5,            /* a stride is negative */
    FLASHATTN_STATUS_INDEX_OVERFLOW = 6,        /* extents x strides overflow int64 */
    FLASHATTN_STATUS_BAD_HEAD_GROUPING = 7,     /* heads_q is not a multiple of heads_kv */
    FLASHATTN_STATUS_UNSUPPORTED_HEAD_DIM = 8,  /* head_dim outside 1..256 */
    FLASHATTN_STATUS_BAD_DTYPE = 9,             /* dtype is not a flashattn_dtype value */
    FLASHATTN_STATUS_BAD_SCALE = 10,            /* softmax_scale negative, NaN or infinite */
    FLASHATTN_STATUS_BAD_MASK = 11,             /* mask is not a flashattn_mask value */
    FLASHATTN_STATUS_BAD_WINDOW = 12,           /* window_left or window_right below -1 */
    FLASHATTN_STATUS_BAD_SOFTCAP = 13,          /* softcap negative, NaN or infinite */
    FLASHATTN_STATUS_BAD_BACKEND = 14,          /* backend is not a flashattn_backend value */
    FLASHATTN_STATUS_UNSUPPORTED = 15,          /* valid, but the requested backend cannot run it
                                                   (under AUTO: no backend can) */
    FLASHATTN_STATUS_WORKSPACE_TOO_SMALL = 16,  /* workspace_bytes below what the plan needs */
    FLASHATTN_STATUS_DEVICE_TOO_OLD = 17,       /* the device is below compute capability 8.0 */
    FLASHATTN_STATUS_WRONG_DEVICE = 18,         /* the current device is not the handle's device */
    FLASHATTN_STATUS_NO_DEVICE = 19,            /* no CUDA device, or the device index is invalid */
    FLASHATTN_STATUS_CUDA_ERROR = 20,           /* a CUDA runtime call failed */
    FLASHATTN_STATUS_CUBLAS_ERROR = 21,         /* a cuBLAS call failed */
    FLASHATTN_STATUS_OUT_OF_HOST_MEMORY = 22,   /* flashattn_handle_create could not allocate */
    FLASHATTN_STATUS_BAD_LSE_BASE = 23,         /* lse_base is not a flashattn_lse_base value
                                                   (added in 0.2.0) */
    FLASHATTN_STATUS_BAD_VARLEN = 24,           /* the ragged-batch fields disagree: total_q or
                                                   total_k without its cu_seqlens array, a packed
                                                   tensor with a batch stride, kv_batch_idx with
                                                   packed or paged K/V (added in 0.3.0) */
    FLASHATTN_STATUS_BAD_PAGED_KV = 25,         /* the paged-KV fields disagree: page_size,
                                                   num_pages, pages_per_seq or the block table's
                                                   row stride out of range, seqlen_k above
                                                   pages_per_seq x page_size, a page-list field
                                                   without kv_indptr (added in 0.3.0), or
                                                   cache_leftpad with paged K/V (0.4.0) */
    FLASHATTN_STATUS_BAD_APPEND = 26,           /* the KV-append fields disagree: k_new without
                                                   v_new or seqused_k, a packed Q or K/V, or
                                                   seqlen_new without k_new (added in 0.3.0) */
    FLASHATTN_STATUS_BAD_ROTARY = 27            /* the rotary fields disagree: one table without
                                                   the other, no k_new, rotary_dim odd or above
                                                   head_dim, seqlen_ro < 1, a flag not 0 or 1
                                                   (added in 0.3.0) */
} flashattn_status;

/* The enumerator's name, e.g. "FLASHATTN_STATUS_BAD_SHAPE"; "FLASHATTN_STATUS_UNKNOWN" for a value
 * this library does not define. A static string, never NULL. */
FLASHATTN_API const char *flashattn_status_name(flashattn_status status);

/* A sentence that says what went wrong and what to do about it. A static string, never NULL. */
FLASHATTN_API const char *flashattn_status_string(flashattn_status status);

/* The detail of the most recent call on this thread that returned something other than
 * FLASHATTN_STATUS_SUCCESS: which argument, which value, what was expected. An empty string when the
 * most recent call on this thread succeeded. Thread-local; valid until the next call on this thread.
 * Never NULL. */
FLASHATTN_API const char *flashattn_last_error(void);

/* ---------------------------------------------------------------------------------------------
 * Handle
 * ------------------------------------------------------------------------------------------- */

/* Opaque. Caches the device's properties (compute capability, SM count, shared-memory limit) and a
 * cuBLAS handle for the REFERENCE backend. Bound to one device for its lifetime. */
typedef struct flashattn_handle flashattn_handle;

/* Creates a handle for `device` (a CUDA device ordinal; -1 means the calling thread's current
 * device). On success *handle receives it; on failure *handle is set to NULL.
 * This call allocates host memory and creates a cuBLAS handle (which allocates device memory); it
 * leaves the calling thread's current device as it found it. It is the only call besides
 * flashattn_handle_destroy that allocates.
 * Returns: SUCCESS; NULL_POINTER (handle is NULL); NO_DEVICE (no CUDA device, or device out of range);
 * DEVICE_TOO_OLD (compute capability below 8.0); CUDA_ERROR; CUBLAS_ERROR; OUT_OF_HOST_MEMORY. */
FLASHATTN_API flashattn_status flashattn_handle_create(flashattn_handle **handle, int device);

/* Destroys a handle and its cuBLAS handle. Work already enqueued with it may still be running; the
 * caller must not destroy a handle while another thread is calling with it. NULL is a no-op.
 * Returns: SUCCESS; CUBLAS_ERROR (the handle is freed all the same). */
FLASHATTN_API flashattn_status flashattn_handle_destroy(flashattn_handle *handle);

/* The device ordinal the handle was created for, in *device.
 * Returns: SUCCESS; NULL_POINTER. */
FLASHATTN_API flashattn_status flashattn_handle_device(const flashattn_handle *handle, int *device);

/* ---------------------------------------------------------------------------------------------
 * Forward parameters
 * ------------------------------------------------------------------------------------------- */

typedef enum flashattn_dtype {
    FLASHATTN_DTYPE_FLOAT16 = 0,   /* IEEE half */
    FLASHATTN_DTYPE_BFLOAT16 = 1,  /* bfloat16 */
    FLASHATTN_DTYPE_FLOAT32 = 2    /* float32: partial results for flashattn_merge only; flashattn_fwd
                                      refuses it (added in 0.2.0) */
} flashattn_dtype;

typedef enum flashattn_mask {
    FLASHATTN_MASK_NONE = 0,
    /* Query i sees keys j <= i + seqlen_k - seqlen_q (FlashAttention >= 2.1). */
    FLASHATTN_MASK_CAUSAL_BOTTOM_RIGHT = 1,
    /* Query i sees keys j <= i (cuDNN's and PyTorch's is_causal). Same as bottom-right if Sq == Sk. */
    FLASHATTN_MASK_CAUSAL_TOP_LEFT = 2
} flashattn_mask;

typedef enum flashattn_backend {
    FLASHATTN_BACKEND_AUTO = 0,       /* the fastest backend that supports the call on this device */
    FLASHATTN_BACKEND_REFERENCE = 1,  /* cuBLAS GEMMs + softmax kernel; needs a workspace */
    FLASHATTN_BACKEND_FUSED = 2,      /* FlashAttention kernel on tensor cores (mma.sync, sm_80 and
                                         newer). Asks for a workspace only to split the keys of a
                                         call with too few query tiles to fill the GPU (0.4.0); given
                                         less (NULL, as before 0.4.0), it runs the call unsplit */
    FLASHATTN_BACKEND_FUSED_SM90 = 3  /* FlashAttention kernel on Hopper's TMA and warpgroup MMAs
                                         (wgmma); compute capability 9.0 only, and only in builds for
                                         sm_90a (the default); head dims that are multiples of 8 up to
                                         256; FUSED's layout rules, and no zero stride on a dimension
                                         with more than one element. Needs a workspace only when it splits
                                         the keys of a decode-shaped call. AUTO picks it on 9.0 devices
                                         for head dims 33..256, where it is measured faster. */
} flashattn_backend;

/*
 * Everything one forward call needs. Fill it with flashattn_fwd_params_init, then set fields.
 *
 * Growth: fields are only ever appended, and struct_size tells the library which ones the caller
 * knows. A library accepts every released size up to its own (an application built against an
 * older header keeps working: the fields it does not know take their defaults, and the library
 * reads no byte past struct_size); any other size is refused with BAD_STRUCT_SIZE, a larger one
 * too (an application built against a newer header than the library it loaded).
 *
 * Layout: Q [batch, seqlen_q, heads_q, head_dim]; K and V [batch, seqlen_k, heads_kv, head_dim];
 * O like Q. Element (b, s, h, d) of Q is at q + b*q_batch_stride + s*q_seq_stride + h*q_head_stride + d.
 * Each dimension shared by two tensors is given once (seqlen_k and heads_kv for K and V; batch,
 * head_dim for all four), so Q, K, V and O cannot disagree on a shape.
 * Strides are in elements, must be >= 0, and may describe any layout (e.g. [B, H, S, D] tensors,
 * slices of a packed QKV buffer, a batch stride of 0 to broadcast K and V). O's strides must not make
 * two of its elements share an address (BAD_STRIDE). O must not overlap Q, K, V or LSE: that is not
 * checked, and the result is then undefined.
 *
 * Semantics (FlashAttention-2's):
 *  - grouped-query attention: heads_q % heads_kv == 0; query head h reads KV head h / (heads_q/heads_kv);
 *  - scores s_ij = softmax_scale * <q_i, k_j>; then softcap (if > 0): s = softcap * tanh(s / softcap);
 *    then ALiBi (if slopes given): s -= slope_h * |i + seqlen_k - seqlen_q - j|;
 *  - visibility: the causal mask (see flashattn_mask) and the sliding window: query i sees keys j with
 *    i + seqlen_k - seqlen_q - window_left <= j <= i + seqlen_k - seqlen_q + window_right,
 *    -1 meaning unbounded on that side. Causal and window combine (a key must pass both);
 *  - a query row that sees no key (fully masked, or seqlen_k == 0) gets O = 0 and LSE = -inf, never NaN;
 *  - LSE = natural log of sum_j exp(s_ij) over visible keys (after softcap and ALiBi).
 */
typedef struct flashattn_fwd_params {
    size_t struct_size;      /* sizeof(flashattn_fwd_params); set by flashattn_fwd_params_init */

    int32_t dtype;           /* flashattn_dtype of Q, K, V and O */
    int32_t mask;            /* flashattn_mask; default NONE */
    int32_t backend;         /* flashattn_backend; default AUTO */
    int32_t reserved0;       /* must be 0 */

    int64_t batch;           /* >= 1 */
    int64_t seqlen_q;        /* >= 0; 0 makes the call a no-op */
    int64_t seqlen_k;        /* >= 0; 0 gives O = 0 and LSE = -inf */
    int64_t heads_q;         /* >= 1, a multiple of heads_kv */
    int64_t heads_kv;        /* >= 1 */
    int64_t head_dim;        /* 1..256 (the FUSED and FUSED_SM90 backends: multiples of 8) */

    const void *q;           /* device, [batch, seqlen_q, heads_q, head_dim] */
    int64_t q_batch_stride, q_seq_stride, q_head_stride;
    const void *k;           /* device, [batch, seqlen_k, heads_kv, head_dim] */
    int64_t k_batch_stride, k_seq_stride, k_head_stride;
    const void *v;           /* device, [batch, seqlen_k, heads_kv, head_dim] */
    int64_t v_batch_stride, v_seq_stride, v_head_stride;
    void *o;                 /* device, [batch, seqlen_q, heads_q, head_dim], written */
    int64_t o_batch_stride, o_seq_stride, o_head_stride;

    float *lse;              /* device float32 [batch, heads_q, seqlen_q] ([heads_q, total_q] with
                                cu_seqlens_q), contiguous; may be NULL */

    float softmax_scale;     /* > 0; 0 (the default) means 1/sqrt(head_dim) */
    float softcap;           /* >= 0; 0 (the default) disables it */
    int64_t window_left;     /* >= -1; -1 (the default) is unbounded */
    int64_t window_right;    /* >= -1; -1 (the default) is unbounded */

    const float *alibi_slopes;     /* device float32, may be NULL (no ALiBi); slope of (b, h) is
                                      alibi_slopes[b * alibi_batch_stride + h] */
    int64_t alibi_batch_stride;    /* 0 (one slope per head, shared by the batch) or >= heads_q */

    /* ---- Added in 0.3.0: ragged batches, per-sequence key counts, paged and indexed KV caches.
     * Their defaults (NULL and 0) keep the dense layout above. See "Serving calls" below. */
    const int32_t *cu_seqlens_q;   /* device int32 [batch + 1], or NULL. Set: Q and O are packed */
    const int32_t *cu_seqlens_k;   /* device int32 [batch + 1], or NULL. Set: key counts (and, unless
                                      paged, K and V packed) */
    const int32_t *seqused_k;      /* device int32 [batch], or NULL: keys used per sequence */
    int64_t total_q;               /* rows of packed Q and O (with cu_seqlens_q), else 0 */
    int64_t total_k;               /* rows of packed K and V (with cu_seqlens_k, not paged), else 0 */
    const int32_t *block_table;    /* device int32 [batch, pages_per_seq] (row stride below), or
                                      NULL. Set: K and V are page pools */
    int64_t block_table_batch_stride; /* elements between rows of block_table, >= pages_per_seq */
    int64_t pages_per_seq;         /* pages one row of block_table lists, >= 1 when paged */
    int64_t page_size;             /* keys per page, >= 1 when paged (any value: 1, 16, 19, 256...) */
    int64_t num_pages;             /* pages in each of the K and V pools, >= 1 when paged */
    const int32_t *kv_batch_idx;   /* device int32 [batch], or NULL: batch entry b reads K/V entry
                                      kv_batch_idx[b] of a dense cache (FlashAttention's
                                      cache_batch_idx) */
    int64_t kv_batch;              /* entries of that dense cache (with kv_batch_idx), else 0 */

    /* ---- Added in 0.3.0: appending new keys to the cache, rotary embedding (see "Serving calls"). */
    const void *k_new;             /* device [batch, seqlen_new, heads_kv, head_dim], or NULL */
    int64_t k_new_batch_stride, k_new_seq_stride, k_new_head_stride;
    const void *v_new;             /* device, like k_new; set with k_new */
    int64_t v_new_batch_stride, v_new_seq_stride, v_new_head_stride;
    int64_t seqlen_new;            /* keys appended per sequence (with k_new), else 0 */
    const void *rotary_cos;        /* device [seqlen_ro, rotary_dim / 2] in dtype, contiguous, or NULL */
    const void *rotary_sin;        /* likewise; set with rotary_cos */
    int64_t rotary_dim;            /* columns rotated: even, 2..head_dim (with the tables), else 0 */
    int64_t seqlen_ro;             /* rows of the tables (positions), >= 1 with the tables, else 0 */
    int32_t rotary_interleaved;    /* 1: GPT-J pairs (x[2i], x[2i+1]); 0 (default): GPT-NeoX halves
                                      (x[i], x[i + rotary_dim/2]) */
    int32_t rotary_q_at_cache_len; /* 0 (default): query row i at position seqused_k[b] + i; 1: every
                                      query row at seqused_k[b] */
    int32_t reserved1;             /* must be 0 */

    /* ---- Added in 0.3.0: FlashInfer's page lists (CSR) instead of block-table rows. */
    const int32_t *kv_indptr;      /* device int32 [batch + 1], or NULL. Set (with block_table holding
                                      num_page_indices page numbers and block_table_batch_stride 0):
                                      sequence b's pages are block_table[kv_indptr[b] ..
                                      kv_indptr[b + 1] - 1] */
    const int32_t *kv_last_page_len; /* device int32 [batch], or NULL: keys in each sequence's last page
                                      (1..page_size): a sequence of n pages has (n - 1) x page_size +
                                      kv_last_page_len[b] keys (NULL: n x page_size) */
    int64_t num_page_indices;      /* entries of block_table with kv_indptr, else 0 */

    /* ---- Added in 0.4.0: left-padded caches (FlashAttention's cache_leftpad). */
    const int32_t *cache_leftpad;  /* device int32 [batch], or NULL (0 for every sequence): sequence b's
                                      keys start at row cache_leftpad[b] of its dense, indexed or
                                      packed K/V; not with block_table (see "Serving calls") */
} flashattn_fwd_params;

/* The struct's size in release 0.1.0, the first layout. A library accepts every released size. */
#define FLASHATTN_FWD_PARAMS_SIZE_0_1 248
/* The struct's size in release 0.3.0 (the serving, append, rotary and page-list fields appended). */
#define FLASHATTN_FWD_PARAMS_SIZE_0_3 488
/* The struct's size in release 0.4.0 (cache_leftpad appended). */
#define FLASHATTN_FWD_PARAMS_SIZE_0_4 496

/*
 * Serving calls (0.3.0): a batch of sequences of different lengths, a KV cache in pages, or both.
 * Every length lives in device memory and is read only by the kernels: the host never reads it, so a
 * call can be captured in a CUDA graph once and replayed while the contents of cu_seqlens_q,
 * cu_seqlens_k, seqused_k, block_table, kv_indptr, kv_last_page_len, kv_batch_idx, Q, K, V, k_new,
 * v_new and the rotary tables change. seqlen_q and seqlen_k are then capacities, fixed at capture:
 * the longest query and key count any sequence may have.
 *
 *  - Ragged queries (cu_seqlens_q set): Q and O are [total_q, heads_q, head_dim]; token t, head h at
 *    q + t*q_seq_stride + h*q_head_stride (q_batch_stride and o_batch_stride must be 0). Sequence b
 *    owns rows cu_seqlens_q[b] .. cu_seqlens_q[b+1] - 1; LSE is float32 [heads_q, total_q],
 *    contiguous. Rows that no sequence owns are not written.
 *  - Keys of sequence b: seqused_k[b] if seqused_k is set; else cu_seqlens_k[b+1] - cu_seqlens_k[b]
 *    if cu_seqlens_k is set; else, with page lists, from its pages (below); else seqlen_k. Masks,
 *    windows and ALiBi are per sequence (causal is bottom-right within each sequence, as in
 *    FlashAttention's varlen functions).
 *  - Ragged keys (cu_seqlens_k set, block_table NULL): K and V are [total_k, heads_kv, head_dim],
 *    sequence b's keys start at row cu_seqlens_k[b] (k_batch_stride and v_batch_stride must be 0).
 *  - Paged keys (block_table set): K and V are pools [num_pages, page_size, heads_kv, head_dim] whose
 *    page stride is k_batch_stride / v_batch_stride (so K and V may be two halves of one pool, or
 *    the pages head-major: any strides). Key j of sequence b is row j % page_size of page
 *    block_table[b * block_table_batch_stride + j / page_size]. A row stride larger than
 *    pages_per_seq lets a column slice of a wider table be passed (a shared prefix's pages, then
 *    each sequence's own). Needs seqlen_k <= pages_per_seq * page_size; cu_seqlens_k, if set, gives
 *    only the key counts.
 *  - Page lists (kv_indptr set, FlashInfer's CSR form): as paged keys, but sequence b's pages are
 *    block_table[kv_indptr[b] ..] (block_table_batch_stride 0, num_page_indices entries), and its
 *    key count, unless seqused_k or cu_seqlens_k give it, comes from its page count and
 *    kv_last_page_len (a sequence with no pages has no keys). pages_per_seq is then the most pages
 *    any sequence may have (seqlen_k <= pages_per_seq x page_size).
 *  - Indexed dense cache (kv_batch_idx set, K/V neither packed nor paged): K and V are
 *    [kv_batch, seqlen_k, heads_kv, head_dim] and batch entry b reads entry kv_batch_idx[b].
 *  - Left padding (cache_leftpad set, 0.4.0; dense, indexed or packed K/V, not paged): the first
 *    cache_leftpad[b] rows of sequence b's K and V are padding. With n its key count as above
 *    (appended keys included), it attends to the n - cache_leftpad[b] keys in rows cache_leftpad[b]
 *    .. n - 1 (a value outside 0..n is clamped to it). Positions do not move: appends still go to
 *    seqused_k[b] + i and rotary uses the same positions; causal masks, windows and ALiBi count from
 *    the first key after the padding, and the last query still meets the last key. This is
 *    FlashAttention-2's cache_leftpad.
 *  - Appending (k_new set; needs seqused_k, dense Q, and a dense, indexed or paged cache): before
 *    attending, new key i of sequence b (k_new, rotated when the tables are set) and its value
 *    (v_new) are written into the cache at position seqused_k[b] + i (skipped where that is at or
 *    past seqlen_k); the sequence then has seqused_k[b] + seqlen_new keys. K and V are written: the
 *    cache is an output too. Two batch entries appending to one cache row (duplicate kv_batch_idx
 *    or block-table pages) is a race, and the result undefined.
 *  - Rotary embedding (rotary_cos/rotary_sin set; needs k_new): columns [0, rotary_dim) of the new
 *    keys and of Q are rotated, in float32 and rounded once, by the table row of their position
 *    (new key i: seqused_k[b] + i; query row i: seqused_k[b] + i, or seqused_k[b] for every row with
 *    rotary_q_at_cache_len), GPT-J interleaved pairs or GPT-NeoX halves. Q itself is not modified:
 *    the rotated copy lives in the workspace (flashattn_fwd_workspace_size counts it). A position
 *    at or past seqlen_ro uses the table's last row (give tables that cover every position).
 *  - Contents the host cannot check are clamped, never trusted: a count is clamped to
 *    [0, capacity], rows to the extents total_q / total_k, a page or cache index outside the pools
 *    reads zeros. Such contents give meaningless numbers, but nothing outside the tensors described
 *    here is read or written. Sequences with no queries cost nothing and write nothing; sequences
 *    with no keys give O = 0 and LSE = -inf.
 *  - Memory that holds no key of a sequence takes no part in its attention, whatever it holds (NaN
 *    included): a cache's rows past a sequence's key count, a last page's rows past its last key,
 *    pages and cache entries no sequence uses, packed rows past seqused_k. Q rows that no sequence
 *    owns affect no output either. A fresh, uninitialised cache needs no clearing.
 *  - Backends: all three run every serving call, any page size; AUTO picks as for dense calls.
 *    FUSED_SM90 reads pages with the tensor memory accelerator when the page size is a multiple
 *    of 8 (in boxes of gcd(page size, block_n) keys; flashattn_fwd_plan's block_n: 128 at head
 *    dims up to 128, or 176 there for calls with no mask or window over 4096 keys or more (not
 *    over gathered pages), 112 up to 192, 80 above), and gathers rows with cp.async otherwise (in
 *    decode 0.89-0.95x the dense call's speed on the H200; in prefill slower, 0.76-0.85x at head
 *    dim 128 and 0.73x at head dim 64 causal). A decode call gathers pages of 8 keys too, and
 *    pages of any size when it splits its keys (blocks of a few key tiles each): small boxes cost
 *    TMA more than the copies, and a split's first key tile arrives sooner gathered (the
 *    description says e.g. paged=256:gather). A box holds all of its keys' columns
 *    (one copy, not one per 64 columns; the description says paged=16:tma_full, else
 *    paged=16:tma) when head_dim is 128, 192 or 256 and K and V have the same strides with a page
 *    stride that is a multiple of 8 row strides (pools [num_pages, page_size, heads_kv, head_dim],
 *    head-major pools [num_pages, heads_kv, page_size, head_dim], and K and V as the two halves of
 *    one pool all qualify).
 *    Both fused kernels split the keys of decode-shaped calls (few query tiles at the
 *    capacities), packed Q or not, as for dense calls.
 *    REFERENCE runs them too, as the oracle: it gathers each sequence's Q, K and V into dense copies
 *    at the capacities in its workspace, then computes as for a dense call.
 */

/* Sets every field that a struct of `struct_size` bytes has to its default, and struct_size to that
 * size: pointers NULL, sizes and strides 0, dtype FLOAT16, mask NONE, backend AUTO, softmax_scale 0
 * (default), softcap 0 (off), windows -1 (unbounded). Writes exactly struct_size bytes.
 * struct_size is sizeof(flashattn_fwd_params) as the caller compiled it (C: use the
 * flashattn_fwd_params_init macro below; ctypes and other FFIs: the size of their mirror).
 * Returns: SUCCESS; NULL_POINTER; BAD_STRUCT_SIZE (not a released size, nothing written). */
FLASHATTN_API flashattn_status flashattn_fwd_params_init_size(flashattn_fwd_params *params,
                                                               size_t struct_size);

/* Initialises the 0.1.0 layout (FLASHATTN_FWD_PARAMS_SIZE_0_1 bytes), for programs built against
 * 0.1.0. Code compiled against this header calls the macro of the same name instead, which passes
 * the caller's sizeof; both return what flashattn_fwd_params_init_size returns. */
FLASHATTN_API flashattn_status flashattn_fwd_params_init(flashattn_fwd_params *params);
#define flashattn_fwd_params_init(params) \
    flashattn_fwd_params_init_size((params), sizeof *(params))

/* Fills the strides of Q, K, V and O for densely packed [B, S, H, D] tensors from the shape fields
 * (which must be set first). A convenience; any strides may be set by hand instead. Nothing is
 * written unless it succeeds.
 * Returns: SUCCESS; NULL_POINTER; BAD_STRUCT_SIZE (params->struct_size not a released size);
 * BAD_SHAPE (batch, seqlen_q, seqlen_k, heads_q, heads_kv or head_dim negative); INDEX_OVERFLOW (a
 * stride does not fit int64). */
FLASHATTN_API flashattn_status flashattn_fwd_params_set_packed_strides(flashattn_fwd_params *params);

/* ---------------------------------------------------------------------------------------------
 * Planning queries. All three are answered by the same planner as flashattn_fwd, so they can never
 * disagree with what the forward call does. They validate params exactly as flashattn_fwd does but
 * never dereference the tensor pointers, touch the device or enqueue work.
 * ------------------------------------------------------------------------------------------- */

/* Bytes of device workspace flashattn_fwd needs for these params, in *bytes: the REFERENCE backend's
 * score matrix (and, for a serving call, its dense copies of Q, K and V); a fused kernel's per-split
 * partial results when it splits the key range of a call with too few query tiles to fill the GPU
 * (decode-shaped calls: flashattn_fwd_plan reports num_splits); the rotated copy of Q when rotary
 * tables are set; otherwise 0. Always ask rather than assume 0. Returns: SUCCESS or any validation status
 * flashattn_fwd can return (never WORKSPACE_TOO_SMALL, CUDA_ERROR or CUBLAS_ERROR). */
FLASHATTN_API flashattn_status flashattn_fwd_workspace_size(const flashattn_handle *handle,
                                                            const flashattn_fwd_params *params,
                                                            size_t *bytes);

/* Whether flashattn_fwd would accept these params on this handle's device: SUCCESS, or the status it
 * would return, with the reason in flashattn_last_error(). */
FLASHATTN_API flashattn_status flashattn_fwd_supported(const flashattn_handle *handle,
                                                       const flashattn_fwd_params *params);

/* What flashattn_fwd would run, for logs and profilers. Fields are only ever appended. */
typedef struct flashattn_plan_info {
    size_t struct_size;        /* sizeof(flashattn_plan_info); set by flashattn_plan_info_init */
    int32_t backend;           /* the resolved flashattn_backend (never AUTO) */
    int32_t block_m;           /* query rows per thread block (fused) or per softmax block row */
    int32_t block_n;           /* keys per tile (fused); 0 for REFERENCE */
    int32_t num_warps;         /* warps per thread block of the main kernel */
    int32_t grid_x, grid_y, grid_z;  /* grid of the main kernel */
    int32_t num_splits;        /* key-sequence splits (1: none) */
    int32_t kernel_head_dim;   /* head dim of the compiled kernel variant (>= head_dim) */
    int64_t workspace_bytes;   /* same as flashattn_fwd_workspace_size */
    int64_t shared_mem_bytes;  /* dynamic shared memory per block of the main kernel */
    char kernel_name[64];      /* e.g. "fused_fwd_bf16_d128_m128_n64_w4",
                                  "fused_sm90_bf16_d128_m128_n128_w12" */
    char description[192];     /* one line with all of the above, and how the blocks take their
                                  tiles: "gqa_packed" / "gqa_rows" (a KV group's query heads in one
                                  tile), "persistent" (resident blocks taking tile after tile: one
                                  per SM, or, for a decode whose tile packs a KV group's query
                                  heads, as few as take its tiles in the same number of rounds;
                                  "persistent=pairs": causal tiles in pairs of equal work),
                                  "heaviest_first=N" (heaviest tiles first across N heads),
                                  "idle_warps=N" (FUSED: N warps a block have no query row and only
                                  load and wait; where all of a block's rows fit in 16, its warps
                                  split each key tile among them instead), "kv_evict_first"
                                  (FUSED_SM90 split decode: K and V, each read once, are loaded
                                  with an evict-first L2 policy, by TMA or gathered row by row),
                                  and a serving call's paths; a line that would not fit leaves
                                  out threads=, smem= and workspace= (fields of their own) */
} flashattn_plan_info;

/* The struct's size in release 0.1.0. */
#define FLASHATTN_PLAN_INFO_SIZE_0_1 320

/* Sets struct_size to `struct_size` and clears the rest of those bytes (and no others), as
 * flashattn_fwd_params_init_size does. Returns: SUCCESS; NULL_POINTER; BAD_STRUCT_SIZE. */
FLASHATTN_API flashattn_status flashattn_plan_info_init_size(flashattn_plan_info *info,
                                                             size_t struct_size);

/* The 0.1.0 layout, for programs built against 0.1.0; the macro passes the caller's sizeof. */
FLASHATTN_API flashattn_status flashattn_plan_info_init(flashattn_plan_info *info);
#define flashattn_plan_info_init(info) flashattn_plan_info_init_size((info), sizeof *(info))

/* Fills *info with the plan for these params, writing only the info->struct_size bytes the caller
 * has (any released size). Returns: SUCCESS; NULL_POINTER; BAD_STRUCT_SIZE (info->struct_size); or
 * any validation status flashattn_fwd can return. */
FLASHATTN_API flashattn_status flashattn_fwd_plan(const flashattn_handle *handle,
                                                  const flashattn_fwd_params *params,
                                                  flashattn_plan_info *info);

/* ---------------------------------------------------------------------------------------------
 * Forward
 * ------------------------------------------------------------------------------------------- */

/* Computes O (and LSE if params->lse is not NULL) as described at flashattn_fwd_params.
 *
 * workspace: device memory of at least flashattn_fwd_workspace_size bytes, 256-byte aligned (any
 *   cudaMalloc pointer is), or NULL when that size is 0. It must stay valid, and not be used by
 *   anything else, until the enqueued work completes on `stream`. Its contents on entry do not matter.
 *   One exception keeps callers of 0.1-0.3 working: a FUSED call given less than it asks for only to
 *   split its keys (NULL included) runs without splitting, as it did then.
 * stream: the CUDA stream to enqueue on (0 is the legacy default stream). The calling thread's current
 *   device must be the handle's device.
 *
 * The call is asynchronous: it validates, plans and enqueues kernels, and returns. It does not
 * allocate, does not synchronise, and may be captured into a CUDA graph. Any number of threads may
 * call it at once with the same handle (calls on the REFERENCE backend serialise their enqueue on the
 * handle's cuBLAS handle). The result is deterministic: the same inputs give bit-identical O and LSE.
 * Stream order holds as for any launch. (FUSED_SM90's kernels are launched as programmatic dependents
 * of the stream's previous kernel, which costs the host less: they may be scheduled early only when
 * that kernel signals its dependents, and then wait for it to finish before touching memory.)
 *
 * Returns: SUCCESS; NULL_POINTER (handle, params, a tensor pointer, or workspace when one is needed);
 * MISALIGNED_POINTER; BAD_STRUCT_SIZE; BAD_SHAPE; BAD_STRIDE; INDEX_OVERFLOW; BAD_HEAD_GROUPING;
 * UNSUPPORTED_HEAD_DIM; BAD_DTYPE;
 * BAD_SCALE; BAD_MASK; BAD_WINDOW; BAD_SOFTCAP; BAD_BACKEND; BAD_VARLEN; BAD_PAGED_KV; BAD_APPEND;
 * BAD_ROTARY (the serving fields, see "Serving calls"); UNSUPPORTED (the forced backend cannot
 * run these params; under AUTO, no backend can: the fused kernels take batch and heads_q up to 65535
 * and head dims that are multiples of 8, REFERENCE takes batch x heads_q and the Q/K seq strides up
 * to 2^31 - 1; the message names the limit each backend hit); WORKSPACE_TOO_SMALL; WRONG_DEVICE; CUDA_ERROR (a launch
 * failed; outputs may be partly written); CUBLAS_ERROR (likewise). On every status before CUDA_ERROR
 * in this list, nothing was enqueued and no output was touched. */
FLASHATTN_API flashattn_status flashattn_fwd(const flashattn_handle *handle,
                                             const flashattn_fwd_params *params,
                                             void *workspace, size_t workspace_bytes,
                                             void *stream /* cudaStream_t */);

/* ---------------------------------------------------------------------------------------------
 * Merging partial results (added in 0.2.0)
 *
 * Attention over a key set split into parts (split-KV decode, a shared prefix and per-request
 * suffixes, several devices) gives one (O_i, LSE_i) per part and query row. Merging them gives the
 * attention over the union of the keys:
 *
 *     m = max_i LSE_i,  w_i = exp(LSE_i - m),  O = sum_i w_i O_i / sum_i w_i,  LSE = m + log(sum_i w_i)
 *
 * (exp and log in the LSE's base). Parts are added in index order, so the result is deterministic.
 * A part whose LSE is -inf or +inf (FlashAttention-2 writes +inf for an empty row) contributes
 * nothing; a row with no contributing part gets O = 0 and LSE = -inf. A NaN LSE makes the row NaN.
 * ------------------------------------------------------------------------------------------- */

typedef enum flashattn_lse_base {
    FLASHATTN_LSE_NATURAL = 0,  /* natural log (FlashAttention's, and this library's LSE output) */
    FLASHATTN_LSE_BASE2 = 1     /* log2 (FlashInfer's merge_state convention) */
} flashattn_lse_base;

/*
 * Layout: part i's O is [batch, seqlen, heads, head_dim] at
 * o_parts + i*o_part_stride + b*o_batch_stride + s*o_seq_stride + h*o_head_stride + d, and its LSE
 * (float32) [batch, heads, seqlen] at lse_parts + i*lse_part_stride + b*lse_batch_stride +
 * h*lse_head_stride + s*lse_seq_stride. The merged O has the same shape (its own strides) and the
 * merged LSE, float32 [batch, heads, seqlen], may be NULL. Strides are in elements, >= 0, head_dim
 * contiguous. Packed (varlen) results are batch = 1 with seqlen = the total number of tokens.
 * The output must not overlap the inputs.
 */
typedef struct flashattn_merge_params {
    size_t struct_size;        /* set by flashattn_merge_params_init */
    int32_t dtype_parts;       /* flashattn_dtype of the O parts: FLOAT16, BFLOAT16 or FLOAT32 */
    int32_t dtype_out;         /* flashattn_dtype of the merged O: FLOAT16, BFLOAT16 or FLOAT32 */
    int32_t lse_base;          /* flashattn_lse_base of every LSE, in and out; default NATURAL */
    int32_t reserved0;         /* must be 0 */
    int64_t num_parts;         /* >= 1 */
    int64_t batch, seqlen, heads, head_dim;  /* batch, heads, head_dim >= 1; seqlen >= 0 (0: no-op) */
    const void *o_parts;       /* device */
    int64_t o_part_stride, o_batch_stride, o_seq_stride, o_head_stride;
    const float *lse_parts;    /* device */
    int64_t lse_part_stride, lse_batch_stride, lse_head_stride, lse_seq_stride;
    void *o;                   /* device, written */
    int64_t out_batch_stride, out_seq_stride, out_head_stride;
    float *lse;                /* device, written; may be NULL */
    int64_t lse_out_batch_stride, lse_out_head_stride, lse_out_seq_stride;
} flashattn_merge_params;

/* The struct's size in release 0.2.0, its first layout. */
#define FLASHATTN_MERGE_PARAMS_SIZE_0_2 208

/* Defaults for the fields a struct of struct_size bytes has: zeros, dtypes FLOAT32 in and FLOAT16
 * out, lse_base NATURAL; struct_size set. Returns: SUCCESS; NULL_POINTER; BAD_STRUCT_SIZE. */
FLASHATTN_API flashattn_status flashattn_merge_params_init_size(flashattn_merge_params *params,
                                                                size_t struct_size);
#define flashattn_merge_params_init(params) \
    flashattn_merge_params_init_size((params), sizeof *(params))

/* Merges the parts as described above, asynchronously on `stream` (a cudaStream_t; the current
 * device must be the handle's). Allocates nothing, needs no workspace, graph-capturable, callable
 * from any number of threads at once.
 * Returns: SUCCESS; NULL_POINTER (handle, params, o_parts, lse_parts or o, where the tensors are not
 * empty); BAD_STRUCT_SIZE (also reserved0 != 0); BAD_DTYPE; BAD_LSE_BASE; BAD_SHAPE; BAD_STRIDE;
 * INDEX_OVERFLOW; MISALIGNED_POINTER (a pointer not aligned to its element size); WRONG_DEVICE;
 * CUDA_ERROR (the launch failed). Before CUDA_ERROR nothing was enqueued and no output touched. */
FLASHATTN_API flashattn_status flashattn_merge(const flashattn_handle *handle,
                                               const flashattn_merge_params *params,
                                               void *stream /* cudaStream_t */);

#ifdef __cplusplus
}
#endif

#endif /* FLASHATTN_H */
