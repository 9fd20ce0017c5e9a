/*
 * errors.c: MPI failures to Python exceptions, and the small argument helpers every _C function uses.
 *
 * Every MPI return code goes through pd_raise_mpi, so a failed call always surfaces as
 * DistBackendError("<call> failed: <MPI's own text> (error class N)"), never as an abort: the
 * communicators use MPI_ERRORS_RETURN (groups/group.c).
 */
#include "core/errors.h"

PyObject *pd_DistError = NULL;
PyObject *pd_DistBackendError = NULL;
PyObject *pd_DistTimeoutError = NULL;

PyObject *pd_raise_mpi(int rc, const char *call) {
    char text[MPI_MAX_ERROR_STRING + 1] = {0};
    int len = 0, cls = rc;
    if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS) {
        snprintf(text, sizeof text, "unknown MPI error %d", rc);
    }
    MPI_Error_class(rc, &cls);
    PyErr_Format(pd_DistBackendError ? pd_DistBackendError : PyExc_RuntimeError,
                 "%s failed: %s (error class %d)", call, text, cls);
    return NULL;
}

int pd_raise_mpi_int(int rc, const char *call) {
    pd_raise_mpi(rc, call);
    return -1;
}

// ---------------------------------------------------------------------------------------------------
// Positional argument helpers. The Python layer passes plain ints and bools, but _C re-validates
// everything it uses, so a direct caller gets a TypeError rather than a crash.

int pd_check_nargs(Py_ssize_t nargs, Py_ssize_t want, const char *fn) {
    if (nargs != want) {
        PyErr_Format(PyExc_TypeError, "%s() takes %zd arguments (%zd given)", fn, want, nargs);
        return -1;
    }
    return 0;
}

// An int, or an integer that says so through __index__ (numpy.int64 from a rank table): never a bool,
// a float or a 0-d array that merely converts.
int pd_arg_long(PyObject *obj, const char *fn, const char *arg, long *out) {
    if (PyBool_Check(obj) || !(PyLong_Check(obj) || (PyIndex_Check(obj) && !PyArray_Check(obj)))) {
        PyErr_Format(PyExc_TypeError, "%s(): `%s` must be an int; got %.100s",
                     fn, arg, Py_TYPE(obj)->tp_name);
        return -1;
    }
    PyObject *index = PyNumber_Index(obj);
    if (index == NULL) {
        return -1;
    }
    int overflow = 0;
    long v = PyLong_AsLongAndOverflow(index, &overflow);
    Py_DECREF(index);
    if (overflow || (v == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        PyErr_Format(PyExc_ValueError, "%s(): `%s` is out of range; got %R", fn, arg, obj);
        return -1;
    }
    *out = v;
    return 0;
}

int pd_arg_bool(PyObject *obj, const char *fn, const char *arg, int *out) {
    int v = PyObject_IsTrue(obj);
    if (v < 0) {
        return -1;
    }
    (void)fn;
    (void)arg;
    *out = v;
    return 0;
}
