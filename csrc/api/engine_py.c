/*
 * engine_py.c: the training engine (csrc/engine/) as Python objects: _C.Engine, _C.load_idx and
 * _C.epoch_permutation. pydist/engine.py builds the user-facing Model and Trainer on them.
 *
 * The step loop runs with the GIL released; its gradient all-reduce takes the GIL back only to wait
 * the way every pydist call waits (pd_op_wait: polling, Ctrl-C, timeouts, dead ranks). An Engine is used
 * by one call at a time (`busy`), since its buffers are written without the GIL.
 */
#include "api/engine_py.h"

#include "core/buffer.h"
#include "core/errors.h"
#include "groups/child.h"
#include "groups/group.h"
#include "observe/calls.h"
#include "paths/shared_memory.h"
#include "progress/op.h"
#include "progress/wait.h"

#include "engine/blas.h"
#include <time.h>

#include "engine/checkpoint.h"
#include "engine/data.h"
#include "engine/model.h"
#include "engine/train.h"
#include "strategies/comm_glue.h"
#include "strategies/strategy.h"

typedef struct {
    PyObject_HEAD
    Model model;
    float *momentum;       // SGD momentum buffer [num_params]
    int momentum_started;  // PyTorch's "buf is None" on the first step
    int32_t *y;            // [max_batch]
    int busy;
    Strategy strategy;     // how ranks cooperate, once set_strategy() has run (has_strategy)
    int has_strategy;
    long strategy_group;   // the pydist group it runs on
    MPI_Comm strategy_comm;  // its private copy of that group's communicator (MPI_COMM_NULL alone)
    long global_step;      // the strategy's step count, so that periods run across epochs and resumes
    const StepStats *running;  // during train_steps: its stats, which the step loop updates step by step
    int slow_ms;           // sleep per step on this rank (straggler experiments)
    float *gathered;       // [2 * num_params]: what strategy_weights/state gather (MPI writes it; the
                           // engine owns it, so a parked request can never write freed memory)
    char name[48];         // the model's name as checkpoints record it (printable ASCII; "" unnamed)
} EngineObject;

static PyTypeObject *EngineType;

static int engine_enter(EngineObject *e, const char *fn) {
    if (e->model.params == NULL) {
        PyErr_Format(PyExc_RuntimeError, "%s(): the engine was not created", fn);
        return -1;
    }
    if (e->busy) {
        PyErr_Format(PyExc_RuntimeError, "%s(): the engine is in use by another thread", fn);
        return -1;
    }
    e->busy = 1;
    return 0;
}

// An array argument that C reads or writes directly: exactly this dtype, C-contiguous, aligned.
static PyArrayObject *array_arg(PyObject *obj, int typenum, const char *fn, const char *arg) {
    if (!PyArray_Check(obj)) {
        PyErr_Format(PyExc_TypeError, "%s(): `%s` must be a numpy.ndarray, not %.100s", fn, arg,
                     Py_TYPE(obj)->tp_name);
        return NULL;
    }
    PyArrayObject *a = (PyArrayObject *)obj;
    if (PyArray_TYPE(a) != typenum || !PyArray_ISCARRAY_RO(a) || !PyArray_ISNOTSWAPPED(a)) {
        PyErr_Format(PyExc_ValueError, "%s(): `%s` must be a C-contiguous, aligned, native-byte-order %s array",
                     fn, arg, typenum == NPY_FLOAT32 ? "float32" : "int32");
        return NULL;
    }
    return a;
}

static long pixels_of(const Model *m) {
    return (long)m->in_c * m->in_h * m->in_w;  // at most 2^31 - 1 (model.c caps every buffer)
}

// Images (n, pixels...) float32 with n x pixels elements, labels (n,) int32 in [0, classes).
static int data_args(EngineObject *e, PyObject *images, PyObject *labels, const char *fn, Dataset *ds) {
    PyArrayObject *xi = array_arg(images, NPY_FLOAT32, fn, "images");
    PyArrayObject *yi = xi ? array_arg(labels, NPY_INT32, fn, "labels") : NULL;
    if (yi == NULL) {
        return -1;
    }
    npy_intp n = PyArray_NDIM(xi) > 0 ? PyArray_DIM(xi, 0) : 0;
    // n first: with n <= 2^31 and pixels < 2^31 the product cannot overflow
    if (PyArray_NDIM(xi) < 1 || n > INT32_MAX || PyArray_SIZE(xi) != n * pixels_of(&e->model) ||
        PyArray_NDIM(yi) != 1 || PyArray_DIM(yi, 0) != n) {
        PyErr_Format(PyExc_ValueError, "%s(): `images` must be (n, %ld pixels) and `labels` (n,); got "
                     "%lld and %lld elements", fn, pixels_of(&e->model), (long long)PyArray_SIZE(xi),
                     (long long)PyArray_SIZE(yi));
        return -1;
    }
    const int32_t *y = PyArray_DATA(yi);
    for (npy_intp i = 0; i < n; i++) {
        if (y[i] < 0 || y[i] >= e->model.classes) {
            PyErr_Format(PyExc_ValueError, "%s(): label %d at index %lld is outside the model's %d classes",
                         fn, (int)y[i], (long long)i, e->model.classes);
            return -1;
        }
    }
    *ds = (Dataset){(int)n, 1, (int)pixels_of(&e->model), PyArray_DATA(xi), (int32_t *)y, e->model.classes};
    return 0;
}

// A batch for forward/loss_and_grad: 1 <= B <= max_batch examples.
static int batch_args(EngineObject *e, PyObject *const *args, int with_labels, const char *fn, int *B) {
    PyArrayObject *x = array_arg(args[0], NPY_FLOAT32, fn, "x");
    if (x == NULL) {
        return -1;
    }
    npy_intp n = PyArray_NDIM(x) > 0 ? PyArray_DIM(x, 0) : 0;
    if (n < 1 || n > e->model.max_batch || PyArray_SIZE(x) != n * pixels_of(&e->model)) {
        PyErr_Format(PyExc_ValueError, "%s(): `x` must hold 1 to %d examples of %ld values each; got "
                     "shape with %lld values", fn, e->model.max_batch, pixels_of(&e->model),
                     (long long)PyArray_SIZE(x));
        return -1;
    }
    *B = (int)n;
    if (with_labels) {
        Dataset ds;
        if (data_args(e, args[0], args[1], fn, &ds) < 0) {
            return -1;
        }
    }
    return 0;
}

// ---------------------------------------------------------------------------------------------------
// Construction

// Engine(layers, input_shape, max_batch): layers is a sequence of 6-tuples of ints
// (type, in, out, kernel, stride, padding), type a LayerType; pydist/engine.py writes them.
static PyObject *engine_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    PyObject *layers;
    int in_c, in_h, in_w, max_batch;
    static char *kwlist[] = {"layers", "input_shape", "max_batch", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O(iii)i:Engine", kwlist, &layers, &in_c, &in_h, &in_w,
                                     &max_batch)) {
        return NULL;
    }
    PyObject *seq = PySequence_Fast(layers, "Engine(): `layers` must be a sequence of tuples");
    if (seq == NULL) {
        return NULL;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    LayerSpec *specs = PyMem_Calloc(n > 0 ? (size_t)n : 1, sizeof(LayerSpec));
    EngineObject *e = NULL;
    if (specs == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        int t, v[5];
        PyObject *item = PySequence_Fast_GET_ITEM(seq, i);
        if (!PyTuple_Check(item) || !PyArg_ParseTuple(item, "iiiiii", &t, &v[0], &v[1], &v[2], &v[3], &v[4])) {
            // an int too large for C stays an OverflowError
            PyObject *kind = PyErr_Occurred() && PyErr_ExceptionMatches(PyExc_OverflowError) ? PyExc_OverflowError
                                                                                             : PyExc_TypeError;
            PyErr_Clear();
            PyErr_Format(kind, "Engine(): layer %zd must be a tuple of 6 C ints (type, in, out, kernel, stride, "
                         "padding); got %.200R", i, item);
            goto done;
        }
        if (t < LAYER_LINEAR || t > LAYER_FLATTEN) {
            PyErr_Format(PyExc_ValueError, "Engine(): layer %zd has unknown type %d", i, t);
            goto done;
        }
        specs[i] = (LayerSpec){(LayerType)t, v[0], v[1], v[2], v[3], v[4]};
    }
    if (n > INT32_MAX) {
        PyErr_Format(PyExc_ValueError, "Engine(): at most 2**31 - 1 layers; got %zd", n);
        goto done;
    }
    allocfunc alloc = (allocfunc)PyType_GetSlot(type, Py_tp_alloc);
    if ((e = (EngineObject *)alloc(type, 0)) == NULL) {
        goto done;
    }
    // Before anything can fail: dealloc frees a communicator that is not MPI_COMM_NULL (alloc's zeroes
    // are not MPICH's MPI_COMM_NULL), and a model refused before init_process_group must raise, not abort.
    e->strategy_comm = MPI_COMM_NULL;
    char err[512];
    if (model_create(&e->model, specs, (int)n, in_c, in_h, in_w, max_batch, err, sizeof err) < 0) {
        PyErr_Format(PyExc_ValueError, "Engine(): %s", err);
        Py_CLEAR(e);
        goto done;
    }
    // The gradients in pydist's shared segment when there is one, so that the data-parallel all-reduce
    // of replicas on one node reduces them in place (shared_memory.c); else they stay malloc'd.
    void *owner = NULL;
    float *shared = pd_shm_alloc_floats(e->model.num_params, &owner);
    if (shared != NULL) {
        memcpy(shared, e->model.grads, sizeof(float) * (size_t)e->model.num_params);
        free(e->model.grads);
        e->model.grads = shared;
        e->model.grads_release = pd_shm_owner_release;
        e->model.grads_ctx = owner;
    }
    e->momentum = PyMem_Calloc((size_t)e->model.num_params, sizeof(float));
    e->y = PyMem_Calloc((size_t)max_batch, sizeof(int32_t));
    e->gathered = PyMem_Calloc(2 * (size_t)e->model.num_params, sizeof(float));
    if (e->momentum == NULL || e->y == NULL || e->gathered == NULL) {
        PyErr_NoMemory();
        Py_CLEAR(e);
    }
done:
    PyMem_Free(specs);
    Py_DECREF(seq);
    return (PyObject *)e;
}

