/*
 * rng.h: splitmix64, the engine's one random generator (data order, initial weights): tiny, good
 * enough for shuffling and initialisation, and identical on every rank and platform.
 */
#ifndef PYDIST_ENGINE_RNG_H
#define PYDIST_ENGINE_RNG_H

#include <stdint.h>

static inline uint64_t splitmix64(uint64_t *state) {
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

#endif  // PYDIST_ENGINE_RNG_H
