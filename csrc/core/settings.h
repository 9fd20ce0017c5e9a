/*
 * settings.h: pydist's byte-count and seconds settings from the environment, parsed strictly (settings.c).
 */
#ifndef PYDIST_CORE_SETTINGS_H
#define PYDIST_CORE_SETTINGS_H

#include <stddef.h>

// 0 and *out, or -1 when v is not a byte count: decimal digits alone (no sign, which strtoull would wrap
// to a huge count; no spaces, suffix or exponent) up to PD_ENV_BYTES_MAX, room to multiply by any node's
// ranks without overflow.
#define PD_ENV_BYTES_MAX ((unsigned long long)1 << 40)   // 1 TiB
int pd_parse_bytes(const char *v, unsigned long long *out);

// 0 and *out, or -1 when v is not a number of seconds: decimal digits, optionally a point and more digits
// ("60", "0.5"; no sign, exponent, "inf" or hex, which strtod alone would take), at most PD_ENV_SECONDS_MAX.
#define PD_ENV_SECONDS_MAX 1e9
int pd_parse_seconds(const char *v, double *out);

// A byte count from the environment: `dflt` when unset or empty. init_process_group has refused
// a malformed one (a ValueError naming it); one set malformed since is taken as unset.
size_t pd_env_bytes(const char *name, size_t dflt);

#endif  // PYDIST_CORE_SETTINGS_H