static void drop_strategy(EngineObject *e) {
    if (e->has_strategy) {
        strategy_free(&e->strategy);
        e->has_strategy = 0;
    }
    int finalized = 1;
    MPI_Finalized(&finalized);
    if (e->strategy_comm != MPI_COMM_NULL && !finalized && !pd_mpi_inherited) {   // a forked child: the parent's
        MPI_Comm_free(&e->strategy_comm);
    }
    e->strategy_comm = MPI_COMM_NULL;
}

static void engine_dealloc(EngineObject *e) {
    PyTypeObject *tp = Py_TYPE(e);
    drop_strategy(e);
    model_free(&e->model);
    PyMem_Free(e->momentum);
    PyMem_Free(e->y);
    PyMem_Free(e->gathered);
    freefunc free_slot = (freefunc)PyType_GetSlot(tp, Py_tp_free);
    free_slot(e);
    Py_DECREF(tp);
}

// ---------------------------------------------------------------------------------------------------
// Buffers as arrays that share the engine's memory (and keep the engine alive)

static PyObject *buffer_view(EngineObject *e, float *data) {
    npy_intp n = e->model.num_params;
    PyObject *a = PyArray_SimpleNewFromData(1, &n, NPY_FLOAT32, data);
    if (a != NULL && PyArray_SetBaseObject((PyArrayObject *)a, Py_NewRef((PyObject *)e)) < 0) {
        Py_DECREF(a);
        return NULL;
    }
    return a;
}

// A new array holding a copy of n floats.
static PyObject *buffer_copy(const float *data, long n) {
    npy_intp dims[1] = {n};
    PyObject *a = PyArray_SimpleNew(1, dims, NPY_FLOAT32);
    if (a != NULL) {
        memcpy(PyArray_DATA((PyArrayObject *)a), data, sizeof(float) * (size_t)n);
    }
    return a;
}

static PyObject *get_params(EngineObject *e, void *c) { (void)c; return buffer_view(e, e->model.params); }
static PyObject *get_grads(EngineObject *e, void *c) { (void)c; return buffer_view(e, e->model.grads); }
static PyObject *get_momentum(EngineObject *e, void *c) { (void)c; return buffer_view(e, e->momentum); }
static PyObject *get_num_params(EngineObject *e, void *c) { (void)c; return PyLong_FromLong(e->model.num_params); }
static PyObject *get_classes(EngineObject *e, void *c) { (void)c; return PyLong_FromLong(e->model.classes); }
static PyObject *get_max_batch(EngineObject *e, void *c) { (void)c; return PyLong_FromLong(e->model.max_batch); }
// name: the model's name as checkpoints record it; any str is kept as its printable ASCII characters
// (others become '?'), cut to 47, so that a header always holds it whole and the loader can check it.
static PyObject *get_name(EngineObject *e, void *c) {
    (void)c;
    return PyUnicode_FromString(e->name);
}

static int set_name(EngineObject *e, PyObject *value, void *c) {
    (void)c;
    if (value == NULL || !PyUnicode_Check(value)) {
        PyErr_SetString(PyExc_TypeError, "Engine.name must be a str");
        return -1;
    }
    Py_ssize_t n = PyUnicode_GetLength(value), i = 0;
    for (; i < n && i < (Py_ssize_t)sizeof e->name - 1; i++) {
        Py_UCS4 ch = PyUnicode_READ_CHAR(value, i);
        e->name[i] = ch >= 0x20 && ch < 0x7f ? (char)ch : '?';
    }
    memset(e->name + i, 0, sizeof e->name - (size_t)i);
    return 0;
}

static PyObject *get_model_hash(EngineObject *e, void *c) {
    (void)c;
    return PyLong_FromUnsignedLongLong(model_hash(&e->model));
}
static PyObject *get_momentum_started(EngineObject *e, void *c) {
    (void)c;
    return PyBool_FromLong(e->momentum_started);
}
static int set_momentum_started(EngineObject *e, PyObject *v, void *c) {
    (void)c;
    int flag = v == NULL ? -1 : PyObject_IsTrue(v);
    if (flag < 0) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "momentum_started cannot be deleted");
        return -1;
    }
    e->momentum_started = flag;
    return 0;
}

// Forward floating-point operations per example, per layer (what the pipeline balances its stages by).
static PyObject *get_layer_flops(EngineObject *e, void *c) {
    (void)c;
    PyObject *out = PyList_New(e->model.num_layers);
    for (int i = 0; out != NULL && i < e->model.num_layers; i++) {
        PyObject *v = PyFloat_FromDouble(layer_forward_flops(&e->model.layers[i]));
        if (v == NULL) {
            Py_CLEAR(out);
            break;
        }
        PyList_SET_ITEM(out, i, v);
    }
    return out;
}

// (weight_offset, weight_count, bias_offset, bias_count) per layer: where torch's tensors sit.
static PyObject *get_layout(EngineObject *e, void *c) {
    (void)c;
    PyObject *out = PyList_New(e->model.num_layers);
    for (int i = 0; out != NULL && i < e->model.num_layers; i++) {
        const Layer *L = &e->model.layers[i];
        PyObject *t = Py_BuildValue("(llll)", L->weight_offset, L->weights, L->bias_offset, L->biases);
        if (t == NULL) {
            Py_CLEAR(out);
            break;
        }
        PyList_SET_ITEM(out, i, t);
    }
    return out;
}

// ---------------------------------------------------------------------------------------------------
// Methods

static PyObject *engine_init_params(EngineObject *e, PyObject *const *args, Py_ssize_t nargs) {
    long seed;
    if (pd_check_nargs(nargs, 1, "Engine.init_params") < 0 ||
        pd_arg_long(args[0], "Engine.init_params", "seed", &seed) < 0 || engine_enter(e, "Engine.init_params") < 0) {
        return NULL;
    }
    model_init_params(&e->model, (uint64_t)seed);
    memset(e->momentum, 0, sizeof(float) * (size_t)e->model.num_params);
    e->momentum_started = 0;
    e->busy = 0;
    Py_RETURN_NONE;
}

// forward(x) -> logits (B, classes), a new array
static PyObject *engine_forward(EngineObject *e, PyObject *const *args, Py_ssize_t nargs) {
    int B;
    if (pd_check_nargs(nargs, 1, "Engine.forward") < 0 || batch_args(e, args, 0, "Engine.forward", &B) < 0 ||
        engine_enter(e, "Engine.forward") < 0) {
        return NULL;
    }
    npy_intp dims[2] = {B, e->model.classes};
    PyObject *out = PyArray_SimpleNew(2, dims, NPY_FLOAT32);
    if (out != NULL) {
        const float *x = PyArray_DATA((PyArrayObject *)args[0]);
        const float *logits;
        Py_BEGIN_ALLOW_THREADS
        logits = model_forward(&e->model, x, B);
        Py_END_ALLOW_THREADS
        memcpy(PyArray_DATA((PyArrayObject *)out), logits, sizeof(float) * (size_t)B * e->model.classes);
    }
    e->busy = 0;
    return out;
}

// loss_and_grad(x, labels) -> (mean loss, correct); grads hold d(loss)/d(params)
static PyObject *engine_loss_and_grad(EngineObject *e, PyObject *const *args, Py_ssize_t nargs) {
    int B, correct = 0;
    double loss;
    if (pd_check_nargs(nargs, 2, "Engine.loss_and_grad") < 0 ||
        batch_args(e, args, 1, "Engine.loss_and_grad", &B) < 0 || engine_enter(e, "Engine.loss_and_grad") < 0) {
        return NULL;
    }
    const float *x = PyArray_DATA((PyArrayObject *)args[0]);
    const int32_t *y = PyArray_DATA((PyArrayObject *)args[1]);
    Py_BEGIN_ALLOW_THREADS
    loss = model_loss_backward(&e->model, x, y, B, &correct);
    Py_END_ALLOW_THREADS
    e->busy = 0;
    return Py_BuildValue("(di)", loss, correct);
}

// profile(x, labels, reps) -> (forward seconds per layer, backward seconds per layer, loss seconds): the
// fastest of reps timed steps, per layer (model_profile); grads hold the last step's gradient.
static PyObject *engine_profile(EngineObject *e, PyObject *const *args, Py_ssize_t nargs) {
    int B;
    long reps;
    if (pd_check_nargs(nargs, 3, "Engine.profile") < 0 || batch_args(e, args, 1, "Engine.profile", &B) < 0 ||
        pd_arg_long(args[2], "Engine.profile", "reps", &reps) < 0) {
        return NULL;
    }
    if (reps < 1 || reps > 100000) {
        PyErr_Format(PyExc_ValueError, "Engine.profile(): reps must be in [1, 100000]; got %ld", reps);
        return NULL;
    }
    int L = e->model.num_layers;
    double *times = PyMem_Calloc(2 * (size_t)L + 1, sizeof(double));
    if (times == NULL) return PyErr_NoMemory();
    if (engine_enter(e, "Engine.profile") < 0) {
        PyMem_Free(times);
        return NULL;
    }
    const float *x = PyArray_DATA((PyArrayObject *)args[0]);
    const int32_t *y = PyArray_DATA((PyArrayObject *)args[1]);
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = model_profile(&e->model, x, y, B, (int)reps, times);
    Py_END_ALLOW_THREADS
    e->busy = 0;
    PyObject *fwd = rc == 0 ? PyList_New(L) : NULL, *bwd = rc == 0 ? PyList_New(L) : NULL, *out = NULL;
    for (int i = 0; fwd != NULL && bwd != NULL && i < L; i++) {
        PyList_SET_ITEM(fwd, i, PyFloat_FromDouble(times[i]));
        PyList_SET_ITEM(bwd, i, PyFloat_FromDouble(times[L + i]));
    }
    if (fwd != NULL && bwd != NULL && !PyErr_Occurred()) out = Py_BuildValue("(OOd)", fwd, bwd, times[2 * L]);
    else if (rc != 0) PyErr_NoMemory();
    Py_XDECREF(fwd);
    Py_XDECREF(bwd);
    PyMem_Free(times);
    return out;
}

