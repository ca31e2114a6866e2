/*
 * fused_sm90_launch.cuh - the host side of the FUSED_SM90 kernel (fused_sm90.cuh): the three TMA
 * tensor maps of Q, K and V, the launch, and the split combine when the plan splits the keys.
 * Included once per compiled variant by the generated instance files (FA_SM90_INSTANCE).
 */
#pragma once

#include <cudaTypedefs.h>
#include <cstring>

#include "fused_sm90.cuh"

namespace fa {
namespace sm90 {

/* cuTensorMapEncodeTiled from the driver, through the runtime (no link against libcuda). */
inline PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
    static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
        void *f = nullptr;
        cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
#if CUDART_VERSION >= 12050
        const cudaError_t err = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &q);
#else
        const cudaError_t err = cudaGetDriverEntryPoint("cuTensorMapEncodeTiled", &f, cudaEnableDefault, &q);
#endif
        return (err == cudaSuccess && q == cudaDriverEntryPointSuccess) ? (PFN_cuTensorMapEncodeTiled_v12000)f : nullptr;
    }();
    return fn;
}

/* The map of a [batch, seq, heads, head_dim] tensor (head dim contiguous) read in boxes of
 * 64 columns x box_rows positions x box_heads heads, 128-byte swizzled, the L2 fetching `promotion`
 * bytes per missed box row. Extents of 0 become 1 (such a tensor is never read). */
