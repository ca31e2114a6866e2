// test_serving.cpp - serving calls on the device: ragged batches (cu_seqlens_q/k), per-sequence key
// counts (seqused_k), paged K/V (any page size, through a block table with its own row stride, K and
// V as two halves of one pool), an indexed dense cache (kv_batch_idx), left-padded caches
// (cache_leftpad), and CUDA-graph replay with new lengths, page tables and contents. Each sequence is checked on its own against the fp64 CPU oracle
// by FlashAttention's rule (the plain low-precision REFERENCE run on that sequence alone is the
// baseline); rows no sequence owns must stay poisoned. Skips with a reason when there is no GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <initializer_list>
#include <memory>
#include <numeric>

#include "gpu_util.h"

using namespace fatest;

namespace {

// The GPU tests' fixture (gpu_util.h): a handle on device 0, or a skip with the reason.
class Serving : public GpuTest {};

enum KvMode { kPackedKv, kPagedSeqused, kPagedCuLens, kIndexedCache, kDenseSeqused, kPagedCsr };

struct Spec {
    int dtype = FLASHATTN_DTYPE_BFLOAT16;
    int64_t hq = 4, hkv = 2, d = 64;
    int mask = FLASHATTN_MASK_NONE;
    int64_t wl = -1, wr = -1;
    float softcap = 0.0f;
    bool alibi = false;
    bool packed_q = true;       // cu_seqlens_q; else dense Q [B, cap_q] (every sequence cap_q queries)
    KvMode kv = kPackedKv;
    int64_t page_size = 16;
    bool shared_pool = false;   // paged: K and V are the two halves of one [pages, 2, page, H, D] pool
    bool head_major = false;    // paged: pages [page, H, D] -> [H, page, D] (a pool [pages, H, page, D])
    bool nan_unused = false;    // NaN in every Q, K and V row no sequence owns (else finite filler)
    int64_t cap_q = 0, cap_k = 0;  // capacities (0: the longest sequence)
    std::vector<int64_t> sq, sk;
    std::vector<int64_t> lp;    // cache_leftpad (empty: none): padding rows before sequence b's sk keys
    int64_t pad(size_t b) const { return lp.empty() ? 0 : lp[b]; }
    std::string str() const {
        char buf[256];
        snprintf(buf, sizeof buf, "%s hq=%lld hkv=%lld d=%lld mask=%d win=(%lld,%lld) softcap=%g alibi=%d packed_q=%d kv=%d page=%lld shared=%d hnd=%d B=%zu",
                 dtype ? "bf16" : "fp16", (long long)hq, (long long)hkv, (long long)d, mask, (long long)wl,
                 (long long)wr, softcap, (int)alibi, (int)packed_q, (int)kv, (long long)page_size, (int)shared_pool,
                 (int)head_major, sq.size());
        std::string s = buf;
        for (size_t b = 0; b < sq.size(); ++b)
            s += " (" + std::to_string(sq[b]) + "," + std::to_string(sk[b]) + (lp.empty() ? "" : ",pad " + std::to_string(lp[b])) + ")";
        return s;
    }
};

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// One rounding step of the dtype at magnitude |x| (its ulp; the smallest normal's below it).
float dtype_ulp_of(int dtype, float x) {
    const int mant = dtype == FLASHATTN_DTYPE_BFLOAT16 ? 7 : 10;
    const float ax = std::max(std::fabs(x), dtype == FLASHATTN_DTYPE_BFLOAT16 ? 1.2e-38f : 6.1e-5f);
    return std::ldexp(1.0f, std::ilogb(ax) - mant);
}

// One serving call's inputs: each sequence as its own batch-1 Inputs (for the oracle and the
// low-precision baseline), and the same numbers laid out in the call's device buffers.
struct ServingRun {
    Spec s;
    int64_t B, cap_q, cap_k, total_q, total_k, width, row_stride, num_pages, kv_batch;
    std::vector<std::unique_ptr<Inputs>> seqs;
    std::vector<int32_t> cu_q, cu_k, used, table, kv_idx, indptr, last_len, leftpad;
    std::vector<uint16_t> q, k, v;  // k and v alias one buffer (pool) when shared_pool
    std::vector<float> slopes;
    int64_t q_rows, k_outer, k_rows, k_seq_stride, k_head_stride, k_page_stride, v_offset;

    // Where key position `pos` of sequence b lives in the K buffer, in [heads_kv, head_dim] rows (a
    // cache: dense, indexed or paged, its pages not head-major; not packed K).
    int64_t cache_row(int64_t b, int64_t pos) const {
        const int64_t hd = s.hkv * s.d;
        if (s.kv == kPagedSeqused || s.kv == kPagedCuLens)
            return (int64_t)table[b * row_stride + pos / s.page_size] * k_page_stride / hd + pos % s.page_size;
        if (s.kv == kPagedCsr)
            return (int64_t)table[indptr[b] + pos / s.page_size] * k_page_stride / hd + pos % s.page_size;
        return (s.kv == kIndexedCache ? (int64_t)kv_idx[b] : b) * cap_k + pos;
    }

    Case seq_case(size_t b) const {
        Case c;
        c.dtype = s.dtype, c.b = 1, c.sq = s.sq[b], c.sk = s.sk[b], c.hq = s.hq, c.hkv = s.hkv, c.d = s.d;
        c.mask = s.mask, c.wl = s.wl, c.wr = s.wr, c.softcap = s.softcap, c.alibi = s.alibi;
        return c;
    }

