/*
 * compress.h: gradient compression with error feedback, below the strategies. A strategy hands what it
 * would send (gradients, pushed updates, weight differences) to a Compressor, which adds this rank's
 * residual (what earlier steps did not send), encodes, and keeps as the new residual what the encoding
 * lost, so that nothing is lost for good, only late (Seide et al. 2014; Karimireddy et al. 2019).
 *
 * Compressors, as the command line spells them:
 *   none         nothing changes (no residual);
 *   fp16, bf16   each value cast to 16 bits (round to nearest even); sums are taken in float32;
 *   topk:R       the fraction R (0 < R <= 1) of the entries largest in magnitude, as (index, value);
 *   sign         one bit per entry and one scale per chunk of SIGN_CHUNK entries, the chunk's mean
 *                magnitude (EF-SignSGD: the scaled sign keeps the chunk's L1 norm);
 *   powersgd:K   every matrix-shaped block (a layer's weight) as a rank-K product P Q^T from one power
 *                iteration warm-started from the previous step's Q (Vogels et al. 2019); the other
 *                entries (biases) go as they are.
 *
 * Two ways to send. encode/decode: one rank's payload, self-contained (a worker to a server; powersgd
 * then factors this rank's own matrices). exchange.c's compress_allreduce_sum: the sum over a group, for
 * allreduce and ring (fp16/bf16/topk/sign: every rank's payload to every rank, each summed in float32 in
 * rank order, so every rank gets bitwise the same sum; powersgd: Vogels' all-reduce of P and then of Q).
 *
 * Files: compress.c (names, state, residual, dispatch), cast16.c, topk.c, sign.c, powersgd.c (the
 * encodings), exchange.c (the sum over a group, on strategies/comm.h). Plain C, no Python.h.
 */
#ifndef PYDIST_COMPRESS_COMPRESS_H
#define PYDIST_COMPRESS_COMPRESS_H

#include <stddef.h>
#include <stdint.h>

#include "encodings.h"

typedef enum { COMPRESS_NONE, COMPRESS_FP16, COMPRESS_BF16, COMPRESS_TOPK, COMPRESS_SIGN, COMPRESS_POWERSGD } CompressKind;

typedef struct {
    CompressKind kind;
    double ratio;   // topk: the fraction of entries sent
    int rank;       // powersgd: K
} CompressSpec;


// A matrix-shaped block of the flat buffer (row-major, rows x cols), for powersgd.
typedef struct {
    long offset, rows, cols;
} CompressMatrix;

typedef struct {
    CompressSpec spec;
    long n;                 // the buffer's entries
    float *residual;        // [n]: what was not sent yet (NULL for none)
    // powersgd: the matrices (whole ones inside [0, n)), their warm-start Q (cols x K each, one block)
    int num_matrices;
    CompressMatrix *matrices;
    float *q;
    long q_len;
    float *work;            // topk: the magnitudes (n); powersgd: one matrix's P (rows x K)
    long work_len;
    uint64_t draws;         // powersgd: the generator of Q's draws (its first and any refresh)
    // compress_buffer's block: what MPI sends from and receives into. It lives as long as the compressor
    // (whose owner a request given up is parked with), so a failed wait never leaves MPI a freed block.
    void *buffer;
    size_t buffer_bytes;
    // Why the last compressed sum refused another rank's payload, or the ranks' compressors disagreed:
    // the text its comm_fail names as the failed call, so it lives as long as the compressor; empty when
    // none was refused.
    char refused[400];
    // compress_allreduce_sum first checks that every rank of the group has this spec on this buffer (one
    // small all-reduce): 1 from compressor_create; 0 where the caller agreed it once for the compressor's
    // life (a strategy, whose whole configuration every rank agrees on when it is set)
    int agree_each_sum;
} Compressor;

// Parse `text` ("fp16", "topk:0.01", ...). 0, or -1 with a message in err.
int compress_parse(const char *text, CompressSpec *spec, char *err, size_t errlen);
// The kind's name alone, without its parameters ("topk").
const char *compress_kind_name(CompressKind kind);
// The spec as the command line spells it, into buf.
void compress_name(const CompressSpec *spec, char *buf, size_t len);

// State for a buffer of n entries; `matrices` (copied) say which blocks powersgd factors; Q starts from
// `seed` (the same on every rank). 0, or -1 out of memory.
int compressor_create(Compressor *z, const CompressSpec *spec, long n, const CompressMatrix *matrices,
                      int num_matrices, uint64_t seed);
void compressor_free(Compressor *z);

// The state a checkpoint keeps (the residual, powersgd's warm start): its bytes (0 for none), and the
// state written to / read from a block of that many bytes.
size_t compress_state_bytes(const Compressor *z);
void compress_state_save(const Compressor *z, void *out);
void compress_state_load(Compressor *z, const void *in);

// A block of at least `bytes` for payloads and factors in flight, kept (and grown, never shrunk) with the
// compressor. NULL: out of memory.
void *compress_buffer(Compressor *z, size_t bytes);

// What every rank of a compressed sum must have alike, as numbers (compress_fingerprint): the kind, topk's
// ratio (its bits), powersgd's rank, the buffer's entries, one payload's bytes, and a hash of powersgd's
// matrices. compress_disagreement says in words how the smallest and largest values over the ranks differ.
enum { COMPRESS_FINGERPRINT = 6 };
void compress_fingerprint(const Compressor *z, uint64_t out[COMPRESS_FINGERPRINT]);
void compress_disagreement(const uint64_t *lo, const uint64_t *hi, int field, char *buf, size_t len);

// Bytes of one rank's payload for the entries [lo, lo + len) of the buffer.
size_t compress_payload_bytes(const Compressor *z, long lo, long len);

// One rank's payload for x = in[0..len) (entries [lo, lo + len) of the buffer) plus their residual;
// the residual becomes x minus what the payload decodes to. payload: compress_payload_bytes of it.
void compress_encode(Compressor *z, long lo, const float *in, long len, void *payload);
// Whether `bytes` bytes at `payload`, from outside (another rank, a caller), are a payload that
// compress_encode could have written for the entries [lo, lo + len): the length, topk's indices (inside
// [0, len), increasing), sign's scales (not negative; a NaN only as the one quiet NaN) and its unused
// bits (zero). fp16/bf16, powersgd and none: every bit pattern is a value (NaN and infinities pass as
// the plain all-reduce passes them). 0, or -1 with err saying what is wrong.
int compress_payload_check(const Compressor *z, long lo, long len, const void *payload, size_t bytes, char *err,
                           size_t errlen);
// out[0..len) += scale * what `payload` (compress_payload_bytes of it, for z's spec, lo and len) holds, once
// compress_payload_check has passed it (bytes from outside are checked first, always).
void compress_decode_add_checked(const Compressor *z, long lo, const void *payload, long len, float scale,
                                 float *out);
// sum[0..len) = the sum of `count` payloads of `bytes` each (one per rank, in rank order), every one
// checked before any is added: 0; or -1, sum untouched, with z->refused saying which payload is malformed
// and why ("<what> (<who> i sent ...)"), for the caller's comm_fail.
int compress_decode_sum(Compressor *z, long lo, long len, const char *payloads, size_t bytes, int count,
                        const char *what, const char *who, float *sum);

#endif  // PYDIST_COMPRESS_COMPRESS_H
