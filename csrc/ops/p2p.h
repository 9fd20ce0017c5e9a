/*
 * p2p.h: point-to-point calls (p2p.c).
 */
#ifndef PYDIST_OPS_P2P_H
#define PYDIST_OPS_P2P_H

#include "core/base.h"

PyObject *pd_send(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *pd_recv(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *pd_isend(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *pd_irecv(PyObject *self, PyObject *const *args, Py_ssize_t nargs);

#endif  // PYDIST_OPS_P2P_H
