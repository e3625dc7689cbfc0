#pragma once
// MPSIM_HOST_DEVICE marks a function that CUDA kernels and host code both
// call: __host__ __device__ under nvcc, nothing for a host compiler. Numerics
// written once this way are proven on the host by the ordinary CPU tests and
// run unchanged on the GPU (the idea of CUTLASS_HOST_DEVICE). No CUDA type or
// header is named, so core's headers may use it.
#ifdef __CUDACC__
#define MPSIM_HOST_DEVICE __host__ __device__
#else
#define MPSIM_HOST_DEVICE
#endif
