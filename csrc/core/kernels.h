/*
 * kernels.h: the reduction kernels, the copies and the float16/bfloat16 conversions every path computes with
 * (kernels.c). Plain C.
 */
#ifndef PYDIST_CORE_KERNELS_H
#define PYDIST_CORE_KERNELS_H

#include <stddef.h>
#include <stdint.h>

// The element types the kernels reduce (pydist's dtype table, by kind and size).
enum {
    SHM_BOOL, SHM_I8, SHM_I16, SHM_I32, SHM_I64, SHM_U8, SHM_U16, SHM_U32, SHM_U64,
    SHM_F16, SHM_F32, SHM_F64, SHM_C64, SHM_C128, SHM_BF16, SHM_DTYPES
};
// The ops, in torch's order (the same values as core/dtypes.h's PD_OP_*).
enum { SHM_SUM = 0, SHM_AVG = 1, SHM_PRODUCT = 2, SHM_MIN = 3, SHM_MAX = 4, SHM_BAND = 5, SHM_BOR = 6,
       SHM_BXOR = 7 };

// float16 <-> float32, bit-exact with NumPy; bfloat16 <-> float32, rounding as torch does.
float pd_half_to_float(uint16_t h);
uint16_t pd_float_to_half(float f);
float pd_bf16_to_float(uint16_t h);
uint16_t pd_float_to_bf16(float f);

// acc[0..n) = acc[i] (op) in[i], the kernels' one pairwise step (not AVG's division): dtypes.c's MPI
// user ops for float16/bfloat16 and floating MIN/MAX reduce with it too, so every path computes alike.
void shm_combine(void *acc, const void *in, size_t n, int dtype, int op);

// outs[0..n_outs)[0..len) = the reduction of ins[0..R)[0..len) with op, in rank order (AVG divides by R).
void shm_reduce(char *const *outs, int n_outs, char *const *ins, int R, size_t len, int dtype, int op);

// A copy out of a small collective's slot (libc's memcpy: shm.c says why).
void shm_copy(void *dst, const void *src, size_t n);

// Names for messages.
const char *shm_dtype_name(int dtype);
const char *shm_op_name(int op);
size_t shm_itemsize(int dtype);
// The shared-memory paths' large copies: 64-byte moves that prefetch what they read (kernels.c says why).
void shm_copy_lines(char *restrict dst, const char *restrict src, size_t n);

#endif  // PYDIST_CORE_KERNELS_H