    explicit ServingRun(const Spec &spec) : s(spec) {
        B = (int64_t)s.sq.size();
        cap_q = std::max(s.cap_q, *std::max_element(s.sq.begin(), s.sq.end()));
        cap_k = s.cap_k;
        for (size_t b = 0; b < s.sk.size(); ++b) cap_k = std::max(cap_k, s.pad(b) + s.sk[b]);
        for (size_t b = 0; b < s.sq.size(); ++b) seqs.emplace_back(new Inputs(seq_case(b)));
        const int64_t hd = s.hkv * s.d;
        // Q: packed rows in order in a buffer sized by the capacities (B x cap_q + 3 rows, the rows
        // past the last sequence owned by none), so every call of one capacity has the same buffers;
        // or dense [B, cap_q].
        cu_q.assign(B + 1, 0);
        for (int64_t b = 0; b < B; ++b) cu_q[b + 1] = cu_q[b] + (int32_t)s.sq[b];
        total_q = s.packed_q ? B * cap_q + 3 : 0;
        q_rows = s.packed_q ? total_q : B * cap_q;
        q.assign(q_rows * s.hq * s.d, s.nan_unused ? kPoison16 : from_f32(s.dtype, 0.5f));
        for (int64_t b = 0; b < B; ++b) {
            const Inputs &in = *seqs[b];
            const int64_t row0 = s.packed_q ? cu_q[b] : b * cap_q;
            for (int64_t i = 0; i < s.sq[b]; ++i)
                for (int64_t hh = 0; hh < s.hq; ++hh)
                    for (int64_t dd = 0; dd < s.d; ++dd)
                        q[((row0 + i) * s.hq + hh) * s.d + dd] = in.q[i * in.qs.s + hh * in.qs.h + dd];
        }
        // K/V rows: where key j of sequence b lives, in units of [hkv, d] rows of the buffer (after
        // its padding rows, if any).
        cu_k.assign(B + 1, 0);
        for (int64_t b = 0; b < B; ++b) cu_k[b + 1] = cu_k[b] + (int32_t)(s.pad(b) + s.sk[b]);
        for (int64_t b = 0; b < B; ++b) used.push_back((int32_t)(s.pad(b) + s.sk[b]));
        leftpad.assign(s.lp.begin(), s.lp.end());
        std::vector<std::vector<int64_t>> row_of(B);
        width = row_stride = num_pages = kv_batch = total_k = 0;
        k_page_stride = 0, v_offset = 0, k_head_stride = s.d;
        const bool paged = s.kv == kPagedSeqused || s.kv == kPagedCuLens || s.kv == kPagedCsr;
        if (s.kv == kPagedCsr) {
            // FlashInfer's page lists: sequence b's ceil(sk/page) pages in one list, its key count
            // from the list and kv_last_page_len (no seqused_k).
            width = std::max<int64_t>(1, ceil_div(cap_k, s.page_size));
            num_pages = B * width + 2;
            std::vector<int32_t> perm(num_pages);
            std::iota(perm.begin(), perm.end(), 0);
            std::shuffle(perm.begin(), perm.end(), rng());
            indptr.assign(1, 0);
            for (int64_t b = 0; b < B; ++b) {
                const int64_t n = ceil_div(s.sk[b], s.page_size);
                for (int64_t pg = 0; pg < n; ++pg) table.push_back(perm[table.size()]);
                indptr.push_back((int32_t)table.size());
                last_len.push_back(n ? (int32_t)(s.sk[b] - (n - 1) * s.page_size) : 1);
            }
            table.push_back(perm[table.size()]);  // one entry no sequence lists
            k_outer = num_pages, k_rows = s.page_size, k_seq_stride = hd;
            k_page_stride = s.page_size * hd;
            for (int64_t b = 0; b < B; ++b)
                for (int64_t j = 0; j < s.sk[b]; ++j)
                    row_of[b].push_back((int64_t)table[indptr[b] + j / s.page_size] * s.page_size + j % s.page_size);
        } else if (paged) {
            width = std::max<int64_t>(1, ceil_div(cap_k, s.page_size));
            row_stride = width + 3;
            num_pages = B * width + 2;
            std::vector<int32_t> perm(num_pages);
            std::iota(perm.begin(), perm.end(), 0);
            std::shuffle(perm.begin(), perm.end(), rng());
            table.assign(B * row_stride, -7);  // entries past a sequence's pages are never read
            for (int64_t b = 0; b < B; ++b)
                for (int64_t pg = 0; pg < width; ++pg) table[b * row_stride + pg] = perm[b * width + pg];
            const int64_t page_rows = s.page_size;  // [hkv, d] rows per page (per K or V)
            k_outer = num_pages, k_rows = s.page_size, k_seq_stride = s.head_major ? s.d : hd;
            k_head_stride = s.head_major ? page_rows * s.d : s.d;
            k_page_stride = (s.shared_pool ? 2 : 1) * page_rows * hd;
            v_offset = s.shared_pool ? page_rows * hd : 0;
            for (int64_t b = 0; b < B; ++b)
                for (int64_t j = 0; j < s.sk[b]; ++j)
                    row_of[b].push_back((int64_t)table[b * row_stride + j / s.page_size] * k_page_stride / hd + j % s.page_size);
        } else if (s.kv == kPackedKv) {
            total_k = B * cap_k + 2;
            k_outer = 1, k_rows = total_k, k_seq_stride = hd;
            for (int64_t b = 0; b < B; ++b)
                for (int64_t j = 0; j < s.sk[b]; ++j) row_of[b].push_back(cu_k[b] + s.pad(b) + j);
        } else {  // a dense cache [kv_batch, cap_k]; indexed: a permutation of B of its kv_batch entries
            kv_batch = s.kv == kIndexedCache ? B + 2 : B;
            std::vector<int32_t> perm(kv_batch);
            std::iota(perm.begin(), perm.end(), 0);
            if (s.kv == kIndexedCache) std::shuffle(perm.begin(), perm.end(), rng());
            kv_idx.assign(perm.begin(), perm.begin() + B);
            k_outer = kv_batch, k_rows = cap_k, k_seq_stride = hd;
            for (int64_t b = 0; b < B; ++b)
                for (int64_t j = 0; j < s.sk[b]; ++j) row_of[b].push_back((int64_t)kv_idx[b] * cap_k + s.pad(b) + j);
        }
        const int64_t k_elems = paged ? num_pages * k_page_stride : k_outer * k_rows * hd;
        k.assign(k_elems, s.nan_unused ? kPoison16 : from_f32(s.dtype, -0.25f));
        v.assign(s.shared_pool ? 0 : k_elems, s.nan_unused ? kPoison16 : from_f32(s.dtype, 0.75f));
        std::vector<uint16_t> &vbuf = s.shared_pool ? k : v;
        for (int64_t b = 0; b < B; ++b) {
            const Inputs &in = *seqs[b];
            for (int64_t j = 0; j < s.sk[b]; ++j)
                for (int64_t hh = 0; hh < s.hkv; ++hh)
                    for (int64_t dd = 0; dd < s.d; ++dd) {
                        // (pages head-major: row_of's page and row placed by the strides)
                        const int64_t at = s.head_major ? row_of[b][j] / (k_page_stride / hd) * k_page_stride +
                                                              row_of[b][j] % (k_page_stride / hd) * k_seq_stride
                                                        : row_of[b][j] * hd;
                        const int64_t src = j * in.ks.s + hh * in.ks.h + dd, dst = at + hh * k_head_stride + dd;
                        k[dst] = in.k[src];
                        vbuf[dst + v_offset] = in.v[src];
                    }
        }
        if (s.alibi)
            for (int64_t b = 0; b < B; ++b) slopes.insert(slopes.end(), seqs[b]->slopes.begin(), seqs[b]->slopes.end());
    }
};

// Device buffers of a ServingRun, and the params of its call.
struct DeviceRun {
    DevBuf<uint16_t> q, k, v, o;
    DevBuf<float> lse, slopes;
    DevBuf<int32_t> cu_q, cu_k, used, table, kv_idx, indptr, last_len, leftpad;
    explicit DeviceRun(const ServingRun &r)
        : q(r.q.size()), k(r.k.size()), v(r.v.size()), o(r.q.size()), lse(r.s.hq * r.q_rows), slopes(r.slopes.size()),
          cu_q(r.cu_q.size()), cu_k(r.cu_k.size()), used(r.used.size()), table(r.table.size()), kv_idx(r.kv_idx.size()),
          indptr(r.indptr.size()), last_len(r.last_len.size()), leftpad(r.leftpad.size()) {
        upload(r);
    }
    void upload(const ServingRun &r) {
        q.upload(r.q), k.upload(r.k), v.upload(r.v), slopes.upload(r.slopes);
        cu_q.upload(r.cu_q), cu_k.upload(r.cu_k), used.upload(r.used), table.upload(r.table), kv_idx.upload(r.kv_idx);
        indptr.upload(r.indptr), last_len.upload(r.last_len), leftpad.upload(r.leftpad);
    }
    void poison(cudaStream_t st = 0) {
        CUDA_CHECK(cudaMemsetAsync(o.p, 0xff, o.n * 2, st));
        CUDA_CHECK(cudaMemsetAsync(lse.p, 0xff, lse.n * 4, st));
    }
    flashattn_fwd_params params(const ServingRun &r) const {
        const Spec &s = r.s;
        flashattn_fwd_params p;
        flashattn_fwd_params_init(&p);
        p.dtype = s.dtype, p.mask = s.mask, p.backend = FLASHATTN_BACKEND_AUTO;
        p.batch = r.B, p.seqlen_q = r.cap_q, p.seqlen_k = r.cap_k, p.heads_q = s.hq, p.heads_kv = s.hkv, p.head_dim = s.d;
        p.q = q.p, p.o = o.p, p.lse = lse.p;
        p.q_seq_stride = p.o_seq_stride = s.hq * s.d, p.q_head_stride = p.o_head_stride = s.d;
        p.q_batch_stride = p.o_batch_stride = s.packed_q ? 0 : r.cap_q * s.hq * s.d;
        if (s.packed_q) p.cu_seqlens_q = cu_q.p, p.total_q = r.total_q;
        p.k = k.p;
        p.v = s.shared_pool ? (const void *)(k.p + r.v_offset) : v.p;
        p.k_seq_stride = p.v_seq_stride = r.k_seq_stride;
        p.k_head_stride = p.v_head_stride = r.k_head_stride;
        switch (s.kv) {
        case kPackedKv: p.cu_seqlens_k = cu_k.p, p.total_k = r.total_k; break;
        case kPagedSeqused:
        case kPagedCuLens:
            p.block_table = table.p, p.pages_per_seq = r.width, p.block_table_batch_stride = r.row_stride;
            p.page_size = s.page_size, p.num_pages = r.num_pages;
            p.k_batch_stride = p.v_batch_stride = r.k_page_stride;
            if (s.kv == kPagedSeqused) p.seqused_k = used.p;
            else p.cu_seqlens_k = cu_k.p;
            break;
        case kPagedCsr:
            p.block_table = table.p, p.pages_per_seq = r.width, p.block_table_batch_stride = 0;
            p.page_size = s.page_size, p.num_pages = r.num_pages;
            p.k_batch_stride = p.v_batch_stride = r.k_page_stride;
            p.kv_indptr = indptr.p, p.kv_last_page_len = last_len.p, p.num_page_indices = (int64_t)r.table.size();
            break;
        case kIndexedCache:
            p.kv_batch_idx = kv_idx.p, p.kv_batch = r.kv_batch;
            p.k_batch_stride = p.v_batch_stride = r.cap_k * s.hkv * s.d, p.seqused_k = used.p;
            break;
        case kDenseSeqused:
            p.k_batch_stride = p.v_batch_stride = r.cap_k * s.hkv * s.d, p.seqused_k = used.p;
            break;
        }
        if (!s.lp.empty()) p.cache_leftpad = leftpad.p;
        p.softcap = s.softcap, p.window_left = s.wl, p.window_right = s.wr;
        if (s.alibi) p.alibi_slopes = slopes.p, p.alibi_batch_stride = s.hq;
        return p;
    }
};

struct Stats {
    int seqs = 0, calls[4] = {0, 0, 0, 0}, split_packed_q = 0;  // split_packed_q: fused calls with a packed Q that split
    int unsplit_m64 = 0;  // FUSED_SM90 calls on 64-row tiles (one consumer, 8 warps), unsplit
    int not_built = 0;  // calls not made: a build restricted to other head dims (FLASHATTN_HEAD_DIMS) lacks the kernel
    double worst_ratio = 0, max_err = 0, max_lse_err = 0;
};

// Whether this build has `backend`'s kernel for head dim d (a development build may be restricted to
// some head dims: FLASHATTN_HEAD_DIMS).
bool kernel_built(int backend, int dtype, int64_t d) {
    if (backend == FLASHATTN_BACKEND_FUSED) return fa_fused_compiled(dtype, fa_fused_kernel_head_dim(d)) != 0;
    if (backend == FLASHATTN_BACKEND_FUSED_SM90) return fa_sm90_compiled(dtype, fa_sm90_kernel_head_dim(d)) != 0;
    return true;
}

// The backends that run serving calls on this device: REFERENCE (the gathered oracle), FUSED, and
// FUSED_SM90 on Hopper builds.
std::vector<int> serving_backends() {
    std::vector<int> b = {FLASHATTN_BACKEND_REFERENCE, FLASHATTN_BACKEND_FUSED};
    int dev = 0, major = 0, minor = 0;
    if (cudaGetDevice(&dev) == cudaSuccess &&
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess &&
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) == cudaSuccess && major == 9 &&
        minor == 0 && fa_sm90_compiled(FLASHATTN_DTYPE_BFLOAT16, 128))
        b.push_back(FLASHATTN_BACKEND_FUSED_SM90);
    return b;
}

// Whether FUSED_SM90 is among them (the tests of its resident serving blocks skip otherwise).
bool serves_on_sm90() {
    const std::vector<int> b = serving_backends();
    return std::find(b.begin(), b.end(), FLASHATTN_BACKEND_FUSED_SM90) != b.end();
}

// Runs the call on `backend` (workspace as planned) into dev's poisoned outputs.
flashattn_status call(flashattn_handle *h, flashattn_fwd_params p, int backend, cudaStream_t st = 0) {
    p.backend = backend;
    size_t need = 0;
    flashattn_status status = flashattn_fwd_workspace_size(h, &p, &need);
    if (status != FLASHATTN_STATUS_SUCCESS) return status;
    DevBuf<char> ws(need);
    status = flashattn_fwd(h, &p, ws.p, need, st);
    CUDA_CHECK(cudaStreamSynchronize(st));  // before ws is freed
    return status;
}

// Each sequence's rows of O and LSE against its oracle, by FlashAttention's rule; unowned rows poisoned.
void check_outputs(flashattn_handle *h, const ServingRun &r, const std::vector<uint16_t> &o,
                   const std::vector<float> &lse, Stats &st) {
    const Spec &s = r.s;
    std::vector<char> owned(r.q_rows, 0);
    for (int64_t b = 0; b < r.B; ++b) {
        SCOPED_TRACE("sequence " + std::to_string(b) + " of " + s.str());
        const Inputs &in = *r.seqs[b];
        const int64_t row0 = s.packed_q ? r.cu_q[b] : b * r.cap_q;
        const int64_t n = s.sq[b];
        std::fill(owned.begin() + row0, owned.begin() + row0 + n, 1);
        if (n == 0) continue;
        std::vector<float> ob(n * s.hq * s.d), lb(s.hq * n);
        for (int64_t i = 0; i < n; ++i)
            for (int64_t x = 0; x < s.hq * s.d; ++x) ob[i * s.hq * s.d + x] = to_f32(s.dtype, o[(row0 + i) * s.hq * s.d + x]);
        for (int64_t hh = 0; hh < s.hq; ++hh)
            for (int64_t i = 0; i < n; ++i)
                lb[hh * n + i] = s.packed_q ? lse[hh * r.total_q + row0 + i] : lse[(b * s.hq + hh) * r.cap_q + i];
        const Oracle ora = oracle(in);
        const Result low = run(h, in, FLASHATTN_BACKEND_REFERENCE, true);
        ASSERT_EQ(FLASHATTN_STATUS_SUCCESS, low.status) << flashattn_last_error();
        const double err_f = max_abs_diff(ob, ora.o), err_l = max_abs_diff(low.o, ora.o);
        const double lse_err = max_abs_diff(lb, ora.lse);
        constexpr double kAtol = 1e-5;
        EXPECT_LE(err_f, 2 * err_l + kAtol) << "serving error " << err_f << " vs plain low-precision " << err_l;
        EXPECT_LE(lse_err, 2e-3);
        st.worst_ratio = std::max(st.worst_ratio, err_f / std::max(err_l, kAtol));
        st.max_err = std::max(st.max_err, err_f), st.max_lse_err = std::max(st.max_lse_err, lse_err);
        ++st.seqs;
    }
    size_t touched = 0;
    for (int64_t row = 0; row < r.q_rows; ++row)
        if (!owned[row])
            for (int64_t x = 0; x < s.hq * s.d; ++x) touched += o[row * s.hq * s.d + x] != kPoison16;
    EXPECT_EQ(0u, touched) << "rows that no sequence owns were written (" << s.str() << ")";
}

