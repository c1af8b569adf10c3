// cuda_toolchain verification: a device kernel plus a host main, compiled for the target architecture
// and linked against the shared CUDA runtime. It is built, never run (no GPU needed).
#include <cuda_runtime.h>

__global__ void saxpy(int n, float a, const float *x, float *y) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + y[i];
}

int main() {
  int version = 0;
  cudaRuntimeGetVersion(&version);
  saxpy<<<1, 32>>>(0, 2.0f, nullptr, nullptr);
  return version > 0 ? 0 : 1;
}
