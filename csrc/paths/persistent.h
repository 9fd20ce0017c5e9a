/*
 * persistent.h: cached persistent requests for small collectives (persistent.c).
 */
#ifndef PYDIST_PATHS_PERSISTENT_H
#define PYDIST_PATHS_PERSISTENT_H

#include "core/dtypes.h"
#include "groups/group.h"
#include "progress/progress.h"

enum { PD_PERSIST_BARRIER, PD_PERSIST_BCAST, PD_PERSIST_ALLREDUCE, PD_PERSIST_REDUCE, PD_PERSIST_ALLGATHER,
       PD_PERSIST_REDUCE_SCATTER };

// What identifies a cached request: the same on every rank for the same call (never an address).
typedef struct {
    int kind;
    MPI_Count count;     // the init's count: elements per rank's block (all_gather, reduce_scatter,
                         // all_to_all) or of the whole buffer
    MPI_Datatype type;
    size_t extent;       // bytes per element of `type`
    MPI_Op op;           // MPI_OP_NULL where there is none
    int root;            // group rank; -1 where there is none
    int rank, size;      // this rank's and the group's: fixed per group, not compared
} PdPersistKey;

// One call's data: src (src_bytes) is copied into the staging before the start, the result is copied
// out into dst (dst_bytes) on completion and then divided by avg_divisor (AVG, avg_count elements).
typedef struct {
    const void *src;
    size_t src_bytes;
    void *dst;
    size_t dst_bytes;
    int avg_divisor;
    const PdDtype *avg_dtype;
    MPI_Count avg_count;
} PdPersistCall;

typedef struct PdPersistEntry PdPersistEntry;

// Messages up to this many bytes take the cached path (PYDIST_PERSISTENT_BYTES, read at init; 0: off).
extern Py_ssize_t pd_persist_bytes;
static inline int pd_persist_wanted(size_t message_bytes) {
    return pd_persist_bytes > 0 && message_bytes <= (size_t)pd_persist_bytes;
}
// 0: all-gathers stay nonblocking (MPICH's chosen algorithm is wrong on a restarted request).
extern int pd_persist_allgather_ok;
void pd_persist_read_env(void);
// Run a collective through the group's cache: blocking (list == NULL: waits the pydist way, returns
// None) or async (returns a Work holding `keep` whose result() is `list`). NULL with an exception.
PyObject *pd_persist_run(const PdOp *op, MPI_Comm comm, const PdPersistKey *key, const PdPersistCall *call,
                         PyObject *keep, PyObject *list);
extern const PdPath pd_persistent_path;
PyObject *pd_persistent_stats(PyObject *self, PyObject *const *args, Py_ssize_t nargs);

#endif  // PYDIST_PATHS_PERSISTENT_H
