// test_gpu.cpp - correctness on the device: the REFERENCE backend against the fp64 CPU oracle, the
// FUSED backend by FlashAttention's rule over a wide matrix, determinism, bad inputs leaving outputs
// untouched, CUDA-graph capture, and many host threads. Every test skips with a reason when the
// machine has no CUDA device; the host-only tests still run there.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <initializer_list>
#include <thread>
#include <utility>
#include <vector>

#include "gpu_util.h"

using namespace fatest;

namespace {

using Gpu = GpuTest;

bool device_has_sm90_backend() {
    int dev = 0, major = 0, minor = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess)
        return false;
    return major == 9 && minor == 0 && fa_sm90_compiled(FLASHATTN_DTYPE_BFLOAT16, 128);
}

// REFERENCE plus every fused backend this device and build have.
std::vector<int> all_backends() {
    std::vector<int> b = {FLASHATTN_BACKEND_REFERENCE, FLASHATTN_BACKEND_FUSED};
    if (device_has_sm90_backend()) b.push_back(FLASHATTN_BACKEND_FUSED_SM90);
    return b;
}

// The FUSED_SM90 tests: the same checks, on devices and builds that have that backend.
class GpuSm90 : public Gpu {
  protected:
    void SetUp() override {
        Gpu::SetUp();
        if (HasFatalFailure() || IsSkipped()) return;
        int dev = 0, major = 0, minor = 0;
        ASSERT_EQ(cudaSuccess, cudaGetDevice(&dev));
        ASSERT_EQ(cudaSuccess, cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
        ASSERT_EQ(cudaSuccess, cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
        if (major != 9 || minor != 0)
            GTEST_SKIP() << "FUSED_SM90 needs a compute capability 9.0 device; this one is " << major << "."
                         << minor;
        if (!fa_sm90_compiled(FLASHATTN_DTYPE_BFLOAT16, 128))
            GTEST_SKIP() << "this build has no FUSED_SM90 head-dim-128 kernel, which these tests need "
                            "(CMAKE_CUDA_ARCHITECTURES without 90a, or FLASHATTN_HEAD_DIMS without 128)";
    }
};

// Whether this build compiled `backend`'s kernels for head dim d in both dtypes (FLASHATTN_HEAD_DIMS
// restricts them; REFERENCE takes every head dim).
bool built(int backend, int64_t d) {
    for (int dt : {FLASHATTN_DTYPE_BFLOAT16, FLASHATTN_DTYPE_FLOAT16}) {
        if (backend == FLASHATTN_BACKEND_FUSED && !fa_fused_compiled(dt, fa_fused_kernel_head_dim(d))) return false;
        if (backend == FLASHATTN_BACKEND_FUSED_SM90 && !fa_sm90_compiled(dt, fa_sm90_kernel_head_dim(d))) return false;
    }
    return true;
}

// A test whose assertions need `backend`'s kernels at every listed head dim skips, naming the one
// this build lacks (a development build restricted by FLASHATTN_HEAD_DIMS).
#define SKIP_UNLESS_BUILT(backend, ...)                                                                  \
    do {                                                                                                 \
        for (int64_t d_ : {__VA_ARGS__})                                                                 \
            if (!built(backend, d_))                                                                     \
                GTEST_SKIP() << "this build lacks the " << ((backend) == FLASHATTN_BACKEND_FUSED_SM90 ? "FUSED_SM90" : "FUSED") \
                             << " kernels for head dim " << d_ << " (FLASHATTN_HEAD_DIMS)";              \
    } while (0)
#define ALL_HEAD_DIMS 32, 64, 96, 128, 160, 192, 256

// Relative rounding of one output element in the dtype (one full ulp, twice the round-off).
double dtype_ulp(int dtype) { return dtype == FLASHATTN_DTYPE_BFLOAT16 ? 1.0 / 128 : 1.0 / 1024; }

// ---- REFERENCE against the fp64 oracle -------------------------------------------------------------

struct RefStats { int cases = 0; double max_o_err = 0, max_lse_err = 0; };

void check_reference(flashattn_handle *h, const Case &c, RefStats &st) {
    SCOPED_TRACE(c.str());
    Inputs in(c);
    const Result r = run(h, in, FLASHATTN_BACKEND_REFERENCE, false, true);
    ASSERT_EQ(FLASHATTN_STATUS_SUCCESS, r.status) << flashattn_last_error();
    EXPECT_EQ(0u, r.unwritten);
    EXPECT_EQ(0u, r.gap_writes);
    const Oracle ora = oracle(in);
    double worst = 0;
    for (size_t x = 0; x < ora.o.size(); ++x) {
        const double err = std::fabs(r.o[x] - ora.o[x]);
        const double tol = dtype_ulp(c.dtype) * std::fabs(ora.o[x]) + 2e-5;
        if (!(err <= tol)) {
            ADD_FAILURE() << "O[" << x << "] = " << r.o[x] << ", oracle " << ora.o[x];
            break;
        }
        worst = std::max(worst, err);
    }
    const double f32_err = max_abs_diff(r.o_f32, ora.o);
    EXPECT_LE(f32_err, 2e-4) << "fp32 O of the reference";
    if (c.lse) {
        const double lse_err = max_abs_diff(r.lse, ora.lse);
        EXPECT_LE(lse_err, 1e-3);
        st.max_lse_err = std::max(st.max_lse_err, lse_err);
    }
    st.max_o_err = std::max(st.max_o_err, worst);
    ++st.cases;
}

TEST_F(Gpu, ReferenceMatchesOracleAcrossShapesAndDtypes) {
    RefStats st;
    const int64_t dims[] = {32, 40, 64, 72, 128, 200, 256};
    const std::pair<int64_t, int64_t> seqs[] = {{1, 239}, {113, 203}, {203, 113}, {128, 128}, {64, 1}};
    for (int dtype : {FLASHATTN_DTYPE_FLOAT16, FLASHATTN_DTYPE_BFLOAT16})
        for (int64_t d : dims)
            for (auto [sq, sk] : seqs)
                for (int mask : {FLASHATTN_MASK_NONE, FLASHATTN_MASK_CAUSAL_BOTTOM_RIGHT, FLASHATTN_MASK_CAUSAL_TOP_LEFT}) {
                    Case c;
                    c.dtype = dtype, c.d = d, c.sq = sq, c.sk = sk, c.mask = mask, c.b = 2, c.hq = 2, c.hkv = 2;
                    check_reference(h, c, st);
                }
    printf("[ reference ] %d cases vs fp64 oracle: max |O err| %.3g, max |LSE err| %.3g\n", st.cases, st.max_o_err, st.max_lse_err);
}

TEST_F(Gpu, ReferenceFeatures) {
    RefStats st;
    std::vector<Case> cases;
    for (int dtype : {FLASHATTN_DTYPE_FLOAT16, FLASHATTN_DTYPE_BFLOAT16}) {
        Case c;
        c.dtype = dtype, c.sq = 97, c.sk = 150, c.d = 64;
        Case w = c; w.wl = 16, w.wr = 4; cases.push_back(w);
        w.mask = FLASHATTN_MASK_CAUSAL_BOTTOM_RIGHT; cases.push_back(w);
        w.mask = FLASHATTN_MASK_CAUSAL_TOP_LEFT; w.wl = 0; w.wr = -1; cases.push_back(w);
        Case s = c; s.softcap = 0.5f; s.scale = 0.3f; cases.push_back(s);
        Case a = c; a.alibi = true; a.mask = FLASHATTN_MASK_CAUSAL_BOTTOM_RIGHT; cases.push_back(a);
        a.mask = FLASHATTN_MASK_NONE; a.softcap = 2.0f; cases.push_back(a);
        Case g = c; g.hq = 8, g.hkv = 2; cases.push_back(g);      // GQA
        g.hkv = 1; cases.push_back(g);                              // MQA
        Case l = c; l.layout = kHeadMajor; cases.push_back(l);
        l.layout = kPadded; l.hq = 4; l.hkv = 2; cases.push_back(l);
        Case z = c; z.sk = 0; cases.push_back(z);                   // no keys: O = 0, LSE = -inf
        Case fm = c; fm.sq = 150; fm.sk = 97; fm.mask = FLASHATTN_MASK_CAUSAL_BOTTOM_RIGHT; cases.push_back(fm);  // 53 rows see nothing
        Case wm = c; wm.wl = 0; wm.wr = 0; wm.sq = 40; wm.sk = 20; cases.push_back(wm);  // window past the keys
        Case nolse = c; nolse.lse = false; cases.push_back(nolse);
    }
    for (const Case &c : cases) check_reference(h, c, st);
    printf("[ reference ] %d feature cases vs fp64 oracle: max |O err| %.3g, max |LSE err| %.3g\n", st.cases, st.max_o_err, st.max_lse_err);
}

TEST_F(Gpu, EmptyRowsAreZeroAndLseMinusInf) {
    SKIP_UNLESS_BUILT(FLASHATTN_BACKEND_FUSED, 64);
    if (device_has_sm90_backend()) SKIP_UNLESS_BUILT(FLASHATTN_BACKEND_FUSED_SM90, 64);

    for (int backend : all_backends()) {
        Case c;
        c.sq = 150, c.sk = 97, c.mask = FLASHATTN_MASK_CAUSAL_BOTTOM_RIGHT;  // rows 0..52 see nothing
        Inputs in(c);
        const Result r = run(h, in, backend);
        ASSERT_EQ(FLASHATTN_STATUS_SUCCESS, r.status) << flashattn_last_error();
        for (int64_t hh = 0; hh < c.hq; ++hh)
            for (int64_t i = 0; i < c.sq; ++i) {
                const float lse = r.lse[hh * c.sq + i];
                if (i < 53) {
                    EXPECT_TRUE(std::isinf(lse) && lse < 0) << "backend " << backend << " row " << i;
                    for (int64_t d = 0; d < c.d; ++d) ASSERT_EQ(0.0f, r.o[(i * c.hq + hh) * c.d + d]);
                } else {
                    EXPECT_TRUE(std::isfinite(lse)) << "backend " << backend << " row " << i;
                }
            }
        c.sk = 0;
        Inputs in0(c);
        const Result r0 = run(h, in0, backend);
        ASSERT_EQ(FLASHATTN_STATUS_SUCCESS, r0.status) << flashattn_last_error();
        EXPECT_EQ(0u, r0.unwritten);
        for (float x : r0.o) ASSERT_EQ(0.0f, x);
        for (float x : r0.lse) ASSERT_TRUE(std::isinf(x) && x < 0);
    }
}

// ---- FUSED by FlashAttention's rule ------------------------------------------------------------------

struct RuleStats { int cases = 0, not_built = 0; double worst_ratio = 0, max_err = 0, max_lse_err = 0; std::string worst_case; };

// max|fused - hi| <= 2 * max|lowprec - hi| + atol, hi = fp64 oracle (small) or the reference's fp32 O.
void check_fa_rule(flashattn_handle *h, const Case &c, RuleStats &st, int backend = FLASHATTN_BACKEND_FUSED) {
    SCOPED_TRACE(c.str() + (backend == FLASHATTN_BACKEND_FUSED_SM90 ? " [fused_sm90]" : " [fused]"));
    if (!built(backend, c.d)) {  // (counted and said by print_rule)
        ++st.not_built;
        return;
    }
    Inputs in(c);
    const Result f = run(h, in, backend);
    ASSERT_EQ(FLASHATTN_STATUS_SUCCESS, f.status) << flashattn_last_error();
    EXPECT_EQ(0u, f.unwritten);
    EXPECT_EQ(0u, f.gap_writes);
    const Result low = run(h, in, FLASHATTN_BACKEND_REFERENCE, true);
    ASSERT_EQ(FLASHATTN_STATUS_SUCCESS, low.status) << flashattn_last_error();
    double err_f, err_l, lse_err = 0;
    const bool small = c.b * c.hq * c.sq * c.sk * c.d <= (int64_t)1 << 23;
    if (small) {
        const Oracle ora = oracle(in);
        err_f = max_abs_diff(f.o, ora.o), err_l = max_abs_diff(low.o, ora.o);
        if (c.lse) lse_err = max_abs_diff(f.lse, ora.lse);
    } else {
        const Result hi = run(h, in, FLASHATTN_BACKEND_REFERENCE, false, true);
        ASSERT_EQ(FLASHATTN_STATUS_SUCCESS, hi.status) << flashattn_last_error();
        err_f = max_abs_diff(f.o, hi.o_f32), err_l = max_abs_diff(low.o, hi.o_f32);
        if (c.lse) lse_err = max_abs_diff(f.lse, hi.lse);
    }
    constexpr double kAtol = 1e-5;
    EXPECT_LE(err_f, 2 * err_l + kAtol) << "fused error " << err_f << " vs plain low-precision " << err_l;
    EXPECT_LE(lse_err, 2e-3);
    const double ratio = err_f / std::max(err_l, kAtol);
    if (ratio > st.worst_ratio) st.worst_ratio = ratio, st.worst_case = c.str();
    st.max_err = std::max(st.max_err, err_f);
    st.max_lse_err = std::max(st.max_lse_err, lse_err);
    ++st.cases;
}

void print_rule(const char *name, const RuleStats &st, int backend = FLASHATTN_BACKEND_FUSED) {
    printf("[ %s ] %s: %d cases, max |O err| %.3g, max |LSE err| %.3g, worst err/lowprec-err %.2f (%s)\n",
           backend == FLASHATTN_BACKEND_FUSED_SM90 ? "fused_sm90" : "fused", name, st.cases, st.max_err,
           st.max_lse_err, st.worst_ratio, st.worst_case.c_str());
    if (st.not_built > 0)
        printf("[ %s ] %s: %d cases not run: this build lacks their head dims' kernels\n",
               backend == FLASHATTN_BACKEND_FUSED_SM90 ? "fused_sm90" : "fused", name, st.not_built);
    if (st.cases == 0 && st.not_built > 0) GTEST_SKIP() << "this build lacks the kernels of every case's head dim";
}

const int64_t kRuleDims[] = {32, 40, 64, 80, 96, 128, 160, 192, 224, 256};
const std::pair<int64_t, int64_t> kRuleSeqs[] = {{1, 239}, {239, 1}, {113, 203}, {203, 113}, {128, 217},
                                                 {217, 128}, {108, 256}, {256, 108}, {256, 512}, {512, 256},
                                                 {1023, 1024}, {1024, 1023}, {2048, 2048}};

void rule_bf16(flashattn_handle *h, int backend) {
    RuleStats st;
    for (int64_t d : kRuleDims)
        for (auto [sq, sk] : kRuleSeqs)
            for (auto [hq, hkv] : {std::pair<int64_t, int64_t>{4, 4}, {4, 2}, {4, 1}})
                for (int m = 0; m < 4; ++m) {
                    Case c;
                    c.dtype = FLASHATTN_DTYPE_BFLOAT16, c.d = d, c.sq = sq, c.sk = sk, c.hq = hq, c.hkv = hkv;
                    c.b = (sq * sk > 300000) ? 1 : 2;
                    if (m < 3) c.mask = m;
                    else c.wl = 64, c.wr = 16;  // sliding window
                    check_fa_rule(h, c, st, backend);
                }
    print_rule("bf16 (head dims x seqlens x MHA/GQA/MQA x none/causal-br/causal-tl/window)", st, backend);
}

void rule_fp16(flashattn_handle *h, int backend) {
    RuleStats st;
    for (int64_t d : kRuleDims)
        for (auto [sq, sk] : kRuleSeqs)
            for (int mask : {FLASHATTN_MASK_NONE, FLASHATTN_MASK_CAUSAL_BOTTOM_RIGHT}) {
                Case c;
                c.dtype = FLASHATTN_DTYPE_FLOAT16, c.d = d, c.sq = sq, c.sk = sk, c.hq = 4, c.hkv = 2, c.mask = mask;
                check_fa_rule(h, c, st, backend);
            }
    print_rule("fp16 (head dims x seqlens x GQA x none/causal-br)", st, backend);
}

void rule_features(flashattn_handle *h, int backend) {
    RuleStats st;
    for (int dtype : {FLASHATTN_DTYPE_FLOAT16, FLASHATTN_DTYPE_BFLOAT16})
        for (int64_t d : {40, 64, 128, 256})
            for (auto [sq, sk] : {std::pair<int64_t, int64_t>{113, 203}, {256, 512}, {1023, 1024}, {300, 77}}) {
                Case c;
                c.dtype = dtype, c.d = d, c.sq = sq, c.sk = sk, c.hq = 4, c.hkv = 2;
                Case s = c; s.softcap = 1.5f; s.scale = 0.5f; check_fa_rule(h, s, st, backend);
                Case a = c; a.alibi = true; a.mask = FLASHATTN_MASK_CAUSAL_BOTTOM_RIGHT; check_fa_rule(h, a, st, backend);
                Case as = c; as.alibi = true; as.softcap = 5.0f; check_fa_rule(h, as, st, backend);
                Case w = c; w.wl = 0; w.wr = 0; check_fa_rule(h, w, st, backend);
                Case wl = c; wl.wl = 100; wl.mask = FLASHATTN_MASK_CAUSAL_TOP_LEFT; check_fa_rule(h, wl, st, backend);
                Case l1 = c; l1.layout = kHeadMajor; check_fa_rule(h, l1, st, backend);
                Case l2 = c; l2.layout = kPadded; l2.mask = FLASHATTN_MASK_CAUSAL_BOTTOM_RIGHT; check_fa_rule(h, l2, st, backend);
                Case sc = c; sc.scale = 0.02f; sc.lse = false; check_fa_rule(h, sc, st, backend);
            }
    print_rule("features (softcap, ALiBi, windows, layouts, scale, no LSE)", st, backend);
}

TEST_F(Gpu, FusedFlashAttentionRuleBf16) { rule_bf16(h, FLASHATTN_BACKEND_FUSED); }
TEST_F(Gpu, FusedFlashAttentionRuleFp16) { rule_fp16(h, FLASHATTN_BACKEND_FUSED); }
TEST_F(Gpu, FusedFeatures) { rule_features(h, FLASHATTN_BACKEND_FUSED); }
TEST_F(GpuSm90, FlashAttentionRuleBf16) { rule_bf16(h, FLASHATTN_BACKEND_FUSED_SM90); }
TEST_F(GpuSm90, FlashAttentionRuleFp16) { rule_fp16(h, FLASHATTN_BACKEND_FUSED_SM90); }
TEST_F(GpuSm90, Features) { rule_features(h, FLASHATTN_BACKEND_FUSED_SM90); }

// The running max raised late: K's rows scaled up along the keys, so that a key tile's row max
// exceeds the last one's by less than, about, and more than the slack within which the lazy loops
// keep the old max (8 in log2 units: softmax_new_max_lazy; FUSED_SM90 at head dims 192 and 256,
// FUSED at 160 and 192), and O accumulates probabilities up to 2^8 before a raise rescales it.
// Plain random inputs raise the max after the first key tile too rarely to tell a loop that never
// rescales from a right one. Every head dim class, both dtypes, with and without a causal mask, by
// FlashAttention's rule.
void rule_running_max_raised_late(flashattn_handle *h, int backend) {
    RuleStats st;
    for (int dtype : {FLASHATTN_DTYPE_BFLOAT16, FLASHATTN_DTYPE_FLOAT16})
        for (int64_t d : {64, 128, 160, 192, 256})
            for (float ramp : {3.0f, 12.0f, 40.0f})
                for (int mask : {FLASHATTN_MASK_NONE, FLASHATTN_MASK_CAUSAL_BOTTOM_RIGHT}) {
                    Case c;
                    c.dtype = dtype, c.d = d, c.sq = 256, c.sk = 1024, c.hq = 4, c.hkv = 2, c.mask = mask, c.ramp = ramp;
                    check_fa_rule(h, c, st, backend);
                }
    print_rule("running max raised late (K ramped along the keys)", st, backend);
}
TEST_F(Gpu, FusedRunningMaxRaisedLate) { rule_running_max_raised_late(h, FLASHATTN_BACKEND_FUSED); }
TEST_F(GpuSm90, RunningMaxRaisedLate) { rule_running_max_raised_late(h, FLASHATTN_BACKEND_FUSED_SM90); }

// FUSED_SM90 at head dims 160-256 (key tiles of 112 and 80) computes a last key tile in which the
// keys any of the block's rows can see end at most 32 keys in over those 32 keys alone (S, softmax
// and P V narrowed); one key further it computes the whole tile. Key counts n k + r on both sides
// of that edge (r = 1, 16, 32, 33, n), with no mask, causal (the diagonal tiles end anywhere), a
// window whose right edge ends the keys early, split decode (the last split's tile), softcap and
// ALiBi with padded strides, and resident blocks (more tiles than SMs), by FlashAttention's rule.
TEST_F(GpuSm90, NarrowLastKeyTile) {
    SKIP_UNLESS_BUILT(FLASHATTN_BACKEND_FUSED_SM90, 160, 192, 256);

    RuleStats st;
    for (int dtype : {FLASHATTN_DTYPE_BFLOAT16, FLASHATTN_DTYPE_FLOAT16})
        for (int64_t d : {160, 192, 256}) {
            const int64_t n = d == 256 ? 80 : 112;
            for (int64_t r : {int64_t{1}, int64_t{16}, int64_t{32}, int64_t{33}, n}) {
                Case c;
                c.dtype = dtype, c.d = d, c.hq = 4, c.hkv = 2, c.sq = 200, c.sk = 3 * n + r;
                check_fa_rule(h, c, st, FLASHATTN_BACKEND_FUSED_SM90);
                Case k = c;
                k.mask = FLASHATTN_MASK_CAUSAL_BOTTOM_RIGHT, k.sq = k.sk;
                check_fa_rule(h, k, st, FLASHATTN_BACKEND_FUSED_SM90);
                Case w = c;
                w.sq = w.sk, w.wl = n + 7, w.wr = r;
                check_fa_rule(h, w, st, FLASHATTN_BACKEND_FUSED_SM90);
                Case dec = c;
                dec.sq = 1, dec.hq = 8, dec.hkv = 1, dec.sk = 40 * n + r;
                check_fa_rule(h, dec, st, FLASHATTN_BACKEND_FUSED_SM90);
            }
            Case f;
            f.dtype = dtype, f.d = d, f.hq = 4, f.hkv = 2, f.sq = 150, f.sk = 5 * n + 16;
            f.softcap = 3.0f, f.alibi = true, f.layout = kPadded;
            check_fa_rule(h, f, st, FLASHATTN_BACKEND_FUSED_SM90);
            Case p;
            p.dtype = dtype, p.d = d, p.b = 2, p.hq = p.hkv = 16, p.sq = 1024, p.sk = 12 * n + 16;
            check_fa_rule(h, p, st, FLASHATTN_BACKEND_FUSED_SM90);
            p.mask = FLASHATTN_MASK_CAUSAL_BOTTOM_RIGHT;
            check_fa_rule(h, p, st, FLASHATTN_BACKEND_FUSED_SM90);
        }
    print_rule("last key tile narrowed (keys ending 1-33 keys into a 112- or 80-key tile)", st,
               FLASHATTN_BACKEND_FUSED_SM90);
}

// A small, representative set for compute-sanitizer (memcheck, racecheck, initcheck, synccheck):
// every compiled head dim, ragged lengths, each mask, softcap/ALiBi, GQA, padded strides, blocks
// with rowless warps (decode, a few queries), both backends.
TEST_F(Gpu, SanitizerSubset) {
    SKIP_UNLESS_BUILT(FLASHATTN_BACKEND_FUSED, ALL_HEAD_DIMS);

    RuleStats st;
    for (int64_t d : {32, 64, 96, 128, 160, 192, 256}) {
        Case c;
        c.d = d, c.sq = 77, c.sk = 150, c.hq = 4, c.hkv = 2, c.b = 1;
        c.mask = (int)(d / 32 % 3);
        check_fa_rule(h, c, st);
        Case f = c;
        f.softcap = 2.0f, f.alibi = true, f.layout = kPadded, f.wl = 40, f.wr = 5, f.sq = 150, f.sk = 77;
        check_fa_rule(h, f, st);
        Case dec = c;  // a decode's grouped heads, and five queries: blocks with rowless warps
        dec.sq = 1, dec.hq = 8, dec.sk = 300 + d;
        check_fa_rule(h, dec, st);
        Case few = c;
        few.sq = 5, few.hq = few.hkv = 2, few.mask = FLASHATTN_MASK_CAUSAL_TOP_LEFT;
        check_fa_rule(h, few, st);
        // The same two on the idle-warp kernel's softcap/ALiBi instantiation: a softcapped decode
        // (its keys split where d puts fewer blocks than the GPU holds), five queries with ALiBi.
        Case dec_cap = dec, few_alibi = few;
        dec_cap.softcap = 5.0f, dec_cap.sk = 2000 + 7 * d;
        few_alibi.alibi = true;
        for (const Case *x : {&dec, &few, &dec_cap, &few_alibi}) {
            const std::string desc = plan_for(h, Inputs(*x), FLASHATTN_BACKEND_FUSED).description;
            EXPECT_NE(std::string::npos, desc.find(" idle_warps=")) << x->str() << ": " << desc;
        }
        check_fa_rule(h, dec_cap, st);
        check_fa_rule(h, few_alibi, st);
    }
    print_rule("sanitizer subset", st);
}

TEST_F(GpuSm90, SanitizerSubset) {
    SKIP_UNLESS_BUILT(FLASHATTN_BACKEND_FUSED_SM90, 64, 128, 256);

    RuleStats st;
    for (int64_t d : {64, 128, 256}) {
        Case c;
        c.d = d, c.sq = 77, c.sk = 150, c.hq = 4, c.hkv = 2, c.b = 1;
        c.mask = (int)(d / 64 % 3);
        check_fa_rule(h, c, st, FLASHATTN_BACKEND_FUSED_SM90);
        // Sizes as small as the FUSED subset's: at sq=300, sk=200 initcheck reported the REFERENCE
        // softmax reading the score matrix cuBLAS had just written as uninitialised (every result
        // was correct), so larger shapes would hide this kernel's own report behind cuBLAS's.
        Case f = c;
        f.softcap = 2.0f, f.alibi = true, f.layout = kPadded, f.wl = 40, f.wr = 5, f.sq = 150, f.sk = 77;
        check_fa_rule(h, f, st, FLASHATTN_BACKEND_FUSED_SM90);
        Case g = c;
        g.sq = 150, g.sk = 150, g.mask = FLASHATTN_MASK_CAUSAL_TOP_LEFT;
        check_fa_rule(h, g, st, FLASHATTN_BACKEND_FUSED_SM90);
        // A split decode on one consumer's tile (head dims 64 and 128), whose key loop issues S_j
        // before it waits for V_{j-1}.
        if (d != 256) {
            Case dec = c;
            dec.sq = 1, dec.hq = 8, dec.mask = FLASHATTN_MASK_NONE, dec.sk = 1500 + 3 * d;
            const std::string desc = plan_for(h, Inputs(dec), FLASHATTN_BACKEND_FUSED_SM90).description;
            EXPECT_NE(std::string::npos, desc.find("_m64_")) << dec.str() << ": " << desc;
            EXPECT_EQ(std::string::npos, desc.find("splits=1 ")) << dec.str() << ": " << desc;
            check_fa_rule(h, dec, st, FLASHATTN_BACKEND_FUSED_SM90);
        }
        // Persistent blocks (more tiles than SMs; no mask, or causal): checked against the FUSED kernel, which
        // the rule checks elsewhere, so that no REFERENCE call of this size runs under the tools.
        Case q = c;
        q.b = 3, q.hq = q.hkv = 8, q.sq = 1000, q.sk = 100, q.mask = FLASHATTN_MASK_NONE, q.softcap = d == 128 ? 3.0f : 0.0f;
        if (d == 64) q.sk = 1100, q.mask = FLASHATTN_MASK_CAUSAL_BOTTOM_RIGHT;  // pairs of tiles
        Inputs in(q);
        const Result a = run(h, in, FLASHATTN_BACKEND_FUSED_SM90), b = run(h, in, FLASHATTN_BACKEND_FUSED);
        ASSERT_EQ(FLASHATTN_STATUS_SUCCESS, a.status) << flashattn_last_error();
        ASSERT_EQ(FLASHATTN_STATUS_SUCCESS, b.status) << flashattn_last_error();
        EXPECT_EQ(0u, a.unwritten);
        EXPECT_LE(max_abs_diff(a.o, b.o), 2e-2) << q.str();
        EXPECT_LE(max_abs_diff(a.lse, b.lse), 1e-4) << q.str();
    }
    print_rule("sanitizer subset", st, FLASHATTN_BACKEND_FUSED_SM90);
}

// FUSED blocks whose warps are not all given query rows: a decode's grouped query heads (2 to 48
// rows of a tile), a few queries of one head, the keys split or not, both causal masks, a window,
// padded strides, fp16, no LSE, softcap, ALiBi, every head dim; the plan takes the idle-warp
// kernel exactly where a block has a rowless warp (and the full-tile kernel elsewhere: checked too).
TEST_F(Gpu, FusedWarpsWithNoQueryRowComputeNothing) {
    SKIP_UNLESS_BUILT(FLASHATTN_BACKEND_FUSED, ALL_HEAD_DIMS);

    RuleStats st;
    int idle_calls = 0, idle_split = 0, full_calls = 0;
    struct Shape { int64_t b, hq, hkv, sq, sk; };
    const Shape shapes[] = {{1, 8, 4, 1, 4099},   {3, 32, 8, 1, 1000},  {2, 16, 1, 1, 777}, {1, 48, 1, 1, 3000},
                            {2, 4, 4, 1, 2500},   {1, 4, 4, 5, 300},     {2, 2, 2, 17, 129}, {1, 2, 1, 33, 1500},
                            {1, 2, 2, 96, 250},   {1, 2, 2, 97, 250},    {1, 2, 2, 48, 4000}, {2, 64, 4, 1, 600}};
    for (int64_t d : {32, 64, 96, 128, 160, 192, 256}) {
        if (!fa_fused_compiled(FLASHATTN_DTYPE_BFLOAT16, fa_fused_kernel_head_dim(d))) continue;
        int i = 0;
        for (const Shape &sh : shapes) {
            Case c;
            c.b = sh.b, c.hq = sh.hq, c.hkv = sh.hkv, c.sq = sh.sq, c.sk = sh.sk, c.d = d;
            const int v = (i++ + (int)(d / 32)) % 7;
            if (v == 1) c.mask = FLASHATTN_MASK_CAUSAL_BOTTOM_RIGHT, c.dtype = FLASHATTN_DTYPE_FLOAT16;
            if (v == 2) c.mask = FLASHATTN_MASK_CAUSAL_TOP_LEFT, c.layout = kPadded;
            if (v == 3) c.lse = false, c.wl = 100, c.wr = 0;
            if (v == 4) c.layout = kHeadMajor;
            if (v == 5) c.softcap = 5.0f;
            if (v == 6) c.alibi = true, c.softcap = 20.0f, c.mask = FLASHATTN_MASK_CAUSAL_BOTTOM_RIGHT;
            const flashattn_plan_info info = plan_for(h, Inputs(c), FLASHATTN_BACKEND_FUSED);
            const std::string desc = info.description;
            const int64_t rows = desc.find(" gqa_rows") != std::string::npos ? c.hq / c.hkv : c.sq;
            const int64_t per_warp = info.block_m / info.num_warps;
            const int64_t want = rows > info.block_m ? 0 : info.num_warps - (rows + per_warp - 1) / per_warp;
            const size_t at = desc.find(" idle_warps=");
            EXPECT_EQ(want > 0, at != std::string::npos) << c.str() << ": " << desc;
            if (at != std::string::npos) EXPECT_EQ(want, std::atoll(desc.c_str() + at + 12)) << desc;
            idle_calls += want > 0, idle_split += want > 0 && info.num_splits > 1;
            full_calls += want == 0;
            check_fa_rule(h, c, st, FLASHATTN_BACKEND_FUSED);
        }
    }
    print_rule("blocks with rowless warps (grouped decode heads, a few queries)", st);
    printf("[ fused ] blocks with rowless warps: %d calls on the idle-warp kernel (%d split), %d on the full-tile one\n",
           idle_calls, idle_split, full_calls);
    EXPECT_GT(idle_calls, 30);
    EXPECT_GT(idle_split, 10);
    EXPECT_GT(full_calls, 3);
}

// Decode-shaped calls: query heads of a KV group packed into one tile, and the key range split
// across blocks and merged from the workspace. Checks that both paths really ran.
TEST_F(GpuSm90, DecodePackedAndSplit) {
    SKIP_UNLESS_BUILT(FLASHATTN_BACKEND_FUSED_SM90, 64, 128, 256);

    RuleStats st;
    int packed = 0, split = 0;
    struct Shape { int64_t b, hq, hkv, sq, sk; };
    const Shape shapes[] = {{1, 8, 2, 1, 4099}, {2, 12, 2, 3, 1000}, {1, 16, 1, 17, 16384}, {1, 8, 8, 1, 5000},
                            {3, 8, 4, 64, 2048}, {1, 32, 8, 1, 131}};
    for (const Shape &sh : shapes)
        for (int64_t d : {64, 128, 256})
            for (int m = 0; m < 3; ++m) {
                Case c;
                c.dtype = (m == 1) ? FLASHATTN_DTYPE_FLOAT16 : FLASHATTN_DTYPE_BFLOAT16;
                c.b = sh.b, c.hq = sh.hq, c.hkv = sh.hkv, c.sq = sh.sq, c.sk = sh.sk, c.d = d;
                if (m == 1) c.mask = FLASHATTN_MASK_CAUSAL_BOTTOM_RIGHT;
                if (m == 2) c.wl = 700, c.wr = 0, c.softcap = 3.0f, c.alibi = true;
                const flashattn_plan_info info = plan_for(h, Inputs(c), FLASHATTN_BACKEND_FUSED_SM90);
                packed += std::string(info.description).find("gqa_packed") != std::string::npos;
                split += info.num_splits > 1;
                check_fa_rule(h, c, st, FLASHATTN_BACKEND_FUSED_SM90);
            }
    print_rule("decode shapes (GQA-packed tiles, split keys)", st, FLASHATTN_BACKEND_FUSED_SM90);
    printf("[ fused_sm90 ] decode shapes: %d of 54 packed, %d of 54 split\n", packed, split);
    EXPECT_GT(packed, 20);
    EXPECT_GT(split, 20);
}

// Calls with more query tiles than SMs, every row seeing a key, run on resident blocks that take
// tile after tile (the next tile's Q and K loading while this one's O is stored; causal calls in
// pairs of tiles): every head dim, a tile count that does not divide evenly, GQA, softcap and
// ALiBi, padded layouts, both dtypes, both causal masks, a sliding window and a two-sided one.
TEST_F(GpuSm90, PersistentBlocksTakeTileAfterTile) {
    SKIP_UNLESS_BUILT(FLASHATTN_BACKEND_FUSED_SM90, 64, 96, 128, 160, 192, 256);

    RuleStats st;
    int persistent = 0, cases = 0;
    for (int64_t d : {64, 96, 128, 160, 192, 256})
        for (int variant = 0; variant < 8; ++variant) {
            Case c;
            c.dtype = variant == 1 ? FLASHATTN_DTYPE_FLOAT16 : FLASHATTN_DTYPE_BFLOAT16;
            c.d = d, c.b = 3, c.hq = 8, c.hkv = variant == 2 ? 2 : 8, c.sq = 1000 + 37 * variant, c.sk = 777 + 211 * variant;
            if (variant == 2) c.softcap = 4.0f, c.alibi = true;
            if (variant == 3) c.layout = kPadded, c.lse = false;
            // Causal (pairs of tiles): bottom-right with more keys than queries; top-left with an
            // odd count of query tiles (the middle one alone) and GQA.
            if (variant == 4) c.mask = FLASHATTN_MASK_CAUSAL_BOTTOM_RIGHT, c.sq = 1000, c.sk = 1300;
            if (variant == 5) c.mask = FLASHATTN_MASK_CAUSAL_TOP_LEFT, c.sq = c.sk = 1150, c.hkv = 4;
            // Windows (tiles in the grid's order): causal sliding, and two-sided with no mask.
            if (variant == 6) c.mask = FLASHATTN_MASK_CAUSAL_BOTTOM_RIGHT, c.wl = 200, c.sq = 1000, c.sk = 1100;
            if (variant == 7) c.wl = 300, c.wr = 90, c.sq = c.sk = 1200, c.hkv = 2;
            const flashattn_plan_info info = plan_for(h, Inputs(c), FLASHATTN_BACKEND_FUSED_SM90);
            persistent += std::string(info.description).find(" persistent") != std::string::npos;
            ++cases;
            check_fa_rule(h, c, st, FLASHATTN_BACKEND_FUSED_SM90);
        }
    print_rule("persistent blocks (no mask, causal or windows; more tiles than SMs)", st, FLASHATTN_BACKEND_FUSED_SM90);
    EXPECT_EQ(cases, persistent) << "every case must take the persistent path";
}

// Dense decode with more tiles (batch x KV heads) than SMs, each tile a KV head's group of query
// heads on one consumer: FUSED_SM90 runs it on resident blocks as a serving call of full-length
// sequences (the next tile's Q, K and V loading while the consumer finishes the last). Three SMs'
// worth of tiles and a few: four rounds, about four tiles a block; head dims 64 (192-key tiles), 96
// and 128; no mask with one query; both causal masks with four (speculative decode); a sliding
// window; softcap with ALiBi; a padded layout without LSE; groups of 4 and 8; both dtypes. Every
// case must plan resident blocks.
TEST_F(GpuSm90, DenseDecodeOnResidentBlocks) {
    SKIP_UNLESS_BUILT(FLASHATTN_BACKEND_FUSED_SM90, 64, 96, 128);

    const int sms = sm_count();
    ASSERT_GT(sms, 0);
    RuleStats st;
    int persistent = 0, cases = 0;
    for (int64_t d : {64, 96, 128})
        for (int variant = 0; variant < 6; ++variant) {
            Case c;
            c.dtype = variant % 2 ? FLASHATTN_DTYPE_FLOAT16 : FLASHATTN_DTYPE_BFLOAT16;
            c.d = d, c.hkv = variant == 3 ? 2 : 4, c.hq = c.hkv * (variant == 3 ? 8 : 4);
            c.b = 3 * sms / c.hkv + 5, c.sq = 1, c.sk = 300 + 77 * variant;
            if (variant == 1) c.mask = FLASHATTN_MASK_CAUSAL_BOTTOM_RIGHT, c.sq = 4;
            if (variant == 2) c.mask = FLASHATTN_MASK_CAUSAL_TOP_LEFT, c.sq = 4;
            if (variant == 3) c.mask = FLASHATTN_MASK_CAUSAL_BOTTOM_RIGHT, c.wl = 100;
            if (variant == 4) c.softcap = 20.0f, c.alibi = true;
            if (variant == 5) c.layout = kPadded, c.lse = false;
            const flashattn_plan_info info = plan_for(h, Inputs(c), FLASHATTN_BACKEND_FUSED_SM90);
            const std::string desc = info.description;
            EXPECT_EQ(64, info.block_m) << c.str() << ": " << desc;
            persistent += desc.find(" gqa_packed persistent") != std::string::npos;
            ++cases;
            check_fa_rule(h, c, st, FLASHATTN_BACKEND_FUSED_SM90);
        }
    print_rule("dense decode on resident single-consumer blocks (about four tiles a block)", st,
               FLASHATTN_BACKEND_FUSED_SM90);
    EXPECT_EQ(cases, persistent) << "every case must take resident blocks";
}

// A FUSED_SM90 consumer warpgroup (64 rows of a block's tile) whose rows all lie past the last query
// computes no key tile, and one whose last row sees no key past some key tile (a causal or
// windowed upper bound: consumer 0's rows end first) stops there; it still takes its turns and
// releases every stage. How many (tile, split, consumer) triples of a dense call do so, by the
// kernel's rule, for a call without packed query heads (0 otherwise). Only kernels whose key tiles
// are narrower than their rows carry the rule (head dim 64's 192-row tile, head dims 192 and 256).
int64_t consumers_stopping_early(const Case &c, const flashattn_plan_info &info) {
    const std::string d = info.description;
    if (d.find("gqa_") != std::string::npos || info.block_m % 64 != 0 || info.block_n >= info.block_m) return 0;
    const int64_t sq = c.sq, sk = c.sk, off = sk - sq, bm = info.block_m, bn = info.block_n, splits = info.num_splits;
    int64_t lo = -sq, hi = sk;  // key_lo_off <= j - i <= key_hi_off, as the planner folds them
    if (c.mask == FLASHATTN_MASK_CAUSAL_BOTTOM_RIGHT) hi = std::min(hi, off);
    if (c.mask == FLASHATTN_MASK_CAUSAL_TOP_LEFT) hi = std::min<int64_t>(hi, 0);
    if (c.wr >= 0) hi = std::min(hi, off + std::min(c.wr, sq + sk));
    if (c.wl >= 0) lo = std::max(lo, off - std::min(c.wl, sq + sk));
    lo = std::max(-sq, std::min(lo, sk)), hi = std::max(-sq, std::min(hi, sk));
    int64_t pairs = 0;
    for (int64_t m0 = 0; m0 < sq; m0 += bm) {
        const int64_t row_last = std::min(m0 + bm, sq) - 1;
        const int64_t key_lo = std::max<int64_t>(0, m0 + lo), key_hi = std::min(sk, row_last + hi + 1);
        const int64_t first_tile = key_lo / bn, all = key_hi > key_lo ? (key_hi + bn - 1) / bn - first_tile : 0;
        const int64_t per_split = (all + splits - 1) / splits;
        for (int64_t split = 0; split < splits; ++split) {  // (each split's tiles: the kernel's tile::set_key_tiles)
            const int64_t begin = first_tile + split * per_split;
            const int64_t tiles = std::max<int64_t>(0, std::min(per_split, all - split * per_split));
            if (tiles == 0) continue;  // (no key: the block stores O = 0 and returns)
            for (int64_t first = m0; first < m0 + bm; first += 64) {
                const int64_t end = std::min(sk, std::min(first + 63, row_last) + hi + 1);
                const int64_t mine =
                    first > row_last ? 0 : std::max<int64_t>(0, std::min(tiles, (end + bn - 1) / bn - begin));
                pairs += mine < tiles;
            }
        }
    }
    return pairs * c.b * c.hq;
}

// Calls whose tiles have such consumers: the last tile's rows filling one or two of three
// consumers (head dim 64's 192-row tile) or one of two; causal and windowed edges on 128-, 112-
// and 80-key tiles; blocks a tile and resident blocks; softcap, ALiBi, fp16, padded strides. By
// FlashAttention's rule; each case must have such pairs.
TEST_F(GpuSm90, ConsumersStopAtTheLastKeyTileTheirRowsSee) {
    SKIP_UNLESS_BUILT(FLASHATTN_BACKEND_FUSED_SM90, ALL_HEAD_DIMS);

    RuleStats st;
    std::vector<Case> cases;
    auto add = [&cases](int64_t d, int64_t b, int64_t hq, int64_t hkv, int64_t sq, int64_t sk, int mask) {
        Case c;
        c.d = d, c.b = b, c.hq = hq, c.hkv = hkv, c.sq = sq, c.sk = sk, c.mask = mask;
        cases.push_back(c);
        return &cases.back();
    };
    add(64, 2, 4, 4, 1024, 1024, FLASHATTN_MASK_NONE);                 // the last tile's 64 rows: two idle
    add(64, 2, 4, 2, 512, 700, FLASHATTN_MASK_NONE)->dtype = FLASHATTN_DTYPE_FLOAT16;  // 128 rows: one
    add(64, 3, 8, 8, 1000, 1000, FLASHATTN_MASK_NONE);                 // resident blocks
    add(64, 1, 4, 2, 2000, 2000, FLASHATTN_MASK_CAUSAL_BOTTOM_RIGHT);  // 192 rows on 128 keys
    add(64, 3, 8, 4, 1150, 1150, FLASHATTN_MASK_CAUSAL_TOP_LEFT);      // resident, causal pairs
    add(64, 1, 4, 4, 1500, 1500, FLASHATTN_MASK_NONE)->wl = 100;
    cases.back().wr = 0;                                                // a sliding window
    add(256, 2, 4, 4, 60, 300, FLASHATTN_MASK_NONE);                   // 60 rows of 128
    add(192, 2, 16, 16, 2100, 2100, FLASHATTN_MASK_CAUSAL_BOTTOM_RIGHT)->lse = false;  // resident
    add(160, 1, 4, 4, 60, 500, FLASHATTN_MASK_CAUSAL_BOTTOM_RIGHT);
    add(192, 1, 4, 2, 700, 900, FLASHATTN_MASK_CAUSAL_BOTTOM_RIGHT)->layout = kPadded;  // 112-key tiles
    add(256, 2, 4, 4, 1000, 1000, FLASHATTN_MASK_CAUSAL_BOTTOM_RIGHT)->dtype = FLASHATTN_DTYPE_FLOAT16;
    add(256, 1, 4, 2, 333, 512, FLASHATTN_MASK_CAUSAL_TOP_LEFT)->softcap = 4.0f;  // 80-key tiles
    cases.back().alibi = true;
    int64_t pairs = 0;
    for (const Case &c : cases) {
        const flashattn_plan_info info = plan_for(h, Inputs(c), FLASHATTN_BACKEND_FUSED_SM90);
        const int64_t n = consumers_stopping_early(c, info);
        EXPECT_GT(n, 0) << c.str() << ": " << info.description << " (no consumer stops early: the case tests nothing)";
        pairs += n;
        check_fa_rule(h, c, st, FLASHATTN_BACKEND_FUSED_SM90);
    }
    print_rule("consumers past the last query or the causal edge", st, FLASHATTN_BACKEND_FUSED_SM90);
    printf("[ fused_sm90 ] consumers past the last query or the causal edge: %lld (tile, split, consumer) triples\n",
           (long long)pairs);
}

// Calls with no mask and no window over at least 4096 keys, head dims 97-128, take 176-key tiles
// (FA_SM90_CONFIGS): a block a tile, persistent, fp16, softcap/ALiBi with GQA, head dim 112, a
// padded layout; a causal call of the same length keeps 128-key tiles, and so does head dim 96
// (the 128-key tile's shorter S, FA_SM90_D128_SHORT_S_HEAD_DIM), on one block a tile and resident.
TEST_F(GpuSm90, WideKeyTilesForLongUnmaskedCalls) {
    RuleStats st;
    for (int variant = 0; variant < 8; ++variant) {
        Case c;
        c.dtype = variant == 1 ? FLASHATTN_DTYPE_FLOAT16 : FLASHATTN_DTYPE_BFLOAT16;
        c.d = variant == 3 ? 112 : variant >= 6 ? 96 : 128, c.b = 1, c.hq = 4, c.hkv = 4, c.sq = 300, c.sk = 8192 + 77;
        if (variant == 0 || variant == 7) c.b = 2, c.hq = 8, c.hkv = 8, c.sq = 2100;  // 272 query tiles: persistent
        if (variant == 2) c.softcap = 4.0f, c.alibi = true, c.hkv = 2;
        if (variant == 4) c.layout = kPadded, c.lse = false, c.sk = 4096;  // the rule's first length
        if (variant == 5) c.mask = FLASHATTN_MASK_CAUSAL_BOTTOM_RIGHT;
        const std::string d = plan_for(h, Inputs(c), FLASHATTN_BACKEND_FUSED_SM90).description;
        EXPECT_EQ(variant < 5, d.find("_n176_") != std::string::npos) << d;
        if (variant >= 6) EXPECT_NE(std::string::npos, d.find("_n128_")) << d;
        if (variant == 0 || variant == 7) EXPECT_NE(std::string::npos, d.find(" persistent")) << d;
        check_fa_rule(h, c, st, FLASHATTN_BACKEND_FUSED_SM90);
    }
    print_rule("176-key tiles (no mask, 4k keys and more)", st, FLASHATTN_BACKEND_FUSED_SM90);
}

// Windowed causal calls (a block a tile) whose K and V outgrow the L2 run their heaviest tiles first
// in sections of fewer heads than the call has (the last section partial); every tile still lands
// where it belongs.
TEST_F(GpuSm90, CausalSectionsOfHeads) {
    SKIP_UNLESS_BUILT(FLASHATTN_BACKEND_FUSED_SM90, 64, 128, 256);

    RuleStats st;
    int l2 = 0;
    ASSERT_EQ(cudaSuccess, cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, 0));
    struct Shape { int64_t b, hq, hkv, sq, sk, d; int mask; };
    const Shape shapes[] = {
        // 32 query tiles a head or more (128 rows a tile; 192 at head dim 64)
        {1, 7, 7, 4096, 16384, 128, FLASHATTN_MASK_CAUSAL_BOTTOM_RIGHT},  // 8 MiB of K and V a head
        {1, 6, 2, 4100, 65536, 128, FLASHATTN_MASK_CAUSAL_BOTTOM_RIGHT},  // 32 MiB a KV head, shared by 3
        {2, 3, 3, 4096, 32768, 256, FLASHATTN_MASK_CAUSAL_BOTTOM_RIGHT},  // 32 MiB a head
        {2, 3, 3, 6144, 32768, 64, FLASHATTN_MASK_CAUSAL_TOP_LEFT},       // 8 MiB a head
    };
    for (const Shape &sh : shapes) {
        Case c;
        c.dtype = FLASHATTN_DTYPE_BFLOAT16, c.b = sh.b, c.hq = sh.hq, c.hkv = sh.hkv, c.sq = sh.sq, c.sk = sh.sk;
        c.d = sh.d, c.mask = sh.mask, c.wl = 3000;
        const std::string d = plan_for(h, Inputs(c), FLASHATTN_BACKEND_FUSED_SM90).description;
        const size_t at = d.find(" heaviest_first=");
        ASSERT_NE(std::string::npos, at) << d;
        const int64_t kv = 4 * sh.sk * sh.d / (sh.hq / sh.hkv), expected = std::max<int64_t>(1, (int64_t)l2 * 2 / 3 / kv);
        EXPECT_EQ(expected, std::atoi(d.c_str() + at + 16)) << d;
        EXPECT_LT(expected, sh.b * sh.hq) << "the shape must need more than one section";
        printf("[ fused_sm90 ] %s: %s\n", c.str().c_str(), d.c_str());
        check_fa_rule(h, c, st, FLASHATTN_BACKEND_FUSED_SM90);
    }
    print_rule("causal, heaviest tiles first in sections of heads", st, FLASHATTN_BACKEND_FUSED_SM90);
}

// 100 repeats of one call must give bit-identical O and LSE.
void check_deterministic(flashattn_handle *h, int backend, const Case &c, const char *what) {
    Inputs in(c);
    const Result first = run(h, in, backend);
    ASSERT_EQ(FLASHATTN_STATUS_SUCCESS, first.status);
    int identical = 0;
    for (int rep = 0; rep < 100; ++rep) {
        const Result r = run(h, in, backend);
        ASSERT_EQ(FLASHATTN_STATUS_SUCCESS, r.status);
        const bool same = std::memcmp(r.o.data(), first.o.data(), r.o.size() * 4) == 0 &&
                          std::memcmp(r.lse.data(), first.lse.data(), r.lse.size() * 4) == 0;
        EXPECT_TRUE(same) << "repeat " << rep;
        identical += same;
    }
    printf("[ %s ] %s: %d of 100 repeats bit-identical\n",
           backend == FLASHATTN_BACKEND_FUSED_SM90 ? "fused_sm90" : "fused", what, identical);
}

Case determinism_case() {
    Case c;
    c.sq = 1023, c.sk = 1024, c.d = 128, c.hq = 4, c.hkv = 2, c.mask = FLASHATTN_MASK_CAUSAL_BOTTOM_RIGHT;
    return c;
}

TEST_F(Gpu, FusedIsDeterministic) { check_deterministic(h, FLASHATTN_BACKEND_FUSED, determinism_case(), "determinism"); }
TEST_F(GpuSm90, IsDeterministic) { check_deterministic(h, FLASHATTN_BACKEND_FUSED_SM90, determinism_case(), "determinism"); }

TEST_F(GpuSm90, SplitDecodeIsDeterministic) {
    Case c;  // packed and split 16 ways, merged by the combine kernel
    c.b = 1, c.hq = 32, c.hkv = 8, c.sq = 1, c.sk = 8192, c.d = 128;
    check_deterministic(h, FLASHATTN_BACKEND_FUSED_SM90, c, "split decode determinism");
}

// flashattn_fwd's workspace: "Its contents on entry do not matter." A split decode keeps its
// partial results there, and its merge must read only what this call stored: never another call's
// partial results (here, each time, those of other inputs of the same shape, the call before on the
// same stream), nor a pattern left by anything else (a signalling NaN in every word, then 0xff
// bytes). Every call's O and LSE must be bit-identical to the same inputs' over a workspace of
// zeros. 8192 keys split 16 ways; 8320 keys, whose 65 key tiles the 16 splits share unevenly (the
// first five, the others four); and 8192 keys under a window of 600 keys to the left, whose 5
// visible key tiles leave 11 of the 16 splits none (their parts empty: an LSE of -inf and no O
// stored).
TEST_F(GpuSm90, SplitDecodeIgnoresWhatTheWorkspaceHeld) {
    for (const auto &keys_window : std::initializer_list<std::pair<int64_t, int64_t>>{{8192, -1}, {8320, -1}, {8192, 600}}) {
        const int64_t sk = keys_window.first, wl = keys_window.second;
        Case c;
        c.b = 1, c.hq = 32, c.hkv = 8, c.sq = 1, c.sk = sk, c.d = 128;
        if (wl >= 0) c.wl = wl, c.wr = 0;
        Inputs in(c), other(c);
        DevBuf<uint16_t> o(in.qs.numel);
        DevBuf<float> lse(c.b * c.hq * c.sq);
        const flashattn_fwd_params p = make_params(in, o.p, lse.p, FLASHATTN_BACKEND_FUSED_SM90);
        const flashattn_fwd_params po = make_params(other, o.p, lse.p, FLASHATTN_BACKEND_FUSED_SM90);
        const flashattn_plan_info info = plan_for(h, in, FLASHATTN_BACKEND_FUSED_SM90);
        ASSERT_GT(info.num_splits, 1) << info.description;
        size_t bytes = 0;
        ASSERT_EQ(FLASHATTN_STATUS_SUCCESS, flashattn_fwd_workspace_size(h, &p, &bytes)) << flashattn_last_error();
        ASSERT_GT(bytes, 0u);
        DevBuf<char> ws(bytes);
        auto call = [&](const flashattn_fwd_params &q) {
            ASSERT_EQ(FLASHATTN_STATUS_SUCCESS, flashattn_fwd(h, &q, ws.p, bytes, nullptr)) << flashattn_last_error();
        };
        CUDA_CHECK(cudaMemset(ws.p, 0, bytes));
        call(p);
        CUDA_CHECK(cudaDeviceSynchronize());
        const std::vector<uint16_t> o0 = o.download();
        const std::vector<float> lse0 = lse.download();
        int checked = 0, identical = 0;
        auto check = [&](const char *what, int rep) {
            CUDA_CHECK(cudaDeviceSynchronize());
            const std::vector<uint16_t> o1 = o.download();
            const std::vector<float> lse1 = lse.download();
            const bool same = std::memcmp(o1.data(), o0.data(), o0.size() * 2) == 0 &&
                              std::memcmp(lse1.data(), lse0.data(), lse0.size() * 4) == 0;
            EXPECT_TRUE(same) << what << ", call " << rep << ", " << sk << " keys, window " << wl;
            ++checked, identical += same;
        };
        for (int rep = 0; rep < 50; ++rep) { /* the other inputs' parts, then ours over them */
            call(po);
            call(p);
            check("after another call's partial results", rep);
        }
        const std::vector<uint32_t> snan(bytes / 4, 0x7fbadbadu);
        CUDA_CHECK(cudaMemcpy(ws.p, snan.data(), snan.size() * 4, cudaMemcpyHostToDevice));
        call(p);
        check("over a workspace of signalling NaNs", 0);
        CUDA_CHECK(cudaMemset(ws.p, 0xff, bytes));
        call(p);
        check("over a workspace of 0xff bytes", 0);
        printf("[ fused_sm90 ] split decode, %lld keys%s, %d splits: %d of %d calls over a workspace already "
               "written bit-identical to the call over zeros\n",
               (long long)sk, wl >= 0 ? " (a window of 600 to the left)" : "", info.num_splits, identical, checked);
    }
}

// ---- the API on the device ---------------------------------------------------------------------------

TEST_F(Gpu, BadInputLeavesOutputsUntouched) {
    Case c;
    c.d = 64, c.sq = 77, c.sk = 130;
    Inputs in(c);
    DevBuf<uint16_t> o(in.qs.numel);
    DevBuf<float> lse(c.b * c.hq * c.sq);
    std::vector<uint16_t> pattern(o.n);
    for (size_t x = 0; x < pattern.size(); ++x) pattern[x] = (uint16_t)(x * 2654435761u >> 7);
    o.upload(pattern);
    CUDA_CHECK(cudaMemset(lse.p, 0x5a, lse.n * 4));
    const std::vector<float> lse_before = lse.download();
    struct Bad { const char *what; void (*mutate)(flashattn_fwd_params &); flashattn_status expected; };
    const Bad bads[] = {
        {"scale NaN", [](auto &p) { p.softmax_scale = NAN; }, FLASHATTN_STATUS_BAD_SCALE},
        {"window -2", [](auto &p) { p.window_right = -2; }, FLASHATTN_STATUS_BAD_WINDOW},
        {"head_dim 300", [](auto &p) { p.head_dim = 300; }, FLASHATTN_STATUS_UNSUPPORTED_HEAD_DIM},
        {"grouping", [](auto &p) { p.heads_kv = 3; }, FLASHATTN_STATUS_BAD_HEAD_GROUPING},
        {"o overlap", [](auto &p) { p.o_seq_stride = 1; }, FLASHATTN_STATUS_BAD_STRIDE},
        {"backend", [](auto &p) { p.backend = 5; }, FLASHATTN_STATUS_BAD_BACKEND},
        {"struct size", [](auto &p) { p.struct_size = 16; }, FLASHATTN_STATUS_BAD_STRUCT_SIZE},
        {"fused, head_dim 60", [](auto &p) { p.head_dim = 60; p.backend = FLASHATTN_BACKEND_FUSED; }, FLASHATTN_STATUS_UNSUPPORTED},
        {"reference without workspace", [](auto &p) { p.backend = FLASHATTN_BACKEND_REFERENCE; }, FLASHATTN_STATUS_NULL_POINTER},
        {"misaligned q", [](auto &p) { p.q = (const char *)p.q + 1; }, FLASHATTN_STATUS_MISALIGNED_POINTER},
        {"softcap -1", [](auto &p) { p.softcap = -1.0f; }, FLASHATTN_STATUS_BAD_SOFTCAP},
    };
    for (const Bad &b : bads) {
        flashattn_fwd_params p = make_params(in, o.p, lse.p, FLASHATTN_BACKEND_AUTO);
        b.mutate(p);
        EXPECT_EQ(b.expected, flashattn_fwd(h, &p, nullptr, 0, 0)) << b.what << ": " << flashattn_last_error();
        EXPECT_GT(std::strlen(flashattn_last_error()), 0u) << b.what;
    }
    CUDA_CHECK(cudaDeviceSynchronize());
    EXPECT_TRUE(o.download() == pattern) << "O was touched";
    const std::vector<float> lse_after = lse.download();
    EXPECT_EQ(0, std::memcmp(lse_after.data(), lse_before.data(), lse.n * 4)) << "LSE was touched";
}

TEST_F(Gpu, WorkspaceChecks) {
    SKIP_UNLESS_BUILT(FLASHATTN_BACKEND_FUSED, 64, 128);

    Case c;
    Inputs in(c);
    DevBuf<uint16_t> o(in.qs.numel);
    CUDA_CHECK(cudaMemset(o.p, 0xff, o.n * 2));
    flashattn_fwd_params p = make_params(in, o.p, nullptr, FLASHATTN_BACKEND_REFERENCE);
    size_t need = 0;
    ASSERT_EQ(FLASHATTN_STATUS_SUCCESS, flashattn_fwd_workspace_size(h, &p, &need));
    EXPECT_GT(need, 0u);
    DevBuf<char> ws(need + 256);
    EXPECT_EQ(FLASHATTN_STATUS_NULL_POINTER, flashattn_fwd(h, &p, nullptr, need, 0));
    EXPECT_EQ(FLASHATTN_STATUS_WORKSPACE_TOO_SMALL, flashattn_fwd(h, &p, ws.p, need - 1, 0));
    EXPECT_NE(std::string(flashattn_last_error()).find(std::to_string(need)), std::string::npos);
    EXPECT_EQ(FLASHATTN_STATUS_MISALIGNED_POINTER, flashattn_fwd(h, &p, ws.p + 16, need, 0));
    CUDA_CHECK(cudaDeviceSynchronize());
    for (uint16_t x : o.download()) ASSERT_EQ(kPoison16, x);
    EXPECT_EQ(FLASHATTN_STATUS_SUCCESS, flashattn_fwd(h, &p, ws.p, need, 0)) << flashattn_last_error();
    p.backend = FLASHATTN_BACKEND_FUSED;
    ASSERT_EQ(FLASHATTN_STATUS_SUCCESS, flashattn_fwd_workspace_size(h, &p, &need));
    EXPECT_EQ(0u, need);
    EXPECT_EQ(FLASHATTN_STATUS_SUCCESS, flashattn_fwd(h, &p, nullptr, 0, 0)) << flashattn_last_error();
    CUDA_CHECK(cudaDeviceSynchronize());
    // FUSED needed no workspace before 0.4.0: a call it would split, given none, runs unsplit, right.
    Case s;
    s.sq = 1, s.sk = 4096, s.hq = 4, s.hkv = 4, s.d = 128;
    Inputs sin(s);
    DevBuf<uint16_t> so(sin.qs.numel);
    CUDA_CHECK(cudaMemset(so.p, 0xff, so.n * 2));
    flashattn_fwd_params sp = make_params(sin, so.p, nullptr, FLASHATTN_BACKEND_FUSED);
    ASSERT_EQ(FLASHATTN_STATUS_SUCCESS, flashattn_fwd_workspace_size(h, &sp, &need));
    EXPECT_GT(need, 0u);  // with a workspace it splits the keys
    ASSERT_EQ(FLASHATTN_STATUS_SUCCESS, flashattn_fwd(h, &sp, nullptr, 0, 0)) << flashattn_last_error();
    CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<float> got;
    for (uint16_t x : so.download()) got.push_back(to_f32(s.dtype, x));
    const Oracle ora = oracle(sin);
    const Result low = run(h, sin, FLASHATTN_BACKEND_REFERENCE, true);
    ASSERT_EQ(FLASHATTN_STATUS_SUCCESS, low.status) << flashattn_last_error();
    EXPECT_LE(max_abs_diff(got, ora.o), 2 * max_abs_diff(low.o, ora.o) + 1e-5);
}

TEST_F(Gpu, WrongDeviceIsRefused) {
    SKIP_UNLESS_BUILT(FLASHATTN_BACKEND_FUSED, 64);

    // A handle bound to another device ordinal than the current one (a copy with the ordinal
    // changed, so the check is exercised on a one-GPU machine too).
    flashattn_handle other = *h;
    other.caps.device = h->caps.device + 1;
    Case c;
    Inputs in(c);
    DevBuf<uint16_t> o(in.qs.numel);
    flashattn_fwd_params p = make_params(in, o.p, nullptr, FLASHATTN_BACKEND_FUSED);
    EXPECT_EQ(FLASHATTN_STATUS_WRONG_DEVICE, flashattn_fwd(&other, &p, nullptr, 0, 0));
    EXPECT_NE(std::string(flashattn_last_error()).find("device"), std::string::npos);
}

TEST_F(Gpu, PlanQueryMatchesWhatRuns) {
    Case c;
    c.d = 128;
    Inputs in(c);
    DevBuf<uint16_t> o(in.qs.numel);
    flashattn_fwd_params p = make_params(in, o.p, nullptr, FLASHATTN_BACKEND_AUTO);
    flashattn_plan_info info;
    flashattn_plan_info_init(&info);
    ASSERT_EQ(FLASHATTN_STATUS_SUCCESS, flashattn_fwd_plan(h, &p, &info));
    int dev = 0, major = 0, minor = 0;
    ASSERT_EQ(cudaSuccess, cudaGetDevice(&dev));
    ASSERT_EQ(cudaSuccess, cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    ASSERT_EQ(cudaSuccess, cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
    const bool sm90 = major == 9 && minor == 0 && fa_sm90_compiled(FLASHATTN_DTYPE_BFLOAT16, 128);
    EXPECT_EQ(sm90 ? FLASHATTN_BACKEND_FUSED_SM90 : FLASHATTN_BACKEND_FUSED, info.backend);
    EXPECT_EQ(0, info.workspace_bytes);
    EXPECT_EQ(FLASHATTN_STATUS_SUCCESS, flashattn_fwd_supported(h, &p));
    printf("[ plan ] %s\n", info.description);
    info.struct_size = 8;
    EXPECT_EQ(FLASHATTN_STATUS_BAD_STRUCT_SIZE, flashattn_fwd_plan(h, &p, &info));
    p.head_dim = 36;  // odd layout for the fused kernel: AUTO falls back to the reference
    p.q_head_stride = p.o_head_stride = p.k_head_stride = p.v_head_stride = 64;
    flashattn_plan_info_init(&info);
    ASSERT_EQ(FLASHATTN_STATUS_SUCCESS, flashattn_fwd_plan(h, &p, &info));
    EXPECT_EQ(FLASHATTN_BACKEND_REFERENCE, info.backend);
}

TEST_F(Gpu, DefaultScaleIsOneOverSqrtHeadDim) {
    SKIP_UNLESS_BUILT(FLASHATTN_BACKEND_FUSED, 96);

    Case c;
    c.d = 96;
    Inputs in(c);
    const Result def = run(h, in, FLASHATTN_BACKEND_FUSED);
    in.c.scale = (float)(1.0 / std::sqrt(96.0));
    const Result exp = run(h, in, FLASHATTN_BACKEND_FUSED);
    ASSERT_EQ(FLASHATTN_STATUS_SUCCESS, def.status);
    EXPECT_EQ(0, std::memcmp(def.o.data(), exp.o.data(), def.o.size() * 4));
}

TEST_F(Gpu, EmptyQueryIsANoOp) {
    Case c;
    c.sq = 0;
    Inputs in(c);
    flashattn_fwd_params p = make_params(in, nullptr, nullptr, FLASHATTN_BACKEND_AUTO);
    EXPECT_EQ(FLASHATTN_STATUS_SUCCESS, flashattn_fwd(h, &p, nullptr, 0, 0)) << flashattn_last_error();
}

TEST_F(Gpu, CudaGraphCaptureAndReplay) {
    for (int backend : all_backends()) {
        Case c;
        c.sq = 300, c.sk = 500, c.d = 128, c.hq = 4, c.hkv = 2, c.mask = FLASHATTN_MASK_CAUSAL_BOTTOM_RIGHT;
        Inputs in(c);
        DevBuf<uint16_t> o(in.qs.numel);
        DevBuf<float> lse(c.b * c.hq * c.sq);
        flashattn_fwd_params p = make_params(in, o.p, lse.p, backend);
        size_t need = 0;
        ASSERT_EQ(FLASHATTN_STATUS_SUCCESS, flashattn_fwd_workspace_size(h, &p, &need));
        DevBuf<char> ws(need);
        CapturedCall captured(h, p, ws.p, need);
        ASSERT_EQ(FLASHATTN_STATUS_SUCCESS, captured.status) << flashattn_last_error();
        for (int rep = 0; rep < 3; ++rep) {
            // New inputs into the captured buffers, then replay and compare with a direct call.
            Inputs fresh(c);
            CUDA_CHECK(cudaMemcpy(in.dq.p, fresh.dq.p, in.dq.n * 2, cudaMemcpyDeviceToDevice));
            CUDA_CHECK(cudaMemcpy(in.dk.p, fresh.dk.p, in.dk.n * 2, cudaMemcpyDeviceToDevice));
            CUDA_CHECK(cudaMemcpy(in.dv.p, fresh.dv.p, in.dv.n * 2, cudaMemcpyDeviceToDevice));
            CUDA_CHECK(cudaMemset(o.p, 0xff, o.n * 2));
            CUDA_CHECK(cudaDeviceSynchronize());  // the copies ran on the legacy stream; the graph's does not wait for it
            captured.replay();
            const std::vector<uint16_t> replayed = o.download();
            const Result direct = run(h, fresh, backend);
            ASSERT_EQ(FLASHATTN_STATUS_SUCCESS, direct.status);
            std::vector<float> rf(direct.o.size());
            for (size_t x = 0; x < rf.size(); ++x) rf[x] = to_f32(c.dtype, replayed[x]);
            EXPECT_EQ(0, std::memcmp(rf.data(), direct.o.data(), rf.size() * 4)) << "backend " << backend << " replay " << rep;
        }
    }
}

TEST_F(Gpu, ManyHostThreadsOneHandle) {
    constexpr int kThreads = 8;
    std::atomic<int> ok{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t)
        threads.emplace_back([&, t] {
            try {
                CUDA_CHECK(cudaSetDevice(0));
                const OwnedStream stream;  // (destroyed on every way out, a thrown CUDA error included)
                const cudaStream_t s = stream.s;
                int good = 0;
                for (int rep = 0; rep < 4; ++rep) {
                    Case c;
                    c.dtype = t % 2, c.d = 32 + 32 * (t % 4), c.sq = 50 + 37 * t + rep, c.sk = 90 + 29 * rep;
                    c.hq = 4, c.hkv = (t % 3 == 0) ? 1 : 2, c.mask = rep % 3;
                    Inputs in(c);
                    // The inputs were copied on the legacy stream, which s (non-blocking) does not wait for.
                    CUDA_CHECK(cudaStreamSynchronize(0));
                    const int backend = (t + rep) % 2 ? FLASHATTN_BACKEND_REFERENCE : FLASHATTN_BACKEND_AUTO;
                    const Result r = run(h, in, backend, false, false, s);
                    if (r.status != FLASHATTN_STATUS_SUCCESS || r.unwritten) continue;
                    const Oracle ora = oracle(in);
                    const double err = max_abs_diff(r.o, ora.o);
                    good += err < 2e-2;
                    if (!(err < 2e-2)) ADD_FAILURE() << "thread " << t << " " << c.str() << " err " << err;
                }
                if (good == 4) ++ok;
            } catch (const std::exception &e) {
                ADD_FAILURE() << "thread " << t << ": " << e.what();
            }
        });
    for (auto &th : threads) th.join();
    EXPECT_EQ(kThreads, ok.load());
    printf("[ threads ] %d host threads x 4 calls on their own streams, one handle: %d threads all correct\n", kThreads, ok.load());
}

}  // namespace

// ---- flashattn_merge against an fp64 CPU oracle ------------------------------------------------------

namespace {

struct MergeCase {
    int64_t parts, batch, seqlen, heads, head_dim;
    int dtype_parts, dtype_out, base;
    bool strided;      // parts laid out [S, B, H, Sq, D] (heads before positions) and padded rows
    double p_empty;    // chance a part's LSE is -inf (or +inf, FlashAttention-2's empty row)
};

// Stores x in `dtype` (float32 bits or fp16/bf16 in the low half) and returns the value stored.
uint32_t store_as(int dtype, float x, float *stored) {
    if (dtype == FLASHATTN_DTYPE_FLOAT32) {
        uint32_t u;
        std::memcpy(&u, &x, 4);
        *stored = x;
        return u;
    }
    const uint16_t h = fatest::from_f32(dtype, x);
    *stored = fatest::to_f32(dtype, h);
    return h;
}

// The fp64 merge of one row over `parts` parts: lse(p) part p's LSE (an infinite one contributes
// nothing), o(p, d) its value in column d < D, the LSE's base ln_base (1: natural). out[d] gets the
// merged value (0 where no part contributes), *mx the largest finite LSE; returns the sum of the
// weights relative to it (0: no part contributes).
template <class Lse, class O>
double oracle_merge_row(int64_t parts, int64_t D, double ln_base, Lse lse, O o, std::vector<double> &out, double *mx) {
    *mx = -INFINITY;
    for (int64_t p = 0; p < parts; ++p)
        if (std::isfinite(lse(p))) *mx = std::max(*mx, lse(p));
    double sum = 0;
    out.assign(D, 0.0);
    for (int64_t p = 0; p < parts; ++p) {
        if (!std::isfinite(lse(p))) continue;
        const double w = std::exp((lse(p) - *mx) * ln_base);
        sum += w;
        for (int64_t d = 0; d < D; ++d) out[d] += w * o(p, d);
    }
    if (sum > 0)
        for (double &x : out) x /= sum;
    return sum;
}

void check_merge(flashattn_handle *h, const MergeCase &c) {
    const int eb_in = c.dtype_parts == FLASHATTN_DTYPE_FLOAT32 ? 4 : 2;
    const int eb_out = c.dtype_out == FLASHATTN_DTYPE_FLOAT32 ? 4 : 2;
    const int64_t D = c.head_dim, pad = c.strided ? 8 : 0, rowlen = D + pad;
    // O parts: [S, B, Sq, H, D] packed, or [S, B, H, Sq, D + pad] when strided.
    const int64_t o_h = c.strided ? c.seqlen * rowlen : rowlen, o_s = c.strided ? rowlen : c.heads * rowlen;
    const int64_t o_b = c.heads * c.seqlen * rowlen, o_p = c.batch * o_b;
    // LSE parts [S, B, H, Sq]; when strided, [B, H, Sq, S] (a part stride of 1).
    const int64_t rows = c.batch * c.heads * c.seqlen;
    const int64_t l_p = c.strided ? 1 : rows, l_seq = c.strided ? c.parts : 1;
    const int64_t l_h = c.seqlen * l_seq, l_b = c.heads * l_h;
    std::vector<float> o_val(c.parts * o_p, NAN), lse_val(c.parts * rows);
    std::vector<uint8_t> o_bytes(c.parts * o_p * eb_in);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f), ul(-4.0f, 4.0f), coin(0.0f, 1.0f);
    auto &g = fatest::rng();
    for (int64_t i = 0; i < (int64_t)o_val.size(); ++i) {
        float stored;
        const uint32_t bits = store_as(c.dtype_parts, u(g), &stored);
        std::memcpy(&o_bytes[i * eb_in], &bits, eb_in);
        o_val[i] = stored;
    }
    std::vector<float> lse_host(c.parts * rows);
    for (int64_t p = 0; p < c.parts; ++p)
        for (int64_t b = 0; b < c.batch; ++b)
            for (int64_t hh = 0; hh < c.heads; ++hh)
                for (int64_t s = 0; s < c.seqlen; ++s) {
                    const float draw = coin(g);
                    float l = ul(g);
                    if (draw < c.p_empty / 2) l = -INFINITY;
                    else if (draw < c.p_empty) l = INFINITY;
                    lse_host[p * l_p + b * l_b + hh * l_h + s * l_seq] = l;
                }
    fatest::DevBuf<uint8_t> d_o(o_bytes.size()), d_out(c.batch * c.seqlen * c.heads * D * eb_out);
    fatest::DevBuf<float> d_lse(lse_host.size()), d_lse_out(rows);
    d_o.upload(o_bytes);
    d_lse.upload(lse_host);
    CUDA_CHECK(cudaMemset(d_out.p, 0xff, d_out.n));  // poisoned: every element must be written
    CUDA_CHECK(cudaMemset(d_lse_out.p, 0xff, d_lse_out.n * 4));

    flashattn_merge_params m;
    flashattn_merge_params_init(&m);
    m.dtype_parts = c.dtype_parts, m.dtype_out = c.dtype_out, m.lse_base = c.base;
    m.num_parts = c.parts, m.batch = c.batch, m.seqlen = c.seqlen, m.heads = c.heads, m.head_dim = D;
    m.o_parts = d_o.p, m.o_part_stride = o_p, m.o_batch_stride = o_b, m.o_seq_stride = o_s, m.o_head_stride = o_h;
    m.lse_parts = d_lse.p, m.lse_part_stride = l_p, m.lse_batch_stride = l_b, m.lse_head_stride = l_h;
    m.lse_seq_stride = l_seq;
    m.o = d_out.p, m.out_head_stride = D, m.out_seq_stride = c.heads * D, m.out_batch_stride = c.seqlen * c.heads * D;
    m.lse = d_lse_out.p, m.lse_out_seq_stride = 1, m.lse_out_head_stride = c.seqlen, m.lse_out_batch_stride = c.heads * c.seqlen;
    ASSERT_EQ(FLASHATTN_STATUS_SUCCESS, flashattn_merge(h, &m, nullptr)) << flashattn_last_error();
    const std::vector<uint8_t> out = d_out.download();
    const std::vector<float> lse_out = d_lse_out.download();

    const double ln_base = c.base == FLASHATTN_LSE_BASE2 ? std::log(2.0) : 1.0;
    double max_err = 0, max_lse_err = 0;
    for (int64_t b = 0; b < c.batch; ++b)
        for (int64_t hh = 0; hh < c.heads; ++hh)
            for (int64_t s = 0; s < c.seqlen; ++s) {
                double mx;
                std::vector<double> want_row;
                const double sum = oracle_merge_row(
                    c.parts, D, ln_base, [&](int64_t p) { return (double)lse_host[p * l_p + b * l_b + hh * l_h + s * l_seq]; },
                    [&](int64_t p, int64_t d) { return (double)o_val[p * o_p + b * o_b + s * o_s + hh * o_h + d]; }, want_row,
                    &mx);
                const int64_t orow = ((b * c.seqlen + s) * c.heads + hh) * D;
                for (int64_t d = 0; d < D; ++d) {
                    float got;
                    if (eb_out == 4) std::memcpy(&got, &out[(orow + d) * 4], 4);
                    else {
                        uint16_t bits;
                        std::memcpy(&bits, &out[(orow + d) * 2], 2);
                        got = fatest::to_f32(c.dtype_out, bits);
                    }
                    const double err = std::fabs(got - want_row[d]);
                    ASSERT_FALSE(std::isnan(got)) << "row " << b << "," << hh << "," << s << " d " << d;
                    max_err = std::max(max_err, err);
                }
                const float got_lse = lse_out[(b * c.heads + hh) * c.seqlen + s];
                if (sum == 0) {
                    ASSERT_EQ(-INFINITY, got_lse) << "a row with no contributing part";
                } else {
                    ASSERT_TRUE(std::isfinite(got_lse));
                    max_lse_err = std::max(max_lse_err, std::fabs(got_lse - (mx + std::log(sum) / ln_base)));
                }
            }
    // Rounding the output once: half an ulp of |O| <= 1 in the output dtype, plus fp32 accumulation.
    const double tol = c.dtype_out == FLASHATTN_DTYPE_FLOAT32 ? 1e-5 : c.dtype_out == FLASHATTN_DTYPE_BFLOAT16 ? 4e-3 : 5e-4;
    EXPECT_LE(max_err, tol) << "parts " << c.parts << " dtypes " << c.dtype_parts << "->" << c.dtype_out;
    EXPECT_LE(max_lse_err, 1e-5);
    std::printf("[ merge ] S=%lld B=%lld Sq=%lld H=%lld D=%lld %d->%d base%s%s p_empty=%.2f: max |O err| %.2e, max |LSE err| %.2e\n",
                (long long)c.parts, (long long)c.batch, (long long)c.seqlen, (long long)c.heads, (long long)D,
                c.dtype_parts, c.dtype_out, c.base ? "2" : "e", c.strided ? " strided" : "", c.p_empty, max_err,
                max_lse_err);
}

}  // namespace

TEST_F(Gpu, MergeMatchesOracle) {
    const int F16 = FLASHATTN_DTYPE_FLOAT16, BF16 = FLASHATTN_DTYPE_BFLOAT16, F32 = FLASHATTN_DTYPE_FLOAT32;
    const MergeCase cases[] = {
        {1, 1, 7, 3, 64, F32, BF16, 0, false, 0.0},
        {2, 2, 33, 4, 128, F32, F16, 0, false, 0.1},
        {5, 1, 17, 8, 40, BF16, BF16, 0, true, 0.3},
        {7, 3, 9, 2, 256, F16, F32, 1, false, 0.2},
        {40, 1, 5, 3, 96, F32, F32, 0, true, 0.25},   // more parts than a warp has lanes
        {16, 1, 1, 32, 128, F32, BF16, 0, false, 0.1}, // a batch-1 split decode's 16 parts: one load group
        {17, 2, 3, 4, 128, F32, F16, 1, true, 0.2},    // one part past a group
        {3, 2, 11, 2, 1, F32, F16, 1, false, 0.5},     // head dim 1, many empty parts and rows
        {4, 1, 64, 16, 72, BF16, F32, 0, false, 1.0},  // every part empty: O = 0, LSE = -inf
        {6, 2, 13, 5, 30, F16, BF16, 1, false, 0.2},   // head dim 30: one element per thread, not 4
    };
    for (const MergeCase &c : cases) check_merge(h, c);
}

TEST_F(Gpu, MergeNaNLseGivesNaNAndEmptyCallIsANoOp) {
    fatest::DevBuf<float> o(2 * 32), lse(2), out(32), lse_out(1);
    std::vector<float> ov(64, 0.5f), lv = {1.0f, NAN};
    o.upload(ov);
    lse.upload(lv);
    flashattn_merge_params m;
    flashattn_merge_params_init(&m);
    m.dtype_parts = m.dtype_out = FLASHATTN_DTYPE_FLOAT32;
    m.num_parts = 2, m.batch = 1, m.seqlen = 1, m.heads = 1, m.head_dim = 32;
    m.o_parts = o.p, m.o_part_stride = 32, m.lse_parts = lse.p, m.lse_part_stride = 1, m.o = out.p, m.lse = lse_out.p;
    ASSERT_EQ(FLASHATTN_STATUS_SUCCESS, flashattn_merge(h, &m, nullptr)) << flashattn_last_error();
    for (float x : out.download()) EXPECT_TRUE(std::isnan(x));
    EXPECT_TRUE(std::isnan(lse_out.download()[0]));
    CUDA_CHECK(cudaMemset(out.p, 0x7f, 32 * 4));
    m.seqlen = 0;
    ASSERT_EQ(FLASHATTN_STATUS_SUCCESS, flashattn_merge(h, &m, nullptr));
    CUDA_CHECK(cudaDeviceSynchronize());
    for (float x : out.download()) EXPECT_NE(0.0f, x);  // untouched
}

// A merge of more than 2^31 items, so that the kernel's items are numbered in 64 bits (below that it
// divides in 32): head dim 3 (one element an item, 2^31 + 1M of them), every batch entry reading the
// same parts (batch strides 0). Each entry's merged rows must then be bit-identical to entry 0's,
// which the fp64 oracle checks; the outputs are poisoned first, so a row written to the wrong place
// or not at all shows. Needs about 7.2 GB of device memory (skipped with the reason where less is free).
TEST_F(Gpu, MergePastTwoToThe31Items) {
    const int64_t S = 3, Sq = 997, H = 5, D = 3, per_entry = Sq * H * D, lse_entry = H * Sq;
    const int64_t B = ((int64_t)INT32_MAX + (1 << 20)) / per_entry + 1;
    const int64_t n_out = B * per_entry, n_lse = B * lse_entry;
    ASSERT_GT(n_out, (int64_t)INT32_MAX);
    size_t free_bytes = 0, total_bytes = 0;
    CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
    const size_t need = (size_t)n_out * 2 + (size_t)n_lse * 4 + ((size_t)256 << 20);
    if (free_bytes < need)
        GTEST_SKIP() << "needs " << (need >> 20) << " MiB of device memory; " << (free_bytes >> 20) << " MiB free";

    auto &g = fatest::rng();
    std::uniform_real_distribution<float> u(-1.0f, 1.0f), ul(-4.0f, 4.0f), coin(0.0f, 1.0f);
    std::vector<float> o_parts(S * per_entry), lse_parts(S * lse_entry);  // [S][Sq][H][D], [S][H][Sq]
    for (float &x : o_parts) x = u(g);
    for (float &l : lse_parts) {
        const float draw = coin(g);
        l = draw < 0.1f ? -INFINITY : draw < 0.2f ? INFINITY : ul(g);
    }
    fatest::DevBuf<float> d_o(o_parts.size()), d_lse(lse_parts.size()), d_lse_out(n_lse);
    fatest::DevBuf<uint16_t> d_out(n_out);
    d_o.upload(o_parts);
    d_lse.upload(lse_parts);
    CUDA_CHECK(cudaMemset(d_out.p, 0xff, d_out.n * 2));  // NaN in fp16 and in float32
    CUDA_CHECK(cudaMemset(d_lse_out.p, 0xff, d_lse_out.n * 4));

    flashattn_merge_params m;
    flashattn_merge_params_init(&m);
    m.dtype_parts = FLASHATTN_DTYPE_FLOAT32, m.dtype_out = FLASHATTN_DTYPE_FLOAT16;
    m.num_parts = S, m.batch = B, m.seqlen = Sq, m.heads = H, m.head_dim = D;
    m.o_parts = d_o.p, m.o_part_stride = per_entry, m.o_batch_stride = 0, m.o_seq_stride = H * D, m.o_head_stride = D;
    m.lse_parts = d_lse.p, m.lse_part_stride = lse_entry, m.lse_batch_stride = 0, m.lse_head_stride = Sq;
    m.lse_seq_stride = 1;
    m.o = d_out.p, m.out_batch_stride = per_entry, m.out_seq_stride = H * D, m.out_head_stride = D;
    m.lse = d_lse_out.p, m.lse_out_batch_stride = lse_entry, m.lse_out_head_stride = Sq, m.lse_out_seq_stride = 1;
    ASSERT_EQ(FLASHATTN_STATUS_SUCCESS, flashattn_merge(h, &m, nullptr)) << flashattn_last_error();
    CUDA_CHECK(cudaDeviceSynchronize());

    // Entry 0 against the fp64 oracle.
    std::vector<uint16_t> out0(per_entry);
    std::vector<float> lse0(lse_entry);
    CUDA_CHECK(cudaMemcpy(out0.data(), d_out.p, per_entry * 2, cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(lse0.data(), d_lse_out.p, lse_entry * 4, cudaMemcpyDeviceToHost));
    double max_err = 0, max_lse_err = 0;
    for (int64_t s = 0; s < Sq; ++s)
        for (int64_t hh = 0; hh < H; ++hh) {
            double mx;
            std::vector<double> want_row;
            const double sum = oracle_merge_row(
                S, D, 1.0, [&](int64_t p) { return (double)lse_parts[p * lse_entry + hh * Sq + s]; },
                [&](int64_t p, int64_t d) { return (double)o_parts[p * per_entry + (s * H + hh) * D + d]; }, want_row, &mx);
            for (int64_t d = 0; d < D; ++d) {
                const float got = fatest::to_f32(FLASHATTN_DTYPE_FLOAT16, out0[(s * H + hh) * D + d]);
                ASSERT_FALSE(std::isnan(got)) << "entry 0, position " << s << ", head " << hh << ", column " << d;
                max_err = std::max(max_err, std::fabs(got - want_row[d]));
            }
            const float got_lse = lse0[hh * Sq + s];
            if (sum == 0) ASSERT_EQ(-INFINITY, got_lse) << "a row with no contributing part";
            else max_lse_err = std::max(max_lse_err, std::fabs(got_lse - (mx + std::log(sum))));
        }
    EXPECT_LE(max_err, 5e-4);
    EXPECT_LE(max_lse_err, 1e-5);

    // Every other entry, bit for bit, read back a slice at a time.
    const int64_t slice = 4096;
    std::vector<uint16_t> out_s(slice * per_entry);
    std::vector<float> lse_s(slice * lse_entry);
    int64_t differing = 0, first_bad = -1;
    for (int64_t b0 = 0; b0 < B; b0 += slice) {
        const int64_t nb = std::min(slice, B - b0);
        CUDA_CHECK(cudaMemcpy(out_s.data(), d_out.p + b0 * per_entry, nb * per_entry * 2, cudaMemcpyDeviceToHost));
        CUDA_CHECK(cudaMemcpy(lse_s.data(), d_lse_out.p + b0 * lse_entry, nb * lse_entry * 4, cudaMemcpyDeviceToHost));
        for (int64_t i = 0; i < nb; ++i)
            if (std::memcmp(&out_s[i * per_entry], out0.data(), per_entry * 2) != 0 ||
                std::memcmp(&lse_s[i * lse_entry], lse0.data(), lse_entry * 4) != 0) {
                ++differing;
                if (first_bad < 0) first_bad = b0 + i;
            }
    }
    EXPECT_EQ(0, differing) << "batch entries whose merged O or LSE differ from entry 0's; the first is " << first_bad;
    std::printf("[ merge ] S=%lld B=%lld Sq=%lld H=%lld D=%lld f32->f16: %lld items (past 2^31), max |O err| %.2e, "
                "max |LSE err| %.2e, %lld of %lld entries differ from entry 0\n",
                (long long)S, (long long)B, (long long)Sq, (long long)H, (long long)D, (long long)n_out, max_err,
                max_lse_err, (long long)differing, (long long)B);
}