static int sgd_args(PyObject *const *args, const char *fn, SgdConfig *c) {
    double v[4];
    static const char *names[4] = {"lr", "momentum", "dampening", "weight_decay"};
    for (int i = 0; i < 4; i++) {
        v[i] = PyFloat_AsDouble(args[i]);
        if (v[i] == -1.0 && PyErr_Occurred()) {
            if (PyErr_ExceptionMatches(PyExc_TypeError)) {  // keep OverflowError (an int too large) as it is
                PyErr_Format(PyExc_TypeError, "%s(): `%s` must be a number; got %.100s", fn, names[i],
                             Py_TYPE(args[i])->tp_name);
            }
            return -1;
        }
    }
    int nesterov = PyObject_IsTrue(args[4]);
    if (nesterov < 0) {
        return -1;
    }
    *c = (SgdConfig){(float)v[0], (float)v[1], (float)v[2], (float)v[3], nesterov};
    return 0;
}

// sgd_step(lr, momentum, dampening, weight_decay, nesterov): one update from the current grads
static PyObject *engine_sgd_step(EngineObject *e, PyObject *const *args, Py_ssize_t nargs) {
    SgdConfig c;
    if (pd_check_nargs(nargs, 5, "Engine.sgd_step") < 0 || sgd_args(args, "Engine.sgd_step", &c) < 0 ||
        engine_enter(e, "Engine.sgd_step") < 0) {
        return NULL;
    }
    sgd_step(&c, e->model.params, e->model.grads, e->momentum, &e->momentum_started, e->model.num_params);
    e->busy = 0;
    Py_RETURN_NONE;
}

// ---------------------------------------------------------------------------------------------------
// Strategies (csrc/strategies/): their waits and MPI calls, made the pydist way

static int hook_step(void *ctx, float *params, float *grads, float *momentum, int *started, long step) {
    return strategy_step(ctx, params, grads, momentum, started, step);
}

static int hook_serve(void *ctx, float *params, float *momentum, int *started, long step) {
    return strategy_serve(ctx, params, momentum, started, step);
}

static int hook_serve_call(void *ctx, float *params, int first, int last) {
    return strategy_serve_call(ctx, params, first, last);
}

static void hook_begin_call(void *ctx, int first, int last) {
    strategy_begin_call(ctx, first, last);
}

static int hook_next_batch(void *ctx, long *batch_index) {
    return strategy_next_batch(ctx, batch_index);
}

static int hook_end_call(void *ctx) {
    return strategy_end_call(ctx);
}

static int hook_run_step(void *ctx, const Dataset *ds, const int *perm, int offset, int batch, float *params,
                         float *momentum, int *started, double *loss, int *correct) {
    return strategy_run_step(ctx, ds, perm, offset, batch, params, momentum, started, loss, correct);
}

static double hook_seconds(void *ctx) {
    return ((Strategy *)ctx)->comm.seconds;
}

// A strategy call failed: -1 left the wait's exception, -2 names the MPI call. Returns NULL.
static PyObject *strategy_error(const Strategy *st, int rc) {
    if (rc == -2 && !PyErr_Occurred()) {
        pd_raise_mpi(st->comm.mpi_rc, st->comm.mpi_call);
    }
    return NULL;
}

// Run `fn` on the engine's strategy with the GIL released and the strategy's comm waiting through
// sync; the caller has entered the engine.
#define WITH_STRATEGY(e, sync, call)                                  \
    do {                                                             \
        (e)->strategy.comm.ctx = &(sync);                            \
        (sync).released = PyEval_SaveThread();                       \
        call;                                                        \
        PyEval_RestoreThread((sync).released);                       \
    } while (0)

// The pipeline's stage boundaries: None (other strategies; *out stays NULL), or a sequence of
// stages + 1 ints from 0 to the model's layer count, strictly increasing (pipeline.c checks the
// values), into a new PyMem array in *out. Returns 0 or -1.
static int split_arg(PyObject *obj, long stages, const char *fn, int **out) {
    *out = NULL;
    if (obj == Py_None) {
        return 0;
    }
    PyObject *seq = PySequence_Fast(obj, "`split` must be a sequence of ints or None");
    if (seq == NULL) {
        return -1;
    }
    int rc = 0;
    if ((*out = PyMem_Calloc((size_t)stages + 1, sizeof(int))) == NULL) {
        PyErr_NoMemory();
        rc = -1;
    } else if (PySequence_Fast_GET_SIZE(seq) != stages + 1) {
        PyErr_Format(PyExc_ValueError, "%s(): `split` must hold stages + 1 = %ld boundaries; got %zd", fn, stages + 1,
                     PySequence_Fast_GET_SIZE(seq));
        rc = -1;
    }
    for (long q = 0; rc == 0 && q <= stages; q++) {
        long v;
        if (pd_arg_long(PySequence_Fast_GET_ITEM(seq, q), fn, "split", &v) < 0) {
            rc = -1;
        } else if (v < 0 || v > INT32_MAX) {
            PyErr_Format(PyExc_ValueError, "%s(): `split` holds %ld, not a layer index", fn, v);
            rc = -1;
        } else {
            (*out)[q] = (int)v;
        }
    }
    Py_DECREF(seq);
    if (rc < 0) {
        PyMem_Free(*out);
        *out = NULL;
    }
    return rc;
}

// set_strategy(group, name, servers, period, warmup, placement, beta, slow_ms, window, deterministic, stages,
//              micro_batches, schedule, split, lr, momentum, dampening, weight_decay, nesterov[, compression]):
// how this engine's train_steps cooperate from now on, on a private copy of the group's communicator (so
// its messages never meet the user's). compression: as compress/compress.h spells it ("none" when left
// out). Collective over the group. group -1: alone.
// What every rank of a strategy's group must set alike, for agree_config: its fields' names and the
// numbers that stand for them (floats by their bits).
static const char *const CONFIG_FIELDS[] = {
    "strategy", "servers", "period", "warmup", "momentum placement", "beta", "window", "deterministic",
    "pipeline stages", "micro-batches", "pipeline schedule", "the pipeline's split", "compression",
    "topk ratio", "powersgd rank", "parameter count", "model (its layers' hash)", "lr", "momentum",
    "dampening", "weight decay", "nesterov",
};
enum { CONFIG_COUNT = sizeof CONFIG_FIELDS / sizeof *CONFIG_FIELDS };

static uint64_t float_bits(double v) {
    uint64_t bits;
    memcpy(&bits, &v, sizeof bits);
    return bits;
}

// One field's value for a message, as the user gave it.
static void config_value(int field, uint64_t v, char *buf, size_t len) {
    double d;
    memcpy(&d, &v, sizeof d);
    if (field == 0) {
        snprintf(buf, len, "%s", strategy_name((StrategyKind)v));
    } else if (field == 12) {
        snprintf(buf, len, "%s", compress_kind_name((CompressKind)v));
    } else if (field == 5 || field == 13 || (field >= 17 && field <= 20)) {
        snprintf(buf, len, "%g", d);
    } else if (field == 11 || field == 16) {
        snprintf(buf, len, "%016llx", (unsigned long long)v);
    } else {
        snprintf(buf, len, "%llu", (unsigned long long)v);
    }
}

// Every rank of the group sets the same strategy, options, compression, SGD and model (one small
// all-reduce on the strategy's communicator, before any rank acts on them): else every rank raises the
// same ValueError naming what differs. Ranks whose Trainers differ would otherwise exchange what each
// reads its own way (fp16 payloads read as bf16, a server's shard of another size) or wait in
// different collectives. 0, or -1 with the error set.
static int agree_config(EngineObject *e, long group, int rank, int size, const StrategyConfig *cfg,
                        const SgdConfig *sgd) {
    uint64_t split = 14695981039346656037ull;   // FNV-1a of the stage boundaries (none: the basis)
    for (int i = 0; cfg->split != NULL && i <= cfg->stages; i++) {
        split = (split ^ (uint64_t)(uint32_t)cfg->split[i]) * 1099511628211ull;
    }
    const uint64_t mine[CONFIG_COUNT] = {
        (uint64_t)cfg->kind, (uint64_t)cfg->servers, (uint64_t)cfg->period, (uint64_t)cfg->warmup,
        (uint64_t)cfg->placement, float_bits(cfg->beta), (uint64_t)cfg->window, (uint64_t)cfg->deterministic,
        (uint64_t)cfg->stages, (uint64_t)cfg->micro_batches, (uint64_t)cfg->schedule, split,
        (uint64_t)cfg->compression.kind, cfg->compression.kind == COMPRESS_TOPK ? float_bits(cfg->compression.ratio) : 0,
        cfg->compression.kind == COMPRESS_POWERSGD ? (uint64_t)cfg->compression.rank : 0,
        (uint64_t)e->model.num_params, model_hash(&e->model), float_bits(sgd->lr), float_bits(sgd->momentum),
        float_bits(sgd->dampening), float_bits(sgd->weight_decay), (uint64_t)sgd->nesterov,
    };
    uint64_t lo[CONFIG_COUNT], hi[CONFIG_COUNT];
    int differs = -1;
    Comm c = pd_comm_for(e->strategy_comm, rank, size);
    PdSyncContext sync = {(PyObject *)e, group, NULL, 0};
    c.ctx = &sync;
    sync.released = PyEval_SaveThread();
    int rc = comm_agree(&c, mine, CONFIG_COUNT, lo, hi, &differs);
    PyEval_RestoreThread(sync.released);
    if (rc < 0) {
        if (rc == -2 && !PyErr_Occurred()) {
            pd_raise_mpi(c.mpi_rc, c.mpi_call);
        }
        return -1;
    }
    if (differs >= 0) {
        char a[64], b[64];
        config_value(differs, lo[differs], a, sizeof a);
        config_value(differs, hi[differs], b, sizeof b);
        // (said as the Trainer, which every user of set_strategy is)
        PyErr_Format(PyExc_ValueError, "Trainer: the group's ranks set up different Trainers: their %s differs (%s "
                     "and %s). Every rank must construct its Trainer alike: the same model, strategy and options, "
                     "compression and SGD settings", CONFIG_FIELDS[differs], a, b);
        return -1;
    }
    return 0;
}

