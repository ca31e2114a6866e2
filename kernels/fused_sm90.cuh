/*
 * fused_sm90.cuh - the FUSED_SM90 forward kernel: FlashAttention on Hopper's tensor memory
 * accelerator (TMA) and warpgroup tensor-core instructions (wgmma), sm_90a. Same contract and
 * semantics as the portable kernel in fused_fwd.cuh; a separate backend, so neither constrains the
 * other.
 *
 * A block owns 64 x C query rows of one (batch, head) (C consumer warpgroups: 2 at head dims 128,
 * 192 and 256, 3 or 2 at 64, 1 for grouped decode at 64 and 128; the table in fa_kernel_params.h),
 * or, as a persistent block (the
 * kPersistent variant: resident blocks, at most one an SM), such a tile after another (fa_persistent_first /
 * fa_persistent_next; the K/V stages and barrier phases run on across tiles, the producer loads the
 * next tile's first K, and its Q into a second buffer as this tile starts (a block with the shared
 * memory for it) or once every consumer warp is done with this one's (a dense block staging O in
 * Q's rows: each consumer's rows once that consumer's warps are); the last consumer of a block with
 * two Q buffers or of a dense one hands the tensor-core turn to the next tile's first as soon as it
 * has issued its last P V). It has C + 1 warpgroups:
 *   producer (warpgroup 0, one thread): TMA loads of Q once, then of K_j and V_j into two stages
 *     each, as the consumers free them. Each load completes on a "full" mbarrier; each stage is
 *     handed back on an "empty" mbarrier. It keeps 24 registers (setmaxnreg) so that the consumers
 *     can have 240 (C = 1, 2; in a serving block beside a single consumer, 232, for the gathered
 *     copies of produce_gathered); with C = 3 the consumers' 160 leave it 32 (a persistent dense
 *     block's producer computes each next tile ahead); 56 in a persistent serving block, whose
 *     two consumers then keep 224, and whose producer reads each tile's sequence once and hands it
 *     to the consumers in a shared-memory record (post_record / take_record; with two Q buffers,
 *     one warp reads the sequences, posts the records up to two tiles ahead and loads each tile's
 *     Q, another loads K and V from the records: post_tile_record / take_tile_record).
 *   consumers (warpgroups 1..C): 64 query rows each, for the whole kernel. Per key tile j:
 *
 *     wait until K_j (and V_{j-1}) are in shared memory
 *     take the tensor-core turn (named barriers; the consumers go round in turn, so one's
 *       softmax runs while another's matrix products do; a single consumer takes no turns)
 *     issue S_j = Q K_j^T                                  wgmma, A and B from shared memory (over
 *                                                          the head dim's k-steps: kShortSteps)
 *     (a single consumer waits for V_{j-1} only here: kSFirst)
 *     issue O += P_{j-1} V_{j-1}                           wgmma, P from registers, V N-major
 *     pass the turn
 *     wait for S_j; hand back K_j; softcap/ALiBi/mask; online softmax (exp2, scale folded)
 *     wait for P V; hand back V_{j-1}; O *= exp2(m_old - m_new); P_j = bf16/fp16(exp2(S - m_new))
 *
 *   (at head dims 192 and 256, a last key tile in which the block's visible keys end at most 32
 *   keys in runs S, the softmax and P V over those 32 keys alone: kTailW)
 *   and after the last tile O += P V once more, O /= l, LSE = (m + log2 l) ln 2 (a single
 *   consumer works out 1 / l and stores the LSE while that last product runs); O is staged
 *   through the consumer's own rows of the Q tile (a persistent block: of an O tile of its own where
 *   shared memory allows) and stored with 16-byte writes, or, by a persistent block, with TMA stores
 *   that one thread issues and nobody waits for until the rows are needed again.
 *
 * Shared-memory tiles are rows of 64 elements (128 bytes), 16-byte chunks XOR-swizzled by row % 8,
 * one region per 64 columns of the head dim: the layout TMA writes with 128-byte swizzling and
 * wgmma reads through its descriptors. Rows past the sequence and columns past head_dim are zeros
 * (TMA fills out-of-bounds elements with zero). The accumulator layout of wgmma m64nNk16 (per warp:
 * rows g and g + 8 of its 16, columns 8i + 2t, +1) equals mma.sync's, and so does the
 * A-in-registers layout, so the softmax and the S -> P repacking are those of the portable kernel.
 * No atomics, fixed order: deterministic.
 *
 * The pieces, in the order data flows through them:
 *   tile                 which query rows and key tiles the block owns, or a persistent block's
 *                        work number stands for (row_target, lse_slot)
 *   store_empty          the answer for a tile no row of which sees a key
 *   smem_layout          where Q, the O tile, the K/V stages and the mbarriers live; init_barriers
 *   produce              the producer warpgroup's TMA loop, one tile's
 *   the kernel body      a consumer warpgroup's mainloop: S = Q K^T, mask and softmax (softmax.cuh),
 *                        O += P V, then 1/l and LSE, and the plain epilogue (O staged through shared
 *                        memory, stored by threads or by TMA), tile after tile for a persistent
 *                        block; kept in the body because nvcc compiles it differently as a function
 *   store_split_partial  the split epilogue (fp32 partial O for the combine kernel)
 * PTX wrappers are in sm90_ptx.cuh; the host side (tensor maps, launch) in fused_sm90_launch.cuh.
 */
#pragma once

#include "sm90_ptx.cuh"
#include "sm90_wgmma.cuh"
#include "softmax.cuh"

#include <type_traits>

