/*
 * compress_py.c: _C.Compressor, the compressors of csrc/compress/ for Python: one rank's payloads
 * (encode, decode_add) and the compressed sum over a pydist group (allreduce_sum), with this rank's
 * error-feedback residual kept between calls. pydist.torch.hooks and the tests stand on it; the engine's
 * strategies use csrc/compress/ directly.
 */
#include "api/compress_py.h"

#include "core/buffer.h"
#include "core/errors.h"
#include "groups/group.h"
#include "strategies/comm_glue.h"
#include "strategies/exchange.h"

#include <float.h>
#include <math.h>

typedef struct {
    PyObject_HEAD
    Compressor z;
    int busy;   // a call is running with the GIL released: another thread must not enter
} CompressorObject;

static PyTypeObject *CompressorType;

static void compressor_dealloc(CompressorObject *self) {
    compressor_free(&self->z);
    PyTypeObject *tp = Py_TYPE(self);
    tp->tp_free(self);
    Py_DECREF(tp);
}

// Compressor(spec, n, matrices=(), seed=0): matrices, (offset, rows, cols) triples, are the blocks
// powersgd factors.
static PyObject *compressor_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"spec", "n", "matrices", "seed", NULL};
    const char *text;
    long n;
    PyObject *mats = NULL;
    unsigned long long seed = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "sl|OK:Compressor", kwlist, &text, &n, &mats, &seed)) {
        return NULL;
    }
    CompressSpec spec;
    char err[256];
    if (compress_parse(text, &spec, err, sizeof err) < 0) {
        PyErr_Format(PyExc_ValueError, "Compressor(): %s", err);
        return NULL;
    }
    if (n < 0 || n > INT32_MAX) {
        PyErr_Format(PyExc_ValueError, "Compressor(): `n` must be in [0, 2**31); got %ld", n);
        return NULL;
    }
    PyObject *empty = NULL;
    if (mats == NULL || mats == Py_None) {
        if ((mats = empty = PyTuple_New(0)) == NULL) {
            return NULL;
        }
    }
    PyObject *seq = PySequence_Fast(mats, "Compressor(): `matrices` must be a sequence of (offset, rows, cols)");
    Py_XDECREF(empty);
    if (seq == NULL) {
        return NULL;
    }
    Py_ssize_t count = PySequence_Fast_GET_SIZE(seq);
    CompressMatrix *list = PyMem_Calloc((size_t)count + 1, sizeof(CompressMatrix));
    int rc = list == NULL ? (PyErr_NoMemory(), -1) : 0;
    for (Py_ssize_t i = 0; rc == 0 && i < count; i++) {
        CompressMatrix *m = &list[i];
        PyObject *item = PySequence_Fast_GET_ITEM(seq, i);
        if (!PyArg_ParseTuple(item, "lll", &m->offset, &m->rows, &m->cols)) {
            PyErr_Format(PyExc_TypeError, "Compressor(): each of `matrices` must be (offset, rows, cols) ints");
            rc = -1;
        } else if (m->offset < 0 || m->rows < 1 || m->cols < 1 || m->rows > n || m->cols > n ||
                   m->offset + m->rows * m->cols > n || (i > 0 && m->offset < list[i - 1].offset +
                                                                   list[i - 1].rows * list[i - 1].cols)) {
            PyErr_Format(PyExc_ValueError, "Compressor(): matrix %zd (%ld, %ld, %ld) must lie inside [0, n) after "
                         "the one before it", i, m->offset, m->rows, m->cols);
            rc = -1;
        }
    }
    Py_DECREF(seq);
    CompressorObject *self = rc == 0 ? (CompressorObject *)type->tp_alloc(type, 0) : NULL;
    if (self != NULL && compressor_create(&self->z, &spec, n, list, (int)count, seed) < 0) {
        Py_DECREF(self);
        self = NULL;
        PyErr_NoMemory();
    }
    PyMem_Free(list);
    return (PyObject *)self;
}

// A float32 array of the compressor's n entries (writable if asked), into buf.
static int float_array(CompressorObject *self, PyObject *obj, const char *fn, const char *arg, int writable,
                       PdBuf *buf) {
    if (pd_buf_get(obj, fn, arg, writable, buf) < 0) {
        return -1;
    }
    if (PyArray_TYPE(buf->arr) != NPY_FLOAT32 || buf->count != self->z.n) {
        PyErr_Format(PyExc_ValueError, "%s(): `%s` must be float32 with %ld elements; got %s with %lld", fn, arg,
                     self->z.n, buf->dtype->name, (long long)buf->count);
        pd_buf_release(buf);
        return -1;
    }
    return 0;
}