static PyObject *engine_set_strategy(EngineObject *e, PyObject *const *args, Py_ssize_t nargs) {
    const char *fn = "Engine.set_strategy";
    long group, servers, period, warmup, placement, slow_ms, window, deterministic, stages, micro_batches, schedule;
    double beta;
    SgdConfig sgd;
    CompressSpec compression = {COMPRESS_NONE, 1.0, 0};
    if (nargs == 20) {   // the optional last one
        char cerr[256];
        const char *text = PyUnicode_Check(args[19]) ? PyUnicode_AsUTF8(args[19]) : NULL;
        if (text == NULL) {
            if (!PyErr_Occurred()) {
                PyErr_Format(PyExc_TypeError, "%s(): `compression` must be a str; got %.100s", fn,
                             Py_TYPE(args[19])->tp_name);
            }
            return NULL;
        }
        if (compress_parse(text, &compression, cerr, sizeof cerr) < 0) {
            PyErr_Format(PyExc_ValueError, "%s(): %s", fn, cerr);
            return NULL;
        }
        nargs = 19;
    }
    if (pd_check_nargs(nargs, 19, fn) < 0 || pd_arg_long(args[0], fn, "group", &group) < 0 ||
        pd_arg_long(args[2], fn, "servers", &servers) < 0 || pd_arg_long(args[3], fn, "period", &period) < 0 ||
        pd_arg_long(args[4], fn, "warmup", &warmup) < 0 || pd_arg_long(args[5], fn, "placement", &placement) < 0 ||
        pd_arg_long(args[7], fn, "slow_ms", &slow_ms) < 0 || pd_arg_long(args[8], fn, "window", &window) < 0 ||
        pd_arg_long(args[9], fn, "deterministic", &deterministic) < 0 ||
        pd_arg_long(args[10], fn, "stages", &stages) < 0 ||
        pd_arg_long(args[11], fn, "micro_batches", &micro_batches) < 0 ||
        pd_arg_long(args[12], fn, "schedule", &schedule) < 0 || sgd_args(args + 14, fn, &sgd) < 0) {
        return NULL;
    }
    if (stages < 0 || stages > e->model.num_layers || micro_batches < 0 || micro_batches > INT32_MAX ||
        schedule < SCHEDULE_GPIPE || schedule > SCHEDULE_1F1B) {
        PyErr_Format(PyExc_ValueError, "%s(): need 0 <= stages <= %d (the model's layers), micro_batches >= 0 and "
                     "schedule 0 (gpipe) or 1 (1f1b)", fn, e->model.num_layers);
        return NULL;
    }
    if (!PyUnicode_Check(args[1])) {
        PyErr_Format(PyExc_TypeError, "%s(): `name` must be a str; got %.100s", fn, Py_TYPE(args[1])->tp_name);
        return NULL;
    }
    beta = PyFloat_AsDouble(args[6]);
    if (beta == -1.0 && PyErr_Occurred()) {
        return NULL;
    }
    const char *name = PyUnicode_AsUTF8(args[1]);
    int kind = name ? strategy_kind_of(name) : -1;
    if (name == NULL) {
        return NULL;
    }
    if (kind < 0) {
        PyErr_Format(PyExc_ValueError, "%s(): unknown strategy %R", fn, args[1]);
        return NULL;
    }
    if (servers < 0 || servers > INT32_MAX || period < 0 || period > INT32_MAX || warmup < 0 || warmup > INT32_MAX ||
        placement < MOMENTUM_LOCAL || placement > MOMENTUM_RESET || slow_ms < 0 || slow_ms > 3600000 ||
        !(beta >= 0.0 && beta <= 1.0) || window < 0 || window > INT32_MAX || deterministic < 0 || deterministic > 1) {
        PyErr_Format(PyExc_ValueError, "%s(): need servers, period, warmup, window >= 0, placement in [0, 2], "
                     "slow_ms in [0, 3600000], 0 <= beta <= 1 and deterministic 0 or 1", fn);
        return NULL;
    }
    MPI_Comm *gcomm = NULL;
    int rank = 0, size = 1;
    if (group >= 0) {
        if ((gcomm = pd_group_comm(group, fn)) == NULL) {
            return NULL;
        }
        rank = pd_group_rank(group), size = pd_group_size(group);
    } else if (group != -1) {
        PyErr_Format(PyExc_ValueError, "%s(): `group` must be a group handle or -1 (alone); got %ld", fn, group);
        return NULL;
    }
    if (engine_enter(e, fn) < 0) {
        return NULL;
    }
    drop_strategy(e);
    if (gcomm != NULL) {
        MPI_Request req = MPI_REQUEST_NULL;
        int rc = MPI_Comm_idup(*gcomm, &e->strategy_comm, &req);
        if (rc != MPI_SUCCESS) {
            e->busy = 0;
            return pd_raise_mpi(rc, "MPI_Comm_idup");
        }
        PdOp op = pd_op(fn, group, PD_PEER_ALL);
        if (pd_op_wait_or_park(&req, MPI_STATUS_IGNORE, &op, (PyObject *)e, 0) < 0) {
            e->strategy_comm = MPI_COMM_NULL;  // MPI may still write it: the engine is kept with the request
            e->busy = 0;
            return NULL;
        }
    }
    int *split = NULL;   // read after the communicator is ready: every rank fails alike if it is wrong
    if (split_arg(args[13], stages, fn, &split) < 0) {
        drop_strategy(e);
        e->busy = 0;
        return NULL;
    }
    StrategyConfig cfg = {(StrategyKind)kind, (int)servers, (int)period, (int)warmup, (MomentumPlacement)placement,
                          (float)beta, (int)window, (int)deterministic, (int)stages, (int)micro_batches,
                          (PipelineSchedule)schedule, split, compression, 0};
    if (agree_config(e, group, rank, size, &cfg, &sgd) < 0) {
        PyMem_Free(split);
        drop_strategy(e);
        e->busy = 0;
        return NULL;
    }
    char err[512];
    int created = strategy_create(&e->strategy, &cfg, &sgd, pd_comm_for(e->strategy_comm, rank, size), &e->model, err,
                                  sizeof err);
    PyMem_Free(split);   // the pipeline has taken what it needs
    if (created < 0) {
        drop_strategy(e);
        e->busy = 0;
        PyErr_Format(PyExc_ValueError, "%s(): %s", fn, err);
        return NULL;
    }
    e->has_strategy = 1;
    e->strategy_group = group;
    e->strategy.trace_group = group >= 0 ? (long long)pd_call_group_id(group) : 0;   // the timeline's id
    e->slow_ms = (int)slow_ms;
    e->busy = 0;
    Py_RETURN_NONE;
}

