// cuda_toolchain verification: the CUDA half of a flashinfer-style JIT extension, built with
// flashinfer's own cuda_compile line. It calls the runtime (-lcudart) and the driver (-lcuda), so the
// link proves that both libraries are found in the tree ($CUDA_HOME/lib64, $CUDA_HOME/lib64/stubs).
#include <cuda.h>
#include <cuda/std/cstdint>
#include <cuda_runtime.h>
// flashinfer's attention modules include CUTLASS's tensor_fill.h, which includes cuRAND's device header:
// the tree must have it (nvidia-curand), or the fleet's JIT warm-up stops at this line.
#include <curand_kernel.h>

__global__ void fill(cuda::std::uint32_t *out, cuda::std::uint32_t value) { out[threadIdx.x] = value; }

extern "C" int jit_kernel_launch(cuda::std::uint32_t *out, cuda::std::uint32_t value) {
  int driver = 0;
  if (cuDriverGetVersion(&driver) != CUDA_SUCCESS) return -1;
  fill<<<1, 32>>>(out, value);
  return static_cast<int>(cudaGetLastError());
}
