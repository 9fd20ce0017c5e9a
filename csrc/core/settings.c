/*
 * settings.c: byte counts and seconds from the environment. init_process_group checks every PYDIST_* setting C reads
 * first (session.c), so a malformed one is a ValueError before anything starts; the paths then read
 * theirs here.
 */
#include <stdlib.h>

#include "core/settings.h"

int pd_parse_bytes(const char *v, unsigned long long *out) {
    unsigned long long x = 0;
    for (const char *c = v; *c; c++) {
        if (*c < '0' || *c > '9' || (x = x * 10 + (unsigned long long)(*c - '0')) > PD_ENV_BYTES_MAX) {
            return -1;
        }
    }
    *out = x;
    return *v ? 0 : -1;
}

int pd_parse_seconds(const char *v, double *out) {
    const char *c = v;
    int digits = 0, point = 0;
    for (; *c; c++) {
        if (*c >= '0' && *c <= '9') {
            digits++;
        } else if (*c == '.' && !point && digits > 0 && c[1] != 0) {
            point = 1;
        } else {
            return -1;
        }
    }
    if (digits == 0) {
        return -1;
    }
    double x = strtod(v, NULL);   // (the C locale's point: Python never sets LC_NUMERIC)
    if (!(x <= PD_ENV_SECONDS_MAX)) {
        return -1;
    }
    *out = x;
    return 0;
}

size_t pd_env_bytes(const char *name, size_t dflt) {
    const char *v = getenv(name);
    unsigned long long x;
    // init refused a malformed value; one set since (init reads most once) is ignored, as unset
    return v != NULL && pd_parse_bytes(v, &x) == 0 ? (size_t)x : dflt;
}
