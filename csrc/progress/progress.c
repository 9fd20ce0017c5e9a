/*
 * progress.c: the progress engine. What the wait loop (wait.c), the Work type (work.c) and the session
 * (session/session.c) know of the paths a call can take, and nothing more.
 *
 * A path is the plain MPI request (request.c), our ring (ring_path.c), the shared-memory collectives
 * (shared_memory.c), the cached persistent requests (persistent.c), or the private communicator they talk
 * on (private_comm.c). Each registers itself once, at
 * module exec, with three hooks:
 *   progress       move along what no thread is waiting for (rings' next steps, small collectives
 *                  whose peers have posted, persistent calls waiting for their request): called with
 *                  the GIL held when every pydist wait starts and after each of its slices, so any
 *                  wait moves every path (an operation nobody waits for still completes, as MPI's do);
 *   group_setup    what the path makes with a group while every member is in its (collective)
 *                  creation, so that no call on the group ever waits for its peers to set something up;
 *   group_release  the group's communicators are going: give up what is in flight on it.
 * and each of its pending operations is a PdPending (test, wait, abandon) that a Work holds.
 *
 * Arrows go one way: the paths call down into this file, wait.c, work.c and op.c; none of these
 * calls a path by name.
 */
#include "progress/progress.h"

#define MAX_PATHS 8

static const PdPath *paths[MAX_PATHS];
static int n_paths = 0;

int pd_path_register(const PdPath *path) {
    for (int i = 0; i < n_paths; i++) {
        if (paths[i] == path) {
            return 0;   // the module executed again (a second interpreter): registered already
        }
    }
    if (n_paths == MAX_PATHS) {
        PyErr_Format(PyExc_RuntimeError, "pydist: too many paths registered (%d)", MAX_PATHS);
        return -1;
    }
    paths[n_paths++] = path;
    return 0;
}

void pd_progress_all(void) {
    for (int i = 0; i < n_paths; i++) {
        if (paths[i]->progress != NULL) {
            paths[i]->progress();
        }
    }
}

int pd_paths_group_setup(long group, const char *fn) {
    for (int i = 0; i < n_paths; i++) {
        if (paths[i]->group_setup != NULL && paths[i]->group_setup(group, fn) < 0) {
            return -1;
        }
    }
    return 0;
}

// In reverse order of registration, as destructors run: each path gives up what it has in flight before
// what it was set up on goes (the private communicator, registered first, goes last), and all of it
// before the group's communicator (the session frees it after this returns).
void pd_paths_group_release(long group, unsigned generation) {
    for (int i = n_paths - 1; i >= 0; i--) {
        if (paths[i]->group_release != NULL) {
            paths[i]->group_release(group, generation);
        }
    }
}
