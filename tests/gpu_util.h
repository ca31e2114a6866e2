// gpu_util.h - what the GPU tests share: device detection (skip with a reason), host-side fp16/bf16
// conversion, random tensors in any layout, poisoning, one call of the library, and the naive fp64
// CPU oracle that every backend is checked against.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <cuda_runtime_api.h>

extern "C" {
#include "flashattn.h"
#include "internal.h"
}

namespace fatest {

#define CUDA_CHECK(x)                                                                              \
    do {                                                                                           \
        cudaError_t e_ = (x);                                                                      \
        if (e_ != cudaSuccess) throw std::runtime_error(std::string(#x) + ": " + cudaGetErrorString(e_)); \
    } while (0)

inline bool gpu_available() {
    int n = 0;
    return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

// The current device's SM count (0 where CUDA cannot say): the decode tests size their batches by it.
inline int sm_count() {
    int dev = 0, sms = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess)
        return 0;
    return sms;
}

#define REQUIRE_GPU()                                                                  \
    do {                                                                               \
        if (!fatest::gpu_available()) GTEST_SKIP() << "no CUDA device on this machine"; \
    } while (0)

// A test with a handle on device 0, or skipped with the reason when the machine has no GPU.
class GpuTest : public ::testing::Test {
  protected:
    void SetUp() override {
        REQUIRE_GPU();
        ASSERT_EQ(FLASHATTN_STATUS_SUCCESS, flashattn_handle_create(&h, 0)) << flashattn_last_error();
    }
    void TearDown() override {
        if (h) EXPECT_EQ(FLASHATTN_STATUS_SUCCESS, flashattn_handle_destroy(h));
    }
    flashattn_handle *h = nullptr;
};

// ---- host-side 16-bit floats ----------------------------------------------------------------------
inline float bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}
inline uint16_t f32_to_bf16(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
inline float f16_to_f32(uint16_t h) {
    const int sign = h >> 15, exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
    float v;
    if (exp == 0) v = std::ldexp((float)mant, -24);
    else if (exp == 31) v = mant ? NAN : INFINITY;
    else v = std::ldexp(1.0f + mant / 1024.0f, exp - 15);
    return sign ? -v : v;
}
inline uint16_t f32_to_f16(float f) {
    uint32_t x;
    std::memcpy(&x, &f, 4);
    const uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    x &= 0x7fffffffu;
    if (x > 0x7f800000u) return sign | 0x7e00;
    if (x >= 0x477ff000u) return sign | 0x7c00;
    if (x < 0x38800000u) {
        float a;
        std::memcpy(&a, &x, 4);
        return sign | (uint16_t)std::lrint(a * 16777216.0f);
    }
    x += 0xfffu + ((x >> 13) & 1u);
    x -= 0x38000000u;
    return sign | (uint16_t)(x >> 13);
}
inline float to_f32(int dtype, uint16_t h) { return dtype == FLASHATTN_DTYPE_BFLOAT16 ? bf16_to_f32(h) : f16_to_f32(h); }
inline uint16_t from_f32(int dtype, float f) { return dtype == FLASHATTN_DTYPE_BFLOAT16 ? f32_to_bf16(f) : f32_to_f16(f); }
constexpr uint16_t kPoison16 = 0xffff;  // NaN in both fp16 and bf16

// ---- a test case: shape, features, layout --------------------------------------------------------
enum Layout { kPacked = 0, kHeadMajor = 1, kPadded = 2 };

struct Case {
    int dtype = FLASHATTN_DTYPE_BFLOAT16;
    int64_t b = 1, sq = 128, sk = 128, hq = 2, hkv = 2, d = 64;
    int mask = FLASHATTN_MASK_NONE;
    int64_t wl = -1, wr = -1;
    float softcap = 0.0f, scale = 0.0f;
    bool alibi = false, lse = true;
    Layout layout = kPacked;
    float ramp = 0.0f;  // K's row j scaled by 1 + ramp * j / sk: the scores' row max grows along the keys
    std::string str() const {
        char buf[288];
        snprintf(buf, sizeof buf, "%s b=%lld sq=%lld sk=%lld hq=%lld hkv=%lld d=%lld mask=%d win=(%lld,%lld) softcap=%g alibi=%d layout=%d ramp=%g",
                 dtype ? "bf16" : "fp16", (long long)b, (long long)sq, (long long)sk, (long long)hq,
                 (long long)hkv, (long long)d, mask, (long long)wl, (long long)wr, softcap, (int)alibi, (int)layout, ramp);
        return buf;
    }
};

// Strides (batch, seq, head) of a [b, s, h, d] tensor in the case's layout, and its element count.
struct Strides { int64_t b, s, h, numel; };
inline Strides strides_for(const Case &c, int64_t s, int64_t h) {
    const int64_t d = c.d;
    switch (c.layout) {
    case kHeadMajor: return {h * s * d, d, s * d, c.b * h * s * d};
    case kPadded: {  // seq stride padded by 24 elements, heads padded by 8: gaps everywhere
        const int64_t hs = d + 8, ss = h * hs + 24, bs = s * ss + 40;
        return {bs, ss, hs, c.b * bs};
    }
    default: return {s * h * d, h * d, d, c.b * s * h * d};
    }
}

template <typename T> struct DevBuf {
    T *p = nullptr;
    size_t n = 0;
    explicit DevBuf(size_t count) : n(count) {
        if (count) CUDA_CHECK(cudaMalloc((void **)&p, count * sizeof(T)));
    }
    ~DevBuf() { if (p) cudaFree(p); }
    DevBuf(const DevBuf &) = delete;
    DevBuf &operator=(const DevBuf &) = delete;
    void upload(const std::vector<T> &h) { if (n) CUDA_CHECK(cudaMemcpy(p, h.data(), n * sizeof(T), cudaMemcpyHostToDevice)); }
    std::vector<T> download() const {
        std::vector<T> h(n);
        if (n) CUDA_CHECK(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost));
        return h;
    }
};

inline std::mt19937_64 &rng() {
    static std::mt19937_64 gen(std::random_device{}());
    return gen;
}

// Inputs on host and device; every call draws fresh random values.
struct Inputs {
    Case c;
    Strides qs, ks;
    std::vector<uint16_t> q, k, v;
    std::vector<float> slopes;
    DevBuf<uint16_t> dq, dk, dv;
    DevBuf<float> dslopes;
    explicit Inputs(const Case &cs)
        : c(cs), qs(strides_for(cs, cs.sq, cs.hq)), ks(strides_for(cs, cs.sk, cs.hkv)), q(qs.numel),
          k(ks.numel), v(ks.numel), dq(qs.numel), dk(ks.numel), dv(ks.numel), dslopes(cs.alibi ? cs.b * cs.hq : 0) {
        std::normal_distribution<float> nd(0.0f, 1.0f);
        for (auto *t : {&q, &k, &v})
            for (auto &x : *t) x = from_f32(c.dtype, nd(rng()));
        if (c.ramp != 0.0f)
            for (int64_t bi = 0; bi < c.b; ++bi)
                for (int64_t j = 0; j < c.sk; ++j)
                    for (int64_t hi = 0; hi < c.hkv; ++hi)
                        for (int64_t di = 0; di < c.d; ++di) {
                            uint16_t &x = k[bi * ks.b + j * ks.s + hi * ks.h + di];
                            x = from_f32(c.dtype, to_f32(c.dtype, x) * (1.0f + c.ramp * (float)j / (float)c.sk));
                        }
        if (c.alibi) {
            std::uniform_real_distribution<float> ud(0.01f, 0.5f);
            slopes.resize(c.b * c.hq);
            for (auto &s : slopes) s = ud(rng());
            dslopes.upload(slopes);
        }
        dq.upload(q), dk.upload(k), dv.upload(v);
    }
    float qv(int64_t b, int64_t i, int64_t h, int64_t d) const { return to_f32(c.dtype, q[b * qs.b + i * qs.s + h * qs.h + d]); }
    float kv(int64_t b, int64_t j, int64_t h, int64_t d) const { return to_f32(c.dtype, k[b * ks.b + j * ks.s + h * ks.h + d]); }
    float vv(int64_t b, int64_t j, int64_t h, int64_t d) const { return to_f32(c.dtype, v[b * ks.b + j * ks.s + h * ks.h + d]); }
};

// Result of one library call: O as floats in [b, sq, hq, d] order, LSE [b, hq, sq].
struct Result {
    std::vector<float> o, lse;
    std::vector<float> o_f32;        // REFERENCE only, when asked: its fp32 O before rounding
    size_t unwritten = 0;            // poisoned O elements never written
    size_t gap_writes = 0;           // elements between O's rows/heads that were touched
    flashattn_status status = FLASHATTN_STATUS_SUCCESS;
};

inline flashattn_fwd_params make_params(const Inputs &in, void *o, float *lse, int backend) {
    const Case &c = in.c;
    flashattn_fwd_params p;
    flashattn_fwd_params_init(&p);
    p.dtype = c.dtype, p.mask = c.mask, p.backend = backend;
    p.batch = c.b, p.seqlen_q = c.sq, p.seqlen_k = c.sk, p.heads_q = c.hq, p.heads_kv = c.hkv, p.head_dim = c.d;
    p.q = in.dq.p, p.k = in.dk.p, p.v = in.dv.p, p.o = o;
    p.q_batch_stride = in.qs.b, p.q_seq_stride = in.qs.s, p.q_head_stride = in.qs.h;
    p.k_batch_stride = p.v_batch_stride = in.ks.b;
    p.k_seq_stride = p.v_seq_stride = in.ks.s;
    p.k_head_stride = p.v_head_stride = in.ks.h;
    p.o_batch_stride = in.qs.b, p.o_seq_stride = in.qs.s, p.o_head_stride = in.qs.h;
    p.lse = lse;
    p.softmax_scale = c.scale, p.softcap = c.softcap;
    p.window_left = c.wl, p.window_right = c.wr;
    p.alibi_slopes = c.alibi ? in.dslopes.p : nullptr;
    p.alibi_batch_stride = c.alibi ? c.hq : 0;
    return p;
}

// What `backend` would run for these inputs: planned only, never run (Q's buffer stands in for O).
inline flashattn_plan_info plan_for(flashattn_handle *h, const Inputs &in, int backend) {
    flashattn_fwd_params p = make_params(in, nullptr, nullptr, backend);
    p.o = in.dq.p;
    flashattn_plan_info info;
    flashattn_plan_info_init(&info);
    EXPECT_EQ(FLASHATTN_STATUS_SUCCESS, flashattn_fwd_plan(h, &p, &info)) << flashattn_last_error();
    return info;
}

// Runs the library once on poisoned outputs. lowprec: the reference's plain low-precision mode.
inline Result run(flashattn_handle *h, const Inputs &in, int backend, bool lowprec = false,
                  bool want_o_f32 = false, cudaStream_t stream = 0) {
    const Case &c = in.c;
    Result r;
    DevBuf<uint16_t> o(in.qs.numel);
    DevBuf<float> lse(c.lse ? c.b * c.hq * c.sq : 0);
    if (o.n) CUDA_CHECK(cudaMemsetAsync(o.p, 0xff, o.n * 2, stream));
    if (lse.n) CUDA_CHECK(cudaMemsetAsync(lse.p, 0xff, lse.n * 4, stream));
    flashattn_fwd_params p = make_params(in, o.p, lse.p, backend);
    size_t ws_bytes = 0;
    r.status = fa_workspace_size_ex(h, &p, lowprec, &ws_bytes);
    if (r.status != FLASHATTN_STATUS_SUCCESS) return r;
    DevBuf<char> ws(ws_bytes);
    r.status = fa_fwd_ex(h, &p, ws.p, ws_bytes, stream, lowprec);
    if (r.status != FLASHATTN_STATUS_SUCCESS) return r;
    CUDA_CHECK(cudaStreamSynchronize(stream));
    CUDA_CHECK(cudaGetLastError());
    const std::vector<uint16_t> oh = o.download();
    r.o.resize(c.b * c.sq * c.hq * c.d);
    std::vector<char> covered(oh.size(), 0);
    for (int64_t b = 0; b < c.b; ++b)
        for (int64_t i = 0; i < c.sq; ++i)
            for (int64_t hh = 0; hh < c.hq; ++hh)
                for (int64_t d = 0; d < c.d; ++d) {
                    const int64_t at = b * in.qs.b + i * in.qs.s + hh * in.qs.h + d;
                    covered[at] = 1;
                    if (oh[at] == kPoison16) ++r.unwritten;
                    r.o[((b * c.sq + i) * c.hq + hh) * c.d + d] = to_f32(c.dtype, oh[at]);
                }
    for (size_t x = 0; x < oh.size(); ++x)
        if (!covered[x] && oh[x] != kPoison16) ++r.gap_writes;
    if (lse.n) r.lse = lse.download();
    if (want_o_f32 && backend == FLASHATTN_BACKEND_REFERENCE) {
        fa_plan plan;
        if (fa_plan_make(&h->caps, &p, lowprec, &plan) == FLASHATTN_STATUS_SUCCESS && !plan.noop) {
            r.o_f32.resize(c.b * c.hq * c.sq * c.d);  // [b*hq, sq, d]
            CUDA_CHECK(cudaMemcpy(r.o_f32.data(), ws.p + plan.ref.o_f32, r.o_f32.size() * 4, cudaMemcpyDeviceToHost));
            std::vector<float> reordered(r.o_f32.size());
            for (int64_t b = 0; b < c.b; ++b)
                for (int64_t hh = 0; hh < c.hq; ++hh)
                    for (int64_t i = 0; i < c.sq; ++i)
                        for (int64_t d = 0; d < c.d; ++d)
                            reordered[((b * c.sq + i) * c.hq + hh) * c.d + d] = r.o_f32[((b * c.hq + hh) * c.sq + i) * c.d + d];
            r.o_f32.swap(reordered);
        }
    }
    return r;
}

// A non-blocking stream of a test's own, waited for and destroyed when it goes out of scope (a
// failed assertion included), so that nothing enqueued on it outlives the buffers it uses. A wait
// or a destruction that fails fails the test (a destructor cannot throw).
struct OwnedStream {
    cudaStream_t s = nullptr;
    OwnedStream() { CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)); }
    OwnedStream(const OwnedStream &) = delete;
    OwnedStream &operator=(const OwnedStream &) = delete;
    ~OwnedStream() {
        if (!s) return;
        const cudaError_t waited = cudaStreamSynchronize(s), destroyed = cudaStreamDestroy(s);
        if (waited != cudaSuccess) ADD_FAILURE() << "the test's own stream: cudaStreamSynchronize: " << cudaGetErrorString(waited);
        if (destroyed != cudaSuccess) ADD_FAILURE() << "the test's own stream: cudaStreamDestroy: " << cudaGetErrorString(destroyed);
    }
};

