/*
 * tuned.c: the path table (tuned.h). pydist/tune.py measures every path of the five collectives at each
 * size on this machine and writes the table; init_process_group reads it (pydist/tuning.py) and hands it
 * here, and init gives every rank world rank 0's. The paths consult it where a choice used to be a
 * constant tuned on one CPU: whether the slots carry the data (pd_shm_small_takes), and what the data
 * takes once the header round has matched (shared_memory.c's large_data, from flags every rank ANDs,
 * so a rank whose call sits on the other side of a row still agrees with the others).
 */
#include "paths/tuned.h"

#include "core/errors.h"
#include "paths/algorithms/shm_small.h"
#include "progress/wait.h"

#include <stdio.h>
#include <string.h>

typedef struct {
    int32_t n, unusable;       // unusable: the named table could not be used, and why (world rank 0's wins)
    char why[512];
    PdTunedRow rows[PD_TUNE_MAX_ROWS];
} Table;

static Table table;   // GIL held whenever touched
// rows of (ranks, op): table.rows[first[ranks][op] .. + count[ranks][op]), in increasing upto
static uint16_t first[PD_TUNE_MAX_RANKS + 1][PD_TUNE_OPS], count[PD_TUNE_MAX_RANKS + 1][PD_TUNE_OPS];

static int path_allowed(int op, int path, int ranks) {
    switch (path) {
    case PD_TUNED_NONE: case PD_TUNED_SLOTS: case PD_TUNED_MPI: return 1;
    case PD_TUNED_PAIR: return ranks == 2 && op != PD_TUNE_ALL_REDUCE && op != PD_TUNE_REDUCE_SCATTER;
    case PD_TUNED_RING: return op == PD_TUNE_ALL_REDUCE || op == PD_TUNE_REDUCE_SCATTER;
    case PD_TUNED_SHM: return op == PD_TUNE_ALL_REDUCE;
    default: return 0;
    }
}

// Why rows[0..n) cannot be a table (NULL: they can): in range, each path one its op has, and in
// increasing (ranks, op, upto). The same bytes give the same answer on every rank.
static const char *invalid(const PdTunedRow *rows, int n) {
    if (n < 0 || n > PD_TUNE_MAX_ROWS) {
        return "too many rows";
    }
    for (int i = 0; i < n; i++) {
        const PdTunedRow *r = &rows[i];
        if (r->ranks < 2 || r->ranks > PD_TUNE_MAX_RANKS || r->op < 0 || r->op >= PD_TUNE_OPS || r->upto < 1 ||
            r->upto > ((uint64_t)1 << 62)) {
            return "a row's ranks, op or size is out of range";
        }
        if (!path_allowed(r->op, r->path, r->ranks)) {
            return "a row names a path its collective does not have at that many ranks";
        }
        const PdTunedRow *p = i > 0 ? &rows[i - 1] : NULL;
        if (p != NULL && (p->ranks != r->ranks ? p->ranks > r->ranks
                          : p->op != r->op     ? p->op > r->op
                                               : p->upto >= r->upto)) {
            return "rows are not in increasing (ranks, op, upto)";
        }
    }
    return NULL;
}

static void install(const PdTunedRow *rows, int n) {
    table.unusable = 0;
    table.why[0] = 0;
    if (rows != table.rows) {
        memcpy(table.rows, rows, sizeof *rows * (size_t)n);
    }
    table.n = n;
    memset(count, 0, sizeof count);
    for (int i = n - 1; i >= 0; i--) {
        first[rows[i].ranks][rows[i].op] = (uint16_t)i;
        count[rows[i].ranks][rows[i].op]++;
    }
}

int pd_tuned_path(int ranks, int op, size_t bytes) {
    if (ranks < 2 || ranks > PD_TUNE_MAX_RANKS || op < 0 || op >= PD_TUNE_OPS || count[ranks][op] == 0) {
        return PD_TUNED_NONE;
    }
    const PdTunedRow *r = &table.rows[first[ranks][op]], *last = r + count[ranks][op] - 1;
    while (r < last && bytes > r->upto) {
        r++;
    }
    return r->path;
}

int pd_tuned_op_of_kind(int kind) {
    switch (kind & ~SMALL_HEADER_ONLY) {
    case SMALL_ALLREDUCE: return PD_TUNE_ALL_REDUCE;
    case SMALL_BCAST: return PD_TUNE_BROADCAST;
    case SMALL_ALLGATHER: return PD_TUNE_ALL_GATHER;
    case SMALL_ALLTOALL: return PD_TUNE_ALL_TO_ALL;
    case SMALL_REDUCE_SCATTER: return PD_TUNE_REDUCE_SCATTER;
    default: return -1;
    }
}

