/*
 * progress.h: the progress engine's registry of paths (progress.c): all the wait loop, Work and
 * the session know of the paths.
 */
#ifndef PYDIST_PROGRESS_PROGRESS_H
#define PYDIST_PROGRESS_PROGRESS_H

#include "core/base.h"

// A path (request.c, ring_path.c, shared_memory.c, persistent.c) registers once, at module exec.
typedef struct {
    const char *name;
    // Move along what no thread waits for. GIL held, never raises; called when every pydist wait
    // starts and after each of its slices (about 2 ms), and by Work.is_completed. NULL: nothing.
    void (*progress)(void);
    // What the path makes with a new group, every member being in its (collective) creation: 0, or -1
    // raised (the group is not made). NULL: nothing.
    int (*group_setup)(long group, const char *fn);
    // The group's communicators are going (destroy, exit): give up what is in flight on it. Called
    // again harmlessly. NULL: nothing.
    void (*group_release)(long group, unsigned generation);
} PdPath;
int pd_path_register(const PdPath *path);
void pd_progress_all(void);
int pd_paths_group_setup(long group, const char *fn);
void pd_paths_group_release(long group, unsigned generation);

#endif  // PYDIST_PROGRESS_PROGRESS_H
