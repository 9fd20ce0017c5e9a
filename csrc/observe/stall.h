/*
 * stall.h: the stall inspector (stall.c).
 */
#ifndef PYDIST_OBSERVE_STALL_H
#define PYDIST_OBSERVE_STALL_H

#include <stddef.h>
#include <stdint.h>

#include "groups/group.h"


// The stall inspector (stall.c): each rank's current call on its host's shared-memory board, and a
// warning (once per wait) naming the ranks a wait longer than PYDIST_STALL_WARN seconds still waits for.
// shared_memory.c, at init: the board's slots, `stride` bytes apart, one per rank of the node (in node
// rank order, with their world ranks), this rank's at node_rank.
void pd_stall_board_attach(void *slots, size_t stride, int node_size, int node_rank, const int *node_world_ranks);
void pd_stall_board_detach(void);
// pd_call_begin: the call, its group's id and its number among the group's collectives since the group
// was made (PdCall.board_seq, never renumbered), a point-to-point call's peer (else -1).
void pd_stall_note_call(const char *name, uint64_t gid, unsigned long board_seq, int peer);
void pd_stall_note_return(void);               // pd_call_end
void pd_stall_check(const PdOp *op, double wait_started);   // progress/op.c's departed_check, every slice
void pd_stall_read_env(void);                  // at init

#endif  // PYDIST_OBSERVE_STALL_H