namespace fa {
namespace sm90 {

/* One variant of the kernel: a row of FA_SM90_CONFIGS (head dim, key tile, consumer warpgroups), as
 * a block a tile or a persistent block (kPersistentBlock), of a dense or a serving call
 * (kServingBlock: it decides the persistent block's Q buffers). */
template <int kDtype, int kHeadDim, int kKeyTile, int kNumConsumers, bool kPersistentBlock = false,
          bool kServingBlock = false>
struct traits {
    using T = typename elem<kDtype>::type;
    static constexpr int kConsumers = kNumConsumers; /* consumer warpgroups */
    static constexpr int kBlockM = 64 * kNumConsumers, kBlockN = kKeyTile;
    static constexpr int kThreads = kWarpgroupThreads * (kConsumers + 1);
    /* setmaxnreg: the producer keeps kProducerRegs registers, the consumers share the rest (a
     * multiple of 8, at most 240; consumer_regs for a producer given more, as a persistent serving
     * block's is). The registers a block may redistribute are those it was given at launch,
     * kLaunchRegs a thread (ptxas's figure under __launch_bounds__(kThreads, 1): 240 with one
     * consumer, 168 with two, 128 with three), not the register file's 64K: a consumer's
     * setmaxnreg.inc waits for the registers the producer's .dec released, and waits forever if
     * they fall short, so every split used is checked by fits() where it is chosen. */
    static constexpr int kLaunchRegs = 65536 / kThreads / 8 * 8 > 240 ? 240 : 65536 / kThreads / 8 * 8;
    static constexpr int kProducerRegs = kConsumers == 3 ? 32 : 24; /* (3 x 160 + 32 = 4 x 128) */
    /* A serving block a tile's producer, whose whole warpgroup may gather pages (produce_gathered):
     * beside a single consumer, which takes 240 whatever the producer keeps, it keeps nearly all it
     * was launched with. */
    static constexpr int kServingProducerRegs = kConsumers == 1 ? kLaunchRegs - 8 : kProducerRegs;
    static constexpr int consumer_regs(int producer_regs) {
        const int share = ((kConsumers + 1) * kLaunchRegs - producer_regs) / kConsumers / 8 * 8;
        return share > 240 ? 240 : share;
    }
    static constexpr bool fits(int producer_regs, int consumer) {
        return producer_regs + kConsumers * consumer <= (kConsumers + 1) * kLaunchRegs;
    }
    static constexpr int kChunks = kHeadDim / 8; /* 16-byte chunks per row */
    static constexpr uint32_t kQBytes = kBlockM * kHeadDim * 2, kKVBytes = kBlockN * kHeadDim * 2;
    /* A persistent block (p.persistent: tile after tile) stages O in a tile of its own where it
     * fits, so the next tile's Q can load during the epilogue; otherwise O is staged in Q's rows.
     * Where a third tile fits too, it has two Q buffers (kTwoQ): tile n's Q in buffer n % 2, the
     * next tile's loading while this one is computed. A serving block's barrier area then holds
     * two 64-byte tile records (kTwoRecords, kBarBytes 256: a warp of its own posts the next
     * tile's while this one runs). */
    static constexpr bool kPersistent = kPersistentBlock;
    static constexpr bool kOwnO = kPersistent && 1024 + 2 * kQBytes + 4 * kKVBytes + 128 <= FA_SM90_SMEM_MAX;
    static constexpr bool kTwoQ =
        kOwnO && 1024 + 3 * kQBytes + 4 * kKVBytes + (kServingBlock ? 256 : 128) <= FA_SM90_SMEM_MAX;
    static constexpr bool kTwoRecords = kTwoQ && kServingBlock;
    /* A persistent block with neither (head dims 192 and 256, the 176-key d128 tiles) stages O in
     * Q's rows; there each consumer hands its own 64 rows of Q back once its stores have read them,
     * and the producer refills those rows alone (kSplitQ: a Q barrier pair per consumer, Q loaded
     * in 64-row boxes), so consumer 0 begins the next tile while the others still store. A dense
     * block keeps the second consumer's pair in the record area, which it does not use; a serving
     * block's record is there, so its barrier area is 256 bytes, the pair from bar_q + 128. */
    static constexpr bool kSplitQ = kPersistent && !kOwnO;
    static constexpr bool kServing = kServingBlock;
    /* A resident serving block that may gather its pages (fa_sm90_resident_gathers: two consumers
     * and two tile records): its producer warpgroup's four warps copy the rows (row_gather), warp 1
     * after it has posted the tile's record and loaded its Q. */
    static constexpr bool kGathersResident = kTwoRecords && kConsumers == 2;
    /* Whether this tile's serving blocks may gather their pages at all (row_gather): a single
     * consumer's tile, or key tiles of at most 128 keys. The planner keeps gathered pages off head
     * dim 128's 176-key tile (plan.c; they ran 0.86-0.87x there: docs/performance.md v49, v50) and
     * the launcher refuses a plan that puts them there, so that tile's kernels carry no copies. */
    static constexpr bool kMayGather = kNumConsumers == 1 || kKeyTile <= 128;
    static constexpr int kBarBytes = kTwoRecords || (kSplitQ && kServingBlock) ? 256 : 128;
    static constexpr uint32_t kOBytes = kOwnO ? kQBytes : 0, kQBufBytes = (kTwoQ ? 2 : 1) * kQBytes;
    static constexpr int kSmemBytes = 1024 + (int)(kQBufBytes + kOBytes + 4 * kKVBytes) + kBarBytes;
    static_assert(kSmemBytes == (int)(1024 + 2 * kHeadDim * (kBlockM + 4 * kBlockN) + 128 +
                                      (kOwnO ? 2 * kHeadDim * kBlockM : 0) + (kTwoQ ? 2 * kHeadDim * kBlockM : 0) +
                                      (kBarBytes - 128)),
                  "see fa_sm90_smem_bytes (the launcher checks the planner's figure against kSmemBytes)");
    static_assert(kHeadDim % 64 == 0 && kBlockN % 16 == 0 && kBlockN <= 256, "tile shape");
    static_assert(kConsumers >= 1 && kConsumers <= 3, "one producer and one to three consumer warpgroups");
    static_assert(!kSplitQ || kConsumers == 2, "kSplitQ: the second consumer's Q barriers in the record area");
};

/* Shared memory: Q (1024-byte aligned for the swizzle atom; Tr::kTwoQ: two buffers, tile n's in
 * q_buf(n)), the epilogue's O tile (Tr::kOwnO; else o is Q's), two stages of K, two of V, then the
 * mbarriers (8 bytes each): Q loaded and Q free (a persistent block's next Q may load: every
 * consumer warp is done with the buffer, and with kTwoQ has seen the last Q land); K and V stage s
 * full (the TMA landed) and empty (every consumer warp is done with it). full_* and empty_* are
 * stage 0's; stage s's is 8 s bytes on. Then a persistent block's tile records: a serving block's
 * record barriers and a 32-byte record (Tr::kTwoRecords: two of each, 64-byte records, record n in
 * slot n % 2; a Tr::kSplitQ block's second consumer's Q barriers after the 32-byte record), or a
 * dense kTwoQ block's two 16-byte records. */
template <class Tr> struct smem_layout {
    uint32_t q, o, k, v, bar_q, full_k, full_v, empty_k, empty_v, empty_q, rec_full, rec_empty, rec;
    __device__ __forceinline__ explicit smem_layout(uint32_t raw) {
        q = (raw + 1023u) & ~1023u;
        o = Tr::kOwnO ? q + Tr::kQBufBytes : q;
        k = q + Tr::kQBufBytes + Tr::kOBytes;
        v = k + 2 * Tr::kKVBytes;
        bar_q = v + 2 * Tr::kKVBytes;
        full_k = bar_q + 8, full_v = bar_q + 24, empty_k = bar_q + 40, empty_v = bar_q + 56, empty_q = bar_q + 72;
        /* (rec: 32 bytes to the end of the 128; with two records, 2 x 64 from bar_q + 128, to the end of the 256) */
        rec_full = bar_q + 80, rec_empty = bar_q + (Tr::kTwoRecords ? 96 : 88), rec = bar_q + (Tr::kTwoRecords ? 128 : 96);
    }
    /* A serving block's n-th tile record: its slot, and the slot's barriers (posted; taken by every
     * consumer thread, and with two records by every thread of the K/V warp). */
    __device__ __forceinline__ uint32_t rec_slot(int n) const { return Tr::kTwoRecords ? rec + 64 * (uint32_t)(n & 1) : rec; }
    __device__ __forceinline__ uint32_t rec_full_slot(int n) const { return Tr::kTwoRecords ? rec_full + 8 * (uint32_t)(n & 1) : rec_full; }
    __device__ __forceinline__ uint32_t rec_empty_slot(int n) const { return Tr::kTwoRecords ? rec_empty + 8 * (uint32_t)(n & 1) : rec_empty; }
    /* The parity of the slot barriers' phase that record n completes. */
    static __device__ __forceinline__ uint32_t rec_parity(int n) { return (uint32_t)(Tr::kTwoRecords ? n >> 1 : n) & 1u; }
    /* Consumer c's Q barriers: Q (its rows, with Tr::kSplitQ) landed, and free to load again. With
     * kSplitQ (two consumers), consumer 1's are in a dense block's record area (which it does not
     * use), or after a serving block's record (bar_q + 128 and + 136). */
    static constexpr uint32_t kQFullStep = Tr::kServing ? 128 : 96, kQEmptyStep = Tr::kServing ? 64 : 32;
    __device__ __forceinline__ uint32_t q_full(int c) const { return Tr::kSplitQ ? bar_q + kQFullStep * (uint32_t)c : bar_q; }
    __device__ __forceinline__ uint32_t q_empty(int c) const { return Tr::kSplitQ ? empty_q + kQEmptyStep * (uint32_t)c : empty_q; }
    /* The Q buffer of a block's n-th tile. */
    __device__ __forceinline__ uint32_t q_buf(int n) const { return Tr::kTwoQ ? q + (uint32_t)(n & 1) * Tr::kQBytes : q; }
    /* Thread 0, before the block's first barrier: a load arrives once (with its byte count), a
     * stage or Q is handed back once per consumer warp. */
    /* The K/V stages are filled by `full_arrivals` producer threads: 1 with TMA, the whole producer
     * warpgroup when a serving call gathers its pages with cp.async. `records`: a persistent
     * serving block's tile records (post_record, post_tile_record), posted once by the producer and
     * taken once by each consumer thread (and with Tr::kTwoRecords by each of the `kv_takers`
     * threads that load K and V: the K/V warp, or with gathered pages warps 0, 2 and 3). */
    __device__ __forceinline__ void init_barriers(int full_arrivals = 1, bool records = false, int kv_takers = 32) const {
        mbar_init(bar_q, 1);
        if (Tr::kPersistent) mbar_init(empty_q, 4 * (Tr::kSplitQ ? 1 : Tr::kConsumers));
        if (Tr::kSplitQ)
            for (int c = 1; c < Tr::kConsumers; ++c) mbar_init(q_full(c), 1), mbar_init(q_empty(c), 4);
        if (records)
            for (int n = 0; n < (Tr::kTwoRecords ? 2 : 1); ++n) {
                mbar_init(rec_full_slot(n), 1);
                mbar_init(rec_empty_slot(n), kWarpgroupThreads * Tr::kConsumers + (Tr::kTwoRecords ? kv_takers : 0));
            }
#pragma unroll
        for (int st = 0; st < 2; ++st) {
            mbar_init(full_k + 8 * st, full_arrivals);
            mbar_init(full_v + 8 * st, full_arrivals);
            mbar_init(empty_k + 8 * st, 4 * Tr::kConsumers);
            mbar_init(empty_v + 8 * st, 4 * Tr::kConsumers);
        }
        mbar_init_fence();
    }
};

/* Whether a serving call's pages are gathered row by row with cp.async (the planner's choice,
 * fa_sm90_gathers_pages; the launcher checks it, and that the tile may gather: Tr::kMayGather). */
template <class Tr> __device__ __forceinline__ bool gathers_pages(const fa_kernel_params &p) {
    return Tr::kMayGather && p.gather_pages != 0;
}

/* The block's work: query positions [m0, m0 + rows_per_head) of `heads` query heads starting at h0
 * (one head, or with pack_gqa the head_group heads of KV head hk); tile row r is head
 * h0 + r / rows_per_head, position m0 + r % rows_per_head. Split `split` of num_splits takes its
 * share of the key tiles any of its rows can see: n_tiles of them, key_tile(0), key_tile(1), ...
 * (tile_begin, tile_begin + tile_step, ...). */
template <class Tr> struct tile {
    int split, b, heads, rows_per_head, hk, h0, m0, row_last, tile_begin, n_tiles, tile_step;
    bool partial;
    /* Whether a persistent block's tiles pack a KV head's group of query heads (pack_gqa): a decode
     * on one consumer, planned as a serving call (a dense one too, with every sequence full), the
     * only resident tile the planner packs (the launcher checks). The
     * (batch, head) pairs of its work numbers are then over KV heads: work_heads (heads_q in every
     * other kernel, which then reads no more than it did). */
    static __device__ __forceinline__ bool packed(const fa_kernel_params &p) {
        return Tr::kConsumers == 1 && Tr::kServing && p.pack_gqa;
    }
    static __device__ __forceinline__ int work_heads(const fa_kernel_params &p) {
        return Tr::kConsumers == 1 && Tr::kServing ? fa_persistent_heads(&p) : p.heads_q;
    }
    /* bnd: the sequence's counts and visibility offsets (the kernel parameters for a dense call,
     * its fa_seq for a serving call). */
    /* work: a persistent block's work number (fa_persistent_tile; p.persistent, no split), or -1:
     * the block's own tile. */
    template <class Bounds>
    __device__ __forceinline__ tile(const fa_kernel_params &p, const Bounds &bnd, int work = -1) {
        split = (int)blockIdx.x % p.num_splits;
        int m_block = p.num_m_blocks - 1 - (int)blockIdx.x / p.num_splits; /* heaviest tiles first */
        b = blockIdx.z;
        int head = blockIdx.y;
        if (work >= 0) {
            int32_t bh;
            const int hx = work_heads(p);
            fa_persistent_tile(&p, hx, work, &m_block, &bh);
            split = 0, b = bh / hx, head = bh - b * hx;
        } else if (p.sched_heads > 0) { /* heaviest first across a section of heads (no split, no pack_gqa) */
            int64_t bh;
            fa_sched_tile(&p, blockIdx.x + (int64_t)gridDim.x * (blockIdx.y + (int64_t)gridDim.y * blockIdx.z), &m_block, &bh);
            b = (int)(bh / p.heads_q), head = (int)(bh % p.heads_q);
        }
        heads = p.pack_gqa ? p.head_group : 1;
        rows_per_head = p.pack_gqa ? p.pack_rows : Tr::kBlockM;
        hk = p.pack_gqa ? head : head / p.head_group;
        h0 = p.pack_gqa ? hk * p.head_group : head;
        m0 = m_block * rows_per_head;
        row_last = min(m0 + rows_per_head, bnd.seqlen_q) - 1;
        partial = p.num_splits > 1;
        set_key_tiles(bnd, Tr::kPersistent ? 1 : p.num_splits); /* (persistent blocks never split) */
    }
    /* A persistent block's tile as its producer hands it over (take_tile, take_tile_record):
     * positions from m0 of head `head` of batch entry b, one split; nothing divided by a kernel
     * parameter (hk is only the producer's, and the compiler drops it where nothing reads it). With
     * pack_gqa (a single consumer's tile: a decode planned as a serving call) the tile holds the
     * head_group heads from `head`, pack_rows positions each. */
    template <class Bounds>
    __device__ __forceinline__ tile(const fa_kernel_params &p, const Bounds &bnd, int b_, int head, int m0_) {
        const bool pack = packed(p);
        split = 0, b = b_, hk = head / p.head_group, h0 = head, m0 = m0_;
        heads = pack ? p.head_group : 1, rows_per_head = pack ? p.pack_rows : Tr::kBlockM;
        row_last = min(m0 + rows_per_head, bnd.seqlen_q) - 1;
        partial = false;
        set_key_tiles(bnd, 1);
    }
    /* One past the last key any of the tile's rows can see. */
    template <class Bounds> __device__ __forceinline__ int key_end(const Bounds &bnd) const {
        return min(bnd.seqlen_k, row_last + bnd.key_hi_off + 1);
    }
    /* The key tiles any of the tile's rows can see, and split `split`'s share of them: every
     * num_splits-th from its own (split s of S takes the visible tiles s, s + S, s + 2 S, ...), so
     * that at any moment the splits of a KV head read neighbouring key tiles. Consecutive shares
     * (S tiles a split, one after another) had the splits read addresses a share apart (1 MB at a
     * batch-1 decode of 8k keys, 16 splits), and a bare read of that decode's K and V took 17.5 us
     * with the L2 flushed where the strided order took 17.0 (docs/performance.md v80). A split's
     * tiles still ascend, so that only its last can cross the keys' end. */
    template <class Bounds> __device__ __forceinline__ void set_key_tiles(const Bounds &bnd, int num_splits) {
        const int key_lo = max(0, m0 + bnd.key_lo_off);
        const int key_hi = key_end(bnd);
        const int tile_first = key_lo / Tr::kBlockN;
        const int tiles_all = key_hi > key_lo ? (key_hi + Tr::kBlockN - 1) / Tr::kBlockN - tile_first : 0;
        tile_step = num_splits;
        tile_begin = tile_first + split;
        n_tiles = split < tiles_all ? (tiles_all - split + num_splits - 1) / num_splits : 0;
    }
    /* The key tile number of this block's it-th tile. */
    __device__ __forceinline__ int key_tile(int it) const { return tile_begin + it * tile_step; }
    /* Where tile row r goes: false if it is padding (no such head or position). */
    template <class Bounds>
    __device__ __forceinline__ bool row_target(const Bounds &bnd, int r, int &head, int &pos) const {
        const int hg = r / rows_per_head;
        head = h0 + hg, pos = m0 + r % rows_per_head;
        return hg < heads && pos < bnd.seqlen_q;
    }
    /* Where row (head, pos) puts its LSE: this split's slot, the caller's LSE, or nowhere. A
     * ragged batch's LSE is [heads_q, total_q], its rows from lse_row0 (the sequence's first row;
     * -1: the dense [batch, heads_q, seqlen_q] layout). */
    __device__ __forceinline__ float *lse_slot(const fa_kernel_params &p, int head, int pos, int64_t lse_row0 = -1) const {
        const int64_t bhq = (int64_t)b * p.heads_q + head;
        if (partial) return p.lse_accum + (bhq * p.seqlen_q + pos) * p.num_splits + split;
        if (lse_row0 >= 0) return p.lse ? p.lse + (int64_t)head * p.total_q + lse_row0 + pos : nullptr;
        return p.lse ? p.lse + bhq * p.seqlen_q + pos : nullptr;
    }
};

/* A serving call's sequence, for the kernel below: its fa_seq, and for a dense call nothing (the
 * kernel parameters are the bounds). bounds() is what the block's code reads in both cases. */
template <bool kServing> struct seq_view {
    __device__ __forceinline__ explicit seq_view(const fa_kernel_params &, int = 0) {}
    __device__ __forceinline__ const fa_kernel_params &bounds(const fa_kernel_params &p) const { return p; }
    static constexpr int64_t q_row0() { return 0; }
    /* The LSE row offset for lse_slot: -1 selects the dense layout. */
    static constexpr int64_t lse_row0() { return -1; }
    /* Q's and O's batch coordinate in their tensor maps for batch entry b. */
    static __device__ __forceinline__ int map_batch(int b) { return b; }
};
template <> struct seq_view<true> {
    fa_seq s;
    bool packed_q;
    /* Batch entry b's sequence (a block a tile: its grid z). */
    __device__ __forceinline__ explicit seq_view(const fa_kernel_params &p, int b)
        : s(serving_seq(p, b)), packed_q(p.cu_seqlens_q != nullptr) {}
    /* A sequence handed over in a tile record (take_record). */
    __device__ __forceinline__ seq_view(const fa_kernel_params &p, const fa_seq &seq)
        : s(seq), packed_q(p.cu_seqlens_q != nullptr) {}
    __device__ __forceinline__ const fa_seq &bounds(const fa_kernel_params &) const { return s; }
    __device__ __forceinline__ int64_t q_row0() const { return s.q_row0; }
    __device__ __forceinline__ int64_t lse_row0() const { return packed_q ? s.q_row0 : -1; }
    /* (packed rows: one batch entry in the maps, the sequence's rows from q_row0) */
    __device__ __forceinline__ int map_batch(int b) const { return packed_q ? 0 : b; }
};

/* A persistent serving block's tile record, 32 bytes of shared memory (smem_layout::rec_slot): the
 * producer reads each tile's sequence from the device arrays (serving_seq: two or three dependent
 * global loads) and hands the consumers the tile's work number with the sequence's counts,
 * visibility offsets and first query row (what the consumers read of a fa_seq); work -1: no tile
 * left. One record at a time: the producer posts (rec_full) once every consumer thread has taken the
 * last one (rec_empty), which a consumer does as its tile starts, so the next record is usually
 * waiting when the tile ends. Tiles past their sequence's queries get no record. (A block with two
 * Q buffers has two records of another form: post_tile_record.) */
__device__ __forceinline__ void post_record(uint32_t rec, uint32_t rec_full, int work, const fa_seq &s) {
    asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(rec), "r"(work), "r"(s.seqlen_q), "r"(s.seqlen_k),
                 "r"(s.key_lo_off)
                 : "memory");
    asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(rec + 16), "r"(s.key_hi_off) : "memory");
    asm volatile("st.shared.b64 [%0], %1;\n" ::"r"(rec + 24), "l"(s.q_row0) : "memory");
    mbar_arrive(rec_full); /* (release: the consumers' wait acquires the record) */
}
/* The record's work number, and its sequence in s (the fields a producer alone reads are zero). */
__device__ __forceinline__ int take_record(uint32_t rec, fa_seq &s) {
    int work;
    asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(work), "=r"(s.seqlen_q), "=r"(s.seqlen_k), "=r"(s.key_lo_off)
                 : "r"(rec)
                 : "memory");
    asm volatile("ld.shared.b32 %0, [%1];\n" : "=r"(s.key_hi_off) : "r"(rec + 16) : "memory");
    asm volatile("ld.shared.b64 %0, [%1];\n" : "=l"(s.q_row0) : "r"(rec + 24) : "memory");
    s.k_row0 = 0, s.kv_b = 0, s.kv_valid = true, s.page0 = 0, s.pages = 0;
    return work;
}

/* The 64-byte tile record of a serving block with two (Tr::kTwoRecords), posted by its record warp
 * for the consumers and for the warp that loads K and V: the tile's batch entry, head and first
 * query position (b -1: no tile left), worked out from its work number by the record warp, so the
 * others divide nothing per tile; the sequence's counts, visibility offsets and first query row
 * (the consumers read these, the first 40 bytes), then what the K/V loads read of it. */
