/*
 * numpy_api.c: the one file that defines NumPy's shared C API table (PD_IMPORT_NUMPY; core/base.h names
 * it), filled in at module exec. Every other file uses the table through base.h.
 */
#define PD_IMPORT_NUMPY
#include "core/base.h"

int pd_import_numpy(void) {
    import_array1(-1);
    return 0;
}