inline bool encode_map(CUtensorMap *map, int dtype, const void *ptr, int64_t head_dim, int64_t seq, int64_t heads,
                       int64_t batch, int64_t seq_stride, int64_t head_stride, int64_t batch_stride, int box_rows,
                       int box_heads, CUtensorMapL2promotion promotion = CU_TENSOR_MAP_L2_PROMOTION_L2_256B) {
    const PFN_cuTensorMapEncodeTiled_v12000 encode = tensor_map_encoder();
    if (encode == nullptr) return false;
    const cuuint64_t dims[4] = {(cuuint64_t)head_dim, (cuuint64_t)(seq > 0 ? seq : 1), (cuuint64_t)heads,
                                (cuuint64_t)batch};
    const int64_t raw[3] = {seq_stride, head_stride, batch_stride};
    cuuint64_t strides[3];
    for (int i = 0; i < 3; ++i) /* a one-element dimension's stride is never used; keep it legal */
        strides[i] = (cuuint64_t)(dims[i + 1] > 1 ? raw[i] * 2 : 16);
    const cuuint32_t box[4] = {64, (cuuint32_t)box_rows, (cuuint32_t)box_heads, 1};
    const cuuint32_t elem_strides[4] = {1, 1, 1, 1};
    const CUresult r = encode(map, dtype == FA_DTYPE_BF16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 4,
                              const_cast<void *>(ptr), dims, strides, box, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                              CU_TENSOR_MAP_SWIZZLE_128B, promotion,
                              CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    return r == CUDA_SUCCESS;
}

/* The map of a page pool read in full-width boxes (fa_sm90_page_groups: kp.kv_page_groups = G):
 * 64 columns x 8 rows (row_stride apart) x head_dim / 64 regions (128 bytes apart) x 8-row groups
 * of the pool (8 row_stride apart; page p's first is group p G) x heads. A box of box_rows keys
 * (a multiple of 8) is 64 x 8 x regions x box_rows / 8 x 1: it lands as box_rows / 8 groups of 8 rows
 * x every region, the layout the kernel's descriptors then follow. */
inline bool encode_page_groups_map(CUtensorMap *map, int dtype, const void *ptr, int head_dim, int page_size,
                                   int64_t num_pages, int64_t groups_per_page, int64_t heads, int64_t row_stride,
                                   int64_t head_stride, int box_rows) {
    const PFN_cuTensorMapEncodeTiled_v12000 encode = tensor_map_encoder();
    if (encode == nullptr || head_dim % 64 != 0 || box_rows % 8 != 0) return false;
    const int regions = head_dim / 64;
    /* groups up to the last page's last one: a group past it, or a negative one, reads zeros */
    const cuuint64_t dims[5] = {64, 8, (cuuint64_t)regions,
                                (cuuint64_t)((num_pages - 1) * groups_per_page + page_size / 8), (cuuint64_t)heads};
    const cuuint64_t strides[4] = {(cuuint64_t)row_stride * 2, 128, (cuuint64_t)(8 * row_stride * 2),
                                   (cuuint64_t)(heads > 1 ? head_stride * 2 : 16)};
    const cuuint32_t box[5] = {64, 8, (cuuint32_t)regions, (cuuint32_t)(box_rows / 8), 1};
    const cuuint32_t elem_strides[5] = {1, 1, 1, 1, 1};
    const CUresult r = encode(map, dtype == FA_DTYPE_BF16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 5,
                              const_cast<void *>(ptr), dims, strides, box, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                              CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
                              CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    return r == CUDA_SUCCESS;
}

template <int kDtype, int kHeadDim, int kKeyTile, int kConsumers>
int launch(const fa_kernel_params *kp, const fa_launch *l, void *stream) {
    using Tr = traits<kDtype, kHeadDim, kKeyTile, kConsumers>;
    using TrP = traits<kDtype, kHeadDim, kKeyTile, kConsumers, true>;        /* a persistent dense block */
    using TrS = traits<kDtype, kHeadDim, kKeyTile, kConsumers, true, true>;  /* a persistent serving block */
    /* (persistent serving blocks have two consumers, or two tile records: three consumers, or one
     * for a decode's packed query heads; the others are not compiled) */
    constexpr bool kServingPersistent = kConsumers == 2 || TrS::kTwoRecords;
    const int smem = !kp->persistent ? Tr::kSmemBytes : kp->serving ? TrS::kSmemBytes : TrP::kSmemBytes;
    if (l->threads != Tr::kThreads || l->smem_bytes != smem ||
        (kp->pack_gqa && (kp->pack_rows < 1 || kp->pack_rows * kp->head_group > Tr::kBlockM)) ||
        (kp->num_splits > 1 && (kp->o_accum == nullptr || kp->lse_accum == nullptr)) ||
        (kp->persistent && (kp->num_splits > 1 || kp->sched_heads || l->grid_y != 1 || l->grid_z != 1 ||
                            /* (packed query heads: a decode on one consumer, planned as a serving
                             * call, dense ones too, and it only) */
                            (kp->pack_gqa != (kp->serving && kConsumers == 1)) ||
                            (kp->serving && (!kServingPersistent ||
                                             (kp->gather_pages && !TrS::kGathersResident))))) ||
        (kp->gather_pages && !Tr::kMayGather) ||
        (kp->gather_pages != fa_sm90_gathers_pages(kp->serving && kp->block_table != nullptr, kp->page_size, Tr::kBlockN,
                                                   Tr::kBlockM, kp->num_splits)) ||
        (kp->kv_page_groups != 0 &&
         (!kp->serving || !kp->block_table || kp->gather_pages ||
          kp->kv_page_groups != fa_sm90_page_groups(kp->head_dim, kHeadDim, kp->page_size, kp->num_pages,
                                                    kp->k_batch_stride, kp->k_seq_stride, kp->v_batch_stride,
                                                    kp->v_seq_stride))))
        return (int)cudaErrorInvalidConfiguration; /* planner and kernel disagree: refuse */
    CUtensorMap tq, tk, tv;
    /* Q in boxes of one head x kBlockM positions, or (pack_gqa) head_group heads x pack_rows
     * positions, or (a persistent block refilling each consumer's rows alone: kSplitQ) 64. */
    const bool split_q = kp->persistent && (kp->serving ? TrS::kSplitQ : TrP::kSplitQ);
    const int q_rows = kp->pack_gqa ? kp->pack_rows : split_q ? 64 : Tr::kBlockM, q_heads = kp->pack_gqa ? kp->head_group : 1;
    /* The outer two extents of Q and of K/V: [batch, seqlen] for a dense call; for a serving call
     * packed [1, total], page pools [num_pages, page_size] (boxes of gcd(page_size, kBlockN) keys)
     * or a cache [kv_batch, seqlen_k] (flashattn.h, "Serving calls"). */
    int64_t q_seq = kp->seqlen_q, q_batch = kp->batch, kv_seq = kp->seqlen_k, kv_batch = kp->batch;
    int kv_box = Tr::kBlockN;
    if (kp->serving) {
        if (kp->cu_seqlens_q) q_seq = kp->total_q, q_batch = 1;
        /* Pages in boxes of gcd(page_size, kBlockN) keys when TMA reads them; other page sizes are
         * gathered, the map unused. */
        const bool tma_pages = FA_SM90_TMA_PAGES(kp->page_size, Tr::kBlockN);
        if (kp->block_table)
            kv_seq = kp->page_size, kv_batch = kp->num_pages, kv_box = tma_pages ? fa_sm90_page_box(kp->page_size, kv_box) : kv_box;
        else if (kp->cu_seqlens_k) kv_seq = kp->total_k, kv_batch = 1;
        else if (kp->kv_batch_idx) kv_batch = kp->kv_batch;
    }
    /* K and V: the L2 fetches what a box row asks for (128 bytes), no more. Promoting each fetch to
     * 256 bytes (a row's other 64 columns, which the next box reads) cost decode 5.5-7% of its
     * bandwidth on the H200 and prefill nothing measurable (docs/performance.md v18). */
    const CUtensorMapL2promotion kv_promo = CU_TENSOR_MAP_L2_PROMOTION_L2_128B;
    fa_kernel_params args = *kp;
    /* Full-width page boxes where the planner chose them (kv_page_groups, checked above); should the
     * driver refuse such a map, the pages keep their per-region boxes (the kernel follows args). */
    const bool groups = kp->kv_page_groups > 0 &&
                        encode_page_groups_map(&tk, kDtype, kp->k, kHeadDim, kp->page_size, kp->num_pages,
                                               kp->kv_page_groups, kp->heads_kv, kp->k_seq_stride, kp->k_head_stride,
                                               kv_box) &&
                        encode_page_groups_map(&tv, kDtype, kp->v, kHeadDim, kp->page_size, kp->num_pages,
                                               kp->kv_page_groups, kp->heads_kv, kp->v_seq_stride, kp->v_head_stride,
                                               kv_box);
    if (!groups) args.kv_page_groups = 0;
    if (!encode_map(&tq, kDtype, kp->q, kp->head_dim, q_seq, kp->heads_q, q_batch, kp->q_seq_stride,
                    kp->q_head_stride, kp->q_batch_stride, q_rows, q_heads) ||
        (!groups && (!encode_map(&tk, kDtype, kp->k, kp->head_dim, kv_seq, kp->heads_kv, kv_batch, kp->k_seq_stride,
                                 kp->k_head_stride, kp->k_batch_stride, kv_box, 1, kv_promo) ||
                     !encode_map(&tv, kDtype, kp->v, kp->head_dim, kv_seq, kp->heads_kv, kv_batch, kp->v_seq_stride,
                                 kp->v_head_stride, kp->v_batch_stride, kv_box, 1, kv_promo))))
        return (int)cudaErrorInvalidValue; /* the planner checked the limits; not expected */
    /* A persistent block stores O by TMA, in boxes of 64 rows (a consumer's) where the driver takes
     * O's strides (the map's extents are Q's: O has Q's rows); otherwise, and where a tile's rows
     * are a KV group's query heads (pack_gqa), with 16-byte writes. */
    CUtensorMap to;
    memset(&to, 0, sizeof to);
    args.o_tma = kp->persistent && !kp->pack_gqa && encode_map(&to, kDtype, kp->o, kp->head_dim, q_seq, kp->heads_q, q_batch,
                                              kp->o_seq_stride, kp->o_head_stride, kp->o_batch_stride, 64, 1);
    const bool transform = kp->softcap > 0.0f || kp->alibi_slopes != nullptr;
    static std::atomic<unsigned long long> configured[10]; /* per kernel below: devices configured */
    /* (a resident serving block whose pages are gathered: a kernel of its own, where compiled) */
    constexpr bool kGR = TrS::kGathersResident;
    const bool resident_gather = kGR && kp->serving && kp->persistent && kp->gather_pages;
    const int which = (resident_gather ? 8 : (kp->serving ? 2 : 0) + (kp->persistent ? 4 : 0)) + (transform ? 1 : 0);
    auto kernel = resident_gather
                      ? (transform ? fused_sm90_kernel<kDtype, kHeadDim, kKeyTile, kConsumers, true, true, kGR, kGR>
                                   : fused_sm90_kernel<kDtype, kHeadDim, kKeyTile, kConsumers, false, true, kGR, kGR>)
                  : kServingPersistent && kp->serving && kp->persistent
                      ? (transform ? fused_sm90_kernel<kDtype, kHeadDim, kKeyTile, kConsumers, true, true, kServingPersistent>
                                   : fused_sm90_kernel<kDtype, kHeadDim, kKeyTile, kConsumers, false, true, kServingPersistent>)
                  : kp->serving    ? (transform ? fused_sm90_kernel<kDtype, kHeadDim, kKeyTile, kConsumers, true, true>
                                                : fused_sm90_kernel<kDtype, kHeadDim, kKeyTile, kConsumers, false, true>)
                  : kp->persistent ? (transform ? fused_sm90_kernel<kDtype, kHeadDim, kKeyTile, kConsumers, true, false, true>
                                                : fused_sm90_kernel<kDtype, kHeadDim, kKeyTile, kConsumers, false, false, true>)
                                   : (transform ? fused_sm90_kernel<kDtype, kHeadDim, kKeyTile, kConsumers, true, false>
                                                : fused_sm90_kernel<kDtype, kHeadDim, kKeyTile, kConsumers, false, false>);
    cudaError_t err = set_smem_once(kernel, smem, configured[which]);
    if (err != cudaSuccess) return (int)err;
    /* A programmatic dependent of the stream's previous kernel: the kernel waits for it before
     * touching memory (wait_prerequisites), so the order is the stream's; the launch itself costs
     * the host less than a plain one (benchmarks/launch_cost.cu: 2.6 against 3.2-3.6 us on the H200's hosts). */
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(l->grid_x, l->grid_y, l->grid_z), cfg.blockDim = dim3(Tr::kThreads);
    cfg.dynamicSmemBytes = (size_t)smem, cfg.stream = (cudaStream_t)stream;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr, cfg.numAttrs = 1;
    err = cudaLaunchKernelEx(&cfg, kernel, args, tq, tk, tv, to);
    if (err != cudaSuccess || kp->num_splits <= 1) return (int)err;
    return fa_split_combine(kp, kDtype, 1, stream);
}

}  // namespace sm90
}  // namespace fa

#define FA_SM90_INSTANCE(DTYPE, NAME, HD, BN, NC)                                                  \
    extern "C" __attribute__((visibility("hidden"))) int fa_sm90_fwd_##NAME##_d##HD##_n##BN##_c##NC( \
        const fa_kernel_params *kp, const fa_launch *l, void *stream) {                            \
        return fa::sm90::launch<DTYPE, HD, BN, NC>(kp, l, stream);                                 \
    }