static int enter(CompressorObject *self, const char *fn) {
    if (self->busy) {
        PyErr_Format(PyExc_RuntimeError, "%s(): the compressor is in use by another thread", fn);
        return -1;
    }
    self->busy = 1;
    return 0;
}

// encode(x) -> bytes: this rank's payload for x plus its residual; the residual keeps what it leaves out.
static PyObject *compressor_encode(CompressorObject *self, PyObject *const *args, Py_ssize_t nargs) {
    const char *fn = "Compressor.encode";
    PdBuf x = {0};
    if (pd_check_nargs(nargs, 1, fn) < 0 || float_array(self, args[0], fn, "x", 0, &x) < 0) {
        return NULL;
    }
    PyObject *out = NULL;
    if (enter(self, fn) == 0) {
        out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)compress_payload_bytes(&self->z, 0, self->z.n));
        if (out != NULL) {
            compress_encode(&self->z, 0, x.data, self->z.n, PyBytes_AS_STRING(out));
        }
        self->busy = 0;
    }
    pd_buf_release(&x);
    return out;
}

// decode_add(payload, out, scale=1.0): out += scale * what the payload (from encode) holds. A payload
// that encode could not have written (compress_payload_check) is a ValueError, and out is left as it was.
static PyObject *compressor_decode_add(CompressorObject *self, PyObject *const *args, Py_ssize_t nargs) {
    const char *fn = "Compressor.decode_add";
    double scale = 1.0;
    if (nargs == 3 && (scale = PyFloat_AsDouble(args[2])) == -1.0 && PyErr_Occurred()) {
        return NULL;
    }
    if (nargs != 3 && pd_check_nargs(nargs, 2, fn) < 0) {
        return NULL;
    }
    if (!(fabs(scale) <= FLT_MAX)) {   // (a double past float32's range has no float32 to convert to)
        PyErr_Format(PyExc_ValueError, "%s(): `scale` must be a finite float32 value; got %g", fn, scale);
        return NULL;
    }
    Py_buffer payload;
    if (PyObject_GetBuffer(args[0], &payload, PyBUF_SIMPLE) < 0) {
        return NULL;
    }
    PdBuf out = {0};
    PyObject *ret = NULL;
    size_t want = compress_payload_bytes(&self->z, 0, self->z.n);
    char why[160];
    if ((size_t)payload.len != want) {
        PyErr_Format(PyExc_ValueError, "%s(): `payload` must be the %zu bytes encode() gives; got %zd", fn, want,
                     payload.len);
    } else if (compress_payload_check(&self->z, 0, self->z.n, payload.buf, want, why, sizeof why) < 0) {
        PyErr_Format(PyExc_ValueError, "%s(): `payload` is not one that encode() gives: %s", fn, why);
    } else if (float_array(self, args[1], fn, "out", 1, &out) == 0) {
        compress_decode_add_checked(&self->z, 0, payload.buf, self->z.n, (float)scale, out.data);
        ret = Py_NewRef(Py_None);
        pd_buf_release(&out);
    }
    PyBuffer_Release(&payload);
    return ret;
}

// allreduce_sum(x, group, ring) -> (bytes_sent, messages): x becomes its sum over the group, compressed
// (bitwise the same on every rank); collective. group: a pydist group handle.
static PyObject *compressor_allreduce_sum(CompressorObject *self, PyObject *const *args, Py_ssize_t nargs) {
    const char *fn = "Compressor.allreduce_sum";
    long group;
    PdBuf x = {0};
    if (pd_check_nargs(nargs, 3, fn) < 0 || pd_arg_long(args[1], fn, "group", &group) < 0) {
        return NULL;
    }
    int ring = PyObject_IsTrue(args[2]);
    MPI_Comm *comm = ring < 0 ? NULL : pd_group_comm(group, fn);
    if (comm == NULL || float_array(self, args[0], fn, "x", 1, &x) < 0) {
        return NULL;
    }
    PyObject *owner = PyTuple_Pack(2, (PyObject *)self, (PyObject *)x.arr), *ret = NULL;
    if (owner != NULL && enter(self, fn) == 0) {
        Comm c = pd_comm_for(*comm, pd_group_rank(group), pd_group_size(group));
        PdSyncContext sync = {owner, group, NULL, 0};
        c.ctx = &sync;
        sync.released = PyEval_SaveThread();
        int rc = compress_allreduce_sum(&self->z, &c, x.data, self->z.n, ring);
        PyEval_RestoreThread(sync.released);
        self->busy = 0;
        if (rc == -2 && c.mpi_call == self->z.refused) {   // another rank's payload, not MPI, failed
            PyErr_Format(pd_DistError, "%s(): %s", fn, self->z.refused);
        } else if (rc == -2 && !PyErr_Occurred()) {
            pd_raise_mpi(c.mpi_rc, c.mpi_call);
        } else if (rc == 0) {
            ret = Py_BuildValue("(LL)", c.count.bytes_sent, c.count.messages);
        }
    }
    Py_XDECREF(owner);
    pd_buf_release(&x);
    return ret;
}