// The call on every backend (REFERENCE, FUSED, and FUSED_SM90 on Hopper: TMA pages or gathered
// ones, by the page size), or on `only` alone, each checked sequence by sequence; with
// `sm90_plan_has` (`fused_plan_has`), FUSED_SM90's (FUSED's) plan description must contain it (or
// each of its parts joined by '&').
void run_and_check(flashattn_handle *h, const Spec &spec, Stats &st, int only = -1, const char *sm90_plan_has = nullptr,
                   const char *fused_plan_has = nullptr) {
    SCOPED_TRACE(spec.str());
    ServingRun r(spec);
    DeviceRun dev(r);
    const flashattn_fwd_params p = dev.params(r);
    for (int backend : serving_backends()) {
        if (only >= 0 && backend != only) continue;
        if (!kernel_built(backend, spec.dtype, spec.d)) {
            ++st.not_built;
            continue;
        }
        SCOPED_TRACE("backend " + std::to_string(backend));
        flashattn_fwd_params pb = p;
        pb.backend = backend;
        ASSERT_EQ(FLASHATTN_STATUS_SUCCESS, flashattn_fwd_supported(h, &pb)) << flashattn_last_error();
        flashattn_plan_info info;
        flashattn_plan_info_init(&info);
        ASSERT_EQ(FLASHATTN_STATUS_SUCCESS, flashattn_fwd_plan(h, &pb, &info)) << flashattn_last_error();
        st.split_packed_q += spec.packed_q && info.num_splits > 1;
        st.unsplit_m64 +=
            backend == FLASHATTN_BACKEND_FUSED_SM90 && info.block_m == 64 && info.num_warps == 8 && info.num_splits == 1;
        const char *plan_has = backend == FLASHATTN_BACKEND_FUSED_SM90 ? sm90_plan_has
                               : backend == FLASHATTN_BACKEND_FUSED    ? fused_plan_has
                                                                       : nullptr;
        if (plan_has) {
            // (parts joined by '&': each must be there, or, written "!part", must not)
            const std::string want = plan_has, desc = info.description;
            for (size_t at = 0; at <= want.size();) {
                const size_t end = std::min(want.find('&', at), want.size());
                const std::string part = want.substr(at, end - at);
                if (!part.empty() && part[0] == '!')
                    EXPECT_EQ(desc.find(part.substr(1)), std::string::npos) << desc;
                else
                    EXPECT_NE(desc.find(part), std::string::npos) << desc;
                at = end + 1;
            }
        }
        dev.poison();
        ASSERT_EQ(FLASHATTN_STATUS_SUCCESS, call(h, p, backend)) << flashattn_last_error();
        check_outputs(h, r, dev.o.download(), dev.lse.download(), st);
        ++st.calls[backend];
    }
}

void print_stats(const char *name, const Stats &st) {
    printf("[ serving ] %s: %d sequences (%d reference, %d fused, %d fused_sm90 calls), max |O err| %.3g, max |LSE err| "
           "%.3g, worst err/lowprec-err %.2f\n", name, st.seqs, st.calls[FLASHATTN_BACKEND_REFERENCE],
           st.calls[FLASHATTN_BACKEND_FUSED], st.calls[FLASHATTN_BACKEND_FUSED_SM90], st.max_err, st.max_lse_err,
           st.worst_ratio);
    if (st.not_built > 0) printf("[ serving ] %s: %d calls not made: this build lacks their head dims' kernels\n", name, st.not_built);
    if (st.calls[0] + st.calls[1] + st.calls[2] + st.calls[3] == 0 && st.not_built > 0)
        GTEST_SKIP() << "every call needs a kernel this build lacks (FLASHATTN_HEAD_DIMS)";
}

// Lengths with the edge cases: an empty sequence, a sequence with queries but no keys, single-token
// decode rows, lengths just past a tile, and a long one.
const std::vector<int64_t> kSq = {37, 0, 1, 129, 5, 64};
const std::vector<int64_t> kSk = {300, 50, 1, 129, 0, 700};

TEST_F(Serving, RaggedQueriesAndKeysMatchTheOracle) {
    Stats st;
    for (int64_t d : {64, 128})
        for (int mask : {FLASHATTN_MASK_NONE, FLASHATTN_MASK_CAUSAL_BOTTOM_RIGHT})
            for (int dtype : {FLASHATTN_DTYPE_BFLOAT16, FLASHATTN_DTYPE_FLOAT16}) {
                Spec s;
                s.d = d, s.mask = mask, s.dtype = dtype, s.sq = kSq, s.sk = kSk;
                run_and_check(h, s, st);
            }
    print_stats("ragged (cu_seqlens_q, cu_seqlens_k)", st);
}

TEST_F(Serving, FeaturesPerSequence) {
    Stats st;
    Spec base;
    base.sq = {40, 1, 200, 0, 17}, base.sk = {90, 333, 200, 12, 17};
    Spec w = base;
    w.mask = FLASHATTN_MASK_CAUSAL_BOTTOM_RIGHT, w.wl = 32, w.wr = 0;
    Spec sc = base;
    sc.softcap = 30.0f, sc.alibi = true, sc.hq = 8, sc.hkv = 2;
    Spec tl = base;
    tl.mask = FLASHATTN_MASK_CAUSAL_TOP_LEFT, tl.wr = 5;
    Spec mqa = base;
    mqa.hq = 8, mqa.hkv = 1, mqa.d = 96, mqa.alibi = true;
    for (Spec s : {w, sc, tl, mqa})
        for (KvMode kv : {kPackedKv, kPagedSeqused}) {
            s.kv = kv;
            run_and_check(h, s, st);
        }
    print_stats("masks, windows, softcap, ALiBi, GQA/MQA per sequence", st);
}

TEST_F(Serving, PagedKvAnyPageSize) {
    Stats st;
    for (int64_t page : {1, 16, 19, 64, 256})
        for (KvMode kv : {kPagedSeqused, kPagedCuLens, kPagedCsr}) {
            Spec s;
            s.sq = kSq, s.sk = kSk, s.kv = kv, s.page_size = page, s.mask = FLASHATTN_MASK_CAUSAL_BOTTOM_RIGHT;
            s.shared_pool = (page == 16 || page == 19) && kv != kPagedCsr;
            run_and_check(h, s, st);
        }
    print_stats("paged K/V (block table, page lists), pages of 1, 16, 19, 64, 256 keys", st);
}

TEST_F(Serving, GatheredPagesEveryHeadDim) {
    // Pages the tensor-map boxes cannot tile (1 and 19 keys) are gathered by FUSED_SM90's producer
    // warpgroup with cp.async (eight rows x 64 bytes a copy instruction beside two or three
    // consumers, four rows x 128 bytes in the single-consumer decode kernels): every kernel that gathers
    // (head dim 64 on 128- and 192-key tiles, 96 and 128 on 128, 160 and 192 on 112, 256 on 80;
    // one, two and three consumers), real head dims below the kernel's (96, 160: the columns past
    // them zero-filled), ragged prefill causal and unmasked, and decode split over a capacity (its
    // copies carrying the evict-first L2 policy: kv_evict_first).
    Stats st;
    for (int64_t d : {64, 96, 128, 160, 192, 256})
        for (int64_t page : {1, 19}) {
            Spec s;
            s.d = d, s.kv = kPagedSeqused, s.page_size = page, s.hq = 4, s.hkv = 2;
            s.sq = {37, 129, 5, 200}, s.sk = {300, 129, 77, 200};
            for (int mask : {(int)FLASHATTN_MASK_CAUSAL_BOTTOM_RIGHT, (int)FLASHATTN_MASK_NONE}) {
                s.mask = mask;
                run_and_check(h, s, st, -1, ":gather");
            }
            s.packed_q = false, s.mask = FLASHATTN_MASK_NONE, s.cap_k = 4096;
            s.sq = {1, 1, 1}, s.sk = {3001, 100, 1500};
            run_and_check(h, s, st, -1, ":gather&kv_evict_first");
        }
    print_stats("gathered pages (1 and 19 keys), head dims 64, 96, 128, 160, 192, 256: prefill and split decode", st);
}

TEST_F(Serving, PagedKvBoxesCrossKeyTiles) {
    // Page sizes that neither divide FUSED_SM90's key tile nor are a multiple of it: TMA reads them
    // in boxes of gcd(page size, block_n) keys, so a page straddles two key tiles (block_n 128 at
    // head dim 128, 112 at 192, 80 at 256).
    Stats st;
    const int64_t cases[][2] = {{128, 24}, {128, 200}, {192, 40}, {192, 64}, {192, 256}, {256, 64}, {256, 48}, {256, 256}};
    for (const auto &c : cases)
        for (KvMode kv : {kPagedSeqused, kPagedCsr}) {
            Spec s;
            s.d = c[0], s.page_size = c[1], s.sq = kSq, s.sk = kSk, s.kv = kv;
            s.mask = FLASHATTN_MASK_CAUSAL_BOTTOM_RIGHT;
            run_and_check(h, s, st);
        }
    print_stats("paged K/V, pages straddling key tiles (head dims 128, 192, 256)", st);
}

TEST_F(Serving, PagedKvFullWidthBoxes) {
    // FUSED_SM90 reads each TMA box of a page's keys with all their columns at once (one copy where
    // there were head_dim / 64) wherever the pool allows it: pages [page, H, D], head-major pages
    // [H, page, D], and K and V as the halves of one pool; its K and V tiles are then laid out by
    // 8-row groups (the plan says paged=N:tma_full). Head dims 128, 192 and 256; boxes of 8, 16 and
    // 32 keys; a sequence whose last key tile ends inside a page (its rows past the last key cleared
    // in the group layout); more query tiles than SMs (resident blocks). A split decode over the
    // same pages gathers them instead.
    Stats st;
    struct Case {
        int64_t d, page;
    } cases[] = {{128, 16}, {128, 32}, {192, 16}, {192, 24}, {256, 16}, {256, 32}};
    for (const Case &c : cases)
        for (int layout = 0; layout < 3; ++layout) {
            Spec s;
            s.d = c.d, s.page_size = c.page, s.kv = kPagedSeqused, s.hq = 4, s.hkv = 2;
            s.shared_pool = layout == 1, s.head_major = layout == 2;
            s.mask = layout == 1 ? FLASHATTN_MASK_NONE : FLASHATTN_MASK_CAUSAL_BOTTOM_RIGHT;
            s.sq = kSq, s.sk = kSk;
            run_and_check(h, s, st, -1, "tma_full");
        }
    // Resident blocks: 8 sequences x 8 heads of 400 queries (more query tiles than SMs).
    for (int64_t d : {128, 256}) {
        Spec s;
        s.d = d, s.page_size = 16, s.kv = kPagedSeqused, s.hq = 8, s.hkv = 2, s.head_major = d == 256;
        s.mask = FLASHATTN_MASK_CAUSAL_BOTTOM_RIGHT;
        s.sq = std::vector<int64_t>(8, 400), s.sk = {400, 400, 700, 400, 33, 400, 1000, 400};
        run_and_check(h, s, st, -1, "tma_full");
    }
    // The split decode over pages of 32 (fa_sm90_gathers_pages: a split's first tile arrives
    // sooner gathered).
    Spec dec;
    dec.d = 128, dec.page_size = 32, dec.kv = kPagedSeqused, dec.hq = 8, dec.hkv = 2, dec.packed_q = false;
    dec.cap_k = 4200, dec.sq = {1, 1, 1}, dec.sk = {4100, 31, 2000};
    run_and_check(h, dec, st, -1, "paged=32:gather&!splits=1 &!tma_full");
    print_stats("paged K/V, full-width page boxes (head dims 128, 192, 256; pages, head-major pages, one pool)", st);
}

TEST_F(Serving, LongUnmaskedCallsTakeWideKeyTiles) {
    // No mask over a capacity of 4096 keys or more at head dim 128 (these calls' capacities are
    // 9000): FUSED_SM90's 176-key tiles, with packed K/V and TMA pages (boxes of 16 and of 8 keys);
    // gathered pages (19 keys) beside them, which the planner keeps on 128-key tiles.
    Stats st;
    for (KvMode kv : {kPackedKv, kPagedSeqused, kPagedCsr})
        for (int64_t page : {16, 24, 19}) {
            if (kv == kPackedKv && page != 16) continue;
            Spec s;
            s.d = 128, s.kv = kv, s.page_size = page;
            s.sq = {37, 129, 0, 5}, s.sk = {8300, 9000, 50, 0};
            run_and_check(h, s, st);
        }
    print_stats("no mask, 9000 keys, head dim 128 (176-key tiles; gathered pages on 128)", st);
}

