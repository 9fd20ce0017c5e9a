/*
 * engine_py.h: the training engine's Python type and functions (engine_py.c over csrc/engine/ and
 * csrc/strategies/).
 */
#ifndef PYDIST_API_ENGINE_PY_H
#define PYDIST_API_ENGINE_PY_H

#include "core/base.h"

int pd_engine_type_init(PyObject *module);
PyObject *pd_load_idx(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *pd_epoch_permutation(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *pd_set_blas_threads(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *pd_blas_core(PyObject *self, PyObject *unused);
PyObject *pd_sgemm_seconds(PyObject *self, PyObject *const *args, Py_ssize_t nargs);

#endif  // PYDIST_API_ENGINE_PY_H