__device__ __forceinline__ void post_tile_record(uint32_t rec, uint32_t rec_full, int b, int head, int m0, const fa_seq &s) {
    asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(rec), "r"(b), "r"(head), "r"(m0), "r"(s.seqlen_q)
                 : "memory");
    asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(rec + 16), "r"(s.seqlen_k), "r"(s.key_lo_off),
                 "r"(s.key_hi_off), "r"(s.kv_b)
                 : "memory");
    asm volatile("st.shared.v2.b64 [%0], {%1, %2};\n" ::"r"(rec + 32), "l"(s.q_row0), "l"(s.k_row0) : "memory");
    asm volatile("st.shared.b64 [%0], %1;\n" ::"r"(rec + 48), "l"(s.page0) : "memory");
    asm volatile("st.shared.v2.b32 [%0], {%1, %2};\n" ::"r"(rec + 56), "r"(s.pages), "r"((int)s.kv_valid) : "memory");
    mbar_arrive(rec_full); /* (release: the readers' wait acquires the record) */
}
/* The record's tile (returns b) and sequence; kv: the fields the K/V loads read too (else zero). */
__device__ __forceinline__ int take_tile_record(uint32_t rec, fa_seq &s, int &head, int &m0, bool kv) {
    int b;
    asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(b), "=r"(head), "=r"(m0), "=r"(s.seqlen_q)
                 : "r"(rec)
                 : "memory");
    asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(s.seqlen_k), "=r"(s.key_lo_off), "=r"(s.key_hi_off), "=r"(s.kv_b)
                 : "r"(rec + 16)
                 : "memory");
    asm volatile("ld.shared.b64 %0, [%1];\n" : "=l"(s.q_row0) : "r"(rec + 32) : "memory");
    s.k_row0 = 0, s.kv_valid = true, s.page0 = 0, s.pages = 0;
    if (kv) {
        int valid;
        asm volatile("ld.shared.b64 %0, [%1];\n" : "=l"(s.k_row0) : "r"(rec + 40) : "memory");
        asm volatile("ld.shared.b64 %0, [%1];\n" : "=l"(s.page0) : "r"(rec + 48) : "memory");
        asm volatile("ld.shared.v2.b32 {%0, %1}, [%2];\n" : "=r"(s.pages), "=r"(valid) : "r"(rec + 56) : "memory");
        s.kv_valid = valid != 0;
    }
    return b;
}

/* A persistent dense block's tile record (Tr::kTwoQ; its tiles are known ahead, unlike a serving
 * block's): tile n's batch entry, head, first query position and whether the block has another tile
 * after it, 16 bytes in slot n % 2 of smem_layout::rec. The producer writes it before it issues the
 * tile's Q, whose barrier (bar_q) publishes it; the consumer threads read it once that Q has landed,
 * so they divide nothing by kernel parameters per tile. A slot is written again two tiles later,
 * after every consumer warp has begun the tile in between (empty_q). */
__device__ __forceinline__ void post_tile(uint32_t slot, int b, int head, int m0, int more) {
    asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(slot), "r"(b), "r"(head), "r"(m0), "r"(more) : "memory");
}
__device__ __forceinline__ void take_tile(uint32_t slot, int &b, int &head, int &m0, int &more) {
    asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n" : "=r"(b), "=r"(head), "=r"(m0), "=r"(more) : "r"(slot) : "memory");
}

/* No row sees a key in this split: O = 0, LSE = -inf (a split writes only its LSE). Tile rows
 * [row0, row0 + rows), by `threads` threads of which this is number `tid`. */
template <class Tr, class Seq>
__device__ __forceinline__ void store_empty(const fa_kernel_params &p, const tile<Tr> &tl, const Seq &sq, int tid,
                                            int threads = Tr::kThreads, int row0 = 0, int rows = Tr::kBlockM) {
    const auto &bnd = sq.bounds(p);
    for (int i = tid; i < rows * Tr::kChunks; i += threads) {
        const int r = row0 + i / Tr::kChunks, ch = i % Tr::kChunks;
        int head, pos;
        if (!tl.partial && tl.row_target(bnd, r, head, pos) && ch * 8 < p.head_dim)
            *reinterpret_cast<uint4 *>((typename Tr::T *)p.o + tl.b * p.o_batch_stride + head * p.o_head_stride +
                                       ((int64_t)pos + sq.q_row0()) * p.o_seq_stride + ch * 8) = make_uint4(0, 0, 0, 0);
    }
    for (int r = row0 + tid; r < row0 + rows; r += threads) {
        int head, pos;
        if (tl.row_target(bnd, r, head, pos))
            if (float *l = tl.lse_slot(p, head, pos, sq.lse_row0())) *l = -INFINITY;
    }
}

/* The stage of the g-th K (or V) tile a block loads (counted across a persistent block's tiles):
 * g % 2, once the consumers have handed back its use two loads earlier (the "empty" barrier of
 * that stage). Called by the producers. */
__device__ __forceinline__ uint32_t stage_free(uint32_t empty, int g) {
    if (g >= 2) mbar_wait(empty + 8 * (g & 1), ((g - 2) >> 1) & 1);
    return (uint32_t)(g & 1);
}

/* The TMA loads of a tile's Q (`rows` rows: positions from m0 of heads from h0, of batch entry b)
 * into the buffer at dst, completing on bar_q. */
template <class Tr>
__device__ __forceinline__ void produce_q(int m0, int h0, int b, int rows, uint32_t dst, uint32_t bar_q,
                                          const CUtensorMap *tm_q) {
    constexpr int kCB = Tr::kChunks / 8; /* 64-column regions of a tile */
    mbar_expect_tx(bar_q, (uint32_t)(kCB * 128 * rows));
#pragma unroll
    for (int cb = 0; cb < kCB; ++cb) tma_load(dst + cb * Tr::kBlockM * 128, tm_q, cb * 64, m0, h0, b, bar_q);
}
template <class Tr>
__device__ __forceinline__ void produce_q(const tile<Tr> &tl, uint32_t dst, uint32_t bar_q, const CUtensorMap *tm_q) {
    produce_q<Tr>(tl.m0, tl.h0, tl.b, tl.rows_per_head * tl.heads, dst, bar_q, tm_q);
}
/* (Tr::kSplitQ) Consumer c's 64 rows of the tile's Q (its rows from m0 of head h0 of map batch
 * entry b), once that consumer's warps are done with the last tile's: every calling thread waits,
 * `issue` issues. And the tile's Q boxes into the L2 ahead of those loads (a later tile's Q waits
 * for the last one's stores, some two key tiles: the load then reads the L2, not DRAM). */
template <class Tr>
__device__ __forceinline__ void produce_q_rows(const smem_layout<Tr> &sm, int c, int nth, int m0, int h0, int b,
                                               const CUtensorMap *tm_q, bool issue = true) {
    if (nth > 0) mbar_wait(sm.q_empty(c), (nth - 1) & 1);
    if (issue) produce_q<Tr>(m0 + 64 * c, h0, b, 64, sm.q + (uint32_t)c * 64 * 128, sm.q_full(c), tm_q);
}
template <class Tr>
__device__ __forceinline__ void prefetch_q_rows(int m0, int h0, int b, const CUtensorMap *tm_q) {
#pragma unroll
    for (int c = 0; c < Tr::kConsumers; ++c)
#pragma unroll
        for (int cb = 0; cb < Tr::kChunks / 8; ++cb) tma_prefetch_l2(tm_q, cb * 64, m0 + 64 * c, h0, b);
}

/* The producer (one thread) of one tile: TMA loads of Q once, then of K_j and V_j into two stages
 * each as the consumers hand the stages back. A persistent block's tiles follow one another: `nth`
 * is the tile's number in the block, `kv0` how many K (and V) tiles the block loaded before it (the
 * stages and their phases run on across tiles). With one Q buffer, the tile's Q waits until every
 * consumer warp is done with the last one's (Tr::kSplitQ: each consumer's rows until that
 * consumer's warps are, the first's after K_0, the others' after K_1 and V_0); with two
 * (Tr::kTwoQ), the tile's Q was loaded during the last tile, and `next_q` loads the next tile's,
 * once every consumer warp has begun this one (after this tile's V_0: the stages this tile starts
 * with come first). once: K and V carry an evict-first L2 policy (p.kv_evict_first: a split decode
 * whose every K/V tile is read by one block, once; the planner's fa_sm90_kv_evict_first). */
template <class Tr, class NextQ>
__device__ __forceinline__ void produce(const tile<Tr> &tl, const smem_layout<Tr> &sm, const CUtensorMap *tm_q,
                                        const CUtensorMap *tm_k, const CUtensorMap *tm_v, int nth, int kv0,
                                        bool once, NextQ &&next_q) {
    constexpr int kCB = Tr::kChunks / 8; /* 64-column regions of a tile */
    const uint64_t pol = once ? l2_evict_first_policy() : 0;
    auto load_kv = [&](const CUtensorMap *map, uint32_t dst, uint32_t full, int tile) {
        mbar_expect_tx(full, Tr::kKVBytes);
        const int n0 = tl.key_tile(tile) * Tr::kBlockN;
        with_l2_hint(once, [&](auto hint) {
#pragma unroll
            for (int cb = 0; cb < kCB; ++cb)
                tma_load_policy<decltype(hint)::value>(dst + cb * Tr::kBlockN * 128, map, cb * 64, n0, tl.hk, tl.b, full, pol);
        });
    };
    auto q_rows = [&](int c) { produce_q_rows(sm, c, nth, tl.m0, tl.h0, tl.b, tm_q); };
    if (Tr::kSplitQ && nth > 0) prefetch_q_rows<Tr>(tl.m0, tl.h0, tl.b, tm_q);
    if (nth == 0) {
        if (Tr::kSplitQ) {
#pragma unroll
            for (int c = 0; c < Tr::kConsumers; ++c) q_rows(c);
        } else {
            produce_q(tl, sm.q_buf(0), sm.bar_q, tm_q);
        }
    }
    uint32_t st = stage_free(sm.empty_k, kv0);
    load_kv(tm_k, sm.k + st * Tr::kKVBytes, sm.full_k + 8 * st, 0);
    if (!Tr::kTwoQ && nth > 0) { /* the last tile's K is in flight; Q once the consumers are done with the last one's */
        if (Tr::kSplitQ) {
            q_rows(0);
        } else {
            mbar_wait(sm.empty_q, (nth - 1) & 1);
            produce_q(tl, sm.q, sm.bar_q, tm_q);
        }
    }
    /* K_{j+1} once S_{j-1} is done with its stage; V_j once P V_{j-2} is done with its. */
    auto step = [&](int j) {
        if (j + 1 < tl.n_tiles) {
            st = stage_free(sm.empty_k, kv0 + (j + 1));
            load_kv(tm_k, sm.k + st * Tr::kKVBytes, sm.full_k + 8 * st, j + 1);
        }
        st = stage_free(sm.empty_v, kv0 + j);
        load_kv(tm_v, sm.v + st * Tr::kKVBytes, sm.full_v + 8 * st, j);
    };
    step(0); /* (a tile with no key tile never reaches its producer) */
    if (Tr::kSplitQ && nth > 0) /* the other consumers' rows after the first's K_1 and V_0: it may run ahead */
#pragma unroll
        for (int c = 1; c < Tr::kConsumers; ++c) q_rows(c);
    if (Tr::kTwoQ) next_q();
    for (int j = 1; j < tl.n_tiles; ++j) step(j);
}

/* The rows of a serving call's K/V tiles whose page size the tensor-map boxes cannot tile (1, 19,
 * ...), copied with cp.async by the producer warpgroup's four warps into the same swizzled layout
 * the tensor memory accelerator writes (row r's 16-byte chunk c at (c ^ r % 8) * 16 of its 128-byte
 * row), key j of the sequence at row j % page_size of page table[j / page_size]; rows past the
 * sequence's keys and pages outside the pool are zero-filled. Warp w copies tile rows
 * [w kRowsW, (w + 1) kRowsW): lane l looks up the pages of rows w kRowsW + l (and + 32, where a
 * warp has more than 32 rows: head dim 64's 192-key decode tile) a tile ahead of their use
 * (page_of: the table's latency hides behind the copies in between) and passes each row's
 * address, once, to the lanes that copy the row (a row's 2 x head_dim bytes are contiguous in any
 * page layout). A copy instruction covers kRPI = 32 / kLPR rows, kLPR lanes a row: lane l copies
 * chunks l % kLPR + kLPR m (m = 0 .. kPerRow - 1, one instruction each) of rows
 * w kRowsW + l / kLPR + kRPI i. Eight lanes a row (4 rows x 128 bytes an instruction) in the
 * single-consumer (decode) kernels, four (8 rows x 64 bytes, half the shuffles a copy) beside two
 * or three consumers: four made prefill over pages of one 5-12% faster but decode over shuffled
 * pages 0.77-0.92x as fast, with or without an L2 prefetch-size hint; two and sixteen were slower
 * still (v34, v35). Each copying thread's arrival on the stage's full barrier
 * (one per thread: 128 arrivals) takes place when its copies have landed
 * (cp.async.mbarrier.arrive): the copying warps never wait for their own copies, only for free
 * stages, and the consumers fence the proxies after their wait (the copies are generic-proxy
 * writes). sq and tl: the tile's sequence and place, which the caller keeps. */
