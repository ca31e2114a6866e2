/*
 * sm90_ptx.cuh - the Hopper (sm_90a) instructions the FUSED_SM90 kernel uses, as small inline
 * wrappers: warpgroup MMA ordering (wgmma fence/commit/wait), mbarriers, TMA tile loads, named
 * barriers, register reallocation, and the shared-memory matrix descriptor. The matrix products
 * themselves are in the generated sm90_wgmma.cuh.
 */
#pragma once

#include <cuda.h>
#include <stdint.h>

#include <type_traits>

namespace fa {
namespace sm90 {

constexpr int kWarpgroupThreads = 128;

/* Named barriers (bar.sync ids; 0 is __syncthreads). With C consumer warpgroups:
 *   1 + c       consumer c's turn on the tensor cores: consumer c waits there, the consumer before it
 *               (c - 1 mod C) arrives, so kTurnThreads = two warpgroups take part;
 *   1 + C + c   consumer c's epilogue: its own 128 threads, once its rows of O are staged;
 *   1 + 2 C     every consumer thread, once the rows of a serving call's last V tile past its
 *               sequence's keys are zeroed (clear_rows_past). */
constexpr int kTurnThreads = 2 * kWarpgroupThreads;
__device__ __forceinline__ int turn_barrier(int c) { return 1 + c; }
__device__ __forceinline__ int epilogue_barrier(int c, int consumers) { return 1 + consumers + c; }
__device__ __forceinline__ int cleared_barrier(int consumers) { return 1 + 2 * consumers; }

__device__ __forceinline__ void named_sync(int id, int threads) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_arrive(int id, int threads) {
    asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

/* Register reallocation between warpgroups (setmaxnreg): the producer gives registers back, the
 * consumers take them. */
template <int kRegs> __device__ __forceinline__ void release_registers() {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}
template <int kRegs> __device__ __forceinline__ void claim_registers() {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}

/* Lets the kernel enqueued after this one as its programmatic dependent (the split combine) be
 * scheduled now; it still waits (griddepcontrol.wait) for this grid to finish before reading. */
__device__ __forceinline__ void launch_dependents() { asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory"); }

/* wgmma ordering. */
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int kPending> __device__ __forceinline__ void wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}

/* Pin registers that an in-flight wgmma reads or writes: the compiler may not move their other uses
 * across this point (the waits and fences above are ordered with it as volatile asm). */
template <int N> __device__ __forceinline__ void reg_fence(float (&r)[N]) {
#pragma unroll
    for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}
template <int N> __device__ __forceinline__ void reg_fence(uint32_t (&r)[N][4]) {
#pragma unroll
    for (int i = 0; i < N; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) asm volatile("" : "+r"(r[i][j])::"memory");
}
/* The same for the first K rows only: where a narrow wgmma reads only those, pinning the rest would
 * keep their old values alive across it (registers the kernel does not have). */
template <int K, int N> __device__ __forceinline__ void reg_fence_first(uint32_t (&r)[N][4]) {
    static_assert(K <= N, "a prefix of the array");
#pragma unroll
    for (int i = 0; i < K; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) asm volatile("" : "+r"(r[i][j])::"memory");
}

/* mbarriers (shared memory, 8 bytes each). */
__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
/* Makes the initialised barriers visible to the tensor memory accelerator. */
__device__ __forceinline__ void mbar_init_fence() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }
__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
/* Blocks until the barrier's phase with this parity has completed. */
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
    uint32_t done = 0;
    do {
        asm volatile(
            "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
            : "=r"(done)
            : "r"(bar), "r"(parity)
            : "memory");
    } while (!done);
}

/* TMA: a box of a 4-D tensor (head dim, sequence, head, batch) into shared memory, completing on bar. */
__device__ __forceinline__ void tma_load(uint32_t dst, const CUtensorMap *map, int c0, int c1, int c2, int c3,
                                         uint32_t bar) {
    asm volatile(
        "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], [%6];\n" ::"r"(dst),
        "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar)
        : "memory");
}

/* An L2 policy for lines read once (createpolicy): they are the first a set gives up, so that
 * loading them evicts neither each other's set-mates nor lines other kernels left (dirty ones
 * written back while the loads wait). */
__device__ __forceinline__ uint64_t l2_evict_first_policy() {
    uint64_t pol;
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(pol));
    return pol;
}

/* f(std::true_type{}) where `hint`, else f(std::false_type{}): loads written once with the *_policy<kHint>
 * forms, compiled with the L2 policy and without it, the branch outside them. */
template <class F> __device__ __forceinline__ void with_l2_hint(bool hint, F &&f) {
    if (hint) f(std::true_type{});
    else f(std::false_type{});
}

/* tma_load, its box's lines loaded with the L2 policy `policy` (l2_evict_first_policy) where kHint. */
template <bool kHint>
__device__ __forceinline__ void tma_load_policy(uint32_t dst, const CUtensorMap *map, int c0, int c1, int c2, int c3,
                                                uint32_t bar, uint64_t policy) {
    if constexpr (!kHint) {
        tma_load(dst, map, c0, c1, c2, c3, bar);
    } else {
        asm volatile(
            "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1, {%2, %3, %4, %5}], [%6], %7;\n" ::"r"(dst),
            "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar), "l"(policy)
            : "memory");
    }
}

/* tma_load and tma_load_policy for a 5-dimensional map (full-width page boxes: fused_sm90_launch.cuh,
 * encode_page_groups_map). */
