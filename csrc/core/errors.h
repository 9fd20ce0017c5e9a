/*
 * errors.h: pydist's exception types and the raising helpers every layer uses.
 */
#ifndef PYDIST_CORE_ERRORS_H
#define PYDIST_CORE_ERRORS_H

#include "core/base.h"

// Exception types, created in module.c and shared by every file. DistError is a RuntimeError;
// DistBackendError (MPI failures) and DistTimeoutError (waits that ran past their deadline) derive
// from it, as in torch.distributed.
extern PyObject *pd_DistError;
extern PyObject *pd_DistBackendError;
extern PyObject *pd_DistTimeoutError;

// Raise DistBackendError "<call> failed: <MPI_Error_string> (error class N)". Returns NULL.
PyObject *pd_raise_mpi(int rc, const char *call);
// Same, returning -1, for int-returning helpers.
int pd_raise_mpi_int(int rc, const char *call);

// Check an MPI return code where the caller returns PyObject* on error via `goto error`.
#define PD_CHECK_MPI(rc, call)                 \
    do {                                       \
        if ((rc) != MPI_SUCCESS) {             \
            pd_raise_mpi((rc), (call));        \
            goto error;                        \
        }                                      \
    } while (0)

// Small helpers for the positional _C signatures: parse a C long / bool argument or raise TypeError.
int pd_arg_long(PyObject *obj, const char *fn, const char *arg, long *out);
int pd_arg_bool(PyObject *obj, const char *fn, const char *arg, int *out);
int pd_check_nargs(Py_ssize_t nargs, Py_ssize_t want, const char *fn);

#endif  // PYDIST_CORE_ERRORS_H
