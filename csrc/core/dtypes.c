/*
 * dtypes.c: the one table of dtypes we move, the one table of reduction ops, and which op fits
 * which kind of dtype.
 *
 * A NumPy dtype is looked up by kind and item size, not by type number, so every alias of a type
 * (np.intc, np.longlong, ...) finds the same entry. float16 has no reduction ops in MPI, so it
 * travels as MPI_UINT16_T and reduces with user ops (half -> float, operate, round back to nearest
 * even), which gives NumPy's result for each pairwise step. bfloat16 (no NumPy dtype of its own: a torch
 * tensor's, or ml_dtypes.bfloat16) travels and reduces the same way with its own ops, rounding as torch
 * does (to nearest even). AVG is SUM followed by a division by the
 * group size, for floating and complex dtypes only (torch's AVG is not defined for integers here).
 * MIN and MAX on unsigned integers use our own ops too where MPI gets them wrong (MPICH 4.0.2 compares
 * them as signed: see unsigned_ops below), and so do MIN and MAX on every floating dtype, so that NaN
 * and signed zeros give the same bits on every rank and path (algorithms/minmax.h).
 */
#include "core/dtypes.h"

#include "core/errors.h"
#include "core/kernels.h"
#include "core/minmax.h"

#include <math.h>
#include <stdint.h>
#include <string.h>
#include <strings.h>

// ---------------------------------------------------------------------------------------------------
// The dtype table. MPI_Datatype values are link-time constants in MPICH but not in every MPI, so the
// table is filled in at first use rather than statically.

enum { DT_BOOL, DT_I8, DT_I16, DT_I32, DT_I64, DT_U8, DT_U16, DT_U32, DT_U64,
       DT_F16, DT_F32, DT_F64, DT_C64, DT_C128, DT_BF16, DT_COUNT };

static PdDtype table[DT_COUNT];
static int table_ready = 0;

static void table_fill(void) {
    table[DT_BOOL] = (PdDtype){MPI_C_BOOL, "bool", 'b', 0};
    table[DT_I8] = (PdDtype){MPI_INT8_T, "int8", 'i', 0};
    table[DT_I16] = (PdDtype){MPI_INT16_T, "int16", 'i', 0};
    table[DT_I32] = (PdDtype){MPI_INT32_T, "int32", 'i', 0};
    table[DT_I64] = (PdDtype){MPI_INT64_T, "int64", 'i', 0};
    table[DT_U8] = (PdDtype){MPI_UINT8_T, "uint8", 'u', 0};
    table[DT_U16] = (PdDtype){MPI_UINT16_T, "uint16", 'u', 0};
    table[DT_U32] = (PdDtype){MPI_UINT32_T, "uint32", 'u', 0};
    table[DT_U64] = (PdDtype){MPI_UINT64_T, "uint64", 'u', 0};
    table[DT_F16] = (PdDtype){MPI_UINT16_T, "float16", 'f', PD_HALF_F16};
    table[DT_F32] = (PdDtype){MPI_FLOAT, "float32", 'f', 0};
    table[DT_F64] = (PdDtype){MPI_DOUBLE, "float64", 'f', 0};
    table[DT_C64] = (PdDtype){MPI_C_FLOAT_COMPLEX, "complex64", 'c', 0};
    table[DT_C128] = (PdDtype){MPI_C_DOUBLE_COMPLEX, "complex128", 'c', 0};
    table[DT_BF16] = (PdDtype){MPI_UINT16_T, "bfloat16", 'f', PD_HALF_BF16};
    table_ready = 1;
}

static int index_of(char kind, int size) {
    switch (kind) {
    case 'b': return size == 1 ? DT_BOOL : -1;
    case 'i': return size == 1 ? DT_I8 : size == 2 ? DT_I16 : size == 4 ? DT_I32 : size == 8 ? DT_I64 : -1;
    case 'u': return size == 1 ? DT_U8 : size == 2 ? DT_U16 : size == 4 ? DT_U32 : size == 8 ? DT_U64 : -1;
    case 'f': return size == 2 ? DT_F16 : size == 4 ? DT_F32 : size == 8 ? DT_F64 : -1;
    case 'c': return size == 8 ? DT_C64 : size == 16 ? DT_C128 : -1;
    default: return -1;
    }
}