template <class Tr> struct row_gather {
    using T = typename Tr::T;
    static constexpr int kLPR = Tr::kServingProducerRegs >= 128 ? 8 : 4, kRPI = 32 / kLPR;
    static constexpr int kRowsW = Tr::kBlockN / 4, kPerRow = Tr::kChunks / kLPR;
    static constexpr int kLook = (kRowsW + 31) / 32;
    static_assert(Tr::kChunks % 8 == 0 && Tr::kBlockN % 4 == 0 && kLook <= 2,
                  "whole 128-byte regions, whole warps' rows, at most two page lookups per lane");
    struct pages {
        int at[kLook];
    };
    const fa_kernel_params &p;
    const seq_view<true> &sq;
    const tile<Tr> &tl;
    const int32_t *table;
    int rows_valid, w, lane;
    /* w: the copying warp (0-3). */
    __device__ __forceinline__ row_gather(const fa_kernel_params &p_, const seq_view<true> &sq_, const tile<Tr> &tl_, int w_,
                                          int lane_)
        : p(p_), sq(sq_), tl(tl_), table(p_.block_table + sq_.s.page0), rows_valid(sq_.s.kv_valid ? sq_.s.seqlen_k : 0),
          w(w_), lane(lane_) {}
    /* The pages of the rows this lane looks up in `tile` (-1: zeros), as read from the table: the
     * loads are issued a tile ahead of their use, and nothing reads their values (a page outside the
     * pool is caught in load) until then. */
    __device__ __forceinline__ pages page_of(int tile) const {
        pages r;
#pragma unroll
        for (int l = 0; l < kLook; ++l) {
            const int rw = lane + 32 * l, j = tl.key_tile(tile) * Tr::kBlockN + w * kRowsW + rw;
            const int pi = j / p.page_size;
            r.at[l] = tile < tl.n_tiles && rw < kRowsW && j < rows_valid && pi < sq.s.pages ? table[pi] : -1;
        }
        return r;
    }
    /* This thread's copies of `tile`'s rows of the tensor at base into the stage at dst, then its
     * arrival on `full` once they land (kHint: each copy carries the L2 policy pol). */
    template <bool kHint = false>
    __device__ __forceinline__ void load(const T *base, int64_t page_stride, int64_t row_stride, uint32_t dst,
                                         uint32_t full, int tile, const pages &pg, uint64_t pol = 0) const {
        /* Per looked-up row: the address of its first element (base where the row reads zeros) and
         * whether it reads any, one bit a lane. */
        const T *row[kLook];
        uint32_t ok[kLook];
#pragma unroll
        for (int l = 0; l < kLook; ++l) {
            const int j = tl.key_tile(tile) * Tr::kBlockN + w * kRowsW + lane + 32 * l;
            const int page = pg.at[l];
            const bool valid = page >= 0 && page < p.num_pages;
            row[l] = valid ? base + ((int64_t)page * page_stride + (int64_t)(j % p.page_size) * row_stride) : base;
            ok[l] = __ballot_sync(0xffffffffu, valid);
        }
        /* Row r's chunk c lands at r * 128 + (c % 8 ^ r % 8) * 16 of region c / 8 (kBlockN * 128
         * bytes each; dst is 1024-byte aligned). This lane's chunk m is h + kLPR m: c % 8 is h with
         * bit 2 set for odd m when kLPR is 4, so its place is a ^ ((kLPR m % 8) * 16) + region. Its
         * rows are r0 + kRPI i: with kRPI 8 every row has r0's r % 8 (a moves 1024 bytes a row),
         * with kRPI 4 the rows' r % 8 flip bit 2 in turn (a moves 512 bytes and bit 6 flips). */
        const int q = lane / kLPR, h = lane % kLPR; /* this lane's first row within the warp's, its first chunk */
        const uint32_t r0 = (uint32_t)(w * kRowsW + q);
        uint32_t a = dst + r0 * 128 + ((((uint32_t)h) ^ (r0 & 7u)) << 4);
        const int left = p.head_dim - h * 8; /* chunk m is inside the head dim when kLPR 8 m < left */
        /* Rows q + kRPI i of the warp's (those below kRowsW), looked up by lane (kRPI i) % 32 + q in
         * slot kRPI i / 32 (q < kRPI): a loop a slot, rolled in every kernel (beside two consumers
         * the producer keeps 24 registers; unrolled, the shuffles were hoisted and spilled). */
        constexpr int kIters = (kRowsW + kRPI - 1) / kRPI, kPerSlot = 32 / kRPI;
#pragma unroll
        for (int l = 0; l < kLook; ++l) {
            const int n = kIters - l * kPerSlot < kPerSlot ? kIters - l * kPerSlot : kPerSlot;
#pragma unroll 1
            for (int i = 0; i < n; ++i) {
                const int from = q + kRPI * i;
                const T *rp = (const T *)__shfl_sync(0xffffffffu, (unsigned long long)row[l], from) + h * 8;
                const bool row_ok = (ok[l] >> from) & 1u;
                /* (where kRowsW is not a multiple of kRPI, the last row is past the warp's for some
                 * lanes: they shuffle with the others and copy nothing) */
                if (kRowsW % kRPI == 0 || 32 * l + from < kRowsW)
#pragma unroll
                    for (int m = 0; m < kPerRow; ++m) {
                        const uint32_t at = (a ^ (uint32_t)((kLPR * m % 8) * 16)) + (uint32_t)((kLPR * m / 8) * Tr::kBlockN * 128);
                        const bool v = row_ok && 8 * kLPR * m < left;
                        cp_async_16_policy<kHint>(at, rp + kLPR * 8 * m, v, pol);
                    }
                a = kRPI == 8 ? a + 1024u : (a + 512u) ^ 64u;
            }
        }
        cp_async_mbar_arrive(full);
    }
};

/* The producer of a block a tile whose pages are gathered (row_gather): the whole producer
 * warpgroup copies each K/V tile, Q still comes by TMA. ptid: the thread's index in the producer
 * warpgroup. */
template <class Tr>
__device__ __forceinline__ void produce_gathered(const fa_kernel_params &p, const seq_view<true> &sq, const tile<Tr> &tl,
                                                 const smem_layout<Tr> &sm, const CUtensorMap *tm_q, int ptid) {
    using T = typename Tr::T;
    using G = row_gather<Tr>;
    constexpr int kCB = Tr::kChunks / 8;
    if (ptid == 0) {
        mbar_expect_tx(sm.bar_q, (uint32_t)(kCB * 128 * tl.rows_per_head * tl.heads));
        const int qb = sq.packed_q ? 0 : tl.b, q0 = (int)sq.s.q_row0 + tl.m0;
#pragma unroll
        for (int cb = 0; cb < kCB; ++cb) tma_load(sm.q + cb * Tr::kBlockM * 128, tm_q, cb * 64, q0, tl.h0, qb, sm.bar_q);
    }
    const G g(p, sq, tl, ptid / 32, ptid % 32);
    const T *k = (const T *)p.k + (int64_t)tl.hk * p.k_head_stride, *v = (const T *)p.v + (int64_t)tl.hk * p.v_head_stride;
    /* (p.kv_evict_first: a split decode's copies carry the evict-first policy, as its TMA loads do) */
    auto copy_tiles = [&](auto hint) {
        constexpr bool kHint = decltype(hint)::value;
        const uint64_t pol = kHint ? l2_evict_first_policy() : 0;
        typename G::pages page_j = g.page_of(0), page_next = g.page_of(1); /* tile j's (V_j), tile j + 1's (K_{j+1}) */
        g.template load<kHint>(k, p.k_batch_stride, p.k_seq_stride, sm.k, sm.full_k, 0, page_j, pol);
        for (int j = 0; j < tl.n_tiles; ++j) {
            const typename G::pages page_after = g.page_of(j + 2); /* read now, used next iteration */
            if (j + 1 < tl.n_tiles) {
                const int st = (j + 1) & 1;
                if (j + 1 >= 2) mbar_wait(sm.empty_k + 8 * st, ((j - 1) >> 1) & 1);
                g.template load<kHint>(k, p.k_batch_stride, p.k_seq_stride, sm.k + st * Tr::kKVBytes, sm.full_k + 8 * st,
                                       j + 1, page_next, pol);
            }
            const int st = j & 1;
            if (j >= 2) mbar_wait(sm.empty_v + 8 * st, ((j - 2) >> 1) & 1);
            g.template load<kHint>(v, p.v_batch_stride, p.v_seq_stride, sm.v + st * Tr::kKVBytes, sm.full_v + 8 * st, j,
                                   page_j, pol);
            page_j = page_next, page_next = page_after;
        }
    };
    with_l2_hint(p.kv_evict_first != 0, copy_tiles);
    /* No wait here: the thread's last arrivals take place when its copies land, and the block lives
     * until the consumers have seen them. */
}

/* A serving tile's Q: the sequence's rows from its first (a packed Q: one batch entry in the map). */
template <class Tr>
__device__ __forceinline__ void produce_serving_q(const seq_view<true> &sq, const tile<Tr> &tl, uint32_t dst,
                                                  uint32_t bar_q, const CUtensorMap *tm_q) {
    produce_q<Tr>((int)sq.s.q_row0 + tl.m0, tl.h0, sq.packed_q ? 0 : tl.b, tl.rows_per_head * tl.heads, dst, bar_q, tm_q);
}

/* A resident block's row_gather (copying warp w), or nothing (G = int) where pages come in boxes. */
template <class G, class Tr>
__device__ __forceinline__ G make_gather(const fa_kernel_params &p, const seq_view<true> &sq, const tile<Tr> &tl, int w,
                                         int lane) {
    if constexpr (std::is_same_v<G, int>) return 0;
    else return G(p, sq, tl, w, lane);
}

/* The producer of a serving call (the producer warpgroup's first warp; lane 0 issues): the same
 * schedule as produce, with the sequence's rows. Packed Q or K/V: the tensor map has one batch entry
 * and the rows start at the sequence's first (rows past the sequence belong to the next one: masked,
 * never stored; past the tensor: zeros). A cache: entry kv_b (outside the cache: -1, zeros). Pages:
 * a tile is kBlockN / R boxes of R = gcd(page_size, kBlockN) keys (the planner allows the page
 * sizes for which R is a multiple of the 8-row swizzle atom); box i holds keys n0 + i R onwards, of
 * page table[(n0 + i R) / page_size] from row (n0 + i R) % page_size, one copy a 64-column region,
 * or with full-width boxes (kp.kv_page_groups) one copy of every column, the tile then
 * row-group-major (kv_grouped in the kernel). Lane i reads box i's page
 * number one tile ahead (so each tile costs the table's latency once, hidden behind the wait for
 * a free stage) and issues box i. A box past the sequence's keys, or a page outside the pool, reads
 * zeros (an out-of-bounds coordinate); the mask hides those keys. A persistent block's tiles follow
 * one another (nth, kv0: as in produce). With one Q buffer, the tile's Q loads after its first K,
 * once every consumer warp is done with the last one's (Tr::kSplitQ: each consumer's rows once its
 * warps are, as in produce); with two (Tr::kTwoQ), the block's record warp loads it
 * (produce_serving_q, in the kernel). kGather: a resident block's gathered pages, copied by the
 * producer warpgroup's four warps (gw: this thread's warp, lane: its lane; row_gather) in place
 * of the boxes. */
template <class Tr, bool kGather>
__device__ __forceinline__ void produce_serving_tile(const fa_kernel_params &p, const seq_view<true> &sq, const tile<Tr> &tl,
                                                     const smem_layout<Tr> &sm, const CUtensorMap *tm_q,
                                                     const CUtensorMap *tm_k, const CUtensorMap *tm_v, int lane, int nth,
                                                     int kv0, int gw) {
    using T = typename Tr::T;
    constexpr int kCB = Tr::kChunks / 8; /* 64-column regions of a tile */
    const bool leader = lane == 0;
    auto load_q = [&] {
        if (leader) produce_serving_q(sq, tl, sm.q, sm.bar_q, tm_q);
    };
    const int q0 = (int)sq.s.q_row0 + tl.m0, qb = sq.packed_q ? 0 : tl.b;
    auto q_rows = [&](int c) { produce_q_rows(sm, c, nth, q0, tl.h0, qb, tm_q, leader); };
    if (Tr::kSplitQ && nth > 0 && leader) prefetch_q_rows<Tr>(q0, tl.h0, qb, tm_q);
    if (!Tr::kTwoQ && nth == 0) {
        if (Tr::kSplitQ) {
#pragma unroll
            for (int c = 0; c < Tr::kConsumers; ++c) q_rows(c);
        } else {
            load_q();
        }
    }
    const bool paged = p.block_table != nullptr;
    const int box = paged ? fa_sm90_page_box(p.page_size, Tr::kBlockN) : Tr::kBlockN, boxes = Tr::kBlockN / box;
    const int32_t *table = paged ? p.block_table + sq.s.page0 : nullptr;
    const int kv_b = p.cu_seqlens_k != nullptr ? 0 : (sq.s.kv_valid ? sq.s.kv_b : -1);
    auto box_page_of = [&](int tile) -> int { /* this lane's box of `tile` */
        const int n0 = tl.key_tile(tile) * Tr::kBlockN;
        const int entry = (n0 + lane * box) / p.page_size;
        if (!paged || tile >= tl.n_tiles || lane >= boxes || n0 + lane * box >= sq.s.seqlen_k || !sq.s.kv_valid ||
            entry >= sq.s.pages)
            return -1;
        return table[entry];
    };
    const bool once = p.kv_evict_first != 0;
    const uint64_t pol = once ? l2_evict_first_policy() : 0;
    auto load_kv = [&](const CUtensorMap *map, uint32_t dst, uint32_t full, int tile, int my_page) {
        const int n0 = tl.key_tile(tile) * Tr::kBlockN;
        if (leader) mbar_expect_tx(full, Tr::kKVBytes);
        if (!paged) {
            if (leader) {
                const int k0 = (int)sq.s.k_row0 + n0;
                with_l2_hint(once, [&](auto hint) {
#pragma unroll
                    for (int cb = 0; cb < kCB; ++cb)
                        tma_load_policy<decltype(hint)::value>(dst + cb * Tr::kBlockN * 128, map, cb * 64, k0, tl.hk, kv_b, full, pol);
                });
            }
            return;
        }
        /* Lane i issues box i (after the leader has announced the tile's bytes). */
        const int row0 = (n0 + lane * box) % p.page_size;
        __syncwarp();
        if (kCB > 1 && p.kv_page_groups > 0) {
            /* one full-width box: its box / 8 groups of 8 rows x every region; a page outside the
             * pool (or none: -1) as a negative group, which reads zeros */
            const int g = (unsigned)my_page < (unsigned)p.num_pages ? my_page * p.kv_page_groups + row0 / 8 : -1;
            if (lane < boxes)
                with_l2_hint(once, [&](auto hint) {
                    tma_load_5d_policy<decltype(hint)::value>(dst + lane * box * kCB * 128, map, 0, 0, 0, g, tl.hk, full, pol);
                });
            return;
        }
        if (lane < boxes)
            with_l2_hint(once, [&](auto hint) {
#pragma unroll
                for (int cb = 0; cb < kCB; ++cb)
                    tma_load_policy<decltype(hint)::value>(dst + cb * Tr::kBlockN * 128 + lane * box * 128, map, cb * 64, row0,
                                                           tl.hk, my_page, full, pol);
            });
    };
    /* Gathered pages: the rows' pages a tile ahead, and copies in place of the boxes. */
    using G = std::conditional_t<kGather, row_gather<Tr>, int>;
    const G g = make_gather<G>(p, sq, tl, gw, lane);
    const T *k_rows = (const T *)p.k + (int64_t)tl.hk * p.k_head_stride, *v_rows = (const T *)p.v + (int64_t)tl.hk * p.v_head_stride;
    auto page_of = [&](int tile) {
        if constexpr (kGather) return g.page_of(tile);
        else return box_page_of(tile);
    };
    auto load = [&](bool is_k, uint32_t dst, uint32_t full, int tile, const auto &pg) {
        if constexpr (kGather) {
            if (is_k) g.load(k_rows, p.k_batch_stride, p.k_seq_stride, dst, full, tile, pg);
            else g.load(v_rows, p.v_batch_stride, p.v_seq_stride, dst, full, tile, pg);
        } else {
            load_kv(is_k ? tm_k : tm_v, dst, full, tile, pg);
        }
    };
    auto page_j = page_of(0), page_next = page_of(1); /* tile j's pages (for V_j), tile j + 1's (for K_{j+1}) */
    uint32_t st = stage_free(sm.empty_k, kv0);
    load(true, sm.k + st * Tr::kKVBytes, sm.full_k + 8 * st, 0, page_j);
    if (!Tr::kTwoQ && nth > 0) { /* the last tile's K is in flight; Q once the consumers are done with the last one's */
        if (Tr::kSplitQ) {
            q_rows(0);
        } else {
            mbar_wait(sm.empty_q, (nth - 1) & 1);
            load_q();
        }
    }
    for (int j = 0; j < tl.n_tiles; ++j) {
        const auto page_after = page_of(j + 2); /* read now, used next iteration */
        if (j + 1 < tl.n_tiles) {
            st = stage_free(sm.empty_k, kv0 + (j + 1));
            load(true, sm.k + st * Tr::kKVBytes, sm.full_k + 8 * st, j + 1, page_next);
        }
        st = stage_free(sm.empty_v, kv0 + j);
        load(false, sm.v + st * Tr::kKVBytes, sm.full_v + 8 * st, j, page_j);
        page_j = page_next, page_next = page_after;
        if (Tr::kSplitQ && nth > 0 && j == 0) /* the other consumers' rows after the first's K_1 and V_0 */
#pragma unroll
            for (int c = 1; c < Tr::kConsumers; ++c) q_rows(c);
    }
}