// train_steps(images, labels, perm, step_begin, step_end, batch, group, lr, momentum, dampening,
//             weight_decay, nesterov) -> (loss_sum, correct, steps, t_comp, t_sync, bytes_sent, messages,
//             pushes, staleness_sum, staleness_max, exchanges); the last four: the asynchronous
//             strategies' (a server's pushes served and their staleness, a worker's exchanges).
// group: the group set_strategy() was given (its strategy runs), another pydist group handle (the
// gradients are all-reduced on it, as without a strategy) or -1 to train alone (no communication).
static PyObject *engine_train_steps(EngineObject *e, PyObject *const *args, Py_ssize_t nargs) {
    const char *fn = "Engine.train_steps";
    long begin, end, batch, group;
    SgdConfig sgd;
    Dataset ds;
    if (pd_check_nargs(nargs, 12, fn) < 0 || data_args(e, args[0], args[1], fn, &ds) < 0 ||
        pd_arg_long(args[3], fn, "step_begin", &begin) < 0 || pd_arg_long(args[4], fn, "step_end", &end) < 0 ||
        pd_arg_long(args[5], fn, "batch", &batch) < 0 || pd_arg_long(args[6], fn, "group", &group) < 0 ||
        sgd_args(args + 7, fn, &sgd) < 0) {
        return NULL;
    }
    PyArrayObject *perm = array_arg(args[2], NPY_INT32, fn, "perm");
    if (perm == NULL) {
        return NULL;
    }
    if (batch < 1 || batch > e->model.max_batch) {
        PyErr_Format(PyExc_ValueError, "%s(): `batch` must be in [1, %d] (the engine's max_batch); got %ld", fn,
                     e->model.max_batch, batch);
        return NULL;
    }
    if (begin < 0 || end < begin || end > INT32_MAX) {
        PyErr_Format(PyExc_ValueError, "%s(): steps [`step_begin`, `step_end`) must satisfy 0 <= step_begin <= "
                     "step_end < 2**31; got [%ld, %ld)", fn, begin, end);
        return NULL;
    }
    // The strategy: the engine's own on its group, or for this call only today's all-reduce on another
    // group; -1 trains alone.
    Strategy once, *st = &e->strategy;
    int temporary = 0, own = e->has_strategy && group == e->strategy_group;
    if (!own && group >= 0) {
        MPI_Comm *comm = pd_group_comm(group, fn);
        if (comm == NULL) {
            return NULL;
        }
        StrategyConfig cfg = {STRATEGY_ALLREDUCE, 0, 0, 0, MOMENTUM_LOCAL, 0.0f, 0, 0, 0, 0, SCHEDULE_GPIPE, NULL,
                              {COMPRESS_NONE, 1.0, 0}, 0};
        char err[256];
        if (strategy_create(&once, &cfg, &sgd, pd_comm_for(*comm, pd_group_rank(group), pd_group_size(group)),
                            &e->model, err, sizeof err) < 0) {
            PyErr_Format(PyExc_MemoryError, "%s(): %s", fn, err);
            return NULL;
        }
        once.trace_group = (long long)pd_call_group_id(group);
        st = &once, temporary = 1;
    } else if (group < -1) {
        PyErr_Format(PyExc_ValueError, "%s(): `group` must be a group handle or -1 (alone); got %ld", fn, group);
        return NULL;
    }
    const int alone = !own && !temporary;
    TrainConfig c = {0, 1, (int)batch, sgd, {NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL}, e->global_step,
                     e->slow_ms};
    if (!alone) {
        st->sgd = sgd;
        c.rank = strategy_worker_rank(st), c.world = st->workers;
        const int server = strategy_is_server(st), async = strategy_is_async(st->cfg.kind);
        const int worker_async = !server && async;
        const int pipeline = st->cfg.kind == STRATEGY_PIPELINE;
        c.hooks = (StepHooks){pipeline ? NULL : hook_step, server && !async ? hook_serve : NULL, hook_seconds,
                              server && async ? hook_serve_call : NULL, worker_async ? hook_begin_call : NULL,
                              worker_async ? hook_next_batch : NULL, worker_async ? hook_end_call : NULL,
                              pipeline ? hook_run_step : NULL, st};
        if (pipeline && batch % st->cfg.micro_batches != 0) {
            PyErr_Format(PyExc_ValueError, "%s(): the batch of %ld does not divide into %d micro-batches", fn, batch,
                         st->cfg.micro_batches);
            return NULL;   // the engine's own strategy: nothing temporary to free
        }
    }
    // Step s reads perm[(s * world + rank) * batch ...] up to end * world * batch, compared by division
    // so that it cannot overflow; the indices then fit an int (perm has at most ds.n < 2^31 entries).
    npy_intp entries = PyArray_SIZE(perm), per_step = (npy_intp)c.world * batch;
    const int32_t *p = PyArray_DATA(perm);
    PyObject *ret = NULL;
    if (entries > ds.n || end > entries / per_step) {
        PyErr_Format(PyExc_ValueError, "%s(): steps [%ld, %ld) of batch %ld on %d ranks need %ld x %lld entries "
                     "of `perm` (a permutation of the %d examples); got %lld", fn, begin, end, batch, c.world,
                     end, (long long)per_step, ds.n, (long long)entries);
        goto done;
    }
    for (npy_intp i = 0; i < entries; i++) {
        if (p[i] < 0 || p[i] >= ds.n) {
            PyErr_Format(PyExc_ValueError, "%s(): perm[%lld] = %d is not an example index", fn, (long long)i,
                         (int)p[i]);
            goto done;
        }
    }
    if (engine_enter(e, fn) < 0) {
        goto done;
    }
    StepStats stats = {0};
    // under survive, an asynchronous worker may die during the call without ending anyone's wait
    PdSyncContext sync = {(PyObject *)e, group, NULL,
                          own && strategy_is_async(st->cfg.kind) && st->cfg.survive ? st->workers : 0};
    CommCount before = st->comm.count;
    AsyncStats async_before = st->stats;
    st->stats.staleness_max = 0;   // the call's own maximum
    st->comm.ctx = &sync;
    st->trace_step = e->global_step;   // the number of the call's first step, for the pipeline's timeline
    e->running = &stats;
    sync.released = PyEval_SaveThread();
    int rc = train_steps(&e->model, &c, e->momentum, &e->momentum_started, &ds, (const int *)p, (int)begin,
                         (int)end, e->y, &stats);
    PyEval_RestoreThread(sync.released);
    e->running = NULL;
    e->busy = 0;
    if (rc < 0) {
        strategy_error(st, rc);
        goto done;
    }
    e->global_step += end - begin;
    ret = Py_BuildValue("(dliddLLLLLL)", stats.loss_sum, stats.correct, stats.steps, stats.t_comp, stats.t_sync,
                        st->comm.count.bytes_sent - before.bytes_sent, st->comm.count.messages - before.messages,
                        st->stats.pushes - async_before.pushes, st->stats.staleness_sum - async_before.staleness_sum,
                        st->stats.staleness_max, st->stats.exchanges - async_before.exchanges);
done:
    if (temporary) {
        strategy_free(&once);
    }
    return ret;
}

// strategy_weights() -> the weights that count (the replica, the average, the center), a new array.
// Collective over the strategy's group.
static PyObject *engine_strategy_weights(EngineObject *e, PyObject *unused) {
    (void)unused;
    const char *fn = "Engine.strategy_weights";
    if (!e->has_strategy) {
        PyErr_Format(PyExc_RuntimeError, "%s(): no strategy was set", fn);
        return NULL;
    }
    if (engine_enter(e, fn) < 0) {
        return NULL;
    }
    PdSyncContext sync = {(PyObject *)e, e->strategy_group, NULL, 0};
    int rc;
    WITH_STRATEGY(e, sync, rc = strategy_weights(&e->strategy, e->model.params, e->gathered));
    e->busy = 0;
    if (rc < 0) {
        return strategy_error(&e->strategy, rc);
    }
    return buffer_copy(e->gathered, e->model.num_params);
}

// strategy_state() -> (params, momentum, momentum_started): what a checkpoint saves. Collective.
static PyObject *engine_strategy_state(EngineObject *e, PyObject *unused) {
    (void)unused;
    const char *fn = "Engine.strategy_state";
    if (!e->has_strategy) {
        PyErr_Format(PyExc_RuntimeError, "%s(): no strategy was set", fn);
        return NULL;
    }
    if (engine_enter(e, fn) < 0) {
        return NULL;
    }
    PdSyncContext sync = {(PyObject *)e, e->strategy_group, NULL, 0};
    const long n = e->model.num_params;
    int rc, started = 0;
    WITH_STRATEGY(e, sync, rc = strategy_state(&e->strategy, e->model.params, e->momentum, e->momentum_started,
                                               e->gathered, e->gathered + n, &started));
    e->busy = 0;
    if (rc < 0) {
        return strategy_error(&e->strategy, rc);
    }
    PyObject *params = buffer_copy(e->gathered, n), *momentum = params ? buffer_copy(e->gathered + n, n) : NULL;
    if (momentum == NULL) {
        Py_XDECREF(params);
        return NULL;
    }
    return Py_BuildValue("(NNO)", params, momentum, started ? Py_True : Py_False);
}

// strategy_restore(): every rank has loaded the same params: the strategy takes them up (easgd's center).
static PyObject *engine_strategy_restore(EngineObject *e, PyObject *unused) {
    (void)unused;
    if (e->has_strategy) {
        strategy_restore(&e->strategy, e->model.params);
    }
    Py_RETURN_NONE;
}

// strategy_survive(on): an asynchronous strategy carries on without a worker that dies (async.c);
// every rank of the group sets the same. Returns whether the strategy can (the asynchronous ones).
static PyObject *engine_strategy_survive(EngineObject *e, PyObject *arg) {
    int on = PyObject_IsTrue(arg);
    if (on < 0) {
        return NULL;
    }
    if (!e->has_strategy || !strategy_is_async(e->strategy.cfg.kind)) {
        Py_RETURN_FALSE;
    }
    e->strategy.cfg.survive = on;
    Py_RETURN_TRUE;
}

// strategy_departed() -> {"dead": [group ranks], "noticed": {rank: unix time}, "batches": n, "regranted": n,
// "call_batches": n}:
// the workers the last train_steps call went on without (server 0's word, the same on every rank), when
// this server noticed each, and on server 0 the batches of the blocks finished and those handed out again.
static PyObject *engine_strategy_departed(EngineObject *e, PyObject *unused) {
    (void)unused;
    const Strategy *s = &e->strategy;
    PyObject *dead = PyList_New(0), *noticed = PyDict_New();
    for (int v = 0; dead != NULL && noticed != NULL && e->has_strategy && s->dead != NULL && v < s->workers; v++) {
        if (!s->dead[v]) {
            continue;
        }
        PyObject *r = PyLong_FromLong(v);
        int bad = r == NULL || PyList_Append(dead, r) < 0;
        if (!bad && s->noticed != NULL && s->noticed[v] > 0) {
            PyObject *t = PyFloat_FromDouble(s->noticed[v]);
            bad = t == NULL || PyDict_SetItem(noticed, r, t) < 0;
            Py_XDECREF(t);
        }
        Py_XDECREF(r);
        if (bad) {
            Py_CLEAR(dead);
        }
    }
    if (dead == NULL || noticed == NULL) {
        Py_XDECREF(dead);
        Py_XDECREF(noticed);
        return NULL;
    }
    return Py_BuildValue("{sNsNsLsLsL}", "dead", dead, "noticed", noticed, "batches", e->has_strategy ? s->batches_done : 0LL,
                         "regranted", e->has_strategy ? s->regranted : 0LL, "call_batches",
                         e->has_strategy ? s->call_batches : 0LL);
}

