/*
 * grid_stride.cuh - the launch of the small grid-stride kernels that run beside the attention
 * kernels (the KV append, the merge): host code.
 */
#pragma once

#include <cuda_runtime.h>
#include <stdint.h>

#include "fa_kernel_params.h"

namespace fa {

/* The blocks of a grid-stride launch over `total` items, `threads` threads a block: one an item,
 * capped at FA_GRID_STRIDE_MAX_BLOCKS. */
inline int64_t grid_stride_blocks(int64_t total, int threads) {
    const int64_t blocks = (total + threads - 1) / threads;
    return blocks < FA_GRID_STRIDE_MAX_BLOCKS ? blocks : FA_GRID_STRIDE_MAX_BLOCKS;
}

/* Enqueues a grid-stride kernel over `total` items, `threads` threads a block, in
 * grid_stride_blocks blocks; `programmatic`: as a programmatic dependent of the stream's previous
 * kernel (the kernel then waits, wait_prerequisites(), before it touches memory). */
template <class Kernel, class Args>
inline cudaError_t launch_grid_stride(Kernel kernel, int64_t total, int threads, cudaStream_t stream,
                                      bool programmatic, const Args &args) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3((unsigned)grid_stride_blocks(total, threads));
    cfg.blockDim = dim3(threads), cfg.dynamicSmemBytes = 0, cfg.stream = stream;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr, cfg.numAttrs = programmatic ? 1 : 0;
    return cudaLaunchKernelEx(&cfg, kernel, args);
}

}  // namespace fa
