/* cuda_toolchain: the link-time stub of the CUDA driver, $CUDA_HOME/lib64/stubs/libcuda.so.
 *
 * flashinfer's JIT links every extension with
 *   -L$cuda_home/lib64 -L$cuda_home/lib64/stubs -lcudart -lcuda
 * (flashinfer 0.6.11.post1, flashinfer/jit/cpp_ext.py:252-258), so the tree needs a libcuda.so there
 * even on a host without a driver; the pip wheels ship none (nvidia-cuda-runtime 13.2.86 has only
 * lib/libcudart.so.13). Like the toolkit's own stub it carries the SONAME libcuda.so.1, so what links
 * against it NEEDs libcuda.so.1 and the dynamic loader takes the real driver's library at run time;
 * every entry point answers CUDA_ERROR_STUB_LIBRARY (34), as NVIDIA's stub does, should the stub
 * itself ever be loaded. Built on the target: gcc -shared -fPIC -Wl,-soname,libcuda.so.1.
 */
#define CUDA_ERROR_STUB_LIBRARY 34

#define STUB(name) \
  int name(void) { return CUDA_ERROR_STUB_LIBRARY; }

/* The driver API entry points JIT-built kernels and their launchers reference (cuda.h, CUDA 13). */
STUB(cuInit)
STUB(cuDriverGetVersion)
STUB(cuGetErrorName)
STUB(cuGetErrorString)
STUB(cuGetProcAddress)
STUB(cuGetProcAddress_v2)
STUB(cuDeviceGet)
STUB(cuDeviceGetCount)
STUB(cuDeviceGetName)
STUB(cuDeviceGetAttribute)
STUB(cuDeviceTotalMem_v2)
STUB(cuDevicePrimaryCtxRetain)
STUB(cuDevicePrimaryCtxRelease_v2)
STUB(cuCtxGetCurrent)
STUB(cuCtxSetCurrent)
STUB(cuCtxGetDevice)
STUB(cuCtxSynchronize)
STUB(cuModuleLoadData)
STUB(cuModuleLoadDataEx)
STUB(cuModuleUnload)
STUB(cuModuleGetFunction)
STUB(cuModuleGetGlobal_v2)
STUB(cuLibraryLoadData)
STUB(cuLibraryUnload)
STUB(cuLibraryGetKernel)
STUB(cuKernelGetFunction)
STUB(cuFuncGetAttribute)
STUB(cuFuncSetAttribute)
STUB(cuFuncSetCacheConfig)
STUB(cuLaunchKernel)
STUB(cuLaunchKernelEx)
STUB(cuLaunchCooperativeKernel)
STUB(cuOccupancyMaxActiveClusters)
STUB(cuPointerGetAttribute)
STUB(cuPointerGetAttributes)
STUB(cuMemAlloc_v2)
STUB(cuMemFree_v2)
STUB(cuMemcpyHtoD_v2)
STUB(cuMemcpyDtoH_v2)
STUB(cuMemGetInfo_v2)
STUB(cuStreamCreate)
STUB(cuStreamDestroy_v2)
STUB(cuStreamSynchronize)
STUB(cuEventCreate)
STUB(cuEventRecord)
STUB(cuEventSynchronize)
STUB(cuTensorMapEncodeTiled)
STUB(cuTensorMapEncodeIm2col)