TEST_F(Serving, PersistentBlocksSkipWhatTheirSequencesLack) {
    // More query tiles than SMs over the capacities (400 queries: 4 tiles of 128 rows x 8 heads x 8
    // sequences): FUSED_SM90's resident blocks take tile after tile, each tile's sequence read on
    // the device. Tiles past a sequence's queries are skipped; tiles whose rows see no key (a
    // sequence with no keys; the first rows of a bottom-right mask with more queries than keys)
    // write O = 0 and LSE = -inf; the rest match the oracle. Packed K/V, pages TMA reads (64 keys)
    // and a dense cache with per-sequence counts; no mask, causal, and (head dim 128) a sliding
    // window; head dims 64 (no mask: three consumers; causal: two), 128 and 256.
    if (!serves_on_sm90()) GTEST_SKIP() << "FUSED_SM90 needs an sm_90 GPU and a build with its kernels";
    Stats st;
    for (int64_t d : {64, 128, 256})
        for (int mask : {(int)FLASHATTN_MASK_NONE, (int)FLASHATTN_MASK_CAUSAL_BOTTOM_RIGHT, -1})
            for (KvMode kv : {kPackedKv, kPagedSeqused, kDenseSeqused}) {
                if (d == 256 && mask != FLASHATTN_MASK_CAUSAL_BOTTOM_RIGHT) continue;
                if (d == 64 && mask == -1) continue;
                Spec s;
                s.d = d, s.mask = mask, s.kv = kv, s.page_size = 64, s.hq = 8, s.hkv = 2;
                if (mask == -1) s.mask = FLASHATTN_MASK_CAUSAL_BOTTOM_RIGHT, s.wl = 100;  // a sliding window
                s.dtype = d == 64 ? FLASHATTN_DTYPE_FLOAT16 : FLASHATTN_DTYPE_BFLOAT16;
                s.sq = {37, 0, 1, 129, 5, 400, 300, 260};
                s.sk = {300, 50, 1, 129, 0, 450, 250, 400};
                run_and_check(h, s, st, FLASHATTN_BACKEND_FUSED_SM90, " persistent");
            }
    print_stats("persistent serving blocks (ragged, 256 capacity tiles; packed, paged, cached K/V; causal, no mask, a window; head dims 64, 128, 256)", st);
}

// Sequences of sq queries over sk keys on FUSED_SM90's resident blocks (the plan must say so), head
// dims 64 (fp16) and 128 (bf16), no mask and causal, packed K/V and pages of 64 keys.
void check_on_resident_blocks(flashattn_handle *h, int64_t hq, int64_t hkv, const std::vector<int64_t> &sq,
                              const std::vector<int64_t> &sk, Stats &st) {
    for (int64_t d : {64, 128})
        for (int mask : {FLASHATTN_MASK_NONE, FLASHATTN_MASK_CAUSAL_BOTTOM_RIGHT})
            for (KvMode kv : {kPackedKv, kPagedSeqused}) {
                Spec s;
                s.d = d, s.mask = mask, s.kv = kv, s.page_size = 64, s.hq = hq, s.hkv = hkv;
                s.dtype = d == 64 ? FLASHATTN_DTYPE_FLOAT16 : FLASHATTN_DTYPE_BFLOAT16;
                s.sq = sq, s.sk = sk;
                run_and_check(h, s, st, FLASHATTN_BACKEND_FUSED_SM90, " persistent");
            }
}

TEST_F(Serving, PersistentBlocksTakeManyTilesEach) {
    // 1024 capacity tiles (4 of 128 rows x 16 heads x 16 sequences) over the SMs' resident blocks:
    // some eight tiles a block, so that a block's two Q buffers and two tile records (head dims 64
    // and 128) go round several times, through runs of tiles with no query (skipped), with no key
    // (answered without a load) and with both, and a block's last tile may be any of them.
    if (!serves_on_sm90()) GTEST_SKIP() << "FUSED_SM90 needs an sm_90 GPU and a build with its kernels";
    Stats st;
    check_on_resident_blocks(h, 16, 4, {400, 0, 130, 5, 0, 0, 256, 1, 390, 77, 0, 129, 400, 3, 0, 200},
                             {400, 9, 130, 0, 0, 12, 300, 1, 390, 0, 0, 500, 450, 3, 7, 250}, st);
    print_stats("persistent serving blocks, many tiles each (1024 capacity tiles; packed and paged K/V; head dims 64, 128)", st);
}

TEST_F(Serving, GatheredPagesOnResidentBlocks) {
    // Pages the tensor-map boxes cannot tile (1 and 19 keys) on FUSED_SM90's resident blocks: under a
    // causal mask, where the block has two consumers and two Q buffers (head dims 64 and 128 on
    // 128-row tiles), the producer warpgroup's four warps copy each tile's rows with cp.async, tile
    // after tile (warps 0, 2 and 3 following the tile records, warp 1 after it has posted the record
    // and loaded Q), their stages counted across the block's tiles. 384 capacity tiles (6 of 128
    // rows x 8 heads x 8 sequences, about three a block) over shorter sequences, one with no queries
    // and one whose queries see no key. Unmasked and windowed calls (head dim 128) keep a block a
    // tile: their plans say so.
    if (!serves_on_sm90()) GTEST_SKIP() << "FUSED_SM90 needs an sm_90 GPU and a build with its kernels";
    Stats st;
    for (int64_t d : {64, 128})
        for (int mask : {(int)FLASHATTN_MASK_NONE, (int)FLASHATTN_MASK_CAUSAL_BOTTOM_RIGHT, -1})
            for (int64_t page : {1, 19}) {
                if (d != 128 && mask != FLASHATTN_MASK_CAUSAL_BOTTOM_RIGHT) continue;
                Spec s;
                s.d = d, s.mask = mask, s.kv = kPagedSeqused, s.page_size = page, s.hq = 8, s.hkv = 2;
                if (mask == -1) s.mask = FLASHATTN_MASK_CAUSAL_BOTTOM_RIGHT, s.wl = 100;  // a sliding window
                s.dtype = d == 64 ? FLASHATTN_DTYPE_FLOAT16 : FLASHATTN_DTYPE_BFLOAT16;
                s.sq = {37, 0, 1, 129, 5, 700, 300, 260};
                s.sk = {300, 50, 1, 129, 0, 720, 250, 400};
                run_and_check(h, s, st, FLASHATTN_BACKEND_FUSED_SM90,
                              mask == FLASHATTN_MASK_CAUSAL_BOTTOM_RIGHT ? " persistent&:gather" : ":gather");
            }
    print_stats("gathered pages on resident blocks (pages of 1 and 19; 384 capacity tiles; head dims 64 and 128; causal, no mask, a window)", st);
}

TEST_F(Serving, ThreeConsumerPersistentBlocksPairCausalTiles) {
    // Head dim 64 causal over more than 2048 keys (by capacity) takes the 192-row tile on resident
    // blocks: three consumers, the record warp walking each sequence's own query tiles in pairs of
    // equal work (a sequence's heaviest with its lightest), then the middle tiles of sequences with
    // an odd count. Sequences of 11, 4, 1 and 2 query tiles, none, and one with no keys; packed
    // and paged K/V.
    if (!serves_on_sm90()) GTEST_SKIP() << "FUSED_SM90 needs an sm_90 GPU and a build with its kernels";
    Stats st;
    for (KvMode kv : {kPackedKv, kPagedSeqused}) {
        Spec s;
        s.d = 64, s.mask = FLASHATTN_MASK_CAUSAL_BOTTOM_RIGHT, s.kv = kv, s.page_size = 64, s.hq = 4, s.hkv = 2;
        s.dtype = FLASHATTN_DTYPE_FLOAT16;
        s.sq = {2100, 0, 700, 5, 193, 300, 64};
        s.sk = {2100, 9, 700, 0, 1600, 300, 2049};
        run_and_check(h, s, st, FLASHATTN_BACKEND_FUSED_SM90, " persistent=pairs");
    }
    print_stats("three-consumer persistent serving blocks, causal pairs (head dim 64, 2100-key capacity; packed and paged K/V)", st);
}

TEST_F(Serving, RaggedWalksTakeTheLongestSequencesFirst) {
    // 40 sequences of unequal, unsorted lengths (some with no queries, some with one): the record
    // warp of FUSED_SM90's resident blocks walks them 32 at a time, each run of 32 sorted longest
    // first, and deals the units out in rounds forwards and backwards; the second run (8 sequences)
    // and, under a causal mask, the middle tiles after the pairs start their walk again. Every tile
    // must be handed out exactly once: a tile dealt twice or never leaves rows unwritten (the
    // outputs are poisoned) or wrong. Head dims 64 and 128; no mask and causal; packed and paged K/V.
    if (!serves_on_sm90()) GTEST_SKIP() << "FUSED_SM90 needs an sm_90 GPU and a build with its kernels";
    Stats st;
    const std::vector<int64_t> sq = {129, 5,   200, 600, 0,   1, 77, 390, 1,   129, 450, 0,   390, 37,
                                     0,   1,   200, 200, 1,   37, 1,  390, 200, 0,   77,  450, 1,   37,
                                     600, 600, 450, 0,   450, 450, 200, 0,  37,  0,   390, 77};
    std::vector<int64_t> sk;
    for (size_t i = 0; i < sq.size(); ++i) sk.push_back(sq[i] + (int64_t)(i % 3) * 50);
    check_on_resident_blocks(h, 4, 2, sq, sk, st);
    print_stats("ragged walks longest first (40 sequences of unsorted lengths, two runs of 32; head dims 64 and 128; no mask and causal; packed and paged K/V)", st);
}

TEST_F(Serving, OneWarpProducerBlocksWalkRaggedQueries) {
    // The resident serving blocks whose producer is one warp (it posts each tile's record and then
    // loads the tile: head dims 192 and 256, and head dim 128 with 176-key tiles, a capacity of
    // 4096 keys or more without a mask) walk each sequence's own query tiles when Q is ragged, and
    // hand the consumers each tile's work number: no mask (tile after tile), causal (pairs of a
    // sequence's own tiles, then the middle tiles of sequences with an odd count) and a window.
    // Capacities of 1100 queries (9 tiles of 128 rows x 8 heads x 6 sequences: more than SMs) over
    // shorter sequences, one with no queries, one whose queries see no key; packed and paged K/V.
    if (!serves_on_sm90()) GTEST_SKIP() << "FUSED_SM90 needs an sm_90 GPU and a build with its kernels";
    Stats st;
    for (int64_t d : {128, 192, 256})
        for (int mask : {(int)FLASHATTN_MASK_NONE, (int)FLASHATTN_MASK_CAUSAL_BOTTOM_RIGHT, -1})
            for (KvMode kv : {kPackedKv, kPagedSeqused}) {
                if (d == 128 && mask != FLASHATTN_MASK_NONE) continue;  // (masked d128: two records, tested above)
                if (d == 192 && mask == -1) continue;
                Spec s;
                s.d = d, s.mask = mask, s.kv = kv, s.page_size = 64, s.hq = 8, s.hkv = 2;
                if (mask == -1) s.mask = FLASHATTN_MASK_CAUSAL_BOTTOM_RIGHT, s.wl = 150;  // a sliding window
                s.cap_q = 1100, s.cap_k = d == 128 ? 8200 : 1100;
                s.sq = {300, 3, 0, 130, 257, 129};
                s.sk = {500, d == 128 ? 8192 : 1000, 40, 0, 260, 700};
                run_and_check(h, s, st, FLASHATTN_BACKEND_FUSED_SM90, " persistent");
            }
    print_stats("one-warp producer serving blocks, ragged Q (capacity 1100 queries; packed and paged K/V; head dim 128 on 176-key tiles, 192, 256; no mask, causal, a window)", st);
}

