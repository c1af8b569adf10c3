// sglang verification: a JIT-style translation unit that sees torch's CUDA runtime headers first (as a
// flashinfer/torch extension build can) and is compiled by the toolchain's nvcc. CCCL refuses mismatched
// minors unless the compatibility override is in NVCC_APPEND_FLAGS.
#include <cuda/std/cstdint>
#include <cuda_runtime_api.h>

__global__ void touch(cuda::std::uint32_t *out) { out[threadIdx.x] = CUDART_VERSION; }