// pipeline_stats() -> dict of this stage's measurements (PipelineStats), or None when the strategy is
// not a pipeline.
static PyObject *engine_pipeline_stats(EngineObject *e, PyObject *unused) {
    (void)unused;
    const PipelineStats *p = e->has_strategy ? pipeline_stats(&e->strategy) : NULL;
    if (p == NULL) {
        Py_RETURN_NONE;
    }
    return Py_BuildValue("{sisisisislslsdsdsdsdsisislsl}", "stage", p->stage, "replica", p->replica, "first_layer",
                         p->first_layer, "last_layer", p->last_layer, "parameters", p->parameters, "steps", p->steps,
                         "busy_s", p->busy, "idle_s", p->idle, "sync_s", p->sync, "step_s", p->step_seconds, "slots",
                         p->slots, "peak_slots", p->peak_slots, "slot_bytes", p->slot_bytes, "workspace_bytes",
                         p->workspace_bytes);
}

// pipeline_trace() -> [(kind, micro, start, end)] of the last step (kind 0 forward, 1 backward, 2 update;
// CLOCK_MONOTONIC seconds), or [] when the strategy is not a pipeline.
static PyObject *engine_pipeline_trace(EngineObject *e, PyObject *unused) {
    (void)unused;
    const PipelineEvent *ev = NULL;
    int n = e->has_strategy ? pipeline_trace(&e->strategy, &ev) : 0;
    PyObject *out = PyList_New(n);
    for (int i = 0; out != NULL && i < n; i++) {
        PyObject *t = Py_BuildValue("(iidd)", ev[i].kind, ev[i].micro, ev[i].start, ev[i].end);
        if (t == NULL) {
            Py_CLEAR(out);
            break;
        }
        PyList_SET_ITEM(out, i, t);
    }
    return out;
}

// This rank's error-feedback residual (a copy), or None without compression.
static PyObject *get_compression_residual(EngineObject *e, void *c) {
    (void)c;
    if (!e->has_strategy || e->strategy.z.residual == NULL) {
        Py_RETURN_NONE;
    }
    return buffer_copy(e->strategy.z.residual, e->strategy.z.n);
}

static PyObject *get_is_server(EngineObject *e, void *c) {
    (void)c;
    return PyBool_FromLong(e->has_strategy && strategy_is_server(&e->strategy));
}
static PyObject *get_workers(EngineObject *e, void *c) {
    (void)c;
    return PyLong_FromLong(e->has_strategy ? e->strategy.workers : 1);
}
static PyObject *get_global_step(EngineObject *e, void *c) { (void)c; return PyLong_FromLong(e->global_step); }
// global_step plus the steps this rank has computed so far in a train_steps call running now (another
// thread reads it while the call, the GIL released, runs: one word, read whole)
static PyObject *get_steps_done(EngineObject *e, void *c) {
    (void)c;
    const StepStats *r = e->running;
    return PyLong_FromLong(e->global_step + (r != NULL ? (long)__atomic_load_n(&r->steps, __ATOMIC_RELAXED) : 0));
}
static int set_global_step(EngineObject *e, PyObject *v, void *c) {
    (void)c;
    long step;
    if (v == NULL) {
        PyErr_SetString(PyExc_TypeError, "global_step cannot be deleted");
        return -1;
    }
    if (pd_arg_long(v, "Engine.global_step", "value", &step) < 0) {
        return -1;
    }
    if (step < 0) {
        PyErr_Format(PyExc_ValueError, "Engine.global_step must be >= 0; got %ld", step);
        return -1;
    }
    e->global_step = step;
    return 0;
}

// A float32 array of the model's num_params values (C-contiguous), or NULL with an exception.
static const float *weights_arg(EngineObject *e, PyObject *obj, const char *fn, const char *arg) {
    PyArrayObject *w = array_arg(obj, NPY_FLOAT32, fn, arg);
    if (w != NULL && PyArray_SIZE(w) != e->model.num_params) {
        PyErr_Format(PyExc_ValueError, "%s(): `%s` must hold the model's %ld parameters; got %lld", fn, arg,
                     e->model.num_params, (long long)PyArray_SIZE(w));
        return NULL;
    }
    return w ? PyArray_DATA(w) : NULL;
}

static int nargs_either(Py_ssize_t nargs, Py_ssize_t a, Py_ssize_t b, const char *fn) {
    if (nargs != a && nargs != b) {
        PyErr_Format(PyExc_TypeError, "%s() takes %zd or %zd arguments (%zd given)", fn, a, b, nargs);
        return -1;
    }
    return 0;
}

// evaluate(images, labels, start, end, batch[, weights]) -> (loss_sum, correct) over examples
// [start, end), with the model's own parameters or with `weights` (a strategy's average or center).
static PyObject *engine_evaluate(EngineObject *e, PyObject *const *args, Py_ssize_t nargs) {
    const char *fn = "Engine.evaluate";
    long start, end, batch;
    Dataset ds;
    const float *weights = NULL;
    if (nargs_either(nargs, 5, 6, fn) < 0 || data_args(e, args[0], args[1], fn, &ds) < 0 ||
        pd_arg_long(args[2], fn, "start", &start) < 0 || pd_arg_long(args[3], fn, "end", &end) < 0 ||
        pd_arg_long(args[4], fn, "batch", &batch) < 0) {
        return NULL;
    }
    if (start < 0 || end < start || end > ds.n || batch < 1 || batch > e->model.max_batch) {
        PyErr_Format(PyExc_ValueError, "%s(): examples [`start`, `end`) must lie in [0, %d] and `batch` in [1, %d]; "
                     "got [%ld, %ld), batch %ld", fn, ds.n, e->model.max_batch, start, end, batch);
        return NULL;
    }
    if ((nargs == 6 && (weights = weights_arg(e, args[5], fn, "weights")) == NULL) || engine_enter(e, fn) < 0) {
        return NULL;
    }
    double loss_sum = 0.0;
    long correct = 0;
    long pixels = pixels_of(&e->model);
    float *own = e->model.params;
    if (weights != NULL) {
        e->model.params = (float *)weights;  // forward only reads them; the engine is busy meanwhile
    }
    Py_BEGIN_ALLOW_THREADS
    for (long i = start; i < end; i += batch) {
        int B = (int)(end - i < batch ? end - i : batch), right = 0;
        const float *logits = model_forward(&e->model, ds.images + i * pixels, B);
        loss_sum += log_softmax_nll(logits, ds.labels + i, NULL, B, e->model.classes, &right) * B;
        correct += right;
    }
    Py_END_ALLOW_THREADS
    e->model.params = own;
    e->busy = 0;
    return Py_BuildValue("(dl)", loss_sum, correct);
}

// A file name as the bytes the OS takes (str, bytes or os.PathLike; an embedded NUL is a ValueError,
// never a silently shorter name). Returns a new bytes object, or NULL with an exception.
static PyObject *path_arg(PyObject *obj, const char *fn, const char *arg) {
    PyObject *bytes = NULL;
    if (!PyUnicode_FSConverter(obj, &bytes)) {
        if (PyErr_ExceptionMatches(PyExc_TypeError)) {
            PyErr_Format(PyExc_TypeError, "%s(): `%s` must be a path (str, bytes or os.PathLike); got %.100s", fn,
                         arg, Py_TYPE(obj)->tp_name);
        }
        return NULL;
    }
    return bytes;
}

// The model's and the strategy's names into a checkpoint's header (zero-padded, as the loader checks).
static void record_names(const EngineObject *e, CheckpointHeader *h) {
    snprintf(h->model, sizeof h->model, "%s", e->name);
    snprintf(h->strategy, sizeof h->strategy, "%s", e->has_strategy ? strategy_name(e->strategy.cfg.kind) : "");
}

