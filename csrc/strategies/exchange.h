/*
 * exchange.h: the compressed sum over a group (exchange.c), for the strategies that all-reduce.
 */
#ifndef PYDIST_COMPRESS_EXCHANGE_H
#define PYDIST_COMPRESS_EXCHANGE_H

#include "compress/compress.h"
#include "strategies/comm.h"

// buf[0..n) becomes its sum over the Comm's ranks, as z compresses it (bitwise the same on every rank),
// z's residual keeping what was not sent. ring: all-reduces go over our ring, else MPI's. The comm.h
// return codes.
int compress_allreduce_sum(Compressor *z, Comm *c, float *buf, long n, int ring);

#endif  // PYDIST_COMPRESS_EXCHANGE_H