// ml_dtypes.bfloat16 (JAX's and TensorFlow's NumPy dtype): a 2-byte dtype of kind 'V' named bfloat16.
static int is_ml_bfloat16(PyArray_Descr *descr) {
    if (descr->kind != 'V' || PyDataType_ELSIZE(descr) != 2 || PyDataType_HASFIELDS(descr)) {
        return 0;
    }
    const char *name = descr->typeobj != NULL ? descr->typeobj->tp_name : "";
    const char *dot = strrchr(name, '.');
    return strcmp(dot != NULL ? dot + 1 : name, "bfloat16") == 0;
}

static const PdDtype *lookup_descr(PyArray_Descr *descr, const char *fn, const char *arg) {
    if (!table_ready) {
        table_fill();
    }
    int i = is_ml_bfloat16(descr) ? DT_BF16 : index_of(descr->kind, (int)PyDataType_ELSIZE(descr));
    if (i < 0 || PyDataType_HASFIELDS(descr) || PyDataType_HASSUBARRAY(descr)) {
        PyErr_Format(PyExc_TypeError,
                     "%s(): `%s` has unsupported dtype %R; supported: bool, int8..int64, "
                     "uint8..uint64, float16, bfloat16, float32, float64, complex64, complex128",
                     fn, arg, (PyObject *)descr);
        return NULL;
    }
    return &table[i];
}

const PdDtype *pd_dtype_of(PyArrayObject *arr, const char *fn, const char *arg) {
    return lookup_descr(PyArray_DESCR(arr), fn, arg);
}

const PdDtype *pd_dtype_bfloat16(void) {
    if (!table_ready) {
        table_fill();
    }
    return &table[DT_BF16];
}

// ---------------------------------------------------------------------------------------------------
// float16 user ops. MPI calls them as inout[i] = in[i] (op) inout[i].

// A NaN result is the canonical quiet NaN (algorithms/minmax.h): which NaN IEEE arithmetic gives
// depends on the operands' order (the first NaN operand's payload and sign, or the default NaN of
// inf - inf), and MPICH orders the operands differently on different ranks, so without this the
// ranks' bits could differ.
#define HALF_OP(name, widen, narrow, nan_, expr)                                                   \
    static void name(void *in, void *inout, PdOpLen *len, MPI_Datatype *dt) {                    \
        (void)dt;                                                                                   \
        const uint16_t *a_ = (const uint16_t *)in;                                                  \
        uint16_t *b_ = (uint16_t *)inout;                                                           \
        for (MPI_Count i = 0; i < *len; i++) {                                                      \
            float a = widen(a_[i]), b = widen(b_[i]), c = expr;                                     \
            b_[i] = c == c ? narrow(c) : nan_;                                                      \
        }                                                                                           \
    }

HALF_OP(half_sum, pd_half_to_float, pd_float_to_half, PD_F16_QNAN, a + b)
HALF_OP(half_prod, pd_half_to_float, pd_float_to_half, PD_F16_QNAN, a * b)
HALF_OP(bf16_sum, pd_bf16_to_float, pd_float_to_bf16, PD_BF16_QNAN, a + b)
HALF_OP(bf16_prod, pd_bf16_to_float, pd_float_to_bf16, PD_BF16_QNAN, a * b)