TEST_F(Serving, DecodeOverCaches) {
    // Dense Q [B, 1] (one new token per sequence) over a paged, an indexed and a plain dense cache,
    // with capacities above every length.
    // Then the same rows packed (cu_seqlens_q, as varlen decode passes them, one sequence with no
    // query): the fused kernels split these too, and the combine writes the packed rows.
    Stats st;
    for (KvMode kv : {kPagedSeqused, kPagedCsr, kIndexedCache, kDenseSeqused})
        for (int64_t sq : {1, 4}) {
            Spec s;
            s.packed_q = false, s.kv = kv, s.hq = 8, s.hkv = 2, s.d = 128, s.cap_k = 1100;
            s.mask = FLASHATTN_MASK_CAUSAL_BOTTOM_RIGHT;
            s.sq = std::vector<int64_t>(5, sq), s.sk = {1000, 7, 0, 513, 64};
            run_and_check(h, s, st);
            s.packed_q = true, s.sq[1] = 0;
            run_and_check(h, s, st);
        }
    // Varlen decode with a group of 8 query heads per KV head, head dim 64, softcap, over pages of 16.
    Spec g8;
    g8.kv = kPagedSeqused, g8.hq = 16, g8.hkv = 2, g8.d = 64, g8.softcap = 20.0f, g8.cap_k = 2100;
    g8.mask = FLASHATTN_MASK_CAUSAL_BOTTOM_RIGHT;
    g8.sq = {1, 1, 0, 1}, g8.sk = {2000, 1, 77, 0};
    run_and_check(h, g8, st);
    EXPECT_GT(st.split_packed_q, 0) << "no packed-Q decode call was split";
    print_stats("decode over paged, indexed and dense caches (dense and packed Q)", st);
    printf("[ serving ] decode with packed Q: %d fused calls split their keys\n", st.split_packed_q);
}

TEST_F(Serving, UnsplitDecodeOverManySequences) {
    // A decode whose tiles fill the SMs without a split (more sequences x KV heads than SMs):
    // FUSED_SM90's 64-row tiles on resident blocks (the plan must say so), over a dense cache, an
    // indexed one, packed K/V and pages of 64 and 256 that TMA reads; dense and packed Q; lengths
    // from 0 to past a tile, against the oracle.
    if (!serves_on_sm90()) GTEST_SKIP() << "FUSED_SM90 needs an sm_90 GPU and a build with its kernels";
    const int sms = sm_count();
    ASSERT_GT(sms, 0);
    Stats st;
    const int64_t hkv = 4, batch = sms / hkv + 9;  // tiles: batch x hkv > SMs
    for (KvMode kv : {kDenseSeqused, kIndexedCache, kPackedKv, kPagedSeqused})
        for (int64_t page : {64, 256}) {
            if (kv != kPagedSeqused && page != 64) continue;
            for (bool packed_q : {false, true}) {
                Spec s;
                s.packed_q = packed_q, s.kv = kv, s.page_size = page, s.hq = 16, s.hkv = hkv, s.d = 128;
                s.mask = FLASHATTN_MASK_CAUSAL_BOTTOM_RIGHT, s.cap_k = 1100;
                s.dtype = packed_q ? FLASHATTN_DTYPE_FLOAT16 : FLASHATTN_DTYPE_BFLOAT16;
                for (int64_t b = 0; b < batch; ++b) {
                    s.sq.push_back(1);
                    s.sk.push_back(b == 3 ? 0 : b == 5 ? 1 : b == 8 ? 129 : (97 * b) % 1100 + 1);
                }
                run_and_check(h, s, st, FLASHATTN_BACKEND_FUSED_SM90, " persistent");
            }
        }
    EXPECT_EQ(st.calls[FLASHATTN_BACKEND_FUSED_SM90], st.unsplit_m64) << "a call split its keys or left the 64-row tile";
    EXPECT_GT(st.unsplit_m64, 0);
    print_stats("decode whose tiles fill the SMs unsplit (cache, indexed cache, packed K/V, pages of 64 and 256)", st);
}

TEST_F(Serving, DecodeOnResidentBlocksTakesTileAfterTile) {
    // A serving decode with about three times as many tiles (sequences x KV heads) as SMs: FUSED_SM90's
    // resident single-consumer blocks, each tile a KV head's group of query heads, its record warp
    // reading the next tile's sequence and its K/V warp loading the next tile's K and V while the
    // consumer finishes the last one; the two Q buffers and tile records go round several times.
    // Head dims 64 (192-key tiles) and 128; no mask, causal, a sliding window, softcap with ALiBi;
    // one query and four (speculative decode) a sequence; groups of 4 and 3 query heads; a dense
    // cache, pages (64 keys; 16 at head dim 128: eight boxes a key tile) and packed K/V; lengths 0
    // to 700 (a sequence with no key: O = 0, LSE = -inf; with packed Q, one with no query). Pages
    // gathered row by row (19 keys) keep a block a tile: their plan must not say persistent.
    if (!serves_on_sm90()) GTEST_SKIP() << "FUSED_SM90 needs an sm_90 GPU and a build with its kernels";
    const int sms = sm_count();
    ASSERT_GT(sms, 0);
    Stats st;
    int variant = 0;
    const KvMode kvs[3] = {kDenseSeqused, kPagedSeqused, kPackedKv};
    for (int64_t d : {64, 128})
        for (int mask : {(int)FLASHATTN_MASK_NONE, (int)FLASHATTN_MASK_CAUSAL_BOTTOM_RIGHT, -1, -2}) {
            const KvMode kv = kvs[variant++ % 3];  // (each head dim meets every K/V form)
            Spec s;
            s.d = d, s.kv = kv, s.page_size = d == 128 ? 16 : 64, s.cap_k = 700;
            s.hkv = variant % 2 ? 4 : 2, s.hq = s.hkv * (variant % 3 ? 4 : 3);
            s.mask = mask < 0 ? FLASHATTN_MASK_CAUSAL_BOTTOM_RIGHT : mask;
            if (mask == -1) s.wl = 100;                         // a sliding window
            if (mask == -2) s.softcap = 25.0f, s.alibi = true;  // the transform kernels
            s.packed_q = kv != kDenseSeqused;
            s.dtype = variant % 2 ? FLASHATTN_DTYPE_BFLOAT16 : FLASHATTN_DTYPE_FLOAT16;
            const int64_t queries = mask == FLASHATTN_MASK_CAUSAL_BOTTOM_RIGHT ? 4 : 1;
            const int64_t batch = 3 * sms / s.hkv + 5;  // tiles: three SMs' worth and a few, about four a block
            if (!s.packed_q) s.cap_q = queries;
            for (int64_t b = 0; b < batch; ++b) {
                s.sq.push_back(s.packed_q && b == 7 ? 0 : queries);
                s.sk.push_back(b == 3 ? 0 : b == 5 ? 1 : b == 8 ? 129 : (389 * b + 17 * variant) % 700 + 1);
            }
            run_and_check(h, s, st, FLASHATTN_BACKEND_FUSED_SM90, " persistent");
        }
    // Gathered pages: a block a tile.
    Spec g;
    g.d = 128, g.kv = kPagedSeqused, g.page_size = 19, g.hq = 16, g.hkv = 4, g.cap_k = 700;
    for (int64_t b = 0; b < sms / g.hkv + 9; ++b) g.sq.push_back(1), g.sk.push_back((97 * b) % 700 + 1);
    run_and_check(h, g, st, FLASHATTN_BACKEND_FUSED_SM90, ":gather&! persistent");
    print_stats("decode on resident single-consumer blocks (about four tiles a block; head dims 64, 128; no mask, causal, a window, softcap with ALiBi; 1 and 4 queries; cache, pages of 64 and 16, packed K/V)", st);
}

TEST_F(Serving, FusedDecodeWarpsWithNoQueryRowComputeNothing) {
    // FUSED decode whose blocks leave warps without a query row: one query per sequence with its
    // KV group's 4 heads as a tile's rows, or up to 5 queries of one head each (groups of one),
    // packed Q, over pages of 16 and 19, page lists, packed K/V and an indexed cache, split over a
    // capacity of 3100 keys or not; softcap (page lists), ALiBi (the cache's few queries); head
    // dims 64, 128 and 256, both dtypes. Each FUSED plan must take the idle-warp kernel.
    Stats st;
    for (int64_t d : {64, 128, 256})
        for (KvMode kv : {kPagedSeqused, kPagedCsr, kPackedKv, kIndexedCache}) {
            Spec s;
            s.d = d, s.kv = kv, s.page_size = kv == kPagedCsr ? 19 : 16, s.hq = 16, s.hkv = 4;
            s.dtype = d == 128 ? FLASHATTN_DTYPE_FLOAT16 : FLASHATTN_DTYPE_BFLOAT16;
            s.mask = kv == kPackedKv ? FLASHATTN_MASK_NONE : FLASHATTN_MASK_CAUSAL_BOTTOM_RIGHT;
            s.cap_k = kv == kPackedKv ? 0 : 3100;
            s.sq = {1, 1, 0, 1, 1}, s.sk = {3000, 1, 77, 0, 1500};
            if (kv == kPagedCsr) s.softcap = 30.0f;
            run_and_check(h, s, st, FLASHATTN_BACKEND_FUSED, nullptr, " idle_warps=3&gqa_rows");
            s.hq = s.hkv = 2, s.cap_q = 5;
            s.sq = {3, 5, 0, 2, 1};
            if (kv == kIndexedCache) s.alibi = true;
            run_and_check(h, s, st, FLASHATTN_BACKEND_FUSED, nullptr, " idle_warps=3");
        }
    print_stats("FUSED decode with rowless warps (grouped heads as rows, a few queries)", st);
    EXPECT_GT(st.split_packed_q, 0) << "no packed-Q decode call was split";
}

TEST_F(Serving, UnusedRowsNeverReachTheOutput) {
    // NaN in every row no sequence owns, as memory fresh from an allocator may hold: a cache's rows
    // past a sequence's count up to the capacity, a last page's rows past the last key, pages and
    // cache entries no sequence uses, packed K/V rows after the last sequence, Q rows past the last
    // sequence. Keys past a sequence's count take no part in its attention (FlashAttention-2 reads
    // them as zeros), so no backend may let those rows reach O or LSE: a key tile that crosses the
    // end of a sequence's keys holds some of them. Prefill rows (a block a tile, and over more
    // capacity tiles than SMs, FUSED_SM90's resident blocks) and decode rows (dense Q; the fused
    // kernels split those keys into 11-32 parts, and the last split's last tile crosses the end).
    Stats st;
    for (int64_t d : {64, 128})
        for (KvMode kv : {kPackedKv, kDenseSeqused, kIndexedCache, kPagedSeqused, kPagedCsr})
            for (int64_t page : {16, 19, 64}) {
                const bool paged = kv == kPagedSeqused || kv == kPagedCsr;
                if (!paged && page != 16) continue;
                Spec s;
                s.d = d, s.kv = kv, s.page_size = page, s.nan_unused = true, s.hq = 4, s.hkv = 2;
                s.mask = FLASHATTN_MASK_CAUSAL_BOTTOM_RIGHT, s.cap_k = 1100;
                s.sq = {37, 1, 129, 5}, s.sk = {300, 1000, 129, 77};
                run_and_check(h, s, st);
                s.packed_q = false, s.mask = FLASHATTN_MASK_NONE, s.cap_k = 4096;
                s.sq = {1, 1, 1}, s.sk = {3001, 100, 1500};
                run_and_check(h, s, st);
                if (page == 19) continue;
                // More capacity tiles than SMs (4 of 128 rows x 16 heads x 5 sequences): FUSED_SM90's
                // resident blocks, two consumers sharing the zeroing.
                s.packed_q = true, s.mask = FLASHATTN_MASK_CAUSAL_BOTTOM_RIGHT, s.cap_k = 1100, s.hq = 16, s.hkv = 4;
                s.sq = {400, 1, 300, 260, 129}, s.sk = {450, 700, 301, 260, 1000};
                run_and_check(h, s, st, -1, " persistent");
            }
    print_stats("NaN in every unused row (caches past each count, last pages, packed tails; prefill, resident blocks, split decode)", st);
}

