/*
 * buffer.c: turn a Python argument into the (pointer, count, MPI datatype) MPI needs, without copying.
 *
 * We accept a NumPy ndarray, or a torch CPU tensor viewed through tensor.detach().numpy() (a view
 * that shares the tensor's memory; torch is never imported by us). The array must be C-contiguous,
 * aligned and in native byte order, and writeable when the call writes into it: MPI reads and writes
 * the memory as one run of elements, so anything else would be silently wrong.
 */
#include "core/buffer.h"

#include "core/errors.h"

// Shape or strides as "(3, 2)", for messages.
static PyObject *dims_repr(int nd, const npy_intp *dims, npy_intp unit) {
    PyObject *t = PyTuple_New(nd);
    if (t == NULL) {
        return NULL;
    }
    for (int i = 0; i < nd; i++) {
        PyObject *v = PyLong_FromSsize_t(dims[i] / unit);
        if (v == NULL) {
            Py_DECREF(t);
            return NULL;
        }
        PyTuple_SET_ITEM(t, i, v);
    }
    return t;
}

// Whether `cls` is torch.Tensor: a class named "Tensor" from the module "torch" or one under it.
static int is_tensor_class(PyObject *cls) {
    PyObject *name = PyObject_GetAttrString(cls, "__name__");
    PyObject *mod = name ? PyObject_GetAttrString(cls, "__module__") : NULL;
    int yes = 0;
    if (mod != NULL && PyUnicode_Check(name) && PyUnicode_Check(mod) &&
        PyUnicode_CompareWithASCIIString(name, "Tensor") == 0) {
        const char *m = PyUnicode_AsUTF8(mod);
        yes = m != NULL && (strcmp(m, "torch") == 0 || strncmp(m, "torch.", 6) == 0);
    }
    Py_XDECREF(name);
    Py_XDECREF(mod);
    PyErr_Clear();  // a class without those attributes is simply not torch's
    return yes;
}

// A torch tensor: an instance of torch.Tensor or of a subclass (nn.Parameter...). We never import
// torch, so we look for the class in the type's __mro__ by name, through public attribute lookups
// only (a type's tp_dict is NULL for builtin types from Python 3.12 on).
static int is_torch_tensor(PyObject *obj) {
    PyObject *mro = PyObject_GetAttrString((PyObject *)Py_TYPE(obj), "__mro__");
    int yes = 0;
    if (mro != NULL && PyTuple_Check(mro)) {
        for (Py_ssize_t i = 0; !yes && i < PyTuple_GET_SIZE(mro); i++) {
            yes = is_tensor_class(PyTuple_GET_ITEM(mro, i));
        }
    }
    Py_XDECREF(mro);
    PyErr_Clear();
    return yes;
}

// A torch bfloat16 tensor (NumPy has no bfloat16): its memory as an ndarray of 16-bit words. NULL
// with no error set when `det` is not bfloat16, NULL with torch's error when the view fails.
static PyObject *bfloat16_words(PyObject *det) {
    PyObject *dtype = PyObject_GetAttrString(det, "dtype");
    PyObject *name = dtype != NULL ? PyObject_Str(dtype) : NULL;
    int yes = name != NULL && PyUnicode_CompareWithASCIIString(name, "torch.bfloat16") == 0;
    Py_XDECREF(dtype);
    Py_XDECREF(name);
    PyErr_Clear();
    if (!yes) {
        return NULL;
    }
    PyObject *torch = PyImport_ImportModule("torch");   // imported already: the tensor is torch's
    PyObject *int16 = torch != NULL ? PyObject_GetAttrString(torch, "int16") : NULL;
    PyObject *view = int16 != NULL ? PyObject_CallMethod(det, "view", "O", int16) : NULL;
    PyObject *arr = view != NULL ? PyObject_CallMethod(view, "numpy", NULL) : NULL;
    Py_XDECREF(torch);
    Py_XDECREF(int16);
    Py_XDECREF(view);
    return arr;
}