// float32 and float64 SUM and PRODUCT: MPI's own, but for a NaN result, which is canonical (above).
// The loop vectorises (an add or multiply, a compare and a blend per lane).
#define FLOAT_OP(name, type, canon, expr)                                                         \
    static void name(void *in, void *inout, PdOpLen *len, MPI_Datatype *dt) {                    \
        (void)dt;                                                                                   \
        const type *a_ = (const type *)in;                                                          \
        type *b_ = (type *)inout;                                                                   \
        for (MPI_Count i = 0; i < *len; i++) {                                                      \
            type a = a_[i], b = b_[i];                                                              \
            b_[i] = canon(expr);                                                                    \
        }                                                                                           \
    }

FLOAT_OP(f32_sum, float, pd_canon_f32, a + b)
FLOAT_OP(f32_prod, float, pd_canon_f32, a * b)
FLOAT_OP(f64_sum, double, pd_canon_f64, a + b)
FLOAT_OP(f64_prod, double, pd_canon_f64, a * b)

// complex64 and complex128 likewise, part by part: SUM is the float SUM of the 2n parts; PRODUCT is
// the shared-memory kernels' formula (shm.c), each part's NaN canonical. Found by the conformance
// fuzzer: complex64 SUM with NaN at 4 ranks gave ranks different bits through MPI's own MPI_SUM.
// (The 2n parts as two runs of n: 2n need not fit an int, Open MPI's op length.)
static void c64_sum(void *in, void *inout, PdOpLen *len, MPI_Datatype *dt) {
    PdOpLen half = *len;
    f32_sum(in, inout, &half, dt);
    f32_sum((float *)in + half, (float *)inout + half, &half, dt);
}

static void c128_sum(void *in, void *inout, PdOpLen *len, MPI_Datatype *dt) {
    PdOpLen half = *len;
    f64_sum(in, inout, &half, dt);
    f64_sum((double *)in + half, (double *)inout + half, &half, dt);
}

#define COMPLEX_PROD_OP(name, type, canon)                                                         \
    static void name(void *in, void *inout, PdOpLen *len, MPI_Datatype *dt) {                    \
        (void)dt;                                                                                   \
        const type *a_ = (const type *)in;                                                          \
        type *b_ = (type *)inout;                                                                   \
        for (MPI_Count i = 0; i < *len; i++) {                                                      \
            type ar = a_[2 * i], ai = a_[2 * i + 1], br = b_[2 * i], bi = b_[2 * i + 1];            \
            b_[2 * i] = canon(ar * br - ai * bi);                                                   \
            b_[2 * i + 1] = canon(ar * bi + ai * br);                                               \
        }                                                                                           \
    }

COMPLEX_PROD_OP(c64_prod, float, pd_canon_f32)
COMPLEX_PROD_OP(c128_prod, double, pd_canon_f64)

// ---------------------------------------------------------------------------------------------------
// Floating MIN and MAX (float16, bfloat16, float32, float64). MPI's MPI_MIN/MPI_MAX are (a < b ? a : b)
// or the like, whose result for NaN and for -0.0/+0.0 depends on which operand comes first, and MPI
// orders them differently on different ranks: MPICH gave rank 0 [1.0, nan] and rank 1 [nan, 1.0] from
// the same all-reduce. These ops reduce with the shared-memory kernels (shm.c), which follow
// algorithms/minmax.h's commutative rule, so MPI's collectives, the persistent requests and the ring
// give what the shared-memory paths give, bitwise, on every rank.

#define FLOAT_MINMAX_OP(name, shm_dtype, shm_op)                                                   \
    static void name(void *in, void *inout, PdOpLen *len, MPI_Datatype *dt) {                    \
        (void)dt;                                                                                   \
        shm_combine(inout, in, (size_t)*len, shm_dtype, shm_op);                                    \
    }

FLOAT_MINMAX_OP(half_min, SHM_F16, SHM_MIN)
FLOAT_MINMAX_OP(half_max, SHM_F16, SHM_MAX)
FLOAT_MINMAX_OP(bf16_min, SHM_BF16, SHM_MIN)
FLOAT_MINMAX_OP(bf16_max, SHM_BF16, SHM_MAX)
FLOAT_MINMAX_OP(f32_min, SHM_F32, SHM_MIN)
FLOAT_MINMAX_OP(f32_max, SHM_F32, SHM_MAX)
FLOAT_MINMAX_OP(f64_min, SHM_F64, SHM_MIN)
FLOAT_MINMAX_OP(f64_max, SHM_F64, SHM_MAX)

