/*
 * shm_segment.h: making a segment of shared memory that every rank of a communicator on one node maps
 * (shm_segment.c). shared_memory.c makes the session segment and the groups' channels with it.
 */
#ifndef PYDIST_SHM_SEGMENT_H
#define PYDIST_SHM_SEGMENT_H

#include <stddef.h>

#include "core/mpi_calls.h"

// The caller's interruptible wait on one request (Ctrl-C, its timeout, departed ranks): 0 completed;
// -1 with an exception set, the request given up (its buffer may still be written later).
typedef int (*PdSegmentWait)(MPI_Request *req, long group, const char *what, double timeout);

// Make and map a segment of *bytes over comm, collectively. Rank 0's *bytes and *stage (stage may be
// NULL) are broadcast and win on every rank, so all lay it out alike. commit: reserve the pages now
// (fallocate). Returns 1 made (*base mapped, *fd open on it), 0 not made (the same on every rank; why
// in `why`), -1 a wait failed (its error stands).
int pd_shm_segment_make(MPI_Comm comm, int rank, size_t *bytes, int commit, long group, const char *what,
                        double timeout, size_t *stage, char **base, int *fd, char *why, size_t whylen,
                        PdSegmentWait wait);

#endif