/* A serving tile's producer: a block a tile's gathered pages take the whole warpgroup
 * (produce_gathered; lane: the thread's index in it); boxes of pages, packed or cached K/V take one
 * warp, lane 0 issuing. (A resident block's gathered pages: produce_serving_tile, in the kernel.) */
template <class Tr>
__device__ __forceinline__ void produce_serving(const fa_kernel_params &p, const seq_view<true> &sq, const tile<Tr> &tl,
                                                const smem_layout<Tr> &sm, const CUtensorMap *tm_q,
                                                const CUtensorMap *tm_k, const CUtensorMap *tm_v, int lane,
                                                int nth = 0, int kv0 = 0) {
    if constexpr (!Tr::kPersistent && Tr::kMayGather) { /* (the planner keeps gathered pages off other resident blocks; the launcher checks) */
        if (gathers_pages<Tr>(p)) {
            produce_gathered(p, sq, tl, sm, tm_q, lane);
            return;
        }
    }
    produce_serving_tile<Tr, false>(p, sq, tl, sm, tm_q, tm_k, tm_v, lane, nth, kv0, 0);
}

/* The rows from `valid` on of a serving call's V tile at `stage` (a tile that crosses the end of
 * the sequence's keys) become zeros, the consumers sharing the rows (consumer c: rows valid + c,
 * valid + c + C, ...); every consumer thread waits until all are. TMA loads a tile's rows as they
 * are: a cache's rows past the sequence's count up to its capacity, a page's rows past the last
 * key, packed rows of whatever follows (a box past the tensor or the pool alone reads zeros). Their
 * scores are masked, so each probability there is 0, but 0 x NaN is NaN: freshly allocated cache
 * memory may hold NaNs, and P V must not meet them. (Gathered pages zero-fill those rows.) */
template <class Tr>
__device__ __forceinline__ void clear_rows_past(uint32_t stage, int valid, int c, int ctid, bool grouped) {
    if (valid >= Tr::kBlockN) return; /* (the same for every consumer thread: the barrier below is taken by all or none) */
    constexpr int kCB = Tr::kChunks / 8;
    /* a row is 128 bytes in each 64-column region: 8 chunks of 16, zeroed whole (the swizzle only
     * permutes a row's chunks); region-major, or row-group-major (`grouped`: full-width page boxes) */
    const int mine = (Tr::kBlockN - valid - c + Tr::kConsumers - 1) / Tr::kConsumers; /* (>= 0: valid >= 1, c < C) */
#pragma unroll 1
    for (int i = ctid; i < mine * 8 * kCB; i += kWarpgroupThreads) {
        const int row = valid + c + (i / (8 * kCB)) * Tr::kConsumers, cb = (i / 8) % kCB, ch = i % 8;
        const int at = grouped ? ((row / 8) * kCB + cb) * 8 + row % 8 : cb * Tr::kBlockN + row; /* in 128-byte rows */
        asm volatile("st.shared.v4.b32 [%0], {%1, %1, %1, %1};\n" ::"r"(stage + (uint32_t)at * 128 + ch * 16), "r"(0)
                     : "memory");
    }
    fence_proxy_async_shared(); /* the zeros, before the tensor cores read the stage */
    named_sync(cleared_barrier(Tr::kConsumers), kWarpgroupThreads * Tr::kConsumers);
}

/* a when kFirst, else b (two arrays of different types, chosen at compile time). */
template <bool kFirst, class A, class B> __device__ __forceinline__ auto &pick_ref(A &a, B &b) {
    if constexpr (kFirst) return a;
    else return b;
}

/* Split epilogue: this split's normalised O, fp32, straight from the registers into o_accum, where a
 * row's splits sit side by side ([row][split](head_dim): fa_kernel_params.o_accum). */
template <class Tr, int kON>
__device__ __forceinline__ void store_split_partial(const fa_kernel_params &p, const tile<Tr> &tl, const float (&o)[kON],
                                                    const float (&inv_r)[2], const bool (&valid_r)[2],
                                                    const int (&head_r)[2], const int (&pos_r)[2], int t) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        if (!valid_r[r]) continue;
        float *dst = p.o_accum + ((((int64_t)tl.b * p.heads_q + head_r[r]) * p.seqlen_q + pos_r[r]) * p.num_splits +
                                  tl.split) * p.head_dim;
#pragma unroll
        for (int j = 0; j < kON / 4; ++j)
            if (8 * j + 2 * t < p.head_dim) /* head_dim is a multiple of 8: both or neither */
                *reinterpret_cast<float2 *>(dst + 8 * j + 2 * t) =
                    make_float2(o[4 * j + 2 * r] * inv_r[r], o[4 * j + 2 * r + 1] * inv_r[r]);
    }
}

/* The tiles of a resident serving block whose Q is ragged (cu_seqlens_q), walked by the warp that
 * posts its tile records (all 32 lanes; the record warp, or the one producer warp that also loads):
 * the tiles of each sequence's own query count rather than of the capacity, so a
 * block skips no tile past a sequence's queries and a causal pair is of one sequence's tiles. The
 * order is persistent's (fa_persistent_works): kind 1, sequence after sequence, each sequence's tiles
 * query tile fastest, then head; kind 2, first every sequence's units (head h's pair of query tiles
 * m - 1 - j, the heavier, then j, for m = the sequence's query tiles), then the middle tiles of the
 * sequences with m odd. The sequences are taken 32 at a time (one load of cu_seqlens_q per lane), and
 * within those 32 the one with the most query tiles first (a stable sort: equal ones in batch order),
 * so that the heaviest units come first. Units are dealt out in rounds of G = gridDim.x, in turn
 * forwards and backwards: in round r block i takes unit r G + i (r even) or r G + G - 1 - i (r odd);
 * the middle tiles continue the same rounds after the last unit, so the first of them go to the
 * blocks that took one unit fewer. (Dealt i, i + G, ... in batch order, a ragged causal batch of 16k
 * tokens left its most loaded block about 1.12x an even share of the work: docs/performance.md v61.)
 * A unit is found by a prefix sum over the 32 sequences, from a cursor that only moves forward.
 *
 * kLongestFirst false: the sequences in batch order and block i taking units i, i + G, ... (the
 * middle tiles going on from the block after the last unit's). The blocks whose one producer warp
 * also loads every tile walk so: there the sort's registers pushed ptxas's spills in that warp from
 * 16-28 to 40-48 bytes, and its equal-length rows ran 2-3.6% slower (docs/performance.md v62); in
 * batch order its ragged 32/8 row read 0.997-1.013x the sorted walk's (v63). */
template <class Tr, bool kLongestFirst = true> struct ragged_walk {
    const fa_kernel_params &p;
    int lane, phase = 0, target, step, base = 0, before = 0; /* phase 1: the middle tiles */
    int seq = -1; /* this lane's sequence of the 32 from `base`, longest first (-1: not yet sorted) */
    int light = -1, light_b = 0, light_h = 0; /* kind 2: the unit's lighter tile, still to hand out */
    /* (step: the distance to the block's unit in the next round, 2 G - 1 - 2 i and 1 + 2 i in turn;
     * G throughout without kLongestFirst) */
    __device__ __forceinline__ ragged_walk(const fa_kernel_params &p_, int lane_)
        : p(p_), lane(lane_), target((int)blockIdx.x),
          step(kLongestFirst ? 2 * ((int)gridDim.x - (int)blockIdx.x) - 1 : (int)gridDim.x) {}
    /* Sequence e's query tiles (serving_seq's query count; FUSED_SM90 is never planned with
     * q_group_rows), and its units or middle tiles. */
    __device__ __forceinline__ int query_tiles(int e) const {
        if (e >= p.batch) return 0;
        const int64_t q0 = clamp64(p.cu_seqlens_q[e], 0, p.total_q);
        const int64_t sq = clamp64((int64_t)p.cu_seqlens_q[e + 1] - q0, 0, min((int64_t)p.seqlen_q, p.total_q - q0));
        return (int)((sq + Tr::kBlockM - 1) / Tr::kBlockM);
    }
    __device__ __forceinline__ int count(int m) const {
        return (phase == 1 ? (m & 1) : p.persistent == 2 ? m / 2 : m) * p.heads_q;
    }
    /* Sequences base..base + 31 (seq, with their query tiles m) across the lanes, most query tiles
     * first (ties: lower index first): left as they are when already in that order (equal lengths),
     * else put in it by a bitonic sort across the warp. Not unrolled: it runs once a block and 32
     * sequences (unrolled at each place it is called, it added some 1,400 instructions to the head
     * dim 64 resident serving kernel). */
    __device__ __forceinline__ void sort_sequences(int &m) {
        seq = base + lane, m = query_tiles(seq);
        const int m_after = __shfl_down_sync(0xffffffffu, m, 1); /* (every lane: no shuffle under a condition) */
        if (__all_sync(0xffffffffu, lane == 31 || m >= m_after)) return;
#pragma unroll 1
        for (int k = 2; k <= 32; k <<= 1)
#pragma unroll 1
            for (int j = k >> 1; j > 0; j >>= 1) {
                const int other_m = __shfl_xor_sync(0xffffffffu, m, j);
                const int other_seq = __shfl_xor_sync(0xffffffffu, seq, j);
                const bool other_first = other_m > m || (other_m == m && other_seq < seq);
                /* the lower lane of the pair keeps the earlier of the two where its run of k is in
                 * order ((lane & k) == 0), the later where it is reversed; the upper lane the other */
                if (((lane & j) == 0) == ((lane & k) == 0) ? other_first : !other_first) m = other_m, seq = other_seq;
            }
    }
    /* The sequence holding unit `target` of the phase, the unit's rank in it and the sequence's query
     * tiles; false past the last. */
    __device__ __forceinline__ bool locate(int &b, int &rank, int &m_b) {
        for (; base < p.batch; base += 32, seq = -1) {
            int m;
            if constexpr (!kLongestFirst) seq = base + lane, m = query_tiles(seq);
            else if (seq < 0) sort_sequences(m);
            else m = query_tiles(seq);
            const int c = count(m);
            int incl = c;
#pragma unroll
            for (int o = 1; o < 32; o <<= 1) {
                const int v = __shfl_up_sync(0xffffffffu, incl, o);
                if (lane >= o) incl += v;
            }
            const int total = __shfl_sync(0xffffffffu, incl, 31);
            if (target < before + total) {
                const int l = __ffs(__ballot_sync(0xffffffffu, target < before + incl)) - 1;
                const int excl = __shfl_sync(0xffffffffu, incl - c, l);
                m_b = __shfl_sync(0xffffffffu, m, l);
                b = __shfl_sync(0xffffffffu, seq, l), rank = target - before - excl;
                return true;
            }
            before += total;
        }
        return false;
    }
    /* The block's next tile: batch entry b, head h, query tile mb; false when none is left. */
    __device__ __forceinline__ bool next(int &b, int &h, int &mb) {
        if (light >= 0) {
            b = light_b, h = light_h, mb = light, light = -1;
            return true;
        }
        for (;;) {
            int rank, m;
            if (locate(b, rank, m)) {
                target += step;
                if constexpr (kLongestFirst) step = 2 * (int)gridDim.x - step;
                if (phase == 1) {
                    h = rank, mb = m / 2;
                } else if (p.persistent == 2) {
                    const int half = m / 2, j = rank % half;
                    h = rank / half, mb = m - 1 - j;
                    light = j, light_b = b, light_h = h;
                } else {
                    h = rank / m, mb = rank % m;
                }
                return true;
            }
            if (phase == 1 || p.persistent != 2) return false;
            /* every unit counted (before): the middle tiles go on from there in the same rounds */
            if constexpr (kLongestFirst) {
                phase = 1, target -= before, base = 0, before = 0;
            } else {
                const int units = before, grid = (int)gridDim.x;
                phase = 1, base = 0, before = 0;
                target = FA_MIDDLE_TILE_TURN((int)blockIdx.x, units, grid); /* (fa_persistent_next's rule) */
            }
        }
    }
};

/* kTransform: softcap and/or ALiBi present. kServing: a serving call (fa_kernel_params.serving):
 * the sequence's counts, offsets and rows from the device arrays (seq_view), ragged Q/K/V and page
 * pools through the tensor maps; its own instantiation, so the dense kernels carry none of it.
 * kResidentGather: a resident serving block whose pages are gathered (Tr::kGathersResident), also
 * an instantiation of its own, so that the other serving calls' resident blocks carry none of it. */
template <int kDtype, int kHeadDim, int kKeyTile, int kConsumers, bool kTransform, bool kServing = false,
          bool kPersistent = false, bool kResidentGather = false>