// A new reference to an ndarray for obj, or NULL with TypeError. *bf16 = 1 when it holds the words of
// a torch bfloat16 tensor.
static PyArrayObject *as_array(PyObject *obj, const char *fn, const char *arg, int *bf16) {
    *bf16 = 0;
    if (PyArray_Check(obj)) {
        Py_INCREF(obj);
        return (PyArrayObject *)obj;
    }
    if (is_torch_tensor(obj)) {
        PyObject *det = PyObject_CallMethod(obj, "detach", NULL);
        PyObject *arr = det ? PyObject_CallMethod(det, "numpy", NULL) : NULL;
        if (arr == NULL && det != NULL) {   // NumPy has no bfloat16: its 16-bit words, if it is one
            PyObject *type, *value, *tb;
            PyErr_Fetch(&type, &value, &tb);
            arr = bfloat16_words(det);
            *bf16 = arr != NULL;
            if (arr == NULL && !PyErr_Occurred()) {
                PyErr_Restore(type, value, tb);   // not bfloat16: torch's own reason
            } else {
                Py_XDECREF(type);
                Py_XDECREF(value);
                Py_XDECREF(tb);
            }
        }
        Py_XDECREF(det);
        if (arr == NULL) {
            // e.g. a CUDA tensor: say which argument and keep torch's reason
            PyObject *type, *value, *tb;
            PyErr_Fetch(&type, &value, &tb);
            PyErr_Format(PyExc_TypeError, "%s(): `%s` is a torch tensor whose memory NumPy cannot view "
                         "(CPU tensors of NumPy dtypes and bfloat16 only): %S", fn, arg, value ? value : Py_None);
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
    int bf16;
    PyArrayObject *arr = as_array(obj, fn, arg, &bf16);
    if (arr == NULL) {
        return -1;
    }
    const PdDtype *dt = bf16 ? pd_dtype_bfloat16() : pd_dtype_of(arr, fn, arg);
    if (dt == NULL) {
        goto error;
    }
    if (!PyArray_IS_C_CONTIGUOUS(arr)) {
        // in the user's own terms: torch counts strides in elements (NumPy in bytes)
        int torch = !PyArray_Check(obj);
        PyObject *strides = dims_repr(PyArray_NDIM(arr), PyArray_STRIDES(arr), torch ? PyArray_ITEMSIZE(arr) : 1);
        PyObject *shape = dims_repr(PyArray_NDIM(arr), PyArray_DIMS(arr), 1);
        if (strides && shape && torch) {
            PyErr_Format(PyExc_ValueError, "%s(): `%s` must be contiguous; got a tensor of shape %R with strides "
                         "%R, in elements (use tensor.contiguous())", fn, arg, shape, strides);
        } else if (strides && shape) {
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
    if (PyArray_NBYTES(arr) > (npy_intp)PD_MPI_MAX_COUNT) {
        // Open MPI before 6 counts in ints: one call carries at most 2 GiB (as bytes, or elements)
        PyErr_Format(PyExc_ValueError, "%s(): `%s` must be at most %lld bytes on this MPI library (its calls "
                     "count in ints, and pydist sends arrays as bytes); got %zd bytes: split it, or run on an MPI "
                     "with MPI-4 large counts (MPICH 4 or later, Intel MPI, the standard ABI)", fn, arg,
                     (long long)PD_MPI_MAX_COUNT, (Py_ssize_t)PyArray_NBYTES(arr));
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

// ---------------------------------------------------------------------------------------------------
// Lists of arrays (all_gather, gather, scatter, all_to_all). MPI moves them without copying as
// bytes at displacements from the lowest array's address; every array must have the dtype and the
// element count of `like` (the call's single tensor), as torch requires.

int pd_buflist_get(PyObject *seq_obj, Py_ssize_t n, const char *fn, const char *arg, int writable,
                   const PdBuf *like, PdBufList *out) {
    memset(out, 0, sizeof *out);
    if (!PyList_Check(seq_obj) && !PyTuple_Check(seq_obj)) {
        PyErr_Format(PyExc_TypeError, "%s(): `%s` must be a list of arrays; got %.100s", fn, arg,
                     Py_TYPE(seq_obj)->tp_name);
        return -1;
    }
    // A tuple snapshot: viewing a torch tensor runs Python code, which could resize a list under us.
    PyObject *seq = PySequence_Tuple(seq_obj);
    if (seq == NULL) {
        return -1;
    }
    if (PyTuple_GET_SIZE(seq) != n) {
        PyErr_Format(PyExc_ValueError, "%s(): `%s` must have one array per rank of the group (%zd); got %zd",
                     fn, arg, n, PyTuple_GET_SIZE(seq));
        goto error;
    }
    out->n = n;
    out->bufs = PyMem_Calloc(n ? n : 1, sizeof(PdBuf));
    // counts and displacements must stay untouched until MPI completes, so they live in a bytes
    // object that the operation's owner keeps alive with the arrays
    out->meta = PyBytes_FromStringAndSize(NULL, (n ? n : 1) * (sizeof(MPI_Count) + sizeof(MPI_Aint)));
    out->keep = PyTuple_New(n + 1);
    if (out->bufs == NULL || out->meta == NULL || out->keep == NULL) {
        PyErr_NoMemory();
        goto error;
    }
    out->counts = (MPI_Count *)PyBytes_AS_STRING(out->meta);
    out->displs = (MPI_Aint *)(out->counts + (n ? n : 1));
    for (Py_ssize_t i = 0; i < n; i++) {
        char name[64];
        snprintf(name, sizeof name, "%s[%zd]", arg, i);
        if (pd_buf_get(PyTuple_GET_ITEM(seq, i), fn, name, writable, &out->bufs[i]) < 0) {
            goto error;
        }
        if (out->bufs[i].dtype != like->dtype || out->bufs[i].count != like->count) {
            PyErr_Format(PyExc_ValueError, "%s(): `%s` must have the dtype and size of the other array "
                         "(%s, %lld elements); got %s with %lld elements", fn, name, like->dtype->name,
                         (long long)like->count, out->bufs[i].dtype->name, (long long)out->bufs[i].count);
            goto error;
        }
        PyTuple_SET_ITEM(out->keep, i, Py_NewRef((PyObject *)out->bufs[i].arr));
        if (out->base == NULL || (char *)out->bufs[i].data < out->base) {
            out->base = out->bufs[i].data;
        }
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        out->counts[i] = (MPI_Count)out->bufs[i].nbytes;
        out->displs[i] = (MPI_Aint)((char *)out->bufs[i].data - out->base);
    }
    PyTuple_SET_ITEM(out->keep, n, Py_NewRef(out->meta));
    Py_DECREF(seq);
    return 0;
error:
    Py_DECREF(seq);
    pd_buflist_release(out);
    return -1;
}

void pd_buflist_release(PdBufList *l) {
    if (l->bufs != NULL) {
        for (Py_ssize_t i = 0; i < l->n; i++) {
            pd_buf_release(&l->bufs[i]);
        }
        PyMem_Free(l->bufs);
        l->bufs = NULL;
    }
    Py_CLEAR(l->meta);
    Py_CLEAR(l->keep);
}