// [float16, bfloat16][sum, prod, min, max]
static MPI_Op half_ops[2][4] = {{MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL},
                                {MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL}};
// [complex64, complex128][sum, prod]
static MPI_Op complex_ops[2][2] = {{MPI_OP_NULL, MPI_OP_NULL}, {MPI_OP_NULL, MPI_OP_NULL}};
// [float32, float64][min, max, sum, prod]
static MPI_Op float_ops[2][4] = {{MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL},
                                 {MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL}};

// ---------------------------------------------------------------------------------------------------
// MIN and MAX of unsigned integers. MPICH 4.0.2 (Debian's) compares them as signed, so that
// MIN(1, 200) on uint8 is 200 (pmodels/mpich#6083, fixed in later MPICH): a silently wrong result for
// any value with its top bit set. At init we ask MPI_Reduce_local whether this MPI has the bug, and
// only then reduce with these ops of our own, which compare as C compares unsigned integers.

#define UNSIGNED_OP(name, type, keep_in)                                                           \
    static void name(void *in, void *inout, PdOpLen *len, MPI_Datatype *dt) {                    \
        (void)dt;                                                                                   \
        const type *a = (const type *)in;                                                           \
        type *b = (type *)inout;                                                                    \
        for (MPI_Count i = 0; i < *len; i++) {                                                      \
            b[i] = (keep_in) ? a[i] : b[i];                                                         \
        }                                                                                           \
    }

UNSIGNED_OP(u8_min, uint8_t, a[i] < b[i])
UNSIGNED_OP(u8_max, uint8_t, a[i] > b[i])
UNSIGNED_OP(u16_min, uint16_t, a[i] < b[i])
UNSIGNED_OP(u16_max, uint16_t, a[i] > b[i])
UNSIGNED_OP(u32_min, uint32_t, a[i] < b[i])
UNSIGNED_OP(u32_max, uint32_t, a[i] > b[i])
UNSIGNED_OP(u64_min, uint64_t, a[i] < b[i])
UNSIGNED_OP(u64_max, uint64_t, a[i] > b[i])

// [uint8, uint16, uint32, uint64][min, max]: MPI_OP_NULL where MPI's own MPI_MIN/MPI_MAX are right.
static MPI_Op unsigned_ops[4][2] = {{MPI_OP_NULL, MPI_OP_NULL}, {MPI_OP_NULL, MPI_OP_NULL},
                                    {MPI_OP_NULL, MPI_OP_NULL}, {MPI_OP_NULL, MPI_OP_NULL}};

// Whether MPI's MIN and MAX are right for unsigned integers of 1 << i bytes: MIN(1, top) must be 1 and
// MAX(top, 1) must be top, the largest value (all bits set, which a signed comparison takes for -1).
static int unsigned_minmax_right(int i) {
    static const uint8_t v8[2] = {1, UINT8_MAX};
    static const uint16_t v16[2] = {1, UINT16_MAX};
    static const uint32_t v32[2] = {1, UINT32_MAX};
    static const uint64_t v64[2] = {1, UINT64_MAX};
    const void *small[4] = {&v8[0], &v16[0], &v32[0], &v64[0]}, *top[4] = {&v8[1], &v16[1], &v32[1], &v64[1]};
    MPI_Datatype types[4] = {MPI_UINT8_T, MPI_UINT16_T, MPI_UINT32_T, MPI_UINT64_T};
    size_t bytes = (size_t)1 << i;
    unsigned char got[8];
    memcpy(got, top[i], bytes);
    int right = MPI_Reduce_local(small[i], got, 1, types[i], MPI_MIN) == MPI_SUCCESS &&
                memcmp(got, small[i], bytes) == 0;
    memcpy(got, small[i], bytes);
    return right && MPI_Reduce_local(top[i], got, 1, types[i], MPI_MAX) == MPI_SUCCESS &&
           memcmp(got, top[i], bytes) == 0;
}