__global__ void __launch_bounds__(kWarpgroupThreads * (kConsumers + 1), 1)
fused_sm90_kernel(const __grid_constant__ fa_kernel_params p, const __grid_constant__ CUtensorMap tm_q,
                  const __grid_constant__ CUtensorMap tm_k, const __grid_constant__ CUtensorMap tm_v,
                  const __grid_constant__ CUtensorMap tm_o) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
    using Tr = traits<kDtype, kHeadDim, kKeyTile, kConsumers, kPersistent, kServing>;
    using T = typename Tr::T;
    constexpr int kBlockM = Tr::kBlockM, kBlockN = Tr::kBlockN;
    constexpr int kSN = kBlockN / 2, kON = kHeadDim / 2; /* accumulator floats per thread */
    constexpr int kNC = Tr::kConsumers;
    /* A persistent serving block's producer holds a sequence's counts and offsets besides its tile:
     * beside two consumers 56 registers (the consumers then keep 224 each: 56 + 2 x 224 = 3 x 168,
     * the launch allocation); beside three 32, so that the consumers keep 160 (32 + 3 x 160 =
     * 4 x 128): with 152 (a producer of 40 or 56) ptxas serialises their wgmma. At 32 the producer
     * and the consumers' per-tile code spill (some 200-270 bytes); the key loop does not. */
    constexpr int kProducerRegs = kServing ? (kPersistent ? (kConsumers == 3 ? 32 : 56) : Tr::kServingProducerRegs) : Tr::kProducerRegs;
    static_assert(Tr::fits(kProducerRegs, Tr::consumer_regs(kProducerRegs)),
                  "setmaxnreg: the warpgroups' registers must fit in the block's launch allocation");

    extern __shared__ __align__(1024) unsigned char smem_raw[];
    const smem_layout<Tr> sm(smem_u32(smem_raw));

    const int tid = threadIdx.x, wg = tid / kWarpgroupThreads, lane = tid % 32;
    /* Launched as a programmatic dependent of the stream's previous kernel (fused_sm90_launch.cuh,
     * for the host time it saves): no global memory is read or written before that kernel is done. */
    wait_prerequisites();
    /* A persistent block's work numbers: fa_persistent_first, then fa_persistent_next, below `works` (at
     * most INT32_MAX work numbers; every block has at least one). A dense call's tiles all have keys
     * (the planner takes no window, seqlen_k > 0 and, under a causal mask, seqlen_q <= seqlen_k); a
     * serving call's work numbers cover its capacities: its producer skips a tile past its
     * sequence's queries, and hands the consumers every other tile in a record (post_record),
     * where a tile with no key to see is answered O = 0, LSE = -inf. */
    const int tiles_heads = tile<Tr>::work_heads(p); /* (the work numbers' heads a batch entry) */
    const int works = kPersistent ? fa_persistent_works(&p, tiles_heads) : 0;
    const int work0 = kPersistent ? fa_persistent_first(&p, tiles_heads, blockIdx.x, gridDim.x) : -1;
    auto next_work = [&](int work) { return fa_persistent_next(&p, tiles_heads, work, blockIdx.x, gridDim.x); };
    /* The block's (first) tile, built once: a block a tile uses it throughout; its sequence is the
     * block's (grid z). (A persistent serving block's tiles come with their sequences in the
     * producer's records: no sequence is read here.) */
    auto first_seq = [&] {
        if constexpr (kServing && kPersistent) return seq_view<kServing>(p, fa_seq{});
        else return seq_view<kServing>(p, (int)blockIdx.z);
    };
    const seq_view<kServing> sq0 = first_seq();
    const tile<Tr> tl0(p, sq0.bounds(p), work0);
    if constexpr (!kPersistent) {
        if constexpr (kServing)
            if (tl0.m0 >= sq0.bounds(p).seqlen_q) return; /* past this sequence's queries (the grid covers the capacity) */
        if (tl0.n_tiles == 0) {
            store_empty(p, tl0, sq0, tid);
            return;
        }
    }

    /* A resident block whose pages are gathered (the planner chooses it, the launcher checks): its
     * warps 0, 2 and 3 follow the tile records, and all four copy K and V. */
    static_assert(!kResidentGather || (Tr::kGathersResident && kServing && kPersistent), "resident gathered pages");
    if (tid == 0) {
        /* (gathered pages: one arrival a copying thread, each of the producer warpgroup's; with
         * resident blocks three warps take each tile record besides the consumers) */
        if constexpr (kServing)
            sm.init_barriers(gathers_pages<Tr>(p) ? kWarpgroupThreads : 1, kPersistent, kResidentGather ? 3 * 32 : 32);
        else sm.init_barriers();
    }
    __syncthreads();

    if (wg == 0) { /* the producer warpgroup */
        release_registers<kProducerRegs>();
        if constexpr (kServing && kPersistent) {
            if constexpr (Tr::kTwoRecords) {
                if (tid < 32 || (kResidentGather && tid >= 64)) {
                    /* warp 0 (gathered pages: warps 0, 2 and 3): K and V, tile after tile, from the
                     * records */
                    auto follow = [&](auto gather) {
                        const int gw = tid / 32; /* (the copying warp) */
                        int nth = 0, kv0 = 0; /* tiles loaded, their K/V tiles */
                        for (int n = 0;; ++n) {
                            fa_seq s;
                            int head, m0;
                            mbar_wait(sm.rec_full_slot(n), sm.rec_parity(n));
                            const int b = take_tile_record(sm.rec_slot(n), s, head, m0, true);
                            mbar_arrive(sm.rec_empty_slot(n));
                            if (b < 0) break;
                            const seq_view<kServing> sq(p, s);
                            const tile<Tr> tl(p, sq.bounds(p), b, head, m0);
                            if (tl.n_tiles == 0) continue; /* no key: the consumers write O = 0, LSE = -inf */
                            /* (boxes: warp 0 alone, whose lane is tid) */
                            produce_serving_tile<Tr, decltype(gather)::value>(p, sq, tl, sm, &tm_q, &tm_k, &tm_v,
                                                                              decltype(gather)::value ? lane : tid,
                                                                              nth++, kv0, gw);
                            kv0 += tl.n_tiles;
                        }
                    };
                    follow(std::integral_constant<bool, kResidentGather>{});
                } else if (tid < 64) { /* warp 1: the tiles' sequences, their records and Q */
                    /* Record n in slot n % 2 once every consumer thread and every K/V thread (warp
                     * 0, or warps 0, 2 and 3) has taken the slot's last; tile nq's Q into buffer
                     * nq % 2, once every consumer warp has seen the last Q land (and so is done
                     * with the buffer's last tile). Gathered pages: after a tile's record and Q
                     * this warp copies its share of the tile's K and V too (its rows as warp 1 of
                     * four), and posts the next record once it has issued them. */
                    auto records = [&](auto gather) {
                        int nrec = 0, nq = 0, kv0 = 0; /* records posted, Q loaded, (gather) K/V tiles */
                        auto post = [&](int b, int head, int m0, const fa_seq &s) {
                            if (nrec >= 2) mbar_wait(sm.rec_empty_slot(nrec), sm.rec_parity(nrec) ^ 1u);
                            if (tid == 32) post_tile_record(sm.rec_slot(nrec), sm.rec_full_slot(nrec), b, head, m0, s);
                            ++nrec;
                        };
                        auto hand_out = [&](const seq_view<kServing> &sq, const tile<Tr> &tl) {
                            post(tl.b, tl.h0, tl.m0, sq.s);
                            if (tl.n_tiles == 0) return;
                            if (nq > 0) mbar_wait(sm.empty_q, (nq - 1) & 1);
                            if (tid == 32) produce_serving_q(sq, tl, sm.q_buf(nq), sm.bar_q, &tm_q);
                            if constexpr (decltype(gather)::value) {
                                produce_serving_tile<Tr, true>(p, sq, tl, sm, &tm_q, &tm_k, &tm_v, lane, nq, kv0, 1);
                                kv0 += tl.n_tiles;
                            }
                            ++nq;
                        };
                        /* (a single consumer's tile packs a KV head's group, pack_gqa: its
                         * ragged Q goes by the capacity's tiles, skipping those past a sequence) */
                        if (Tr::kConsumers > 1 && p.cu_seqlens_q != nullptr) { /* ragged Q: the sequences' own tiles */
                            ragged_walk<Tr> walk(p, lane);
                            int b, head, m_block;
                            while (walk.next(b, head, m_block)) {
                                const seq_view<kServing> sq(p, b);
                                hand_out(sq, tile<Tr>(p, sq.bounds(p), b, head, m_block * Tr::kBlockM));
                            }
                        } else {
                            const bool packed = tile<Tr>::packed(p);
                            const int hx = tiles_heads, hmul = packed ? p.head_group : 1;
                            const int rows = packed ? p.pack_rows : Tr::kBlockM;
                            for (int work = work0; work < works; work = next_work(work)) {
                                int32_t m_block, bh; /* (worked out once) */
                                fa_persistent_tile(&p, hx, work, &m_block, &bh);
                                const int b = bh / hx;
                                const seq_view<kServing> sq(p, b);
                                const tile<Tr> tl(p, sq.bounds(p), b, (bh - b * hx) * hmul, m_block * rows);
                                if (tl.m0 >= sq.s.seqlen_q) continue; /* no query: nothing for anyone to do */
                                hand_out(sq, tl);
                            }
                        }
                        post(-1, 0, 0, sq0.s);
                    };
                    records(std::integral_constant<bool, kResidentGather>{});
                }
            } else if (tid < 32) { /* one warp: each tile's record as it reaches the tile, then its loads */
                int nth = 0, kv0 = 0, nrec = 0; /* tiles loaded, their K/V tiles, records posted */
                auto post = [&](int work, const fa_seq &s) {
                    if (nrec > 0) mbar_wait(sm.rec_empty, (nrec - 1) & 1); /* every consumer thread took the last */
                    if (tid == 0) post_record(sm.rec, sm.rec_full, work, s);
                    ++nrec;
                };
                /* Query tile m_block of batch entry b's head `head` (work number `work`, which the
                 * consumers' record carries). */
                auto run = [&](int work, int b, int head, int m_block) {
                    const seq_view<kServing> sq(p, b);
                    const tile<Tr> tl(p, sq.bounds(p), b, head, m_block * Tr::kBlockM);
                    if (tl.m0 >= sq.s.seqlen_q) return; /* no query: nothing for anyone to do */
                    post(work, sq.s);
                    if (tl.n_tiles == 0) return; /* no key: the consumers write O = 0, LSE = -inf */
                    produce_serving(p, sq, tl, sm, &tm_q, &tm_k, &tm_v, tid, nth++, kv0);
                    kv0 += tl.n_tiles;
                };
                if (p.cu_seqlens_q != nullptr) { /* ragged Q: the sequences' own tiles, in batch order */
                    ragged_walk<Tr, false> walk(p, lane);
                    int b, head, m_block;
                    while (walk.next(b, head, m_block))
                        run(fa_persistent_work(&p, p.heads_q, m_block, b * p.heads_q + head), b, head, m_block);
                } else {
                    for (int work = work0; work < works; work = next_work(work)) {
                        int32_t m_block, bh; /* (worked out once) */
                        fa_persistent_tile(&p, p.heads_q, work, &m_block, &bh);
                        const int b = bh / p.heads_q;
                        run(work, b, bh - b * p.heads_q, m_block);
                    }
                }
                post(-1, sq0.s);
            }
        } else if constexpr (kServing) {
            if (tid < 32 || gathers_pages<Tr>(p)) produce_serving(p, sq0, tl0, sm, &tm_q, &tm_k, &tm_v, tid);
        } else if (tid == 0) {
            int nth = 0, kv0 = 0;
            for (int work = work0;;) {
                const tile<Tr> tl = nth == 0 ? tl0 : tile<Tr>(p, sq0.bounds(p), work);
                const int next = kPersistent ? next_work(work) : works;
                if (Tr::kTwoQ && nth == 0) post_tile(sm.rec, tl.b, tl.h0, tl.m0, next < works);
                /* (Tr::kTwoQ) the next tile's record and Q into the other slot and buffer, once every
                 * consumer warp has seen this tile's Q land (one phase of bar_q in flight at a time)
                 * and so is done with the last tile, their last user */
                auto next_q = [&] {
                    if (next >= works) return;
                    int32_t m_block, bh;
                    fa_persistent_tile(&p, p.heads_q, next, &m_block, &bh);
                    const int b = bh / p.heads_q, head = bh - b * p.heads_q, m0 = m_block * Tr::kBlockM;
                    const int more = next_work(next) < works;
                    mbar_wait(sm.empty_q, nth & 1);
                    post_tile(sm.rec + 16 * ((nth + 1) & 1), b, head, m0, more);
                    produce_q<Tr>(m0, head, b, Tr::kBlockM, sm.q_buf(nth + 1), sm.bar_q, &tm_q);
                };
                produce(tl, sm, &tm_q, &tm_k, &tm_v, nth, kv0, p.kv_evict_first != 0, next_q);
                ++nth, kv0 += tl.n_tiles;
                if ((work = next) >= works) break;
            }
        }
        return;
    }

    /* ---- a consumer warpgroup: its 64 rows of each tile through every key tile (the mainloop) ---- */
    claim_registers<Tr::consumer_regs(kProducerRegs)>();
    /* The consumer index: tile rows 64c..64c+63. It comes through a shuffle, which ptxas knows to
     * be the same in every lane: the key loop's wgmma descriptors are then built in uniform
     * registers (no R2UR in the loop). The three-consumer kernels keep the plain form: with the
     * shuffle the persistent d64 three-consumer one spilled 20 -> 44 bytes (the d256 serving
     * kernels, 60 -> 84 then, spill 0-12 with it since their producers work a tile out once).
     * docs/performance.md v20, v21 and v31 have the measurements. */
    constexpr bool kUniformC = kNC != 3;
    const int c = kUniformC ? __shfl_sync(0xffffffffu, wg - 1, 0) : wg - 1;
    const int g = lane / 4, t = lane % 4;
    const int trow = c * 64 + ((tid % kWarpgroupThreads) / 32) * 16 + g; /* this thread's tile rows: trow, trow + 8 */
    /* Turns go round: consumer c waits on its turn barrier and then passes to c + 1 (mod C); the
     * last one starts each tile's round by passing to consumer 0. (One consumer takes none.) */
    constexpr bool kTurns = kNC > 1;
    const int my_turn = turn_barrier(c), next_turn = turn_barrier((c + 1) % kNC);
    const float mult = kTransform ? 1.0f : p.scale_log2;
    /* The large head dims' key loop issues fewer instructions: the running max is raised only past
     * a slack (softmax_new_max_lazy), so that most key tiles skip O *= corr (96-128 multiplications
     * a thread), and each wgmma's descriptors are a base plus a constant (smem_desc_base), not
     * built from their addresses (a dozen uniform instructions each; only where the consumer index
     * is uniform: in the d256 serving kernels the bases would live in ordinary registers, and their
     * key loop spilled). With the H200 at its power limit, fewer instructions a tile mean a higher
     * clock: 1.00-1.14x at head dims 160-256. At head dims 64 and 128 (and 96) the same changes
     * measured 0.95-1.02x, so those kernels keep the plain loop (docs/performance.md v27). */
    constexpr bool kLazyMax = kHeadDim >= 192, kDescByOffset = kHeadDim >= 192 && kUniformC;
    /* Each row's max and sum a tile as pairwise trees (softmax.cuh's kTree) at head dim 128 only:
     * 0.995-1.021x there against the in-order chains (geomean 1.002, the most at 16k), 0.99x at 64,
     * 192 and 256, which keep the chains (docs/performance.md v47). */
    constexpr bool kTree = kHeadDim == 128;
    /* S = Q K^T's k-steps of 16 columns that hold the head dim (a head dim below the kernel's, 160
     * on the 192 kernel or 96 on the 128 one, leaves zero columns in Q and K: their steps would add
     * nothing). Not in the 176-key 128 kernel (long unmasked calls): with the second loop copy its
     * d128 16k rows read 0.965-0.988x (docs/performance.md v17); the planner keeps those head dims
     * off that tile instead (FA_SM90_D128_SHORT_S_HEAD_DIM). */
    constexpr int kShortSteps = kHeadDim == 192                      ? 10
                                : kHeadDim == 128 && kKeyTile != 176 ? FA_SM90_D128_SHORT_S_HEAD_DIM / 16
                                                                     : 0;
    /* The width of a narrow last key tile (key_loop below; 0: none), at the head dims whose key
     * tiles are not a power of two. */
    constexpr int kTailW = kHeadDim >= 192 ? 32 : 0;
    const bool short_k = p.head_dim <= 16 * kShortSteps;
    /* Gathered pages land through the generic proxy (cp.async): after the wait for a stage, a proxy
     * fence before the tensor cores read it. */
    bool gathered = false;
    if constexpr (kServing) gathered = gathers_pages<Tr>(p);
    /* Pages read in full-width boxes (kp.kv_page_groups) leave K and V tiles row-group-major: 8 rows
     * x every 64-column region, then the next 8 rows. The descriptors follow: 8-row groups kCB KB
     * apart, regions 1 KB apart (else 1 KB and kBlockN x 128 bytes). */
    bool kv_grouped = false;
    if constexpr (kServing && kHeadDim > 64) kv_grouped = p.kv_page_groups > 0;
    const uint32_t kv_group_bytes = kv_grouped ? (uint32_t)kHeadDim * 16 : 1024u,
                   kv_region_bytes = kv_grouped ? 1024u : (uint32_t)kBlockN * 128;
    int nth = 0, kv0 = 0; /* tiles done by this block, and their K/V tiles (the stages' running count) */
    int nrec = 0;         /* a persistent serving block: tile records taken */
    int rec_b = 0, rec_head = 0, rec_m0 = 0; /* (Tr::kTwoRecords) the record's tile */
    /* A persistent block whose last consumer hands the tensor-core turn on across tiles (below). */
    constexpr bool kTurnAcross = kPersistent && (!kServing || Tr::kTwoQ || Tr::kSplitQ);
    for (int work = work0;;) {
        seq_view<kServing> sq = sq0;
        if constexpr (kServing && kPersistent) { /* the producer's record of the next tile */
            const int n = nrec++;
            mbar_wait(sm.rec_full_slot(n), sm.rec_parity(n));
            if constexpr (Tr::kTwoRecords) work = rec_b = take_tile_record(sm.rec_slot(n), sq.s, rec_head, rec_m0, false);
            else work = take_record(sm.rec_slot(n), sq.s);
            mbar_arrive(sm.rec_empty_slot(n)); /* (every consumer thread: each releases its own reads) */
            if (work < 0) {
                /* (a turn passed on across tiles) the last consumer's pass after the block's last tile */
                if (kTurnAcross && kTurns && c == 0 && nth > 0) named_sync(my_turn, kTurnThreads);
                break;
            }
        }
        const auto &bnd = sq.bounds(p);
        int more = 0; /* (Tr::kTwoQ, dense) the block has a tile after this one */
        auto make_tile = [&] {
            if constexpr (Tr::kTwoQ && !kServing) { /* the producer's record, with the tile's Q */
                int tb, th, tm0;
                mbar_wait(sm.bar_q, nth & 1);
                take_tile(sm.rec + 16 * (nth & 1), tb, th, tm0, more);
                if (lane == 0) mbar_arrive(sm.empty_q); /* this warp saw Q land: the next may load */
                return tile<Tr>(p, bnd, tb, th, tm0);
            } else {
                if constexpr (kServing && kPersistent)
                    return Tr::kTwoRecords ? tile<Tr>(p, bnd, rec_b, rec_head, rec_m0) : tile<Tr>(p, bnd, work);
                else
                    return nth == 0 ? tl0 : tile<Tr>(p, bnd, work);
            }
        };
        const tile<Tr> tl = make_tile();
        if constexpr (kServing && kPersistent) {
            if (tl.n_tiles == 0) { /* this consumer's rows of a tile with queries but no key: O = 0, LSE = -inf */
                store_empty(p, tl, sq, tid % kWarpgroupThreads, kWarpgroupThreads, c * 64, 64);
                __syncwarp(); /* reconverged before the next tile (else ptxas serialises every wgmma: C7520) */
                continue;
            }
            if constexpr (Tr::kTwoQ) { /* the tile's Q, loaded ahead */
                mbar_wait(sm.bar_q, nth & 1);
                if (lane == 0) mbar_arrive(sm.empty_q); /* this warp saw Q land: the next may load */
            }
        }
        const int b = tl.b, m0 = tl.m0, row_last = tl.row_last, tile_begin = tl.tile_begin, n_tiles = tl.n_tiles;
        /* The key tiles this consumer computes: the block's first n_mine. Where the tile's rows are
         * its sequence's positions in order (no packed query heads), a consumer whose 64 rows all
         * lie past the last query computes none, and one whose last row sees no key past some key
         * tile (a causal mask: consumer 0's rows end before the others') stops there: every score
         * of the tiles after it is masked for its rows, so they would add exactly nothing (the
         * max, the sum and O unchanged). It still waits for those tiles, releases their stages and
         * takes their turns (below, after the key loop), so the other consumers run as before.
         * Dense calls only: a serving call's consumers take every tile (with the rule its prefill
         * calls read 0.97-0.99x warm, those where no consumer stops early among them:
         * docs/performance.md v38). And only where a key tile is narrower than the block's rows
         * (head dim 64's 192 rows on 128-key tiles, 128 rows on 112- or 80-key tiles): elsewhere a
         * consumer would stop early only in a last tile with rows to spare, or under a causal
         * offset that is not a whole number of key tiles, and those kernels leave the rule's code
         * out. */
        constexpr bool kStopEarly = !kServing && kBlockN < kBlockM;
        int n_mine = n_tiles;
        if constexpr (kStopEarly) {
            if (tl.heads == 1) {
                const int first = m0 + c * 64, last = min(first + 63, row_last);
                const int end = min(bnd.seqlen_k, last + bnd.key_hi_off + 1); /* (tile::key_end's form) */
                const int step = tl.tile_step, beyond = (end + kBlockN - 1) / kBlockN - tile_begin;
                n_mine = first > row_last || beyond <= 0 ? 0 : min(n_tiles, (beyond + step - 1) / step);
            }
            n_mine = __shfl_sync(0xffffffffu, n_mine, 0); /* (uniform: the key loop's bound) */
        }
        auto row_target = [&](int r, int &head, int &pos) { return tl.row_target(bnd, r, head, pos); };
        auto lse_slot = [&](int head, int pos) { return tl.lse_slot(p, head, pos, sq.lse_row0()); };
        int head_r[2], pos_r[2];
        bool valid_r[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) valid_r[r] = row_target(trow + 8 * r, head_r[r], pos_r[r]);
        /* A single consumer's tile (a decode: its rows a KV group's query heads at a few positions)
         * holds mostly padding rows: with 4 query heads of one position, rows 0-3 of 64. Where no
         * row of this warp's half r (rows trow + 8 r) is the call's, the warp leaves that half's
         * softmax out (the same for the whole warp: a vote): its probabilities stay the raw scores
         * and its O rows whatever P V makes of them, rows that are never stored, nor read by another
         * row's products. Warp 0 of a 4-row decode then exponentiates half of what it did. (Not
         * in the serving kernels with softcap or ALiBi, where it made ptxas spill: 12-36 bytes.) */
        constexpr bool kSkipDead = kNC == 1 && !(kServing && kTransform);
        bool live_r[2] = {true, true};
        if constexpr (kSkipDead) {
#pragma unroll
            for (int r = 0; r < 2; ++r) live_r[r] = __any_sync(0xffffffffu, valid_r[r]);
        }
        float slope_r[2] = {0.0f, 0.0f};
        if constexpr (kTransform) {
#pragma unroll
            for (int r = 0; r < 2; ++r) slope_r[r] = valid_r[r] ? alibi_slope(p, b, head_r[r]) : 0.0f;
        }

        float o[kON], s[kSN];
        uint32_t pf[kBlockN / 16][4];
#pragma unroll
        for (int i = 0; i < kON; ++i) o[i] = 0.0f;
        float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.0f, 0.0f};

        const uint32_t q_wg = sm.q_buf(nth) + (uint32_t)c * 64 * 128; /* this consumer's 64 rows of Q */
        /* (with two Q buffers: in make_tile). A kSplitQ block waits on its consumer's own barrier,
         * its index the shuffled c (where c is not shuffled already: kUniformC): with a per-thread
         * barrier address ptxas moved the key loop's uniform address arithmetic to ordinary
         * registers (57 more R2UR a key tile at head dim 256; 0.83-0.92x measured). */
        if (!Tr::kTwoQ) mbar_wait(sm.q_full(Tr::kSplitQ ? (kUniformC ? c : __shfl_sync(0xffffffffu, c, 0)) : 0), nth & 1);
        /* A persistent block's next tile, if any (kTurnAcross): its last consumer then passes the
         * turn on (to consumer 0, the next tile's first) as soon as it has issued this tile's last
         * P V, so the next tile's first S overlaps its last P V and epilogue. A serving block does
         * not know yet whether one follows: it always passes, and after the block's last tile
         * consumer 0 takes that pass (above). Otherwise the round starts here, once the last
         * consumer has seen Q land. (One consumer takes no turns.) */
        const bool turn_on = kServing ? kTurnAcross
                             : Tr::kTwoQ ? more != 0
                                         : kPersistent && next_work(work) < works;
        if (kTurns && c == kNC - 1 && !(kTurnAcross && nth > 0)) named_arrive(turn_barrier(0), kTurnThreads);

        /* S = Q K_kv^T for this consumer's rows, issued (not committed) with K from kv's stage, into
         * acc: the key tile's first kW columns (kBlockN, or kTailW for a narrow last tile), kW / 2
         * floats. */
        auto issue_s_steps = [&](auto &acc, int kv, auto steps) {
            constexpr int kW = 2 * (int)(sizeof acc / sizeof acc[0]);
            const uint32_t k_st = sm.k + (uint32_t)(kv & 1) * Tr::kKVBytes;
            const smem_desc_base qd(q_wg, 16, 1024), kd(k_st, 16, kv_group_bytes);
#pragma unroll
            for (int ks = 0; ks < decltype(steps)::value; ++ks) {
                const uint32_t col = (uint32_t)(ks / 4), sub = (uint32_t)(ks % 4) * 32;
                const uint32_t q_off = col * kBlockM * 128 + sub, k_off = col * kv_region_bytes + sub;
                wgmma_ss<kW, kDtype>::run(acc, kDescByOffset ? qd.at(q_off) : smem_desc(q_wg + q_off, 16, 1024),
                                          kDescByOffset ? kd.at(k_off) : smem_desc(k_st + k_off, 16, kv_group_bytes), ks > 0);
            }
        };
        /* O += P V_kv, issued (not committed): the key tile's first kW keys (P's first kW / 16 k-steps). */
        auto issue_pv = [&](int kv, auto width) {
            constexpr int kW = decltype(width)::value;
            const uint32_t v_st = sm.v + (uint32_t)(kv & 1) * Tr::kKVBytes;
            const smem_desc_base vd(v_st, kv_region_bytes, kv_group_bytes);
#pragma unroll
            for (int kk = 0; kk < kW / 16; ++kk) /* (k-step kk: keys 16 kk.., two 8-row groups) */
                wgmma_rs<kHeadDim, kDtype>::run(o, pf[kk], kDescByOffset ? vd.at(kk * 2 * kv_group_bytes)
                                                                         : smem_desc(v_st + kk * 2 * kv_group_bytes, kv_region_bytes, kv_group_bytes), 1);
        };

        /* Key tile `it` of the loop: its S issued in `steps` k-steps over its first kW keys (kBlockN,
         * or kTailW for a narrow last tile: below), the previous tile's P V beside it, then the
         * softmax. */
        auto key_step = [&](int it, auto steps, auto width) {
            constexpr int kW = decltype(width)::value;
            /* the tile's scores: s, or for a narrow tile registers of its own (s's other entries
             * would otherwise stay pinned across it) */
            float s_narrow[kW == kBlockN ? 1 : kW / 2];
            auto &sw = pick_ref<kW == kBlockN>(s, s_narrow);
            auto sw_at = [&sw](int j, int e) -> float & { return sw[4 * j + e]; };
            const int n0 = tl.key_tile(it) * kBlockN;
            const int kv = kv0 + it, st = kv & 1; /* K_it's and V_it's stage */
            mbar_wait(sm.full_k + 8 * st, (kv >> 1) & 1);
            /* A single consumer issues S_it once K_it has landed and only then waits for V_{it-1}
             * (issued after K_it: it lands later), so that S_it and its softmax run while V_{it-1}
             * is in flight, and P V_{it-1}, issued as V_{it-1} lands, hands V's stage back to the
             * producer one product (not two) after it (docs/performance.md v83). With two or three
             * consumers a consumer holds the tensor cores' turn from before S to after P V, and
             * waits for both first. */
            constexpr bool kSFirst = kNC == 1;
            auto wait_v_prev = [&] { mbar_wait(sm.full_v + 8 * (st ^ 1), ((kv - 1) >> 1) & 1); };
            if (!kSFirst && it > 0) wait_v_prev();
            if (gathered) fence_proxy_async_shared();

            if (kTurns) named_sync(my_turn, kTurnThreads); /* our turn on the tensor cores */
            reg_fence(o);
            reg_fence(pf);
            wgmma_fence();
            issue_s_steps(sw, kv, steps);
            wgmma_commit();
            if (it > 0) {
                if constexpr (kSFirst) {
                    wait_v_prev();
                    if (gathered) fence_proxy_async_shared();
                }
                wgmma_fence(); /* P and O were written by ordinary instructions since the last one */
                issue_pv(kv - 1, std::integral_constant<int, kBlockN>{}); /* (only a last tile is narrow) */
            }
            wgmma_commit(); /* empty on the first tile: "all but the newest group" then always means S */
            if (kTurns) named_arrive(next_turn, kTurnThreads); /* the next consumer's turn */

            wgmma_wait<1>();
            reg_fence(sw);
            if (lane == 0) {
                mbar_arrive(sm.empty_k + 8 * st); /* this warp is done with K_it */
                /* and with Q, after the last S (O has a tile of its own; with two Q buffers, the
                 * next Q's load waits only for this tile's Q to have landed) */
                if (Tr::kPersistent && Tr::kOwnO && !Tr::kTwoQ && it == n_tiles - 1) mbar_arrive(sm.empty_q);
            }

            if constexpr (kTransform) {
#pragma unroll
                for (int i = 0; i < kW / 2; ++i) {
                    const int r = (i % 4) / 2;
                    sw[i] = kLog2e * transform_raw_score(p, bnd, sw[i], slope_r[r], pos_r[r], n0 + 8 * (i / 4) + 2 * t + (i % 2));
                }
            }
            const bool need_mask = FA_TILE_NEEDS_MASK(bnd, n0, kBlockN, m0, row_last);
            if (need_mask)
                mask_scores<kW / 8>(sw_at, bnd, [&pos_r](int r) { return pos_r[r]; }, n0, t,
                                    FA_TILE_CUTS_LOW(bnd, n0, row_last));

            float corr[2];
            if constexpr (kSkipDead) corr[0] = corr[1] = 1.0f;
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                if (kSkipDead && !live_r[r]) continue;
                float m_scaled;
                corr[r] = kLazyMax ? softmax_new_max_lazy<kW / 8, kTree>(sw_at, r, row_max[r], mult, m_scaled)
                                   : softmax_new_max<kW / 8, kTree>(sw_at, r, row_max[r], mult, m_scaled);
                const float sum = softmax_exp<kW / 8, kTree>(sw_at, r, mult, m_scaled, 0.0f);
                row_sum[r] = row_sum[r] * corr[r] + sum;
            }

            wgmma_wait<0>(); /* P V_{it-1} is done with O, pf and V_{it-1} */
            reg_fence(o);
            reg_fence(pf);
            if (it > 0 && lane == 0) mbar_arrive(sm.empty_v + 8 * (st ^ 1));
            /* O *= corr; with kLazyMax, only where some row of the warp raised its max (else
             * corr is 1) and O is no longer zero (after the first key tile) */
            if (!kLazyMax || __any_sync(0xffffffffu, it > 0 && (corr[0] != 1.0f || corr[1] != 1.0f))) {
                if constexpr (kSkipDead) { /* (a half left out keeps its O) */
                    auto o_at = [&o](int j, int e) -> float & { return o[4 * j + e]; };
#pragma unroll
                    for (int r = 0; r < 2; ++r)
                        if (live_r[r]) rescale_row<kHeadDim / 8>(o_at, r, corr[r]);
                } else {
#pragma unroll
                    for (int j = 0; j < kHeadDim / 8; ++j) {
                        o[4 * j] *= corr[0], o[4 * j + 1] *= corr[0];
                        o[4 * j + 2] *= corr[1], o[4 * j + 3] *= corr[1];
                    }
                }
            }
