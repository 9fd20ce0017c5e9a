/*
 * base.h: what every file that talks to Python or MPI includes first: Python, NumPy's C API
 * (one shared table, imported by core/numpy_api.c) and MPI, configured once. Nothing here is exported from
 * the shared object except PyInit__C (we build with -fvisibility=hidden).
 */
#ifndef PYDIST_CORE_BASE_H
#define PYDIST_CORE_BASE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#define PY_ARRAY_UNIQUE_SYMBOL pydist_ARRAY_API
#ifndef PD_IMPORT_NUMPY
#define NO_IMPORT_ARRAY
#endif
#include <numpy/arrayobject.h>

#include "core/mpi_calls.h"

// Import NumPy's C API into the shared table (core/numpy_api.c): 0, or -1 with an exception.
int pd_import_numpy(void);

// Thread-local variables that every call touches: the initial-exec model makes each access one load
// from the thread pointer instead of a call to __tls_get_addr (a shared object's default), which cost
// tens of ns per communication call. A few dozen bytes of the static TLS that glibc keeps for dlopen.
#ifndef PD_THREAD_LOCAL
#define PD_THREAD_LOCAL _Thread_local __attribute__((tls_model("initial-exec")))
#endif

#endif  // PYDIST_CORE_BASE_H
