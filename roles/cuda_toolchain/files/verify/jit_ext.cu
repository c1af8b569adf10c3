// cuda_toolchain verification: a JIT-style extension (as flashinfer builds one): a .cu compiled to
// position-independent code, then linked into a shared object with -L$CUDA_HOME/lib64 -lcudart.
#include <cuda/std/cstdint>
#include <cuda_runtime.h>

__global__ void fill(cuda::std::uint32_t *out, cuda::std::uint32_t value) { out[threadIdx.x] = value; }

extern "C" int jit_ext_launch(cuda::std::uint32_t *out, cuda::std::uint32_t value) {
  fill<<<1, 32>>>(out, value);
  return static_cast<int>(cudaGetLastError());
}
