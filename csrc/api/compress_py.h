/*
 * compress_py.h: _C.Compressor (compress_py.c over csrc/compress/).
 */
#ifndef PYDIST_API_COMPRESS_PY_H
#define PYDIST_API_COMPRESS_PY_H

#include "core/base.h"

int pd_compressor_type_init(PyObject *module);

#endif  // PYDIST_API_COMPRESS_PY_H