// save(path, step, epoch, seed, sample, world, global_batch): params + momentum, atomically
// (checkpoint.c). step and epoch are counts (>= 0); sample is the examples of the epoch's order
// consumed (-1: unknown, as in a version 3 file); seed is any C long, stored as its 64 bits and given
// back as it was by load(); world and global_batch record the layout that saved it. With 10 arguments (..., params, momentum, momentum_started) it saves
// those instead of the engine's own: what a strategy's state() gathered (the average, the center, the
// servers' momentum). With 13 (..., state, compression, ranks) also every rank's compression state,
// `ranks` blocks of equal size one after another in `state` (bytes), and the compressor's name.
static PyObject *engine_save(EngineObject *e, PyObject *const *args, Py_ssize_t nargs) {
    const char *fn = "Engine.save";
    long step, epoch, seed, sample, world, global_batch, ranks = 0;
    const float *params = e->model.params, *momentum = e->momentum;
    int started = e->momentum_started;
    const char *compression = "";
    Py_buffer state = {0};
    if ((nargs != 13 && nargs_either(nargs, 7, 10, fn) < 0) || pd_arg_long(args[1], fn, "step", &step) < 0 ||
        pd_arg_long(args[2], fn, "epoch", &epoch) < 0 || pd_arg_long(args[3], fn, "seed", &seed) < 0 ||
        pd_arg_long(args[4], fn, "sample", &sample) < 0 || pd_arg_long(args[5], fn, "world", &world) < 0 ||
        pd_arg_long(args[6], fn, "global_batch", &global_batch) < 0) {
        return NULL;
    }
    if (nargs >= 10 && ((params = weights_arg(e, args[7], fn, "params")) == NULL ||
                        (momentum = weights_arg(e, args[8], fn, "momentum")) == NULL ||
                        (started = PyObject_IsTrue(args[9])) < 0)) {
        return NULL;
    }
    if (nargs == 13) {
        if (pd_arg_long(args[12], fn, "ranks", &ranks) < 0 ||
            (compression = PyUnicode_Check(args[11]) ? PyUnicode_AsUTF8(args[11]) : NULL) == NULL) {
            if (!PyErr_Occurred()) {
                PyErr_Format(PyExc_TypeError, "%s(): `compression` must be a str", fn);
            }
            return NULL;
        }
        if (PyObject_GetBuffer(args[10], &state, PyBUF_SIMPLE) < 0) {
            return NULL;
        }
        if (ranks < 1 || state.len % ranks != 0 || strlen(compression) >= sizeof ((CheckpointHeader *)0)->compression) {
            PyErr_Format(PyExc_ValueError, "%s(): `state` must be `ranks` (>= 1) equal blocks and `compression` a "
                         "known compressor's name", fn);
            PyBuffer_Release(&state);
            return NULL;
        }
    }
    PyObject *path_bytes = NULL;
    if (step < 0 || epoch < 0 || sample < -1 || world < 1 || global_batch < 1) {
        PyErr_Format(PyExc_ValueError, "%s(): need `step`, `epoch` >= 0, `sample` >= -1 (-1: unknown) and `world`, "
                     "`global_batch` >= 1; got %ld, %ld, %ld, %ld, %ld", fn, step, epoch, sample, world, global_batch);
    } else if ((path_bytes = path_arg(args[0], fn, "path")) != NULL && engine_enter(e, fn) < 0) {
        Py_CLEAR(path_bytes);
    }
    if (path_bytes == NULL) {
        PyBuffer_Release(&state);
        return NULL;
    }
    const char *path = PyBytes_AS_STRING(path_bytes);
    CheckpointHeader h = {CHECKPOINT_MAGIC, CHECKPOINT_VERSION, (uint64_t)e->model.num_params, (uint64_t)step,
                          (uint64_t)epoch, (uint64_t)seed, model_hash(&e->model), (uint64_t)started,
                          (uint64_t)ranks, ranks > 0 ? (uint64_t)(state.len / ranks) : 0, {0}, (uint64_t)sample,
                          (uint64_t)world, (uint64_t)global_batch, {0}, {0}};
    snprintf(h.compression, sizeof h.compression, "%s", compression);
    record_names(e, &h);
    char err[1024];
    int rc, cause = 0;
    Py_BEGIN_ALLOW_THREADS
    rc = checkpoint_save(path, &h, params, momentum, state.buf, err, sizeof err);
    cause = errno;
    Py_END_ALLOW_THREADS
    e->busy = 0;
    PyBuffer_Release(&state);
    if (rc < 0) {   // OSError(errno, text, path): the subclass of the cause (PermissionError, ...), errno kept
        PyObject *exc = PyObject_CallFunction(PyExc_OSError, "isO", cause, err, args[0]);
        if (exc != NULL) {
            PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
            Py_DECREF(exc);
        }
    }
    Py_DECREF(path_bytes);
    if (rc < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

// load(path[, strict]) -> (step, epoch, seed, compression, position): params, momentum and
// momentum_started from a checkpoint; compression: None, or (name, ranks, state bytes) as save() was given
// them; position: (sample, world, global_batch) as save() was given them, or None from a file of version 2
// or 3. strict (default true): a file another strategy saved is refused; false takes its weights.
static PyObject *engine_load(EngineObject *e, PyObject *const *args, Py_ssize_t nargs) {
    const char *fn = "Engine.load";
    PyObject *path_bytes;
    int strict = 1;
    if (nargs_either(nargs, 1, 2, fn) < 0 || (nargs == 2 && (strict = PyObject_IsTrue(args[1])) < 0) ||
        (path_bytes = path_arg(args[0], fn, "path")) == NULL) {
        return NULL;
    }
    if (engine_enter(e, fn) < 0) {
        Py_DECREF(path_bytes);
        return NULL;
    }
    const char *path = PyBytes_AS_STRING(path_bytes);
    CheckpointHeader expect = {CHECKPOINT_MAGIC, CHECKPOINT_VERSION, (uint64_t)e->model.num_params, 0, 0, 0,
                               model_hash(&e->model), 0, 0, 0, {0}, 0, 0, 0, {0}, {0}};
    record_names(e, &expect);
    if (!strict) {
        expect.strategy[0] = '\0';   // (an empty name is never compared)
    }
    CheckpointHeader h;
    char err[1024];
    int rc = -1;
    void *state = NULL;
    // Read into new buffers and take them only when the whole file is good: a damaged checkpoint
    // must leave the model as it was, not half overwritten.
    size_t bytes = sizeof(float) * (size_t)e->model.num_params;
    float *params = PyMem_Malloc(bytes), *momentum = PyMem_Malloc(bytes);
    if (params == NULL || momentum == NULL) {
        snprintf(err, sizeof err, "out of memory loading %s", path);
    } else {
        Py_BEGIN_ALLOW_THREADS
        rc = checkpoint_load(path, &h, params, momentum, &state, &expect, err, sizeof err);
        Py_END_ALLOW_THREADS
    }
    if (rc == 0) {   // (checkpoint_load checked every field against what save() writes)
        memcpy(e->model.params, params, bytes);
        memcpy(e->momentum, momentum, bytes);
        e->momentum_started = h.momentum_started != 0;
    }
    PyMem_Free(params);
    PyMem_Free(momentum);
    e->busy = 0;
    Py_DECREF(path_bytes);
    PyObject *compression = NULL;
    if (rc == 0 && state != NULL) {
        compression = Py_BuildValue("(sLy#)", h.compression, (long long)h.state_ranks, (const char *)state,
                                    (Py_ssize_t)(h.state_ranks * h.state_bytes));
    } else if (rc == 0) {
        compression = Py_NewRef(Py_None);
    }
    free(state);
    if (rc < 0) {
        PyErr_SetString(PyExc_ValueError, err);
        return NULL;
    }
    if (compression == NULL) {
        return NULL;
    }
    PyObject *position = h.sample == UINT64_MAX ? Py_NewRef(Py_None)
                         : Py_BuildValue("(LLL)", (long long)h.sample, (long long)h.world, (long long)h.global_batch);
    if (position == NULL) {
        Py_DECREF(compression);
        return NULL;
    }
    return Py_BuildValue("(LLLNN)", (long long)h.step, (long long)h.epoch, (long long)h.seed, compression, position);
}

// compression_state() -> bytes: this rank's compression state (residual, powersgd's warm start) as a
// checkpoint keeps it, or None without compression; set_compression_state(bytes) takes it back.
static PyObject *engine_compression_state(EngineObject *e, PyObject *unused) {
    (void)unused;
    size_t bytes = e->has_strategy ? compress_state_bytes(&e->strategy.z) : 0;
    if (bytes == 0) {
        Py_RETURN_NONE;
    }
    PyObject *out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)bytes);
    if (out != NULL) {
        compress_state_save(&e->strategy.z, PyBytes_AS_STRING(out));
    }
    return out;
}

static PyObject *engine_set_compression_state(EngineObject *e, PyObject *const *args, Py_ssize_t nargs) {
    const char *fn = "Engine.set_compression_state";
    Py_buffer in;
    if (pd_check_nargs(nargs, 1, fn) < 0 || PyObject_GetBuffer(args[0], &in, PyBUF_SIMPLE) < 0) {
        return NULL;
    }
    size_t want = e->has_strategy ? compress_state_bytes(&e->strategy.z) : 0;
    PyObject *ret = NULL;
    if (want == 0 || (size_t)in.len != want) {
        PyErr_Format(PyExc_ValueError, "%s(): this engine's compression state is %zu bytes; got %zd", fn, want,
                     in.len);
    } else if (engine_enter(e, fn) == 0) {
        compress_state_load(&e->strategy.z, in.buf);
        e->busy = 0;
        ret = Py_NewRef(Py_None);
    }
    PyBuffer_Release(&in);
    return ret;
}

#define METHOD(name, fn, doc) {name, (PyCFunction)(void (*)(void))fn, METH_FASTCALL, doc}