#pragma unroll
            for (int kk = 0; kk < kW / 16; ++kk) pack_p<kDtype>(sw_at, kk, pf[kk]);
        };
        /* A narrow last tile (kTailW > 0): where the keys any of the tile's rows can see end at most
         * kTailW keys into the last key tile (1024 keys on 112-key tiles end 16 keys in, 512 on 80-key
         * tiles 32 in), that tile's S, softmax and P V cover its first kTailW keys: the rest are
         * masked for every row, so they would add only zeros. The test is the same for the whole
         * block, taken through a shuffle so that ptxas sees it uniform. */
        const bool narrow =
            kTailW > 0 && __shfl_sync(0xffffffffu, tl.key_end(bnd) - tl.key_tile(n_tiles - 1) * kBlockN <= kTailW, 0);
        /* Each row's 1 / l and LSE (stored), from the sums and maxima of the consumer's last
         * softmax, which the last P V does not change: a single consumer's last_pv works them out
         * while that product runs on the tensor cores, off a decode tile's critical path after its
         * last V lands. The kernels of two or three consumers work them out after it (there the
         * move shifted ptxas's spills, up in some kernels and down in others: docs/performance.md
         * v81). A single consumer always takes last_pv, once a tile (its tiles all have keys, and
         * it never stops early: kStopEarly needs rows beyond a key tile's). */
        float inv_r[2];
        auto finish_rows = [&] {
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                const float l = quad_sum(row_sum[r]);
                inv_r[r] = softmax_inv(l);
                if (valid_r[r] && t == 0)
                    if (float *ls = lse_slot(head_r[r], pos_r[r]))
                        *ls = softmax_lse(l, row_max[r], mult);
            }
        };
        static_assert(kNC != 1 || !kStopEarly, "a single consumer finishes its rows in last_pv, which it always takes");
        /* This consumer's last tile's P V over its first kW keys; its V stage handed back where a
         * persistent block's next tile, or a key tile after this consumer's (n_mine), may load
         * there. Its turn is the consumer's last of the tile unless such key tiles follow. */
        auto last_pv = [&](auto width) {
            /* A split's merge (a programmatic dependent) may be scheduled once every block has a
             * thread here or has exited: its launch then overlaps this last P V and the partial
             * stores; it still waits for the grid's completion before its first load. Triggered at
             * the kernel's start, a batch-1 split decode read 4-7 us slower after other libraries'
             * kernels (docs/performance.md v56); after the partial stores, the merge's launch
             * followed the last block's end (v66: here instead, a batch-1 8k decode over a cache ran
             * 1.12x as fast in graph replays; after the producer's last loads, pages of 256 0.98x
             * cold). */
            if (tl.partial) launch_dependents();
            const int kv = kv0 + n_mine - 1, st = kv & 1;
            mbar_wait(sm.full_v + 8 * st, (kv >> 1) & 1);
            if (gathered) fence_proxy_async_shared();
            if constexpr (kServing) /* (the block's last tile: the only one that can cross the keys' end) */
                if (!gathered) clear_rows_past<Tr>(sm.v + (uint32_t)st * Tr::kKVBytes,
                                                   bnd.seqlen_k - tl.key_tile(n_tiles - 1) * kBlockN, c,
                                                   tid % kWarpgroupThreads, kv_grouped);
            if (kTurns) named_sync(my_turn, kTurnThreads);
            reg_fence(o);
            reg_fence_first<decltype(width)::value / 16>(pf);
            wgmma_fence();
            issue_pv(kv, width);
            wgmma_commit();
            if (kTurns && (c != kNC - 1 || turn_on || n_mine < n_tiles)) /* (above) */
                named_arrive(next_turn, kTurnThreads);
            if constexpr (kNC == 1) finish_rows(); /* (while the product runs: it reads neither o nor pf) */
            wgmma_wait<0>();
            reg_fence(o);
            if ((Tr::kPersistent || n_mine < n_tiles) && lane == 0) mbar_arrive(sm.empty_v + 8 * st);
        };

        /* The key loop, S issued in `steps` k-steps (a copy of the loop per count: a branch between
         * the two issue sequences inside the loop cost the 192 kernel 2-3% at head dim 192); with
         * narrow last tiles, the last tile's P V too (the narrow tile's own copy: no register of P
         * is then live across it). */
        auto key_loop = [&](auto steps) {
            const bool narrow_mine = narrow && n_mine == n_tiles; /* (only the block's last tile is narrow) */
            const int full_tiles = kTailW > 0 && narrow_mine ? n_mine - 1 : n_mine;
            for (int it = 0; it < full_tiles; ++it) key_step(it, steps, std::integral_constant<int, kBlockN>{});
            if constexpr (kTailW > 0) {
                if (narrow_mine) {
                    key_step(n_tiles - 1, steps, std::integral_constant<int, kTailW>{});
                    last_pv(std::integral_constant<int, kTailW>{});
                } else if (!kStopEarly || n_mine > 0) { /* (without the rule: every consumer) */
                    last_pv(std::integral_constant<int, kBlockN>{});
                }
            }
        };
        if constexpr (kShortSteps > 0) {
            if (short_k) key_loop(std::integral_constant<int, kShortSteps>{});
            else key_loop(std::integral_constant<int, kHeadDim / 16>{});
        } else {
            key_loop(std::integral_constant<int, kHeadDim / 16>{});
        }
        if constexpr (kTailW == 0)
            if (!kStopEarly || n_mine > 0) last_pv(std::integral_constant<int, kBlockN>{});
        /* The block's key tiles this consumer does not compute (n_mine): each waited for, its stages
         * released, its turn taken and passed on; with none computed, the turn of the last P V too.
         * Every consumer takes n_tiles + 1 turns a tile; the last passes on as last_pv's would.
         * (Waiting for both stages to land before releasing them keeps each release in its own
         * phase.) Dense calls only (n_mine above): a serving call's consumers clear their shares of
         * its last V tile together (clear_rows_past) just before their last turn, and one that
         * stopped early would have to clear there too, not in an earlier turn of its releases, where
         * it would wait for the others while they wait for that turn (three serving tests hung so:
         * docs/performance.md v38). */
        if (kStopEarly && n_mine < n_tiles) {
            for (int it = n_mine; it < n_tiles; ++it) {
                const int kv = kv0 + it, st = kv & 1;
                mbar_wait(sm.full_k + 8 * st, (kv >> 1) & 1);
                mbar_wait(sm.full_v + 8 * st, (kv >> 1) & 1);
                if (kTurns) named_sync(my_turn, kTurnThreads);
                if (lane == 0) {
                    mbar_arrive(sm.empty_k + 8 * st);
                    mbar_arrive(sm.empty_v + 8 * st);
                    if (Tr::kPersistent && Tr::kOwnO && !Tr::kTwoQ && it == n_tiles - 1) mbar_arrive(sm.empty_q);
                }
                const bool last_turn = it == n_tiles - 1 && n_mine > 0;
                if (kTurns && (!last_turn || c != kNC - 1 || turn_on)) named_arrive(next_turn, kTurnThreads);
            }
            if (kTurns && n_mine == 0) {
                named_sync(my_turn, kTurnThreads);
                if (c != kNC - 1 || turn_on) named_arrive(next_turn, kTurnThreads);
            }
        }

        if constexpr (kNC != 1) finish_rows(); /* (after the last P V, or with no key tile) */
        if (tl.partial) {
            store_split_partial(p, tl, o, inv_r, valid_r, head_r, pos_r, t);
            /* (a consumer that computed no key tile, and so took no last_pv, triggers here; for the
             * others this repeats the block's trigger, which has no further effect) */
            launch_dependents();
            return;
        }
        /* Epilogue: normalise; stage O (swizzled, conflict-free) in this consumer's 64 rows of the O tile
         * (Q's rows when O has no tile of its own: only this consumer's finished S products read them);
         * store rows with 16-byte writes, or (p.o_tma) as TMA boxes that one thread issues and the
         * consumers do not wait for: the next tile's staging waits until they have read the tile
         * (in Q's rows, the next Q's load waits for it). A serving call's box goes by TMA only when
         * its 64 rows all belong to the sequence (the map's bounds are the tensor's, and the rows
         * after a sequence's last are the next sequence's, or not to be written). */
        const bool tma_map = Tr::kPersistent && p.o_tma;
        bool tma_out = tma_map;
        if constexpr (kServing) tma_out = tma_map && m0 + c * 64 + 64 <= bnd.seqlen_q;
        if (tma_map) {
            if (tid % kWarpgroupThreads == 0) bulk_wait_read(); /* the last tile's stores read these rows */
            named_sync(epilogue_barrier(c, kNC), kWarpgroupThreads);
        }
