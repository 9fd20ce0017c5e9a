/*
 * session.h: the session's Python functions (session.c).
 */
#ifndef PYDIST_SESSION_SESSION_H
#define PYDIST_SESSION_SESSION_H

#include "core/base.h"

PyObject *pd_init(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *pd_destroy(PyObject *self, PyObject *unused);
PyObject *pd_finalize(PyObject *self, PyObject *unused);
PyObject *pd_forget_ranks(PyObject *self, PyObject *ranks);
PyObject *pd_abort(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *pd_start_and_abort(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *pd_get_rank(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *pd_get_world_size(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *pd_is_initialized(PyObject *self, PyObject *unused);
PyObject *pd_set_timeout(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *pd_set_group_timeout(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *pd_mpi_info(PyObject *self, PyObject *unused);
PyObject *pd_new_group(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *pd_destroy_group(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *pd_live_groups(PyObject *self, PyObject *unused);

#endif  // PYDIST_SESSION_SESSION_H
