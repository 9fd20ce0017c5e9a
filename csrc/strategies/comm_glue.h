/*
 * comm_glue.h: the strategies' and compressors' communication (strategies/comm.h's Comm) made the
 * pydist way: every wait through pydist's wait loop (polling, Ctrl-C, timeouts, dead ranks), MPI
 * called with the GIL held, the GIL released in between (comm_glue.c).
 */
#ifndef PYDIST_COMM_GLUE_H
#define PYDIST_COMM_GLUE_H

#include "core/base.h"
#include "strategies/comm.h"

// What a Comm's callbacks need while the caller runs without the GIL; the Comm's ctx points to one.
typedef struct {
    PyObject *owner;          // whose buffers MPI reads and writes: kept alive with a request given up
    long group;               // for the wait: which ranks must be alive
    PyThreadState *released;  // the thread state saved while the GIL is released
    int survivable;           // group ranks below this may die without ending a wait (async workers under
                              // PYDIST_SURVIVE, during a train_steps call); 0: none
} PdSyncContext;

// A Comm over `comm` (rank of size) whose callbacks are these; set its ctx to a PdSyncContext.
Comm pd_comm_for(MPI_Comm comm, int rank, int size);

#endif  // PYDIST_COMM_GLUE_H