__device__ __forceinline__ void tma_load_5d(uint32_t dst, const CUtensorMap *map, int c0, int c1, int c2, int c3, int c4,
                                            uint32_t bar) {
    asm volatile(
        "cp.async.bulk.tensor.5d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5, %6}], [%7];\n" ::"r"(dst),
        "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(c4), "r"(bar)
        : "memory");
}
template <bool kHint>
__device__ __forceinline__ void tma_load_5d_policy(uint32_t dst, const CUtensorMap *map, int c0, int c1, int c2, int c3,
                                                   int c4, uint32_t bar, uint64_t policy) {
    if constexpr (!kHint) {
        tma_load_5d(dst, map, c0, c1, c2, c3, c4, bar);
    } else {
        asm volatile(
            "cp.async.bulk.tensor.5d.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1, {%2, %3, %4, %5, %6}], [%7], %8;\n" ::"r"(dst),
            "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(c4), "r"(bar), "l"(policy)
            : "memory");
    }
}

/* The same box brought into the L2 only (no shared memory, no barrier; a hint the memory system
 * may drop): a tma_load of it soon after reads the L2 rather than DRAM. */
__device__ __forceinline__ void tma_prefetch_l2(const CUtensorMap *map, int c0, int c1, int c2, int c3) {
    asm volatile("cp.async.bulk.prefetch.tensor.4d.L2.global.tile [%0, {%1, %2, %3, %4}];\n" ::"l"(
                     reinterpret_cast<uint64_t>(map)),
                 "r"(c0), "r"(c1), "r"(c2), "r"(c3)
                 : "memory");
}

/* Shared-memory matrix descriptor, 128-byte swizzle. Byte offsets: lbo between 64-column regions
 * of an N-major operand (unused, 16, for K-major), sbo between groups of 8 rows. */
__device__ __forceinline__ uint64_t smem_desc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
    return (uint64_t)((addr & 0x3FFFFu) >> 4) | ((uint64_t)(lbo >> 4) << 16) |
           ((uint64_t)(sbo >> 4) << 32) | (1ull << 62);
}
/* smem_desc(addr, lbo, sbo) in two words, for the descriptors of addresses a constant number of
 * bytes further on (a tile's k-steps): at(bytes) == smem_desc(addr + bytes, lbo, sbo) with one
 * 32-bit add to the low word, where building each from its address takes a dozen uniform
 * instructions (mask, shift, or, moves) a wgmma. Exact for any shared-memory address: the address
 * field is bits 0-13 (address / 16, below 2^14 for addresses below 256 KB), so the add never
 * carries into the leading byte offset above it. */
struct smem_desc_base {
    uint32_t lo, hi;
    __device__ __forceinline__ smem_desc_base(uint32_t addr, uint32_t lbo, uint32_t sbo)
        : lo(((addr & 0x3FFFFu) >> 4) | ((lbo >> 4) << 16)), hi((sbo >> 4) | (1u << 30)) {}
    __device__ __forceinline__ uint64_t at(uint32_t bytes) const {
        return ((uint64_t)hi << 32) | (uint32_t)(lo + (bytes >> 4));
    }
};

/* 16-byte asynchronous copy global -> shared (zero-filled when !valid, src not read), an mbarrier
 * arrival that follows the thread's copies, and the proxy fence that orders such generic-proxy
 * writes before the tensor cores (async proxy) read them. */
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void *src, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0)
                 : "memory");
}
/* cp_async_16, the line loaded with the L2 policy `pol` (l2_evict_first_policy) where kHint. */
template <bool kHint>
__device__ __forceinline__ void cp_async_16_policy(uint32_t dst, const void *src, bool valid, uint64_t pol) {
    if constexpr (!kHint) {
        cp_async_16(dst, src, valid);
    } else {
        asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2, %3;\n" ::"r"(dst), "l"(src),
                     "r"(valid ? 16 : 0), "l"(pol)
                     : "memory");
    }
}
/* An arrival on the mbarrier at `bar` that takes place once every cp.async this thread issued so far
 * has landed (counted as one of the barrier's expected arrivals: .noinc). The thread does not wait. */
__device__ __forceinline__ void cp_async_mbar_arrive(uint32_t bar) {
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void fence_proxy_async_shared() {
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

/* TMA store: a box of shared memory (laid out as tma_load writes it) to a 4-D tensor, in a bulk
 * group; the group's commit; and the waits until every committed group has read its shared memory
 * (which may then be rewritten) or has completed. Out-of-bounds elements of the box are not written. */
__device__ __forceinline__ void tma_store(const CUtensorMap *map, uint32_t src, int c0, int c1, int c2, int c3) {
    asm volatile(
        "cp.async.bulk.tensor.4d.global.shared::cta.bulk_group [%0, {%2, %3, %4, %5}], [%1];\n" ::"l"(
            reinterpret_cast<uint64_t>(map)),
        "r"(src), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
        : "memory");
}
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
__device__ __forceinline__ void bulk_wait_read() { asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory"); }
__device__ __forceinline__ void bulk_wait() { asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory"); }

/* Byte offset of 16-byte chunk `ch` of row r in a swizzled tile of kRows rows. */
template <int kRows> __device__ __forceinline__ uint32_t swz_off(int r, int ch) {
    return (uint32_t)((ch / 8) * (kRows * 128) + r * 128 + (((ch % 8) ^ (r % 8)) << 4));
}

}  // namespace sm90
}  // namespace fa
