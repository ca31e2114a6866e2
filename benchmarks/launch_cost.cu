// launch_cost.cu - host CPU time per enqueue of the launch forms the library uses or could use, so
// that a design choice about launches (how many per call, with what attributes) rests on numbers
// from the machine at hand. Kernels are empty: the GPU drains faster than the host enqueues, so the
// time measured is the host's. Each form: rounds of `kCalls` back-to-back enqueues, CPU time of this
// thread divided by kCalls, median over kRounds rounds, after a warm-up; synchronised between rounds.
// Beside the launches: the driver's own launch entry points (what the runtime adds), and the other
// host calls a FUSED_SM90 call makes (cudaGetDevice, cudaGetLastError, a tensor map's encoding).
//
//   nvcc -O2 -std=c++17 -arch=sm_90a benchmarks/launch_cost.cu -o launch_cost && ./launch_cost
#include <cuda.h>
#include <cuda_runtime.h>
#include <cudaTypedefs.h>

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
    auto pdl_big = [&] {  // the attention kernel's launch: 1 KB of parameters, programmatic attribute
        cudaLaunchConfig_t cfg = {};
        cfg.gridDim = dim3(128), cfg.blockDim = dim3(384), cfg.stream = st;
        cudaLaunchAttribute at[1];
        at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        at[0].val.programmaticStreamSerializationAllowed = 1;
        cfg.attrs = at, cfg.numAttrs = 1;
        return cudaLaunchKernelEx(&cfg, big_kernel, b);
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
    // The driver's launch entry points, reached through the runtime (as the library reaches
    // cuTensorMapEncodeTiled): what the runtime's own launch adds on top of the driver's.
    void *fn = nullptr;
    cudaDriverEntryPointQueryResult q;
    CHECK(cudaGetDriverEntryPointByVersion("cuLaunchKernel", &fn, 12000, cudaEnableDefault, &q));
    const auto cu_launch = (PFN_cuLaunchKernel_v4000)fn;
    CHECK(cudaGetDriverEntryPointByVersion("cuLaunchKernelEx", &fn, 12000, cudaEnableDefault, &q));
    const auto cu_launch_ex = (PFN_cuLaunchKernelEx_v11060)fn;
    CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q));
    const auto encode = (PFN_cuTensorMapEncodeTiled_v12000)fn;
    cudaFunction_t f_small, f_big, f_dep;
    CHECK(cudaGetFuncBySymbol(&f_small, (const void *)small_kernel));
    CHECK(cudaGetFuncBySymbol(&f_big, (const void *)big_kernel));
    CHECK(cudaGetFuncBySymbol(&f_dep, (const void *)dependent_kernel));
    auto cu = [](CUresult r) { return r == CUDA_SUCCESS ? cudaSuccess : cudaErrorLaunchFailure; };
    auto drv = [&](cudaFunction_t f, void *arg, int grid, int block) {
        void *args[] = {arg};
        return cu(cu_launch((CUfunction)f, grid, 1, 1, block, 1, 1, 0, (CUstream)st, args, nullptr));
    };
    auto drv_pdl = [&](cudaFunction_t f, void *arg, int grid) {
        CUlaunchConfig cfg = {};
        cfg.gridDimX = grid, cfg.gridDimY = cfg.gridDimZ = 1, cfg.blockDimX = 128, cfg.blockDimY = cfg.blockDimZ = 1;
        cfg.hStream = (CUstream)st;
        CUlaunchAttribute at[1];
        at[0].id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
        at[0].value.programmaticStreamSerializationAllowed = 1;
        cfg.attrs = at, cfg.numAttrs = 1;
        void *args[] = {arg};
        return cu(cu_launch_ex(&cfg, (CUfunction)f, args, nullptr));
    };
    auto map = [&] {  // a [4, 8192, 8, 128] bf16 tensor in boxes of 64 x 176 x 1 x 1, as FUSED_SM90's K
        CUtensorMap m;
        const cuuint64_t dims[4] = {128, 8192, 8, 4}, strides[3] = {8 * 128 * 2, 128 * 2, 8192ull * 8 * 128 * 2};
        const cuuint32_t box[4] = {64, 176, 1, 1}, es[4] = {1, 1, 1, 1};
        return cu(encode(&m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 4, buf, dims, strides, box, es, CU_TENSOR_MAP_INTERLEAVE_NONE,
                         CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE));
    };
    const std::vector<std::pair<const char *, std::function<cudaError_t()>>> forms = {
        {"<<<>>> 64 B parameters", [&] { small_kernel<<<4, 128, 0, st>>>(s); return cudaGetLastError(); }},
        {"<<<>>> 1 KB parameters", [&] { big_kernel<<<128, 384, 0, st>>>(b); return cudaGetLastError(); }},
        {"cudaLaunchKernelEx 64 B, PDL attribute", [&] { return pdl(dependent_kernel, 4); }},
        {"cudaLaunchKernelEx 1 KB, PDL attribute", [&] { return pdl_big(); }},
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
        {"1 KB then 64 B PDL: split decode, 0.4.0", [&] {
             big_kernel<<<128, 384, 0, st>>>(b);
             return pdl(dependent_kernel, 4);
         }},
        {"1 KB PDL then 64 B PDL: split decode now", [&] {
             const cudaError_t e = pdl_big();
             return e != cudaSuccess ? e : pdl(dependent_kernel, 4);
         }},
        {"1 KB, cluster of 8", [&] { return cluster(8); }},
        {"cuLaunchKernel 64 B (driver)", [&] { return drv(f_small, &s, 4, 128); }},
        {"cuLaunchKernel 1 KB (driver)", [&] { return drv(f_big, &b, 128, 384); }},
        {"cuLaunchKernelEx 64 B, PDL attribute (driver)", [&] { return drv_pdl(f_dep, &s, 4); }},
        {"1 KB then 64 B PDL, both through the driver", [&] {
             const cudaError_t e = drv(f_big, &b, 128, 384);
             return e != cudaSuccess ? e : drv_pdl(f_dep, &s, 4);
         }},
        {"cudaGetDevice", [&] { int d; return cudaGetDevice(&d); }},
        {"cudaGetLastError", [&] { return cudaGetLastError(); }},
        {"cuTensorMapEncodeTiled (one map)", [&] { return map(); }},
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