TEST_F(Serving, LeftPaddedCachesSkipThePadding) {
    // cache_leftpad: sequence b's keys are the sk[b] rows after its lp[b] padding rows (packed K/V,
    // a dense and an indexed cache), with masks, windows and ALiBi counted from the first real key;
    // then decode rows over long padded caches (FUSED_SM90 splits those).
    Stats st;
    for (KvMode kv : {kPackedKv, kDenseSeqused, kIndexedCache})
        for (int variant = 0; variant < 3; ++variant) {
            Spec s;
            s.kv = kv;
            s.sq = {37, 1, 5, 0, 64}, s.sk = {300, 50, 0, 12, 129}, s.lp = {13, 0, 7, 4, 200};
            if (variant == 1) s.mask = FLASHATTN_MASK_CAUSAL_BOTTOM_RIGHT, s.wl = 40, s.alibi = true, s.hq = 8;
            if (variant == 2) {
                s.packed_q = false, s.hq = 8, s.hkv = 2, s.d = 128, s.cap_k = 1700;
                s.mask = FLASHATTN_MASK_CAUSAL_BOTTOM_RIGHT;
                s.sq = std::vector<int64_t>(5, 1), s.sk = {1000, 7, 0, 513, 64}, s.lp = {50, 3, 9, 0, 600};
            }
            run_and_check(h, s, st);
        }
    print_stats("left-padded caches (packed, dense, indexed K/V; decode)", st);
}

TEST_F(Serving, OutOfRangeContentsStayInsideTheTensors) {
    // Lengths above the capacities, offsets past total_q/total_k, pages and cache indices outside
    // the pools: clamped (meaningless numbers), but nothing outside the described tensors is touched
    // (run under compute-sanitizer by scripts/gpu_check.sh's sanitize step).
    for (int backend : serving_backends()) {
        SCOPED_TRACE("backend " + std::to_string(backend));
        Spec s;
        if (!kernel_built(backend, s.dtype, s.d)) continue;  // a build restricted to other head dims
        s.sq = {10, 20, 30}, s.sk = {40, 50, 60};
        ServingRun r(s);
        DeviceRun dev(r);
        std::vector<int32_t> bad_cu_q = {0, 500, -3, 1 << 30}, bad_cu_k = {-100, 1 << 29, 7, 9};
        dev.cu_q.upload(bad_cu_q), dev.cu_k.upload(bad_cu_k);
        dev.poison();
        ASSERT_EQ(FLASHATTN_STATUS_SUCCESS, call(h, dev.params(r), backend)) << flashattn_last_error();
        Spec pg = s;
        pg.kv = kPagedSeqused, pg.page_size = 16;
        ServingRun rp(pg);
        DeviceRun devp(rp);
        std::vector<int32_t> bad_table(rp.table.size(), 1 << 30), bad_used = {100000, -5, 60};
        devp.table.upload(bad_table), devp.used.upload(bad_used);
        ASSERT_EQ(FLASHATTN_STATUS_SUCCESS, call(h, devp.params(rp), backend)) << flashattn_last_error();
        Spec ix = s;
        ix.kv = kIndexedCache;
        ServingRun ri(ix);
        DeviceRun devi(ri);
        std::vector<int32_t> bad_idx = {-1, 1 << 20, 2};
        devi.kv_idx.upload(bad_idx);
        devi.poison();
        ASSERT_EQ(FLASHATTN_STATUS_SUCCESS, call(h, devi.params(ri), backend)) << flashattn_last_error();
        // An out-of-range cache index reads zeros: that sequence's values are zeros, O = 0 exactly.
        const std::vector<uint16_t> o = devi.o.download();
        for (int64_t x = 0; x < 10 * s.hq * s.d; ++x) ASSERT_EQ(0.0f, to_f32(s.dtype, o[x])) << x;
        // Padding outside 0..the key count, on a dense cache and on packed K/V.
        for (KvMode kv : {kDenseSeqused, kPackedKv}) {
            Spec lp = s;
            lp.kv = kv, lp.lp = {1, 2, 3};
            ServingRun rl(lp);
            DeviceRun devl(rl);
            std::vector<int32_t> bad_pad = {-5, 1 << 30, 61};
            devl.leftpad.upload(bad_pad);
            ASSERT_EQ(FLASHATTN_STATUS_SUCCESS, call(h, devl.params(rl), backend)) << flashattn_last_error();
        }
        CUDA_CHECK(cudaGetLastError());
    }
}

TEST_F(Serving, GraphReplaysNewLengthsPagesAndContents) {
    // Capture once with fixed capacities; replay after rewriting every device array in place. Dense
    // Q over a paged cache (FUSED_SM90 may split it: a workspace), then ragged Q and K.
    for (int backend : serving_backends())
        for (KvMode kv : {kPagedSeqused, kPackedKv}) {
            SCOPED_TRACE("backend " + std::to_string(backend) + " kv " + std::to_string(kv));
            Spec s;
            s.kv = kv, s.page_size = 16, s.mask = FLASHATTN_MASK_CAUSAL_BOTTOM_RIGHT, s.hq = 8, s.hkv = 2, s.d = 128;
            if (!kernel_built(backend, s.dtype, s.d)) continue;  // a build restricted to other head dims
            s.packed_q = kv == kPackedKv;
            s.cap_q = s.packed_q ? 150 : 2, s.cap_k = 1200;
            s.sq = s.packed_q ? std::vector<int64_t>{100, 3, 0, 150} : std::vector<int64_t>{2, 2, 2, 2};
            s.sk = {200, 1200, 9, 160};
            ServingRun first(s);
            DeviceRun dev(first);
            flashattn_fwd_params p = dev.params(first);
            p.backend = backend;
            size_t need = 0;
            ASSERT_EQ(FLASHATTN_STATUS_SUCCESS, flashattn_fwd_workspace_size(h, &p, &need)) << flashattn_last_error();
            DevBuf<char> ws(need);
            CapturedCall captured(h, p, ws.p, need);
            ASSERT_EQ(FLASHATTN_STATUS_SUCCESS, captured.status) << flashattn_last_error();
            Stats stats;
            const std::vector<std::vector<int64_t>> sqs = {{100, 3, 0, 150}, {1, 150, 77, 0}, {150, 150, 150, 150}};
            const std::vector<std::vector<int64_t>> sks = {{200, 1200, 9, 160}, {1199, 1, 0, 300}, {1200, 17, 250, 1}};
            for (size_t rep = 0; rep < sqs.size(); ++rep) {
                Spec next = s;
                if (s.packed_q) next.sq = sqs[rep];
                next.sk = sks[rep];
                ServingRun r(next);
                // Same capacities, so the same buffer sizes: rewrite the captured buffers' contents.
                ASSERT_EQ(first.q.size(), r.q.size());
                ASSERT_EQ(first.k.size(), r.k.size());
                ASSERT_EQ(first.table.size(), r.table.size());
                dev.upload(r);
                dev.poison();
                CUDA_CHECK(cudaDeviceSynchronize());
                captured.replay();
                check_outputs(h, r, dev.o.download(), dev.lse.download(), stats);
            }
            stats.calls[backend] = (int)sqs.size();
            print_stats("graph replays with new lengths, pages and contents", stats);
        }
}


// ---- appending new keys, with rotary embedding -----------------------------------------------------

// x rotated at table row `pos` (GPT-J pairs when interleaved, else GPT-NeoX halves), in float, rounded once.
std::vector<uint16_t> rotate_row(int dtype, const uint16_t *x, int64_t d, int64_t rd, bool interleaved,
                                 const std::vector<uint16_t> &cos, const std::vector<uint16_t> &sin, int64_t pos) {
    std::vector<uint16_t> out(x, x + d);
    const int64_t half = rd / 2;
    for (int64_t c = 0; c < rd; ++c) {
        int64_t i, partner;
        float sign;
        if (interleaved) i = c / 2, partner = c ^ 1, sign = (c & 1) ? 1.0f : -1.0f;
        else i = c < half ? c : c - half, partner = c < half ? c + half : c - half, sign = c < half ? -1.0f : 1.0f;
        const float cv = to_f32(dtype, cos[pos * half + i]), sv = to_f32(dtype, sin[pos * half + i]);
        out[c] = from_f32(dtype, std::fma(to_f32(dtype, x[c]), cv, sign * to_f32(dtype, x[partner]) * sv));
    }
    return out;
}

// |a - b| in units of the dtype's rounding at b (two values one rounding apart pass).
bool within_one_rounding(int dtype, uint16_t a, uint16_t b) {
    const float fa = to_f32(dtype, a), fb = to_f32(dtype, b);
    return std::fabs(fa - fb) <= dtype_ulp_of(dtype, fb);
}