static int unsigned_index(const PdDtype *dt) {
    return dt->mpi == MPI_UINT8_T ? 0 : dt->mpi == MPI_UINT16_T ? 1 : dt->mpi == MPI_UINT32_T ? 2 : 3;
}

// ops[0..n) = MPI ops for fns[0..n), those not made yet. 0, or -1 raised.
static int create_ops(PdUserFunction *const *fns, MPI_Op *ops, int n, int commute) {
    for (int i = 0; i < n; i++) {
        if (ops[i] == MPI_OP_NULL) {
            int rc = PD_MPI_OP_CREATE(fns[i], commute, &ops[i]);
            if (rc != MPI_SUCCESS) {
                return pd_raise_mpi_int(rc, PD_MPI_LARGE_COUNT ? "MPI_Op_create_c" : "MPI_Op_create");
            }
        }
    }
    return 0;
}

static void free_ops(MPI_Op *ops, int n) {
    for (int i = 0; i < n; i++) {
        if (ops[i] != MPI_OP_NULL) {
            MPI_Op_free(&ops[i]);
            ops[i] = MPI_OP_NULL;
        }
    }
}

int pd_ops_init(void) {
    PdUserFunction *fns[2][4] = {{half_sum, half_prod, half_min, half_max},
                                      {bf16_sum, bf16_prod, bf16_min, bf16_max}};
    PdUserFunction *floats[2][4] = {{f32_min, f32_max, f32_sum, f32_prod}, {f64_min, f64_max, f64_sum, f64_prod}};
    PdUserFunction *complexes[2][2] = {{c64_sum, c64_prod}, {c128_sum, c128_prod}};
    for (int h = 0; h < 2; h++) {
        // float16/bfloat16 SUM and PRODUCT round after every pairwise step, so they are not associative:
        // declared non-commutative, MPICH combines in rank order with the same grouping on every rank (as
        // commutative, its algorithms at 3 ranks gave ranks different bits: the conformance fuzzer, seed
        // 100189). MIN and MAX are exact, so any order gives the same.
        if (create_ops(fns[h], half_ops[h], 2, 0) < 0 || create_ops(fns[h] + 2, half_ops[h] + 2, 2, 1) < 0 ||
            create_ops(floats[h], float_ops[h], 4, 1) < 0 || create_ops(complexes[h], complex_ops[h], 2, 1) < 0) {
            return -1;
        }
    }
    PdUserFunction *minmax[4][2] = {{u8_min, u8_max}, {u16_min, u16_max}, {u32_min, u32_max},
                                         {u64_min, u64_max}};
    for (int i = 0; i < 4; i++) {
        if (unsigned_ops[i][0] == MPI_OP_NULL && !unsigned_minmax_right(i) &&
            create_ops(minmax[i], unsigned_ops[i], 2, 1) < 0) {
            return -1;
        }
    }
    return 0;
}

void pd_ops_free(void) {
    free_ops(&half_ops[0][0], 8);
    free_ops(&float_ops[0][0], 8);
    free_ops(&complex_ops[0][0], 4);
    free_ops(&unsigned_ops[0][0], 8);
}

// ---------------------------------------------------------------------------------------------------
// The op table: which MPI op implements (op, kind). MPI_OP_NULL = not defined for that kind.

