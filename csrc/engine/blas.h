/* The engine's BLAS: the system's OpenBLAS, or PyPI's scipy-openblas32, whose every symbol carries a
 * scipy_ prefix (so it never clashes with another OpenBLAS in the process, NumPy's own among them).
 * setup.py defines BLAS_SYMBOL_PREFIX_SCIPY for the latter; the engine's calls keep their CBLAS names. */
#ifndef PYDIST_BLAS_H
#define PYDIST_BLAS_H

#include <cblas.h>

#ifdef BLAS_SYMBOL_PREFIX_SCIPY
#define cblas_sgemm scipy_cblas_sgemm
#define openblas_set_num_threads scipy_openblas_set_num_threads
#define openblas_get_corename scipy_openblas_get_corename
#endif

#endif
