/*
 * buffer.h: a NumPy array (or a torch CPU tensor, viewed) as MPI's buffer (buffer.c).
 */
#ifndef PYDIST_CORE_BUFFER_H
#define PYDIST_CORE_BUFFER_H

#include "core/dtypes.h"

typedef struct {
    PyArrayObject *arr;  // new reference; NULL when unused
    const PdDtype *dtype;
    void *data;
    MPI_Count count;     // number of elements
    Py_ssize_t nbytes;
} PdBuf;

// Validate `obj` as an array argument: ndarray (or a torch CPU tensor, viewed, not copied),
// C-contiguous, aligned, native byte order, writeable if `writable`, a dtype we support.
// On success fills *buf (holding a new reference) and returns 0; otherwise raises and returns -1.
int pd_buf_get(PyObject *obj, const char *fn, const char *arg, int writable, PdBuf *buf);
void pd_buf_release(PdBuf *buf);

// A list of arrays of one dtype and size, described for MPI's v-collectives as bytes at
// displacements from the lowest address. `keep` (a tuple of the arrays and `meta`, which holds the
// counts and displacements) must outlive the MPI operation.
typedef struct {
    Py_ssize_t n;
    PdBuf *bufs;
    char *base;
    MPI_Count *counts;  // bytes, in meta
    MPI_Aint *displs;   // bytes from base, in meta
    PyObject *meta;
    PyObject *keep;
} PdBufList;

int pd_buflist_get(PyObject *seq, Py_ssize_t n, const char *fn, const char *arg, int writable,
                   const PdBuf *like, PdBufList *out);
void pd_buflist_release(PdBufList *l);

#endif  // PYDIST_CORE_BUFFER_H