#pragma unroll
        for (int r = 0; r < 2; ++r)
#pragma unroll
            for (int j = 0; j < kHeadDim / 8; ++j) {
                const uint32_t v = pack_pair<kDtype>(o[4 * j + 2 * r] * inv_r[r], o[4 * j + 2 * r + 1] * inv_r[r]);
                asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(sm.o + swz_off<kBlockM>(trow + 8 * r, j) + 4 * t), "r"(v)
                             : "memory");
            }
        if (tma_out) fence_proxy_async_shared(); /* the staged rows, before the TMA reads them */
        named_sync(epilogue_barrier(c, kNC), kWarpgroupThreads); /* this consumer's rows of O are staged */
        if (tma_out) {
            if (tid % kWarpgroupThreads == 0) {
#pragma unroll
                for (int cb = 0; cb < Tr::kChunks / 8; ++cb)
                    tma_store(&tm_o, sm.o + (uint32_t)(cb * kBlockM + c * 64) * 128, cb * 64,
                              (int)sq.q_row0() + m0 + c * 64, tl.h0, sq.map_batch(b));
                bulk_commit();
            }
        } else {
            for (int i = tid % kWarpgroupThreads; i < 64 * Tr::kChunks; i += kWarpgroupThreads) {
                const int rl = c * 64 + i / Tr::kChunks, ch = i % Tr::kChunks;
                int head, pos;
                if (row_target(rl, head, pos) && ch * 8 < p.head_dim) {
                    uint4 v;
                    asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n"
                                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                                 : "r"(sm.o + swz_off<kBlockM>(rl, ch))
                                 : "memory");
                    *reinterpret_cast<uint4 *>((T *)p.o + b * p.o_batch_stride + head * p.o_head_stride +
                                               ((int64_t)pos + sq.q_row0()) * p.o_seq_stride + ch * 8) = v;
                }
            }
        }
        if (Tr::kPersistent && !Tr::kOwnO) { /* Q's rows held O: this warp is done with Q now */
            if (tma_out && tid % kWarpgroupThreads == 0) bulk_wait_read(); /* and the stores have read them */
            __syncwarp();
            if (lane == 0) mbar_arrive(sm.q_empty(c));
        }
        ++nth, kv0 += n_tiles;
        if constexpr (!(kServing && kPersistent))
            if (!kPersistent || (Tr::kTwoQ ? !more : (work = next_work(work)) >= works)) break;
    }
    if (Tr::kPersistent && p.o_tma && tid % kWarpgroupThreads == 0) bulk_wait(); /* the last stores */
#endif
}

}  // namespace sm90
}  // namespace fa
