/*
 * collectives.h: the collectives (collectives.c).
 */
#ifndef PYDIST_OPS_COLLECTIVES_H
#define PYDIST_OPS_COLLECTIVES_H

#include "core/base.h"

PyObject *pd_barrier(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *pd_broadcast(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *pd_all_reduce(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *pd_reduce(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *pd_all_gather_into_tensor(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *pd_all_gather(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *pd_gather(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *pd_scatter(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *pd_reduce_scatter_tensor(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *pd_reduce_scatter(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *pd_all_to_all_single(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *pd_all_to_all(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *pd_set_validate_only(PyObject *self, PyObject *const *args, Py_ssize_t nargs);

#endif  // PYDIST_OPS_COLLECTIVES_H
