/*
 * shared_memory.h: the shared-memory all-reduce, the small collectives in shared memory, and dist.empty
 * (shared_memory.c over algorithms/shm.c and shm_small.c).
 */
#ifndef PYDIST_PATHS_SHARED_MEMORY_H
#define PYDIST_PATHS_SHARED_MEMORY_H

#include "core/buffer.h"
#include "paths/algorithms/shm_small.h"
#include "paths/request.h"
#include "progress/progress.h"

// all_reduce with algorithm "shm" or chosen automatically (bytes >= PD_SHM_AUTO_BYTES on a group whose
// ranks share a node, and then only if every rank's array is in the segment). The crossover was
// measured with benchmarks/shm_allreduce.py (README).
#define PD_SHM_AUTO_BYTES (64 * 1024)
// From this size the automatic choice copies ordinary arrays through shm too: benchmarks/shm_allreduce.py
// has shown the copy path ahead of MPICH from 16 or 32 MiB up in every run on this machine (README).
// With more ranks than cores it copies from PD_SHM_AUTO_BYTES (shared_memory.c's copy_pays).
#define PD_SHM_AUTO_COPY_BYTES ((Py_ssize_t)32 << 20)
// Whether the automatic choice takes shm for `nbytes` on this group: depends only on the size and the
// group's layout, so every rank decides alike.
int pd_shm_auto(long group, Py_ssize_t nbytes);
// Run the shm all-reduce of buf (validated) on the group. Returns 1 with *ret set (the result, or
// NULL with an exception), or 0 when the caller must use MPI's all-reduce: the group cannot use shared
// memory (spans nodes, or its segment could not be made), or, when not forced (the automatic choice),
// not every rank's array is in the segment (then MPICH's all-reduce is faster than copying through
// ours; measured in README; at 2 ranks, all blocking, our ring instead). With `tuned` (an automatic call)
// the path table's choice (tuned.h) decides where every rank's call makes the same one. Every rank
// decides alike (from the headers all ranks published).
int pd_shm_all_reduce(PyObject *tensor, PdBuf *buf, long op, MPI_Op mop, long group, int async_op, int forced,
                      int tuned, PyObject **ret);
// At init (collective over the world) and at destroy/finalize (local).
int pd_shm_session_start(MPI_Comm world, double timeout);
void pd_shm_session_stop(void);
// The world ranks on this rank's node, as the session's start found them; 0: not known.
int pd_shm_node_ranks(void);
// The shared-memory path: a group's channel is made with the group (collective over its members, at
// init_process_group / new_group; a group that cannot use shared memory gets none and takes MPI's
// paths) and released with it; its progress completes small collectives whose peers have posted.
extern const PdPath pd_shm_path;
int pd_shm_type_init(PyObject *module);
// n floats in this rank's heap region (zeroed), owned by *owner (release with pd_shm_owner_release, GIL
// held); NULL when there is no segment or no room (no exception).
float *pd_shm_alloc_floats(long n, void **owner);
void pd_shm_owner_release(void *owner);
// Sum buf[0..n) over the group in place with the shm all-reduce when pd_shm_auto says so for n floats:
// 1 done, 0 not used (MPI's instead; the same answer on every rank), -1 failed (raised). GIL held.
int pd_shm_allreduce_floats(long group, float *buf, long n);
PyObject *pd_shm_empty(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
// Small collectives in shared memory (algorithms/shm_small.h): contributions up to this many bytes
// (PYDIST_SHM_SMALL_BYTES, read at init; 0: off; at most SMALL_SLOT_BYTES).
extern Py_ssize_t pd_shm_small_bytes;
// Whether this call goes through them: depends only on the size and the group, so every rank agrees.
int pd_shm_small_wanted(long group, size_t contribution);
// Whether the call's data goes through them (pd_shm_small_wanted for its contribution, but for a 2-rank
// broadcast past 32 KiB): the same answer on every rank whose call matches.
int pd_shm_small_takes(long group, const SmallCall *c);
// Run `call` (filled in but for dtype codes the caller took from pd_shm_dtype) on the group's channel:
// `a` and `b` are the arrays it reads and writes (kept until it completes), `list` what an async Work's
// result() returns. None, or a Work (async_op); NULL with an exception; NULL with *fallback = 1: the
// group cannot use shared memory (the same answer on every rank): use MPI's collective.
PyObject *pd_shm_small_run(const char *fn, const char *what, long group, int async_op, SmallCall *call,
                           PyObject *a, PyObject *b, PyObject *list, int *fallback);
// A call the slots do not carry (past the small bound, or a list form), on a group whose calls go
// through them (pd_shm_small_wanted(group, 0)): `header` (its kind without SMALL_HEADER_ONLY, count,
// dtype, op and root, as every rank describes the call alike) goes through the slots in order with the
// small calls, so that a rank whose call differs, on either side of any threshold, raises ValueError
// with every other; the data then goes as `mpi` on the group's private communicator. With src or dst
// set (an all-to-all of equal blocks) its data goes into the slots too where it fits, and moves there
// when every rank's did. `keep` owns every byte MPI touches; AVG divides `avg` when it completes.
// Returns as pd_shm_small_run.
PyObject *pd_shm_header_run(const char *fn, long group, int async_op, const SmallCall *header, const PdMpiCall *mpi,
                            PyObject *keep, PyObject *list, const PdBuf *avg, int *fallback);
int pd_shm_dtype(const PdBuf *buf);
PyObject *pd_set_shm_small_bytes(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *pd_shm_info(PyObject *self, PyObject *unused);

#endif  // PYDIST_PATHS_SHARED_MEMORY_H