static PyObject *get_residual(CompressorObject *self, void *c) {
    (void)c;
    npy_intp dims[1] = {self->z.n};
    PyObject *out = PyArray_ZEROS(1, dims, NPY_FLOAT32, 0);
    if (out != NULL && self->z.residual != NULL) {
        memcpy(PyArray_DATA((PyArrayObject *)out), self->z.residual, sizeof(float) * (size_t)self->z.n);
    }
    return out;
}

static PyObject *get_payload_bytes(CompressorObject *self, void *c) {
    (void)c;
    return PyLong_FromSize_t(compress_payload_bytes(&self->z, 0, self->z.n));
}

static PyObject *get_spec(CompressorObject *self, void *c) {
    (void)c;
    char name[64];
    compress_name(&self->z.spec, name, sizeof name);
    return PyUnicode_FromString(name);
}

static PyObject *get_matrices(CompressorObject *self, void *c) {
    (void)c;
    PyObject *out = PyList_New(self->z.num_matrices);
    for (int i = 0; out != NULL && i < self->z.num_matrices; i++) {
        const CompressMatrix *m = &self->z.matrices[i];
        PyObject *t = Py_BuildValue("(lll)", m->offset, m->rows, m->cols);
        if (t == NULL) {
            Py_CLEAR(out);
            break;
        }
        PyList_SET_ITEM(out, i, t);
    }
    return out;
}

static PyMethodDef compressor_methods[] = {
    {"encode", (PyCFunction)(void (*)(void))compressor_encode, METH_FASTCALL,
     "encode(x) -> bytes: this rank's payload for x plus its residual (which keeps what is left out)"},
    {"decode_add", (PyCFunction)(void (*)(void))compressor_decode_add, METH_FASTCALL,
     "decode_add(payload, out, scale=1.0): out += scale * what the payload holds"},
    {"allreduce_sum", (PyCFunction)(void (*)(void))compressor_allreduce_sum, METH_FASTCALL,
     "allreduce_sum(x, group, ring) -> (bytes_sent, messages): x becomes its compressed sum over the group"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef compressor_getset[] = {
    {"residual", (getter)get_residual, NULL, "a copy of this rank's error-feedback residual", NULL},
    {"payload_bytes", (getter)get_payload_bytes, NULL, "bytes of one payload", NULL},
    {"spec", (getter)get_spec, NULL, "the compressor, as the command line spells it", NULL},
    {"matrices", (getter)get_matrices, NULL, "the (offset, rows, cols) blocks powersgd factors", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot compressor_slots[] = {
    {Py_tp_new, compressor_new},
    {Py_tp_dealloc, compressor_dealloc},
    {Py_tp_methods, compressor_methods},
    {Py_tp_getset, compressor_getset},
    {Py_tp_doc, "Compressor(spec, n, matrices=(), seed=0): gradient compression with error feedback (csrc/compress/)"},
    {0, NULL},
};

static PyType_Spec compressor_spec = {"pydist._C.Compressor", sizeof(CompressorObject), 0, Py_TPFLAGS_DEFAULT,
                                      compressor_slots};

int pd_compressor_type_init(PyObject *module) {
    CompressorType = (PyTypeObject *)PyType_FromModuleAndSpec(module, &compressor_spec, NULL);
    if (CompressorType == NULL) {
        return -1;
    }
    return PyModule_AddObjectRef(module, "Compressor", (PyObject *)CompressorType);
}