TEST_F(Serving, AppendWithRotaryWritesTheCacheThenAttendsOverIt) {
    Stats st;
    int calls = 0;
    for (int backend : serving_backends())
        for (KvMode kv : {kDenseSeqused, kIndexedCache, kPagedSeqused})
            // Rotary: none; GPT-J (interleaved) on all 64 columns; GPT-NeoX on 32, and on 20 (a
            // 16-byte chunk half rotated); GPT-J with new keys one element apart per head (no
            // 16-byte chunks: the append's element-wise kernel).
            for (int rot : {0, 1, 2, 3, 4}) {
                // (pages of 64 without rotary: read by TMA boxes on FUSED_SM90; the other sizes
                // are gathered)
                const int64_t page = rot == 2 ? 19 : (rot == 4 ? 1 : (rot == 0 ? 64 : 16));
                const bool interleaved = rot == 1 || rot == 4;
                SCOPED_TRACE("backend " + std::to_string(backend) + " kv " + std::to_string(kv) + " rotary " +
                             std::to_string(rot) + " page " + std::to_string(page));
                Spec s;
                s.packed_q = false, s.kv = kv, s.page_size = page, s.hq = 8, s.hkv = 2, s.d = 64;
                s.mask = FLASHATTN_MASK_CAUSAL_BOTTOM_RIGHT, s.dtype = rot == 1 ? FLASHATTN_DTYPE_FLOAT16 : FLASHATTN_DTYPE_BFLOAT16;
                if (!kernel_built(backend, s.dtype, s.d)) {  // a build restricted to other head dims
                    ++st.not_built;
                    continue;
                }
                const int64_t n_new = 3, cap = 260;
                s.cap_k = cap;
                s.sq = std::vector<int64_t>(4, n_new);
                s.sk = {100, 0, 37, 258};  // the last appends past the capacity: its third key is not written
                // Left padding on the dense caches (twice of three): positions still count from row 0.
                if (kv != kPagedSeqused && rot != 1) s.lp = {5, 0, 20, 0};
                ServingRun r(s);
                DeviceRun dev(r);
                const int64_t B = r.B, hd = s.hkv * s.d, rd = rot == 2 ? 32 : (rot == 3 ? 20 : 64), seqlen_ro = cap + 8;
                const int64_t kd = s.d + (rot == 4 ? 1 : 0); /* k_new's head stride */
                std::normal_distribution<float> nd(0.0f, 1.0f);
                std::vector<uint16_t> k_new(B * n_new * s.hkv * kd), v_new(B * n_new * hd), cos_t, sin_t;
                for (auto *t : {&k_new, &v_new})
                    for (auto &x : *t) x = from_f32(s.dtype, nd(rng()));
                for (int64_t pos = 0; pos < seqlen_ro; ++pos)
                    for (int64_t i = 0; i < rd / 2; ++i) {
                        const double ang = pos * std::pow(10000.0, -2.0 * i / rd);
                        cos_t.push_back(from_f32(s.dtype, (float)std::cos(ang)));
                        sin_t.push_back(from_f32(s.dtype, (float)std::sin(ang)));
                    }
                DevBuf<uint16_t> dkn(k_new.size()), dvn(v_new.size()), dcos(cos_t.size()), dsin(sin_t.size());
                dkn.upload(k_new), dvn.upload(v_new), dcos.upload(cos_t), dsin.upload(sin_t);
                flashattn_fwd_params p = dev.params(r);
                p.backend = backend;
                p.k_new = dkn.p, p.v_new = dvn.p, p.seqlen_new = n_new;
                p.k_new_head_stride = kd, p.k_new_seq_stride = s.hkv * kd, p.k_new_batch_stride = n_new * s.hkv * kd;
                p.v_new_head_stride = s.d, p.v_new_seq_stride = hd, p.v_new_batch_stride = n_new * hd;
                if (rot) {
                    p.rotary_cos = dcos.p, p.rotary_sin = dsin.p, p.rotary_dim = rd, p.seqlen_ro = seqlen_ro;
                    p.rotary_interleaved = interleaved;
                }
                size_t need = 0;
                ASSERT_EQ(FLASHATTN_STATUS_SUCCESS, flashattn_fwd_workspace_size(h, &p, &need)) << flashattn_last_error();
                DevBuf<char> ws(need);
                dev.poison();
                ASSERT_EQ(FLASHATTN_STATUS_SUCCESS, flashattn_fwd(h, &p, ws.p, need, 0)) << flashattn_last_error();
                CUDA_CHECK(cudaDeviceSynchronize());
                ++calls;
                // The cache: the new rows where they belong (rotated keys within one rounding, values
                // exact), every other element untouched.
                const std::vector<uint16_t> kc = dev.k.download(), vc = dev.v.download();
                std::vector<uint16_t> k_want = r.k, v_want = r.v;
                std::vector<char> rotated_elem(k_want.size(), 0);
                for (int64_t b = 0; b < B; ++b)
                    for (int64_t i = 0; i < n_new; ++i) {
                        const int64_t pos = r.used[b] + i;
                        if (pos >= cap) continue;
                        const int64_t row = r.cache_row(b, pos);
                        for (int64_t hh = 0; hh < s.hkv; ++hh) {
                            const uint16_t *kn = &k_new[((b * n_new + i) * s.hkv + hh) * kd];
                            const std::vector<uint16_t> kr =
                                rot ? rotate_row(s.dtype, kn, s.d, rd, interleaved, cos_t, sin_t, pos) : std::vector<uint16_t>(kn, kn + s.d);
                            for (int64_t dd = 0; dd < s.d; ++dd) {
                                k_want[row * hd + hh * s.d + dd] = kr[dd];
                                rotated_elem[row * hd + hh * s.d + dd] = rot != 0;
                                v_want[row * hd + hh * s.d + dd] = v_new[(b * n_new + i) * hd + hh * s.d + dd];
                            }
                        }
                    }
                size_t bad_k = 0, bad_v = 0;
                for (size_t x = 0; x < kc.size(); ++x)
                    bad_k += rotated_elem[x] ? !within_one_rounding(s.dtype, kc[x], k_want[x]) : kc[x] != k_want[x];
                for (size_t x = 0; x < vc.size(); ++x) bad_v += vc[x] != v_want[x];
                EXPECT_EQ(0u, bad_k) << "cache K elements not as appended";
                EXPECT_EQ(0u, bad_v) << "cache V elements not as appended";
                // The rotated Q in the workspace (within one rounding of the host's rotation).
                std::vector<uint16_t> q_used = r.q;
                if (rot) {
                    fa_plan plan;
                    ASSERT_EQ(FLASHATTN_STATUS_SUCCESS, fa_plan_make(&h->caps, &p, 0, &plan));
                    q_used.resize(r.q.size());
                    CUDA_CHECK(cudaMemcpy(q_used.data(), ws.p + plan.q_rot_off, q_used.size() * 2, cudaMemcpyDeviceToHost));
                    size_t bad_q = 0;
                    for (int64_t b = 0; b < B; ++b)
                        for (int64_t i = 0; i < n_new; ++i)
                            for (int64_t hh = 0; hh < s.hq; ++hh) {
                                const int64_t at = ((b * n_new + i) * s.hq + hh) * s.d;
                                const std::vector<uint16_t> qr =
                                    rotate_row(s.dtype, &r.q[at], s.d, rd, interleaved, cos_t, sin_t, r.used[b] + i);
                                for (int64_t dd = 0; dd < s.d; ++dd) bad_q += !within_one_rounding(s.dtype, q_used[at + dd], qr[dd]);
                            }
                    EXPECT_EQ(0u, bad_q) << "rotated Q elements";
                }
                // Attention: each sequence against the oracle over its grown cache and the Q used.
                const std::vector<uint16_t> o = dev.o.download();
                const std::vector<float> lse = dev.lse.download();
                for (int64_t b = 0; b < B; ++b) {
                    SCOPED_TRACE("sequence " + std::to_string(b));
                    // The keys after the padding rows, through the appended ones.
                    Case c = r.seq_case(b);
                    c.sq = n_new, c.sk = std::min(r.used[b] + n_new, cap) - s.pad(b);
                    Inputs in(c);
                    for (int64_t x = 0; x < n_new * s.hq * s.d; ++x) in.q[x] = q_used[b * n_new * s.hq * s.d + x];
                    for (int64_t j = 0; j < c.sk; ++j)
                        for (int64_t x = 0; x < hd; ++x) {
                            in.k[j * hd + x] = kc[r.cache_row(b, s.pad(b) + j) * hd + x];
                            in.v[j * hd + x] = vc[r.cache_row(b, s.pad(b) + j) * hd + x];
                        }
                    in.dq.upload(in.q), in.dk.upload(in.k), in.dv.upload(in.v);
                    std::vector<float> ob(n_new * s.hq * s.d), lb(s.hq * n_new);
                    for (int64_t x = 0; x < (int64_t)ob.size(); ++x) ob[x] = to_f32(s.dtype, o[b * n_new * s.hq * s.d + x]);
                    for (int64_t hh = 0; hh < s.hq; ++hh)
                        for (int64_t i = 0; i < n_new; ++i) lb[hh * n_new + i] = lse[(b * s.hq + hh) * n_new + i];
                    const Oracle ora = oracle(in);
                    const Result low = run(h, in, FLASHATTN_BACKEND_REFERENCE, true);
                    ASSERT_EQ(FLASHATTN_STATUS_SUCCESS, low.status) << flashattn_last_error();
                    const double err_f = max_abs_diff(ob, ora.o), err_l = max_abs_diff(low.o, ora.o);
                    EXPECT_LE(err_f, 2 * err_l + 1e-5) << "error " << err_f << " vs plain low-precision " << err_l;
                    EXPECT_LE(max_abs_diff(lb, ora.lse), 2e-3);
                    st.worst_ratio = std::max(st.worst_ratio, err_f / std::max(err_l, 1e-5));
                    st.max_err = std::max(st.max_err, err_f);
                    st.max_lse_err = std::max(st.max_lse_err, max_abs_diff(lb, ora.lse));
                    ++st.seqs;
                }
                ++st.calls[backend];
            }
    print_stats("append (dense, indexed, paged 1/16/19/64 caches, left padding) with GPT-J / GPT-NeoX rotary (full, partial, 16-byte chunks or not)", st);
}

// The calls, each with a workspace of its own, enqueued back to back on one new stream (nothing
// between them), then waited for.
void run_back_to_back(flashattn_handle *h, std::initializer_list<const flashattn_fwd_params *> calls) {
    std::vector<std::unique_ptr<DevBuf<char>>> ws;
    for (const flashattn_fwd_params *p : calls) {
        size_t need = 0;
        ASSERT_EQ(FLASHATTN_STATUS_SUCCESS, flashattn_fwd_workspace_size(h, p, &need)) << flashattn_last_error();
        ws.push_back(std::make_unique<DevBuf<char>>(need));
    }
    const OwnedStream st;  // (after the workspaces: on a failed assertion it waits, then they are freed)
    size_t i = 0;
    for (const flashattn_fwd_params *p : calls) {
        const DevBuf<char> &w = *ws[i++];
        ASSERT_EQ(FLASHATTN_STATUS_SUCCESS, flashattn_fwd(h, p, w.p, w.n, st.s)) << flashattn_last_error();
    }
    CUDA_CHECK(cudaStreamSynchronize(st.s));
}

// A decode step's output after an append, one sequence's: o (its hq x d values) against the fp64
// oracle over the keys it sees (q: its hq x d query; k, v: its first sk cache rows of hkv x d, the
// appended ones among them), by FlashAttention's rule, counted in stats.
void check_decode_after_append(flashattn_handle *h, int dt, const uint16_t *q, const uint16_t *k, const uint16_t *v,
                               int64_t sk, int64_t hq, int64_t hkv, int64_t d, const uint16_t *o, Stats &stats) {
    Case c;
    c.dtype = dt, c.sq = 1, c.sk = sk, c.hq = hq, c.hkv = hkv, c.d = d;
    Inputs in(c);
    std::copy(q, q + hq * d, in.q.begin());
    std::copy(k, k + sk * hkv * d, in.k.begin());
    std::copy(v, v + sk * hkv * d, in.v.begin());
    in.dq.upload(in.q), in.dk.upload(in.k), in.dv.upload(in.v);
    std::vector<float> ob(hq * d);
    for (int64_t x = 0; x < hq * d; ++x) ob[x] = to_f32(dt, o[x]);
    const Oracle ora = oracle(in);
    const Result low = run(h, in, FLASHATTN_BACKEND_REFERENCE, true);
    ASSERT_EQ(FLASHATTN_STATUS_SUCCESS, low.status) << flashattn_last_error();
    const double err_f = max_abs_diff(ob, ora.o), err_l = max_abs_diff(low.o, ora.o);
    EXPECT_LE(err_f, 2 * err_l + 1e-5) << "the attention after the append: error " << err_f << " vs plain low-precision "
                                        << err_l;
    stats.worst_ratio = std::max(stats.worst_ratio, err_f / std::max(err_l, 1e-5));
    stats.max_err = std::max(stats.max_err, err_f);
    ++stats.seqs;
}

