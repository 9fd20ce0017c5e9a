/*
 * child.h: a process forked from a rank (child.c).
 */
#ifndef PYDIST_GROUPS_CHILD_H
#define PYDIST_GROUPS_CHILD_H

#include "core/base.h"

extern int pd_mpi_inherited;             // forked from a process whose MPI had started: not ours to use
int pd_child_register(void);             // module exec: the pthread_atfork handler that sets it
int pd_child_refuse(const char *fn);     // raise DistError ("a child process of rank N") and return -1
int pd_child_check_init(void);           // before MPI_Init: -1 with DistError raised in such a child
PyObject *pd_parent_rank(PyObject *self, PyObject *unused);   // _C.parent_rank

#endif  // PYDIST_GROUPS_CHILD_H
