/* cuda_toolchain verification: a Triton-style launcher, compiled with Triton 3.6.0's own command
 * (triton/runtime/build.py _build) and loaded as a Python extension: <Python.h> from the SGLang
 * venv's exact python, <cuda.h>, and -l:libcuda.so.1 found through `ldconfig -p`. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include "cuda.h"

static PyObject *cu_init(PyObject *self, PyObject *args) {
  (void)self;
  (void)args;
  return PyLong_FromLong((long)cuInit(0));
}

static PyMethodDef methods[] = {{"cu_init", cu_init, METH_NOARGS, "cuInit(0)'s CUresult"}, {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "triton_launcher", NULL, -1, methods};

PyMODINIT_FUNC PyInit_triton_launcher(void) { return PyModule_Create(&module); }
