/*
 * internal.h - what the host-side C files of libflashattn share. Not installed.
 *
 * Call path: api.c (flashattn_fwd) -> plan.c (fa_plan_make, which first calls validate.c's
 *            fa_validate_load and asks variants.c what is compiled) -> dispatch.c (fa_dispatch)
 *            -> a launcher in kernels/ (or reference.c for REFERENCE).
 */
#ifndef FA_INTERNAL_H
#define FA_INTERNAL_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "flashattn.h"
#include "fa_kernel_params.h"

#ifdef __cplusplus
extern "C" {
#endif

#define FA_HIDDEN __attribute__((visibility("hidden")))

/* Largest sequence length accepted: keeps every query/key index and offset difference in int32. */
#define FA_MAX_SEQLEN ((int64_t)1 << 30)
#define FA_MAX_HEAD_DIM 256
/* Workspace alignment the caller must provide, and the alignment of every region carved from it. */
#define FA_WORKSPACE_ALIGN 256
/* cuBLAS's own workspace inside ours (the size cuBLAS recommends for Hopper). */
#define FA_CUBLAS_WORKSPACE_BYTES ((int64_t)32 << 20)

/* What planning needs to know about a device. */
typedef struct fa_device_caps {
    int device;
    int cc_major, cc_minor;
    int sm_count;
    int64_t smem_per_block_optin;
    int64_t l2_bytes;   /* 0: unknown (the planner assumes 50 MB) */
} fa_device_caps;

struct flashattn_handle {
    fa_device_caps caps;
    void *cublas;                 /* cublasHandle_t */
    pthread_mutex_t cublas_lock;  /* serialises stream/workspace binding + enqueue on `cublas` */
};

/* Where the REFERENCE backend's regions lie in the workspace (byte offsets from its start). */
typedef struct fa_ref_layout {
    int64_t ptr_arrays;   /* 6 arrays of batch*heads_q device pointers */
    int64_t scores;       /* float32 [batch*heads_q, seqlen_q, seqlen_k], softmax in place */
    int64_t v_f32;        /* float32 [batch, heads_kv, seqlen_k, head_dim] */
    int64_t o_f32;        /* float32 [batch*heads_q, seqlen_q, head_dim] */
    int64_t cublas_ws;    /* FA_CUBLAS_WORKSPACE_BYTES */
    int64_t gathered;     /* serving calls: Q [batch, seqlen_q, heads_q, head_dim], then K and V
                             [batch, seqlen_k, heads_kv, head_dim], dense (dtype), gathered per
                             sequence with zeros past its counts (seqlen_q/k are the capacities) */
    int64_t total;
} fa_ref_layout;

typedef struct fa_plan {
    int32_t backend;      /* resolved: FLASHATTN_BACKEND_REFERENCE, _FUSED or _FUSED_SM90 */
    int32_t dtype;
    int32_t noop;         /* seqlen_q == 0: nothing to do */
    int32_t ref_lowprec;  /* REFERENCE only: plain low-precision attention (tests' baseline) */
    fa_kernel_params kp;
    fa_fused_config cfg;  /* FUSED and FUSED_SM90 (block_m = 64 x consumers, warps include the producer's) */
    int32_t grid_x, grid_y, grid_z, threads;
    int64_t smem_bytes;
    int64_t workspace_bytes;
    fa_ref_layout ref;    /* REFERENCE */
    int64_t o_accum_off, lse_accum_off; /* FUSED_SM90 with kp.num_splits > 1: workspace offsets */
    int32_t append;       /* k_new set: the append kernel runs first (app; its q_out, when Q is
                             rotated, at workspace offset q_rot_off) */
    fa_append_args app;
    int64_t q_rot_off;
    int32_t gqa_rows;     /* FUSED decode: the query heads of a KV group run as the rows of one
                             tile (fa_fused_gqa_rows) */
} fa_plan;

/* errors.c */
FA_HIDDEN void fa_clear_error(void);
FA_HIDDEN flashattn_status fa_fail(flashattn_status status, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

#define FA_COUNT(a) (sizeof(a) / sizeof((a)[0]))

/* api.c: the struct-growth rule. A caller's params may be any released size (the fields it does
 * not know take their defaults); the library reads no byte past struct_size. fa_size_known: whether
 * size is one of a struct's released sizes. */
FA_HIDDEN int fa_size_known(const size_t *sizes, size_t n, size_t size);
FA_HIDDEN int fa_fwd_params_size_known(size_t size);
FA_HIDDEN int fa_plan_info_size_known(size_t size);
FA_HIDDEN void fa_fwd_params_defaults(flashattn_fwd_params *p);
/* Copies the caller's struct_size bytes over the defaults into *full (this library's layout). */
FA_HIDDEN flashattn_status fa_fwd_params_load(const flashattn_fwd_params *p, flashattn_fwd_params *full);

/* validate.c: every check that needs no device, on the caller's params read into *full. */
FA_HIDDEN flashattn_status fa_validate_load(const flashattn_fwd_params *p, flashattn_fwd_params *full);
FA_HIDDEN flashattn_status fa_validate(const flashattn_fwd_params *p);
/* The outer two extents of Q/O and of K/V: [batch, seqlen_q] or packed [1, total_q]; [batch,
 * seqlen_k], packed [1, total_k], page pools [num_pages, page_size] or a cache [kv_batch, seqlen_k]. */
FA_HIDDEN void fa_outer_extents(const flashattn_fwd_params *p, int64_t *q_outer, int64_t *q_rows, int64_t *kv_outer,
                                int64_t *kv_rows);
/* Whether a loaded params uses any serving field (ragged, seqused, paged, indexed KV, append). */
FA_HIDDEN int fa_is_serving(const flashattn_fwd_params *p);

/* plan.c: validate, then choose a backend and its launch shape. Pure: no CUDA calls. options:
 * FA_PLAN_REF_LOWPREC (REFERENCE as plain low-precision attention, the tests' baseline) and
 * FA_PLAN_NO_SPLIT (never split the keys: FUSED given no workspace, as before 0.4.0). */
#define FA_PLAN_REF_LOWPREC 1
#define FA_PLAN_NO_SPLIT 2
FA_HIDDEN flashattn_status fa_plan_make(const fa_device_caps *caps, const flashattn_fwd_params *p,
                                        int options, fa_plan *out);
FA_HIDDEN int fa_fused_kernel_head_dim(int64_t head_dim);
FA_HIDDEN const fa_fused_config *fa_fused_config_for(int kernel_head_dim);
/* FUSED_SM90: the compiled-for head dim that runs head_dim (0 if none), and its tile row. */
FA_HIDDEN int fa_sm90_kernel_head_dim(int64_t head_dim);
FA_HIDDEN const fa_fused_config *fa_sm90_config_for(int kernel_head_dim);
/* The row of FA_SM90_CONFIGS that runs this call (its masked_max_seqlen_q rule). */
FA_HIDDEN const fa_fused_config *fa_sm90_config_for_call(int kernel_head_dim, const flashattn_fwd_params *p);
/* The fused backends' decode decisions (plan.c says why): FUSED_SM90 packs a KV group's query heads
 * into one tile; both split the key range when the tiles cannot fill the GPU. */
#define FA_MAX_SPLITS 64
FA_HIDDEN int fa_should_pack_gqa(int sm90, int64_t group, int64_t block_m, int64_t seqlen_q);
FA_HIDDEN int64_t fa_num_splits(int64_t slots, int64_t ctas, int64_t key_tiles);
FA_HIDDEN int64_t fa_fused_blocks_per_sm(const fa_device_caps *caps, const fa_fused_config *cfg);
/* Query tiles a head from which FUSED_SM90's causal calls take their tiles heaviest first across heads. */
#define FA_SCHED_MIN_M_BLOCKS 32
FA_HIDDEN int64_t fa_sched_heads(const fa_device_caps *caps, const flashattn_fwd_params *p, int64_t m_blocks);
/* Whether FUSED_SM90's K/V loads of this split decode carry an evict-first L2 policy. */
FA_HIDDEN int fa_sm90_kv_evict_first(const fa_device_caps *caps, const flashattn_fwd_params *p, int64_t splits,
                                     int64_t m_blocks, int pack);
/* Whether AUTO prefers FUSED_SM90 over FUSED for this head dim (when both can run the call). */
FA_HIDDEN int fa_sm90_auto_prefers(int64_t head_dim);
FA_HIDDEN void fa_plan_describe(const fa_plan *plan, flashattn_plan_info *info);

/* variants.c: which fused variants this build compiled. */
FA_HIDDEN int fa_fused_compiled(int dtype, int kernel_head_dim);
FA_HIDDEN int fa_sm90_compiled(int dtype, int kernel_head_dim);
FA_HIDDEN int fa_sm90_variant_compiled(int dtype, int kernel_head_dim, int block_n, int consumers);

/* dispatch.c: the launchers. */
FA_HIDDEN flashattn_status fa_dispatch(const flashattn_handle *h, const fa_plan *plan, void *workspace,
                                       void *stream);

/* merge.c: flashattn_merge's validation alone (for the tests): SUCCESS or the status flashattn_merge
 * would return before touching the device. */
FA_HIDDEN flashattn_status fa_merge_check(const flashattn_merge_params *p);

/* reference.c */
FA_HIDDEN flashattn_status fa_reference_run(const flashattn_handle *h, const fa_plan *plan,
                                            const fa_kernel_params *kp, void *workspace, void *stream);

/* api.c, for the tests: flashattn_fwd with the reference switched to plain low-precision attention
 * (scores and probabilities rounded to the input dtype, as unfused framework attention computes). */
FA_HIDDEN flashattn_status fa_fwd_ex(const flashattn_handle *h, const flashattn_fwd_params *p,
                                     void *workspace, size_t workspace_bytes, void *stream,
                                     int ref_lowprec);
FA_HIDDEN flashattn_status fa_workspace_size_ex(const flashattn_handle *h,
                                                const flashattn_fwd_params *p, int ref_lowprec,
                                                size_t *bytes);

#ifdef __cplusplus
}
#endif

#endif /* FA_INTERNAL_H */
