// cuda_toolchain verification: the host half of a flashinfer-style JIT extension, built with
// flashinfer's own compile line (-isystem <python include> among its flags).
#include <Python.h>
#include <cstdint>

extern "C" int jit_kernel_launch(std::uint32_t *out, std::uint32_t value);

extern "C" int jit_binding_entry(std::uint32_t *out) { return jit_kernel_launch(out, PY_MAJOR_VERSION); }