int pd_tuned_share(MPI_Comm world, double timeout) {
    int size = 1, rc;
    MPI_Comm_size(world, &size);
    if (size == 1) {
        return 0;
    }
    // Static: an Ibcast that times out stays pending (parked) and MPI may still write here.
    static Table shared;
    shared = table;
    MPI_Request req = MPI_REQUEST_NULL;
    if ((rc = MPI_Ibcast(&shared, (int)sizeof shared, MPI_BYTE, 0, world, &req)) != MPI_SUCCESS) {
        pd_raise_mpi(rc, "MPI_Ibcast");
        return -1;
    }
    PdWaitSpec spec = {"init_process_group", timeout, NULL, NULL, 0.0};
    if (pd_wait(&req, MPI_STATUS_IGNORE, &spec) < 0) {
        if (req != MPI_REQUEST_NULL) {
            pd_park(req, NULL, 0);
        }
        if (PyErr_ExceptionMatches(PyExc_KeyboardInterrupt)) {
            return -1;
        }
        // A rank whose own init timed out has gone on without this collective, as the segment's set-up
        // allows: init goes on, without a table (the built-in choices), and says so.
        PyErr_Clear();
        install(table.rows, 0);   // (and no verdict: rank 0's never came)
        fprintf(stderr, "pydist: the path table could not be shared at init (a rank did not take part); "
                        "using the built-in choices\n");
        return 0;
    }
    // rank 0's bytes, checked as every rank checks them: a table that is not one is no table anywhere
    install(shared.rows, invalid(shared.rows, shared.n) == NULL ? shared.n : 0);
    if (shared.unusable) {   // rank 0's named table was unusable: every rank refuses alike, with its words
        table.unusable = 1;
        memcpy(table.why, shared.why, sizeof table.why);
        table.why[sizeof table.why - 1] = 0;
    }
    return 0;
}

const char *pd_tuned_unusable(void) {
    return table.unusable ? table.why : NULL;
}

PyObject *pd_path_table_unusable(PyObject *self, PyObject *arg) {
    (void)self;
    if (!PyUnicode_Check(arg)) {
        PyErr_SetString(PyExc_TypeError, "path_table_unusable(): `message` must be a str");
        return NULL;
    }
    const char *text = PyUnicode_AsUTF8(arg);
    if (text == NULL) {
        return NULL;
    }
    install(table.rows, 0);
    table.unusable = 1;
    snprintf(table.why, sizeof table.why, "%s", text);
    Py_RETURN_NONE;
}

// _C.set_path_table(rows): rows a sequence of (ranks, op, path, upto) ints in increasing (ranks, op, upto),
// or None for none.
PyObject *pd_set_path_table(PyObject *self, PyObject *arg) {
    (void)self;
    if (arg == Py_None) {
        install(table.rows, 0);
        Py_RETURN_NONE;
    }
    PyObject *seq = PySequence_Fast(arg, "set_path_table(): `rows` must be a sequence of (ranks, op, path, upto)");
    if (seq == NULL) {
        return NULL;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PdTunedRow *rows = PyMem_RawCalloc(n > 0 ? (size_t)n : 1, sizeof *rows);
    if (rows == NULL) {
        Py_DECREF(seq);
        return PyErr_NoMemory();
    }
    const char *why = n > PD_TUNE_MAX_ROWS ? "too many rows" : NULL;
    for (Py_ssize_t i = 0; why == NULL && i < n; i++) {
        PyObject *row = PySequence_Fast_GET_ITEM(seq, i);
        long long v[4];
        if (!PyTuple_Check(row) || PyTuple_GET_SIZE(row) != 4) {
            PyErr_SetString(PyExc_TypeError, "set_path_table(): each row must be a tuple (ranks, op, path, upto)");
            goto fail;
        }
        for (int k = 0; k < 4; k++) {
            PyObject *x = PyTuple_GET_ITEM(row, k);
            if (!PyLong_Check(x) || PyBool_Check(x)) {
                PyErr_SetString(PyExc_TypeError, "set_path_table(): a row's entries must be ints");
                goto fail;
            }
            int overflow = 0;
            v[k] = PyLong_AsLongLongAndOverflow(x, &overflow);
            if (overflow || (v[k] == -1 && PyErr_Occurred())) {
                PyErr_Clear();
                why = "a row's ranks, op or size is out of range";
                break;
            }
        }
        if (why != NULL) {
            break;
        }
        if (v[0] < 0 || v[0] > INT32_MAX || v[1] < 0 || v[1] > INT32_MAX || v[2] < 0 || v[2] > INT32_MAX || v[3] < 0) {
            why = "a row's ranks, op or size is out of range";
            break;
        }
        rows[i] = (PdTunedRow){(int32_t)v[0], (int32_t)v[1], (int32_t)v[2], 0, (uint64_t)v[3]};
    }
    if (why == NULL) {
        why = invalid(rows, (int)n);
    }
    if (why != NULL) {
        PyErr_Format(PyExc_ValueError, "set_path_table(): %s", why);
        goto fail;
    }
    install(rows, (int)n);
    PyMem_RawFree(rows);
    Py_DECREF(seq);
    Py_RETURN_NONE;
fail:
    PyMem_RawFree(rows);
    Py_DECREF(seq);
    return NULL;
}

PyObject *pd_path_table(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
    PyObject *out = PyList_New(table.n);
    for (int i = 0; out != NULL && i < table.n; i++) {
        const PdTunedRow *r = &table.rows[i];
        PyObject *row = Py_BuildValue("(iiiK)", r->ranks, r->op, r->path, (unsigned long long)r->upto);
        if (row == NULL) {
            Py_CLEAR(out);
            break;
        }
        PyList_SET_ITEM(out, i, row);
    }
    return out;
}