static const char *op_names[PD_OP_COUNT] = {"SUM", "AVG", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR"};

const char *pd_op_name(int op) {
    return (op >= 0 && op < PD_OP_COUNT) ? op_names[op] : "?";
}

// `op`: a ReduceOp (an int, as IntEnum members are). A string gets the member to use, anything else
// the list of members, rather than "must be an int".
int pd_arg_op(PyObject *obj, const char *fn, long *out) {
    if (PyUnicode_Check(obj)) {
        const char *s = PyUnicode_AsUTF8(obj);
        if (s == NULL) {
            return -1;
        }
        for (int i = 0; i < PD_OP_COUNT; i++) {
            if (strcasecmp(s, op_names[i]) == 0) {
                PyErr_Format(PyExc_TypeError, "%s(): `op` must be a pydist.ReduceOp, not a string: use "
                             "pydist.ReduceOp.%s for %R", fn, op_names[i], obj);
                return -1;
            }
        }
    }
    if (pd_arg_long(obj, fn, "op", out) == 0 || !PyErr_ExceptionMatches(PyExc_TypeError)) {
        return PyErr_Occurred() ? -1 : 0;
    }
    PyErr_Clear();   // not an int: name the members rather than "must be an int"
    PyErr_Format(PyExc_TypeError, "%s(): `op` must be a pydist.ReduceOp (SUM, AVG, PRODUCT, MIN, MAX, "
                 "BAND, BOR, BXOR); got %.100s %R", fn, Py_TYPE(obj)->tp_name, obj);
    return -1;
}

// float16's and bfloat16's ops are created at init; until then a placeholder marks the valid pairs, so
// that which pairs are valid never depends on whether MPI has started.
static MPI_Op half_op(int half, int i) {
    MPI_Op m = half_ops[half == PD_HALF_BF16][i];
    return m != MPI_OP_NULL ? m : MPI_SUM;
}

// float32's and float64's MIN and MAX: ours (created at init; MPI's own as the placeholder before).
static MPI_Op float_minmax_op(const PdDtype *dt, int op) {
    MPI_Op m = float_ops[dt->mpi == MPI_DOUBLE][op == PD_OP_MAX];
    return m != MPI_OP_NULL ? m : op == PD_OP_MIN ? MPI_MIN : MPI_MAX;
}

static MPI_Op op_for(int op, const PdDtype *dt) {
    if (dt->half) {
        switch (op) {
        case PD_OP_SUM: case PD_OP_AVG: return half_op(dt->half, 0);
        case PD_OP_PRODUCT: return half_op(dt->half, 1);
        case PD_OP_MIN: return half_op(dt->half, 2);
        case PD_OP_MAX: return half_op(dt->half, 3);
        default: return MPI_OP_NULL;
        }
    }
    switch (dt->kind) {
    case 'b':  // NumPy's bool arithmetic: + is or, * is and, min is and, max is or
        switch (op) {
        case PD_OP_SUM: case PD_OP_MAX: case PD_OP_BOR: return MPI_LOR;
        case PD_OP_PRODUCT: case PD_OP_MIN: case PD_OP_BAND: return MPI_LAND;
        case PD_OP_BXOR: return MPI_LXOR;
        default: return MPI_OP_NULL;
        }
    case 'i': case 'u':
        switch (op) {
        case PD_OP_SUM: return MPI_SUM;
        case PD_OP_PRODUCT: return MPI_PROD;
        case PD_OP_MIN: case PD_OP_MAX: {
            MPI_Op ours = dt->kind == 'u' ? unsigned_ops[unsigned_index(dt)][op == PD_OP_MAX] : MPI_OP_NULL;
            return ours != MPI_OP_NULL ? ours : op == PD_OP_MIN ? MPI_MIN : MPI_MAX;
        }
        case PD_OP_BAND: return MPI_BAND;
        case PD_OP_BOR: return MPI_BOR;
        case PD_OP_BXOR: return MPI_BXOR;
        default: return MPI_OP_NULL;
        }
    case 'f':
        switch (op) {
        case PD_OP_SUM: case PD_OP_AVG: case PD_OP_PRODUCT: {
            MPI_Op m = float_ops[dt->mpi == MPI_DOUBLE][op == PD_OP_PRODUCT ? 3 : 2];
            return m != MPI_OP_NULL ? m : op == PD_OP_PRODUCT ? MPI_PROD : MPI_SUM;   // before init: MPI's
        }
        case PD_OP_MIN: case PD_OP_MAX: return float_minmax_op(dt, op);
        default: return MPI_OP_NULL;
        }
    case 'c':
        switch (op) {
        case PD_OP_SUM: case PD_OP_AVG: case PD_OP_PRODUCT: {
            MPI_Op m = complex_ops[dt->mpi == MPI_C_DOUBLE_COMPLEX][op == PD_OP_PRODUCT];
            return m != MPI_OP_NULL ? m : op == PD_OP_PRODUCT ? MPI_PROD : MPI_SUM;   // before init: MPI's
        }
        default: return MPI_OP_NULL;
        }
    default:
        return MPI_OP_NULL;
    }
}

int pd_op_resolve(long op, const PdDtype *dt, const char *fn, MPI_Op *out) {
    if (op < 0 || op >= PD_OP_COUNT) {
        PyErr_Format(PyExc_ValueError, "%s(): `op` must be a ReduceOp (SUM, AVG, PRODUCT, MIN, MAX, "
                     "BAND, BOR, BXOR); got %ld", fn, op);
        return -1;
    }
    MPI_Op m = op_for((int)op, dt);
    if (m == MPI_OP_NULL) {
        PyErr_Format(PyExc_TypeError, "%s(): `op` ReduceOp.%s is not defined for dtype %s",
                     fn, op_names[op], dt->name);
        return -1;
    }
    *out = m;
    return 0;
}

// _C.check_op(op, dtype): raise TypeError/ValueError if the pair is invalid, else None. The tests
// use it to enumerate the dtype x op matrix from this very table.
PyObject *pd_check_op(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    long op;
    PyArray_Descr *descr = NULL;
    if (pd_check_nargs(nargs, 2, "check_op") < 0 || pd_arg_op(args[0], "check_op", &op) < 0) {
        return NULL;
    }
    if (!PyArray_DescrConverter(args[1], &descr)) {
        return NULL;
    }
    const PdDtype *dt = lookup_descr(descr, "check_op", "dtype");
    Py_DECREF(descr);
    if (dt == NULL) {
        return NULL;
    }
    MPI_Op m;
    if (pd_op_resolve(op, dt, "check_op", &m) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

// ---------------------------------------------------------------------------------------------------
// AVG: divide the summed buffer by the group size. Runs without the GIL.

void pd_divide_inplace(void *buf, MPI_Count count, const PdDtype *dt, int divisor) {
    if (dt->half == PD_HALF_F16) {
        uint16_t *p = buf;
        for (MPI_Count i = 0; i < count; i++) {
            p[i] = pd_float_to_half(pd_half_to_float(p[i]) / (float)divisor);
        }
    } else if (dt->half == PD_HALF_BF16) {
        uint16_t *p = buf;
        for (MPI_Count i = 0; i < count; i++) {
            p[i] = pd_float_to_bf16(pd_bf16_to_float(p[i]) / (float)divisor);
        }
    } else if (dt->mpi == MPI_FLOAT) {
        float *p = buf;
        for (MPI_Count i = 0; i < count; i++) p[i] /= (float)divisor;
    } else if (dt->mpi == MPI_DOUBLE) {
        double *p = buf;
        for (MPI_Count i = 0; i < count; i++) p[i] /= (double)divisor;
    } else if (dt->mpi == MPI_C_FLOAT_COMPLEX) {
        float *p = buf;  // interleaved (re, im)
        for (MPI_Count i = 0; i < 2 * count; i++) p[i] /= (float)divisor;
    } else if (dt->mpi == MPI_C_DOUBLE_COMPLEX) {
        double *p = buf;
        for (MPI_Count i = 0; i < 2 * count; i++) p[i] /= (double)divisor;
    }
}
