/*
 * ring_path.h: our ring all-reduce as a path (ring_path.c over algorithms/ring.c).
 */
#ifndef PYDIST_PATHS_RING_PATH_H
#define PYDIST_PATHS_RING_PATH_H

#include "core/buffer.h"
#include "progress/progress.h"
#include "progress/work.h"

// Our ring all-reduce as a path (ring_path.c): blocking, or a Work whose steps every wait moves along.
PyObject *pd_ring_all_reduce(PyObject *tensor, PdBuf *buf, long op, MPI_Op mop, long group, int async_op);
// The ring all-reduce of `data` (count elements, in place) as w's operation, on `comm` with `tag`: w's
// arrays stay with it and the ring's scratch joins them, and from here on w is a ring in flight (or,
// with nothing to send, over: w->pending NULL). 0, or -1 with the error raised and w as it was.
int pd_ring_start_on(PdWorkObject *w, void *data, MPI_Count count, MPI_Datatype dtype, MPI_Op op, MPI_Comm comm,
                     int tag);
// The ring's reduce-scatter (ring_rs_init) of `in` (group size x count elements) into `out` (count), as
// pd_ring_start_on's. The ranks' inputs are only read.
int pd_ring_reduce_scatter_start_on(PdWorkObject *w, const void *in, void *out, MPI_Count count, MPI_Datatype dtype,
                                    MPI_Op op, MPI_Comm comm, int tag);
extern const PdPath pd_ring_path;

#endif  // PYDIST_PATHS_RING_PATH_H
