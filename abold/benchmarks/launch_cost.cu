// launch_cost.cu - host CPU time per enqueue of the launch forms the library uses or could use, so
// that a design choice about launches (how many per call, with what attributes) rests on numbers
// from the machine at hand. Kernels are empty: the GPU drains faster than the host enqueues, so the
// time measured is the host's. Each form: rounds of `kCalls` back-to-back enqueues, CPU time of this
// thread divided by kCalls, median over kRounds rounds, after a warm-up; synchronised between rounds.
//
//   nvcc -O2 -std=c++17 -arch=sm_90a benchmarks/launch_cost.cu -o launch_cost && ./launch_cost
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <ctime>
#include <functional>
#include <vector>

#define CHECK(x)                                                                                  \
    do {                                                                                          \
        cudaError_t e_ = (x);                                                                     \
        if (e_ != cudaSuccess) {                                                                  \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
            return 1;                                                                             \
        }                                                                                         \
    } while (0)

struct Small { long long a[8]; };      // 64 bytes, like the merge kernel's arguments (about 200)
struct Big { long long a[128]; };      // 1 KB, like FUSED_SM90's (parameters and three tensor maps)

__global__ void small_kernel(const __grid_constant__ Small s) { if (s.a[0] == 42 && threadIdx.x == 1000) printf("x"); }
__global__ void big_kernel(const __grid_constant__ Big b) {
    if (b.a[0] == 42 && threadIdx.x == 1000) printf("x");
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;\n");
#endif
}
__global__ void dependent_kernel(const __grid_constant__ Small s) {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
    if (s.a[0] == 42 && threadIdx.x == 1000) printf("x");
}

static double thread_us() {
    timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return t.tv_sec * 1e6 + t.tv_nsec * 1e-3;
}

int main() {
    constexpr int kCalls = 200, kRounds = 15;
    cudaStream_t st;
    CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    void *buf;
    CHECK(cudaMalloc(&buf, 1 << 20));
    Small s = {};
    Big b = {};
    auto pdl = [&](void (*k)(Small), int grid) {
        cudaLaunchConfig_t cfg = {};
        cfg.gridDim = dim3(grid), cfg.blockDim = dim3(128), cfg.stream = st;
        cudaLaunchAttribute at[1];
        at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        at[0].val.programmaticStreamSerializationAllowed = 1;
        cfg.attrs = at, cfg.numAttrs = 1;
        return cudaLaunchKernelEx(&cfg, k, s);
    };
    auto cluster = [&](int n) {
        cudaLaunchConfig_t cfg = {};
        cfg.gridDim = dim3(8 * n), cfg.blockDim = dim3(384), cfg.stream = st;
        cudaLaunchAttribute at[1];
        at[0].id = cudaLaunchAttributeClusterDimension;
        at[0].val.clusterDim.x = n, at[0].val.clusterDim.y = 1, at[0].val.clusterDim.z = 1;
        cfg.attrs = at, cfg.numAttrs = 1;
        return cudaLaunchKernelEx(&cfg, big_kernel, b);
    };
    const std::vector<std::pair<const char *, std::function<cudaError_t()>>> forms = {
        {"<<<>>> 64 B parameters", [&] { small_kernel<<<4, 128, 0, st>>>(s); return cudaGetLastError(); }},
        {"<<<>>> 1 KB parameters", [&] { big_kernel<<<128, 384, 0, st>>>(b); return cudaGetLastError(); }},
        {"cudaLaunchKernelEx 64 B, PDL attribute", [&] { return pdl(dependent_kernel, 4); }},
        {"cudaLaunchKernelEx 64 B, no attribute", [&] {
             cudaLaunchConfig_t cfg = {};
             cfg.gridDim = dim3(4), cfg.blockDim = dim3(128), cfg.stream = st;
             return cudaLaunchKernelEx(&cfg, small_kernel, s);
         }},
        {"1 KB then 64 B (plain): split decode, no PDL", [&] {
             big_kernel<<<128, 384, 0, st>>>(b);
             small_kernel<<<4, 128, 0, st>>>(s);
             return cudaGetLastError();
         }},
        {"1 KB then 64 B PDL: split decode today", [&] {
             big_kernel<<<128, 384, 0, st>>>(b);
             return pdl(dependent_kernel, 4);
         }},
        {"1 KB, cluster of 8", [&] { return cluster(8); }},
        {"cudaMemsetAsync 512 B", [&] { return cudaMemsetAsync(buf, 0, 512, st); }},
        {"cudaMemsetAsync 512 B then 1 KB kernel", [&] {
             cudaError_t e = cudaMemsetAsync(buf, 0, 512, st);
             big_kernel<<<128, 384, 0, st>>>(b);
             return e != cudaSuccess ? e : cudaGetLastError();
         }},
    };
    printf("host CPU time per enqueue (median of %d rounds of %d):\n", kRounds, kCalls);
    for (const auto &f : forms) {
        for (int i = 0; i < 50; ++i) CHECK(f.second());
        CHECK(cudaStreamSynchronize(st));
        std::vector<double> us;
        for (int r = 0; r < kRounds; ++r) {
            const double t0 = thread_us();
            for (int i = 0; i < kCalls; ++i) CHECK(f.second());
            us.push_back((thread_us() - t0) / kCalls);
            CHECK(cudaStreamSynchronize(st));
        }
        std::sort(us.begin(), us.end());
        printf("  %-48s %6.2f us\n", f.first, us[us.size() / 2]);
    }
    int clusters = 0;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(128), cfg.blockDim = dim3(384), cfg.dynamicSmemBytes = 160 * 1024;
    CHECK(cudaFuncSetAttribute(big_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 160 * 1024));
    CHECK(cudaFuncSetAttribute(big_kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
    for (int n : {2, 4, 8, 16}) {
        cudaLaunchAttribute at[1];
        at[0].id = cudaLaunchAttributeClusterDimension;
        at[0].val.clusterDim.x = n, at[0].val.clusterDim.y = 1, at[0].val.clusterDim.z = 1;
        cfg.gridDim = dim3(n * 8), cfg.attrs = at, cfg.numAttrs = 1;
        CHECK(cudaOccupancyMaxActiveClusters(&clusters, big_kernel, &cfg));
        printf("  clusters of %2d blocks (384 threads, 160 KB shared memory each) resident at once: %d (%d blocks)\n", n,
               clusters, clusters * n);
    }
    return 0;
}