// One flashattn_fwd call captured on a new non-blocking stream into an instantiated CUDA graph.
struct CapturedCall {
    cudaStream_t stream = nullptr;
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    flashattn_status status = FLASHATTN_STATUS_SUCCESS;
    CapturedCall(flashattn_handle *h, const flashattn_fwd_params &p, void *ws, size_t bytes) {
        CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
        CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
        status = flashattn_fwd(h, &p, ws, bytes, stream);
        CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
        if (status == FLASHATTN_STATUS_SUCCESS) CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    }
    CapturedCall(const CapturedCall &) = delete;
    CapturedCall &operator=(const CapturedCall &) = delete;
    ~CapturedCall() {
        if (exec) cudaGraphExecDestroy(exec);
        if (graph) cudaGraphDestroy(graph);
        if (stream) cudaStreamDestroy(stream);
    }
    // Replays the graph and waits for it.
    void replay() {
        CUDA_CHECK(cudaGraphLaunch(exec, stream));
        CUDA_CHECK(cudaStreamSynchronize(stream));
    }
};

// ---- the naive fp64 CPU oracle, written from the semantics, not from the planner's offsets ---------
inline bool oracle_visible(const Case &c, int64_t i, int64_t j) {
    const int64_t diag = i + c.sk - c.sq;
    if (c.mask == FLASHATTN_MASK_CAUSAL_BOTTOM_RIGHT && j > diag) return false;
    if (c.mask == FLASHATTN_MASK_CAUSAL_TOP_LEFT && j > i) return false;
    if (c.wl >= 0 && j < diag - c.wl) return false;
    if (c.wr >= 0 && j > diag + c.wr) return false;
    return true;
}

