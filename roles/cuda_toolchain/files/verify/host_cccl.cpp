// cuda_toolchain verification: host code that uses libcu++ from CCCL, compiled by the host compiler with
// only -I$CUDA_HOME/include (as torch extensions and JIT builds do).
#include <cuda/std/cstdint>
#include <cuda/std/type_traits>
#include <cub/version.cuh>
#include <thrust/version.h>

static_assert(sizeof(cuda::std::uint64_t) == 8, "cuda::std::uint64_t");
static_assert(cuda::std::is_same<cuda::std::int32_t, int>::value, "cuda::std::int32_t");

int cccl_versions() { return CUB_VERSION + THRUST_VERSION; }