// The append reads what the kernels just before it in the stream wrote: on FUSED_SM90 it starts as
// the previous kernel's programmatic dependent and must wait for that grid. The new keys and
// values here are another call's output, enqueued right before with nothing between; the cache
// must hold them exactly, and the attention after the append must see them (its output against
// the fp64 oracle over the grown cache, by FlashAttention's rule).
TEST_F(Serving, AppendReadsWhatTheKernelBeforeItWrote) {
    if (!serves_on_sm90()) GTEST_SKIP() << "FUSED_SM90 needs an sm_90 GPU and a build with its kernels";
    const int dt = FLASHATTN_DTYPE_BFLOAT16;
    const int64_t B = 2, H = 2, D = 128, cap = 64, sk0 = 8, row = H * D;
    const std::vector<int32_t> used_h = {10, 40};
    std::normal_distribution<float> nd(0.0f, 1.0f);
    auto fresh = [&](size_t n) {
        std::vector<uint16_t> x(n);
        for (auto &e : x) e = from_f32(dt, nd(rng()));
        return x;
    };
    DevBuf<uint16_t> pq(B * row), pk(B * sk0 * row), pv(B * sk0 * row), kn(B * row), vn(B * row);
    DevBuf<uint16_t> kc(B * cap * row), vc(B * cap * row), q(B * row), o(B * row);
    DevBuf<int32_t> used(B);
    Stats stats;
    used.upload(used_h);
    // The producing call: attention over sk0 keys whose output, [B, 1, H, D], is the next call's
    // new keys (one call) and values (a second call, so both come from kernels).
    auto producer = [&](void *out) {
        flashattn_fwd_params p;
        flashattn_fwd_params_init(&p);
        p.dtype = dt, p.batch = B, p.seqlen_q = 1, p.seqlen_k = sk0, p.heads_q = H, p.heads_kv = H, p.head_dim = D;
        p.q = pq.p, p.k = pk.p, p.v = pv.p, p.o = out;
        p.backend = FLASHATTN_BACKEND_FUSED_SM90;
        EXPECT_EQ(FLASHATTN_STATUS_SUCCESS, flashattn_fwd_params_set_packed_strides(&p));
        return p;
    };
    // The decode step: one query a sequence over the dense cache, one new key appended at used[b].
    auto step = [&](void *out, int backend) {
        flashattn_fwd_params p;
        flashattn_fwd_params_init(&p);
        p.dtype = dt, p.batch = B, p.seqlen_q = 1, p.seqlen_k = cap, p.heads_q = H, p.heads_kv = H, p.head_dim = D;
        p.q = q.p, p.k = kc.p, p.v = vc.p, p.o = out;
        EXPECT_EQ(FLASHATTN_STATUS_SUCCESS, flashattn_fwd_params_set_packed_strides(&p));
        p.seqused_k = used.p;
        p.k_new = kn.p, p.v_new = vn.p, p.seqlen_new = 1;
        p.k_new_batch_stride = p.v_new_batch_stride = row, p.k_new_seq_stride = p.v_new_seq_stride = row;
        p.k_new_head_stride = p.v_new_head_stride = D;
        p.backend = backend;
        return p;
    };
    for (int it = 0; it < 6; ++it) {
        SCOPED_TRACE("round " + std::to_string(it));
        const std::vector<uint16_t> qh = fresh(q.n);
        pq.upload(fresh(pq.n)), pk.upload(fresh(pk.n)), pv.upload(fresh(pv.n)), q.upload(qh);
        const std::vector<uint16_t> k0 = fresh(kc.n), v0 = fresh(vc.n);
        kc.upload(k0), vc.upload(v0);
        for (auto *b : {&kn, &vn, &o}) CUDA_CHECK(cudaMemset(b->p, 0xff, b->n * 2));  // NaN until written
        CUDA_CHECK(cudaDeviceSynchronize());  // the fills ran on the legacy stream; the stream below does not wait for it
        const flashattn_fwd_params pk_call = producer(kn.p), pv_call = producer(vn.p), s = step(o.p, FLASHATTN_BACKEND_FUSED_SM90);
        // One stream, back to back: producer, producer, then the append and the attention.
        ASSERT_NO_FATAL_FAILURE(run_back_to_back(h, {&pk_call, &pv_call, &s}));
        // The cache: row used[b] of each sequence is the producers' output, the rest as uploaded.
        const std::vector<uint16_t> knh = kn.download(), vnh = vn.download(), kch = kc.download(), vch = vc.download();
        size_t bad = 0, nan_new = 0;
        for (int64_t b = 0; b < B; ++b)
            for (int64_t pos = 0; pos < cap; ++pos)
                for (int64_t e = 0; e < row; ++e) {
                    const size_t at = (size_t)((b * cap + pos) * row + e);
                    const bool fresh_row = pos == used_h[b];
                    const uint16_t kw = fresh_row ? knh[b * row + e] : k0[at], vw = fresh_row ? vnh[b * row + e] : v0[at];
                    bad += kch[at] != kw || vch[at] != vw;
                    if (fresh_row) nan_new += std::isnan(to_f32(dt, knh[b * row + e])) || std::isnan(to_f32(dt, vnh[b * row + e]));
                }
        EXPECT_EQ(0u, nan_new) << "the producers left NaN: their output was not written";
        EXPECT_EQ(0u, bad) << "cache elements other than the producers' output at used[b]";
        // The attention saw the appended row: each sequence's output against the fp64 oracle over
        // its grown cache (the keys before used[b] and the producers' row), by FlashAttention's rule.
        const std::vector<uint16_t> oh = o.download();
        for (int64_t b = 0; b < B; ++b) {
            SCOPED_TRACE("sequence " + std::to_string(b));
            check_decode_after_append(h, dt, &qh[b * row], &kch[b * cap * row], &vch[b * cap * row], used_h[b] + 1, H, H,
                                      D, &oh[b * row], stats);
        }
        ++stats.calls[FLASHATTN_BACKEND_FUSED_SM90];
    }
    print_stats("an append of another call's output, enqueued right before it (dense cache, head dim 128)", stats);
}

// The attention after an append sees the cache rows that the kernels enqueued right before the
// append wrote: on FUSED_SM90 the append is the previous kernel's programmatic dependent and the
// attention the append's, so the order holds across two such launches. Here another call's output
// is written straight into the cache's first 512 rows (which held NaN) right before a split decode
// over 4096 keys that appends one key near the end, over a dense cache and over the same memory
// as pages of 256 (TMA boxes). Each sequence's output against the fp64 oracle over its grown
// cache, by FlashAttention's rule.
TEST_F(Serving, AppendAttentionSeesRowsTheKernelsBeforeItWrote) {
    if (!serves_on_sm90()) GTEST_SKIP() << "FUSED_SM90 needs an sm_90 GPU and a build with its kernels";
    const int dt = FLASHATTN_DTYPE_BFLOAT16;
    const int64_t HQ = 8, HKV = 2, D = 128, cap = 4096, page = 256, P = 512, row = HKV * D;
    std::normal_distribution<float> nd(0.0f, 1.0f);
    auto fresh = [&](size_t n) {
        std::vector<uint16_t> x(n);
        for (auto &e : x) e = from_f32(dt, nd(rng()));
        return x;
    };
    DevBuf<uint16_t> pq(P * row), pk(64 * row), pv(64 * row), kc(cap * row), vc(cap * row), kn(row), vn(row);
    DevBuf<uint16_t> q(HQ * D), o(HQ * D);
    DevBuf<int32_t> used(1), table(cap / page);
    std::vector<int32_t> ident(cap / page);
    for (size_t i = 0; i < ident.size(); ++i) ident[i] = (int32_t)i;
    table.upload(ident);
    Stats stats;
    // The producing calls: attention of P queries over 64 keys (2 heads), whose output [1, P, 2, D]
    // is written straight into the cache's rows 0 .. P - 1 (K by the first call, V by the second).
    auto producer = [&](void *out) {
        flashattn_fwd_params p;
        flashattn_fwd_params_init(&p);
        p.dtype = dt, p.batch = 1, p.seqlen_q = P, p.seqlen_k = 64, p.heads_q = HKV, p.heads_kv = HKV, p.head_dim = D;
        p.q = pq.p, p.k = pk.p, p.v = pv.p, p.o = out;
        p.backend = FLASHATTN_BACKEND_FUSED_SM90;
        EXPECT_EQ(FLASHATTN_STATUS_SUCCESS, flashattn_fwd_params_set_packed_strides(&p));
        return p;
    };
    for (int paged : {0, 1})
        for (int it = 0; it < 3; ++it) {
            SCOPED_TRACE(std::string(paged ? "pages of 256" : "dense cache") + ", round " + std::to_string(it));
            const int32_t used_h = 3900 + 37 * it;  // the new key's row: in the last split's tiles
            used.upload({used_h});
            const std::vector<uint16_t> qh = fresh(q.n), knh = fresh(kn.n), vnh = fresh(vn.n);
            pq.upload(fresh(pq.n)), pk.upload(fresh(pk.n)), pv.upload(fresh(pv.n)), q.upload(qh);
            kn.upload(knh), vn.upload(vnh), kc.upload(fresh(kc.n)), vc.upload(fresh(vc.n));
            for (auto *b : {&kc, &vc}) CUDA_CHECK(cudaMemset(b->p, 0xff, P * row * 2));  // NaN until the producers write
            CUDA_CHECK(cudaMemset(o.p, 0xff, o.n * 2));
            CUDA_CHECK(cudaDeviceSynchronize());  // (the fills ran on the legacy stream)
            flashattn_fwd_params s;  // the decode step: one query, one new key appended at row used_h
            flashattn_fwd_params_init(&s);
            s.dtype = dt, s.batch = 1, s.seqlen_q = 1, s.seqlen_k = cap, s.heads_q = HQ, s.heads_kv = HKV, s.head_dim = D;
            s.q = q.p, s.k = kc.p, s.v = vc.p, s.o = o.p;
            ASSERT_EQ(FLASHATTN_STATUS_SUCCESS, flashattn_fwd_params_set_packed_strides(&s));
            if (paged) {  // the same memory as 16 pages of 256, in order
                s.block_table = table.p, s.page_size = page, s.num_pages = cap / page, s.pages_per_seq = cap / page;
                s.block_table_batch_stride = cap / page, s.k_batch_stride = s.v_batch_stride = page * row;
            }
            s.seqused_k = used.p, s.mask = FLASHATTN_MASK_CAUSAL_BOTTOM_RIGHT;
            s.k_new = kn.p, s.v_new = vn.p, s.seqlen_new = 1;
            s.k_new_batch_stride = s.v_new_batch_stride = row, s.k_new_seq_stride = s.v_new_seq_stride = row;
            s.k_new_head_stride = s.v_new_head_stride = D;
            s.backend = FLASHATTN_BACKEND_FUSED_SM90;
            flashattn_plan_info info;
            flashattn_plan_info_init(&info);
            ASSERT_EQ(FLASHATTN_STATUS_SUCCESS, flashattn_fwd_plan(h, &s, &info)) << flashattn_last_error();
            EXPECT_GT(info.num_splits, 1) << info.description;  // (a split decode: the written rows in the first split)
            const flashattn_fwd_params pk_call = producer(kc.p), pv_call = producer(vc.p);
            // one stream, back to back: producer, producer, then the append and the attention
            ASSERT_NO_FATAL_FAILURE(run_back_to_back(h, {&pk_call, &pv_call, &s}));
            const std::vector<uint16_t> kch = kc.download(), vch = vc.download(), oh = o.download();
            size_t nan_rows = 0, bad_new = 0;
            for (int64_t e = 0; e < P * row; ++e)
                nan_rows += std::isnan(to_f32(dt, kch[e])) || std::isnan(to_f32(dt, vch[e]));
            for (int64_t e = 0; e < row; ++e)
                bad_new += kch[used_h * row + e] != knh[e] || vch[used_h * row + e] != vnh[e];
            EXPECT_EQ(0u, nan_rows) << "the producers' rows were not written";
            EXPECT_EQ(0u, bad_new) << "the appended row";
            check_decode_after_append(h, dt, qh.data(), kch.data(), vch.data(), used_h + 1, HQ, HKV, D, oh.data(), stats);
            ++stats.calls[FLASHATTN_BACKEND_FUSED_SM90];
        }
    print_stats("an append's attention over rows another call wrote just before it (split decode, 4096-key cache and pages of 256)", stats);
}

}  // namespace