struct Oracle { std::vector<double> o, lse; };
// The fp64 oracle. (batch, head) pairs run on up to 16 threads when the call is large enough to pay
// for them; each pair writes only its own rows, in the serial order, so the result is the same bit
// for bit. In: Inputs, or anything with its c, qv, kv, vv and slopes.
template <class In> Oracle oracle(const In &in) {
    const Case &c = in.c;
    Oracle r;
    r.o.assign(c.b * c.sq * c.hq * c.d, 0.0);
    r.lse.assign(c.b * c.hq * c.sq, -INFINITY);
    const double scale = c.scale > 0 ? c.scale : 1.0 / std::sqrt((double)c.d);
    auto pair = [&](int64_t bh) {
        const int64_t b = bh / c.hq, h = bh % c.hq;
        const int64_t hk = h / (c.hq / c.hkv);
        const double slope = c.alibi ? in.slopes[b * c.hq + h] : 0.0;
        std::vector<double> s(c.sk);
        for (int64_t i = 0; i < c.sq; ++i) {
            double mx = -INFINITY;
            for (int64_t j = 0; j < c.sk; ++j) {
                if (!oracle_visible(c, i, j)) { s[j] = -INFINITY; continue; }
                double acc = 0;
                for (int64_t d = 0; d < c.d; ++d) acc += (double)in.qv(b, i, h, d) * in.kv(b, j, hk, d);
                acc *= scale;
                if (c.softcap > 0) acc = c.softcap * std::tanh(acc / c.softcap);
                if (c.alibi) acc -= slope * std::fabs((double)(i + c.sk - c.sq - j));
                s[j] = acc;
                mx = std::max(mx, acc);
            }
            if (mx == -INFINITY) continue;  // sees no key: O = 0, LSE = -inf
            double l = 0;
            for (int64_t j = 0; j < c.sk; ++j) l += (s[j] == -INFINITY) ? 0.0 : std::exp(s[j] - mx);
            r.lse[(b * c.hq + h) * c.sq + i] = mx + std::log(l);
            double *o = &r.o[((b * c.sq + i) * c.hq + h) * c.d];
            for (int64_t j = 0; j < c.sk; ++j) {
                if (s[j] == -INFINITY) continue;
                const double pj = std::exp(s[j] - mx) / l;
                for (int64_t d = 0; d < c.d; ++d) o[d] += pj * in.vv(b, j, hk, d);
            }
        }
    };
    const int64_t pairs = c.b * c.hq;
    const int64_t hw = std::max<int64_t>(1, std::thread::hardware_concurrency());
    const int64_t workers = c.sq * c.sk * c.d >= (1 << 20) ? std::min<int64_t>({pairs, hw, 16}) : 1;
    std::atomic<int64_t> next{0};
    auto work = [&] {
        for (int64_t bh; (bh = next++) < pairs;) pair(bh);
    };
    std::vector<std::thread> pool;
    for (int64_t t = 1; t < workers; ++t) pool.emplace_back(work);
    work();
    for (auto &t : pool) t.join();
    return r;
}

// max |a - b| over all elements; NaN anywhere gives +inf (NaN never passes).
template <typename A, typename B> double max_abs_diff(const std::vector<A> &a, const std::vector<B> &b) {
    if (a.size() != b.size()) return INFINITY;
    double m = 0;
    for (size_t x = 0; x < a.size(); ++x) {
        const double d = std::fabs((double)a[x] - (double)b[x]);
        if (std::isnan(d)) {
            if (std::isinf((double)a[x]) && a[x] == b[x]) continue;  // -inf == -inf (empty rows' LSE)
            return INFINITY;
        }
        m = std::max(m, d);
    }
    return m;
}

}  // namespace fatest
