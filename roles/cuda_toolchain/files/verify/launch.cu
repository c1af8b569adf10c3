// cuda_toolchain verification on a host that has GPUs (sglfleet_gpus_expected): initialise the driver,
// run a kernel on device 0 and read its result back. Built with the tree's nvcc for the target
// architecture and -cudart shared, linked against the driver (-lcuda: the tree's stub at link time, the
// real libcuda.so.1 at run time). Prints one line per step:
//   cuInit <CUresult> <name>      (CUDA_SUCCESS, CUDA_ERROR_NO_DEVICE, ...)
//   devices <count>
//   launch <cudaError_t> <name>   (the launch, the synchronize, the copy back; the first error)
//   value <hex>                   (every thread wrote EXPECTED ^ its index; 0 when all agree)
// and exits 0 only when every step succeeded and the value read back is the expected one.
#include <cstdio>
#include <cuda.h>
#include <cuda_runtime.h>

constexpr unsigned kExpected = 0x5eed1200u;
constexpr int kThreads = 64;

__global__ void stamp(unsigned *out, unsigned value) { out[threadIdx.x] = value ^ threadIdx.x; }

static int report_runtime(cudaError_t err) {
  std::printf("launch %d %s\n", static_cast<int>(err), cudaGetErrorName(err));
  return err == cudaSuccess ? 0 : 3;
}

int main() {
  CUresult init = cuInit(0);
  const char *name = nullptr;
  if (cuGetErrorName(init, &name) != CUDA_SUCCESS || name == nullptr) name = "unknown";
  std::printf("cuInit %d %s\n", static_cast<int>(init), name);
  if (init != CUDA_SUCCESS) return 2;
  int count = 0;
  cuDeviceGetCount(&count);
  std::printf("devices %d\n", count);

  unsigned *device = nullptr;
  cudaError_t err = cudaMalloc(&device, kThreads * sizeof(unsigned));
  if (err != cudaSuccess) return report_runtime(err);
  stamp<<<1, kThreads>>>(device, kExpected);
  err = cudaGetLastError();
  if (err == cudaSuccess) err = cudaDeviceSynchronize();
  unsigned host[kThreads] = {};
  if (err == cudaSuccess) err = cudaMemcpy(host, device, sizeof(host), cudaMemcpyDeviceToHost);
  cudaFree(device);
  if (report_runtime(err) != 0) return 3;
  unsigned diff = 0;
  for (unsigned i = 0; i < kThreads; ++i) diff |= host[i] ^ (kExpected ^ i);
  std::printf("value %x\n", diff);
  return diff == 0 ? 0 : 4;
}