static PyMethodDef engine_methods[] = {
    METHOD("init_params", engine_init_params, "init_params(seed): PyTorch's default initialisation"),
    METHOD("forward", engine_forward, "forward(x) -> logits (B, classes)"),
    METHOD("loss_and_grad", engine_loss_and_grad, "loss_and_grad(x, labels) -> (loss, correct); fills grads"),
    METHOD("profile", engine_profile,
           "profile(x, labels, reps) -> (forward s per layer, backward s per layer, loss s), fastest of reps"),
    METHOD("sgd_step", engine_sgd_step, "sgd_step(lr, momentum, dampening, weight_decay, nesterov)"),
    METHOD("train_steps", engine_train_steps,
           "train_steps(images, labels, perm, step_begin, step_end, batch, group, lr, momentum, dampening, "
           "weight_decay, nesterov) -> (loss_sum, correct, steps, t_comp, t_sync, bytes_sent, messages)"),
    METHOD("set_strategy", engine_set_strategy,
           "set_strategy(group, name, servers, period, warmup, placement, beta, slow_ms, window, deterministic, "
           "stages, micro_batches, schedule, split, lr, momentum, dampening, weight_decay, nesterov[, compression]): "
           "how train_steps cooperate (collective)"),
    {"strategy_weights", (PyCFunction)engine_strategy_weights, METH_NOARGS,
     "strategy_weights() -> the weights that count (collective)"},
    {"strategy_state", (PyCFunction)engine_strategy_state, METH_NOARGS,
     "strategy_state() -> (params, momentum, momentum_started) to save (collective)"},
    {"pipeline_stats", (PyCFunction)engine_pipeline_stats, METH_NOARGS,
     "pipeline_stats() -> this stage's busy, idle and sync seconds, activation memory (None: no pipeline)"},
    {"pipeline_trace", (PyCFunction)engine_pipeline_trace, METH_NOARGS,
     "pipeline_trace() -> [(kind, micro, start, end)] of the last step (kind 0 forward, 1 backward, 2 update)"},
    {"strategy_survive", (PyCFunction)engine_strategy_survive, METH_O,
     "strategy_survive(on) -> bool: carry on without a worker that dies (the asynchronous strategies)"},
    {"strategy_departed", (PyCFunction)engine_strategy_departed, METH_NOARGS,
     "strategy_departed() -> dict: the workers the last call went on without, and its blocks"},
    {"strategy_restore", (PyCFunction)engine_strategy_restore, METH_NOARGS,
     "strategy_restore(): take up loaded params (easgd's center)"},
    METHOD("evaluate", engine_evaluate,
           "evaluate(images, labels, start, end, batch[, weights]) -> (loss_sum, correct)"),
    METHOD("save", engine_save,
           "save(path, step, epoch, seed, sample, world, global_batch[, params, momentum, momentum_started[, state, "
           "compression, ranks]]): "
           "atomic checkpoint"),
    METHOD("load", engine_load, "load(path[, strict]) -> (step, epoch, seed, compression, position)"),
    {"compression_state", (PyCFunction)engine_compression_state, METH_NOARGS,
     "compression_state() -> this rank's compression state as a checkpoint keeps it (bytes), or None"},
    METHOD("set_compression_state", engine_set_compression_state,
           "set_compression_state(state): take back what compression_state() gave"),
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef engine_getset[] = {
    {"params", (getter)get_params, NULL, "the flat parameter buffer (a view)", NULL},
    {"grads", (getter)get_grads, NULL, "the flat gradient buffer (a view)", NULL},
    {"momentum", (getter)get_momentum, NULL, "the SGD momentum buffer (a view)", NULL},
    {"momentum_started", (getter)get_momentum_started, (setter)set_momentum_started, "momentum holds a value", NULL},
    {"num_params", (getter)get_num_params, NULL, "number of parameters", NULL},
    {"classes", (getter)get_classes, NULL, "number of output classes", NULL},
    {"max_batch", (getter)get_max_batch, NULL, "largest batch per call", NULL},
    {"model_hash", (getter)get_model_hash, NULL, "hash of the architecture (checkpoints)", NULL},
    {"name", (getter)get_name, (setter)set_name, "the model's name as checkpoints record it", NULL},
    {"is_server", (getter)get_is_server, NULL, "this rank serves parameters (strategy ps)", NULL},
    {"compression_residual", (getter)get_compression_residual, NULL,
     "a copy of this rank's error-feedback residual (None without compression)", NULL},
    {"workers", (getter)get_workers, NULL, "ranks that compute gradients", NULL},
    {"global_step", (getter)get_global_step, (setter)set_global_step, "the strategy's step count", NULL},
    {"steps_done", (getter)get_steps_done, NULL, "global_step and the steps of a train_steps call in progress", NULL},
    {"layout", (getter)get_layout, NULL, "(weight_offset, weights, bias_offset, biases) per layer", NULL},
    {"layer_flops", (getter)get_layer_flops, NULL, "forward FLOPs per example, per layer", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot engine_slots[] = {
    {Py_tp_new, engine_new},
    {Py_tp_dealloc, engine_dealloc},
    {Py_tp_methods, engine_methods},
    {Py_tp_getset, engine_getset},
    {Py_tp_doc, "Engine(layers, input_shape, max_batch): a model with flat parameter and gradient buffers, "
                "its forward/backward passes, SGD, and the data-parallel step loop, all in C."},
    {0, NULL},
};

static PyType_Spec engine_spec = {
    .name = "pydist._C.Engine",
    .basicsize = sizeof(EngineObject),
    .flags = Py_TPFLAGS_DEFAULT,
    .slots = engine_slots,
};

// ---------------------------------------------------------------------------------------------------
// Module functions

static void free_capsule(PyObject *capsule) {
    free(PyCapsule_GetPointer(capsule, NULL));
}

// An array over malloc'ed memory that frees it when the array goes.
static PyObject *owning_array(int nd, npy_intp *dims, int typenum, void *data) {
    PyObject *a = PyArray_SimpleNewFromData(nd, dims, typenum, data);
    PyObject *cap = a ? PyCapsule_New(data, NULL, free_capsule) : NULL;
    if (cap == NULL || PyArray_SetBaseObject((PyArrayObject *)a, cap) < 0) {
        if (cap == NULL) free(data);  // a failed SetBaseObject has consumed cap, which frees data
        Py_XDECREF(a);
        return NULL;
    }
    return a;
}

// load_idx(images_path, labels_path) -> (images (n, rows, cols) float32 normalised, labels int32)
PyObject *pd_load_idx(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    PyObject *ibytes = NULL, *lbytes = NULL;
    if (pd_check_nargs(nargs, 2, "load_idx") < 0 || (ibytes = path_arg(args[0], "load_idx", "images_path")) == NULL ||
        (lbytes = path_arg(args[1], "load_idx", "labels_path")) == NULL) {
        Py_XDECREF(ibytes);
        return NULL;
    }
    const char *ipath = PyBytes_AS_STRING(ibytes), *lpath = PyBytes_AS_STRING(lbytes);
    Dataset ds = {0};
    char err[1024];
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = dataset_load_idx(&ds, ipath, lpath, err, sizeof err);
    Py_END_ALLOW_THREADS
    Py_DECREF(ibytes);
    Py_DECREF(lbytes);
    if (rc < 0) {
        PyErr_SetString(PyExc_ValueError, err);
        return NULL;
    }
    npy_intp idims[3] = {ds.n, ds.rows, ds.cols}, ldims[1] = {ds.n};
    // owning_array owns the memory from here on, and frees it itself when it fails.
    PyObject *images = owning_array(3, idims, NPY_FLOAT32, ds.images);
    PyObject *labels = owning_array(1, ldims, NPY_INT32, ds.labels);
    if (images == NULL || labels == NULL) {
        Py_XDECREF(images);
        Py_XDECREF(labels);
        return NULL;
    }
    return Py_BuildValue("(NN)", images, labels);
}

// epoch_permutation(n, seed, epoch) -> int32 array: the order every rank computes alike
PyObject *pd_epoch_permutation(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    long n, seed, epoch;
    if (pd_check_nargs(nargs, 3, "epoch_permutation") < 0 || pd_arg_long(args[0], "epoch_permutation", "n", &n) < 0 ||
        pd_arg_long(args[1], "epoch_permutation", "seed", &seed) < 0 ||
        pd_arg_long(args[2], "epoch_permutation", "epoch", &epoch) < 0) {
        return NULL;
    }
    if (n < 0 || n > INT32_MAX || epoch < 0 || epoch > INT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "epoch_permutation(): n and epoch must be in [0, 2**31)");
        return NULL;
    }
    npy_intp dims[1] = {n};
    PyObject *a = PyArray_SimpleNew(1, dims, NPY_INT32);
    if (a != NULL) {
        epoch_permutation(PyArray_DATA((PyArrayObject *)a), (int)n, (uint64_t)seed, (int)epoch);
    }
    return a;
}

// set_blas_threads(n) -> None: OpenBLAS threads in this process (the ranks are the parallelism)
PyObject *pd_set_blas_threads(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    long n;
    if (pd_check_nargs(nargs, 1, "set_blas_threads") < 0 || pd_arg_long(args[0], "set_blas_threads", "n", &n) < 0) {
        return NULL;
    }
    if (n < 1 || n > 1024) {
        PyErr_SetString(PyExc_ValueError, "set_blas_threads(): n must be in [1, 1024]");
        return NULL;
    }
    openblas_set_num_threads((int)n);
    Py_RETURN_NONE;
}

// blas_core() -> the kernel family the engine's OpenBLAS runs ("SkylakeX", "Haswell", ...): a generic one
// ("Prescott") on a modern CPU means five times slower GEMMs, which benchmarks print so it shows.
PyObject *pd_blas_core(PyObject *self, PyObject *unused) {
    (void)self, (void)unused;
    const char *name = openblas_get_corename();
    return PyUnicode_FromString(name != NULL ? name : "unknown");
}

// sgemm_seconds(n, reps) -> seconds of the fastest of `reps` products of two n x n float32 matrices
// through the engine's own BLAS, at its current thread count: the machine's arithmetic peak as the
// engine can reach it (2 n^3 floating-point operations each), for benchmarks to set beside a step.
PyObject *pd_sgemm_seconds(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    long n, reps;
    if (pd_check_nargs(nargs, 2, "sgemm_seconds") < 0 || pd_arg_long(args[0], "sgemm_seconds", "n", &n) < 0 ||
        pd_arg_long(args[1], "sgemm_seconds", "reps", &reps) < 0) {
        return NULL;
    }
    if (n < 1 || n > 8192 || reps < 1 || reps > 1000) {
        PyErr_Format(PyExc_ValueError, "sgemm_seconds(): need 1 <= n <= 8192 and 1 <= reps <= 1000; got n=%ld, "
                     "reps=%ld", n, reps);
        return NULL;
    }
    size_t elems = (size_t)n * (size_t)n;
    float *a = PyMem_Malloc(sizeof(float) * elems), *b = PyMem_Malloc(sizeof(float) * elems);
    float *c = PyMem_Malloc(sizeof(float) * elems);
    if (a == NULL || b == NULL || c == NULL) {
        PyMem_Free(a), PyMem_Free(b), PyMem_Free(c);
        return PyErr_NoMemory();
    }
    for (size_t i = 0; i < elems; i++) {
        a[i] = (float)(i % 7) * 0.125f, b[i] = (float)(i % 5) * 0.25f;
    }
    double best = 0.0;
    Py_BEGIN_ALLOW_THREADS
    for (long r = 0; r < reps; r++) {
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)n, (int)n, (int)n, 1.0f, a, (int)n, b, (int)n,
                    0.0f, c, (int)n);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        double s = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
        best = r == 0 || s < best ? s : best;
    }
    Py_END_ALLOW_THREADS
    PyMem_Free(a), PyMem_Free(b), PyMem_Free(c);
    return PyFloat_FromDouble(best);
}

int pd_engine_type_init(PyObject *module) {
    EngineType = (PyTypeObject *)PyType_FromModuleAndSpec(module, &engine_spec, NULL);
    if (EngineType == NULL) {
        return -1;
    }
    return PyModule_AddObjectRef(module, "Engine", (PyObject *)EngineType);
}
