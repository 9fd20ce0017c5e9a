/*
 * dtypes.h: the dtypes pydist moves and the reduction ops on them (dtypes.c).
 */
#ifndef PYDIST_CORE_DTYPES_H
#define PYDIST_CORE_DTYPES_H

#include <stdint.h>
#include "core/base.h"

// torch.distributed's ReduceOp values, in torch's order.
enum {
    PD_OP_SUM = 0, PD_OP_AVG = 1, PD_OP_PRODUCT = 2, PD_OP_MIN = 3, PD_OP_MAX = 4,
    PD_OP_BAND = 5, PD_OP_BOR = 6, PD_OP_BXOR = 7, PD_OP_COUNT = 8
};

typedef struct {
    MPI_Datatype mpi;   // what MPI moves (float16, bfloat16 travel as MPI_UINT16_T with our own ops)
    const char *name;   // NumPy's name, for messages
    char kind;          // 'b' bool, 'i' signed, 'u' unsigned, 'f' float, 'c' complex
    int half;           // PD_HALF_F16 or PD_HALF_BF16: reductions need our user ops; else 0
} PdDtype;

enum { PD_HALF_F16 = 1, PD_HALF_BF16 = 2 };

// Look up the table entry for an array's dtype; raises TypeError naming fn/arg and returns NULL
// when the dtype is not one we move.
const PdDtype *pd_dtype_of(PyArrayObject *arr, const char *fn, const char *arg);
// The MPI op for (op, dtype); raises TypeError/ValueError and returns -1 when the pair is invalid.
int pd_op_resolve(long op, const PdDtype *dt, const char *fn, MPI_Op *out);
const char *pd_op_name(int op);
int pd_arg_op(PyObject *obj, const char *fn, long *out);
// bfloat16's entry: a torch bfloat16 tensor is viewed as int16 words and described by it.
const PdDtype *pd_dtype_bfloat16(void);
int pd_ops_init(void);   // create the float16/bfloat16 user ops (after MPI_Init)
void pd_ops_free(void);  // before MPI_Finalize
// AVG is SUM followed by this division (elementwise, in place, on the reduced buffer).
void pd_divide_inplace(void *buf, MPI_Count count, const PdDtype *dt, int divisor);

PyObject *pd_check_op(PyObject *self, PyObject *const *args, Py_ssize_t nargs);   // _C.check_op

#endif  // PYDIST_CORE_DTYPES_H
