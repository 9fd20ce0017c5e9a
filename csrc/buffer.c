/*
 * buffer.c: turn a Python argument into the (pointer, count, MPI datatype) MPI needs, without copying.
 *
 * We accept a NumPy ndarray, or a torch CPU tensor viewed through tensor.detach().numpy() (a view
 * that shares the tensor's memory; torch is never imported by us). The array must be C-contiguous,
 * aligned and in native byte order, and writeable when the call writes into it: MPI reads and writes
 * the memory as one run of elements, so anything else would be silently wrong.
 */
#include "pydist.h"

// Shape or strides as "(3, 2)", for messages.
static PyObject *dims_repr(int nd, const npy_intp *dims) {
    PyObject *t = PyTuple_New(nd);
    if (t == NULL) {
        return NULL;
    }
    for (int i = 0; i < nd; i++) {
        PyObject *v = PyLong_FromSsize_t(dims[i]);
        if (v == NULL) {
            Py_DECREF(t);
            return NULL;
        }
        PyTuple_SET_ITEM(t, i, v);
    }
    return t;
}

// A torch tensor: a type named "Tensor" (or a subclass of one) from a module under "torch".
static int is_torch_tensor(PyObject *obj) {
    for (PyTypeObject *t = Py_TYPE(obj); t != NULL; t = t->tp_base) {
        PyObject *mod = PyDict_GetItemString(t->tp_dict, "__module__");  // borrowed
        if (mod != NULL && PyUnicode_Check(mod)) {
            const char *m = PyUnicode_AsUTF8(mod);
            if (m != NULL && strncmp(m, "torch", 5) == 0 && strcmp(t->tp_name, "Tensor") == 0) {
                return 1;
            }
        }
        PyErr_Clear();
    }
    return 0;
}

// A new reference to an ndarray for obj, or NULL with TypeError.
static PyArrayObject *as_array(PyObject *obj, const char *fn, const char *arg) {
    if (PyArray_Check(obj)) {
        Py_INCREF(obj);
        return (PyArrayObject *)obj;
    }
    if (is_torch_tensor(obj)) {
        PyObject *det = PyObject_CallMethod(obj, "detach", NULL);
        PyObject *arr = det ? PyObject_CallMethod(det, "numpy", NULL) : NULL;
        Py_XDECREF(det);
        if (arr == NULL) {
            // e.g. a CUDA tensor or bfloat16: say which argument and keep torch's reason
            PyObject *type, *value, *tb;
            PyErr_Fetch(&type, &value, &tb);
            PyErr_Format(PyExc_TypeError, "%s(): `%s` is a torch tensor whose memory NumPy cannot view "
                         "(CPU tensors of NumPy dtypes only): %S", fn, arg, value ? value : Py_None);
            Py_XDECREF(type);
            Py_XDECREF(value);
            Py_XDECREF(tb);
            return NULL;
        }
        if (!PyArray_Check(arr)) {
            Py_DECREF(arr);
            PyErr_Format(PyExc_TypeError, "%s(): `%s`.numpy() did not return an ndarray", fn, arg);
            return NULL;
        }
        return (PyArrayObject *)arr;
    }
    PyErr_Format(PyExc_TypeError, "%s(): `%s` must be a numpy.ndarray (or a torch CPU tensor); got %.100s",
                 fn, arg, Py_TYPE(obj)->tp_name);
    return NULL;
}

int pd_buf_get(PyObject *obj, const char *fn, const char *arg, int writable, PdBuf *buf) {
    buf->arr = NULL;
    PyArrayObject *arr = as_array(obj, fn, arg);
    if (arr == NULL) {
        return -1;
    }
    const PdDtype *dt = pd_dtype_of(arr, fn, arg);
    if (dt == NULL) {
        goto error;
    }
    if (!PyArray_IS_C_CONTIGUOUS(arr)) {
        PyObject *strides = dims_repr(PyArray_NDIM(arr), PyArray_STRIDES(arr));
        PyObject *shape = dims_repr(PyArray_NDIM(arr), PyArray_DIMS(arr));
        if (strides && shape) {
            PyErr_Format(PyExc_ValueError, "%s(): `%s` must be C-contiguous; got strides %R for shape %R "
                         "(use numpy.ascontiguousarray)", fn, arg, strides, shape);
        }
        Py_XDECREF(strides);
        Py_XDECREF(shape);
        goto error;
    }
    if (!PyArray_ISALIGNED(arr)) {
        PyErr_Format(PyExc_ValueError, "%s(): `%s` must be aligned; got an unaligned %s array", fn, arg,
                     dt->name);
        goto error;
    }
    if (!PyArray_ISNOTSWAPPED(arr)) {
        PyErr_Format(PyExc_ValueError, "%s(): `%s` must be in native byte order; got a byte-swapped %s "
                     "array (use arr.astype(arr.dtype.newbyteorder('=')))", fn, arg, dt->name);
        goto error;
    }
    if (writable && !PyArray_ISWRITEABLE(arr)) {
        PyErr_Format(PyExc_ValueError, "%s(): `%s` must be writeable, since the result is written into it; "
                     "got a read-only array", fn, arg);
        goto error;
    }
    buf->arr = arr;
    buf->dtype = dt;
    buf->data = PyArray_DATA(arr);
    buf->count = (MPI_Count)PyArray_SIZE(arr);
    buf->nbytes = PyArray_NBYTES(arr);
    return 0;
error:
    Py_DECREF(arr);
    return -1;
}

void pd_buf_release(PdBuf *buf) {
    Py_CLEAR(buf->arr);
}
