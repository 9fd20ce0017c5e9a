/*
 * tuned.h: the path table measured on this machine (`python -m pydist.tune`, pydist/tune.py): for a
 * group within one node, its size and a collective, which path carries the call at each size. World
 * rank 0's table is every rank's from init_process_group on, so every choice made from it is the same on
 * every rank; without a table (or a row for the call) every path keeps its built-in choice.
 */
#ifndef PYDIST_PATHS_TUNED_H
#define PYDIST_PATHS_TUNED_H

#include <Python.h>
#include "core/mpi_calls.h"
#include <stddef.h>
#include <stdint.h>

// The five collectives the table covers, and the paths a row may name.
enum { PD_TUNE_ALL_REDUCE, PD_TUNE_BROADCAST, PD_TUNE_ALL_GATHER, PD_TUNE_ALL_TO_ALL, PD_TUNE_REDUCE_SCATTER,
       PD_TUNE_OPS };
enum {
    PD_TUNED_NONE,    // the built-in choice (no row, or a row that keeps it)
    PD_TUNED_SLOTS,   // the data in the group's shared-memory slots (up to their size)
    PD_TUNED_PAIR,    // 2 ranks: one point-to-point exchange after the header round
    PD_TUNED_MPI,     // MPI's nonblocking collective after the header round
    PD_TUNED_RING,    // all_reduce, reduce_scatter: pydist's ring (reduce_scatter: its first half) after the header round
    PD_TUNED_SHM,     // all_reduce: the shared-memory all-reduce (copying) after the header round
    PD_TUNED_PATHS
};

// One row: on a group of `ranks`, `op`'s calls whose input is at most `upto` bytes (and past the row
// before) take `path`. A call past a table's last row takes its last row's path.
typedef struct {
    int32_t ranks, op, path, unused;
    uint64_t upto;
} PdTunedRow;

#define PD_TUNE_MAX_RANKS 1024
#define PD_TUNE_MAX_ROWS 2048

// The path for op's call of `bytes` (its input, as shm_small_contribution counts it) on a group of
// `ranks`: PD_TUNED_NONE when the table has no row for it.
int pd_tuned_path(int ranks, int op, size_t bytes);
// The table's op for a SmallCall kind (algorithms/shm_small.h); -1 for the collectives it does not cover.
int pd_tuned_op_of_kind(int kind);
// At init (collective over the world, under its deadline): every rank takes world rank 0's table, and
// its verdict on a table the user named: then pd_tuned_unusable() is the same on every rank.
int pd_tuned_share(MPI_Comm world, double timeout);
// Why world rank 0's named table (PYDIST_TUNE=FILE) could not be used, once shared: init raises it as a
// ValueError on every rank. NULL: it could.
const char *pd_tuned_unusable(void);
// _C.set_path_table(rows or None) -> None: this process's table (before init: what init shares if this is
// world rank 0; after: every rank alike, between calls). _C.path_table() -> the rows.
PyObject *pd_set_path_table(PyObject *self, PyObject *arg);
// _C.path_table_unusable(message) -> None: this process's named table cannot be used (no table), and
// why; set_path_table clears it.
PyObject *pd_path_table_unusable(PyObject *self, PyObject *arg);
PyObject *pd_path_table(PyObject *self, PyObject *unused);

#endif  // PYDIST_PATHS_TUNED_H
