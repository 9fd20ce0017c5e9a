/*
 * ring.c: the ring all-reduce of ring.h, and its reduce-scatter half alone (ring_rs_init). Step k of
 * the reduce-scatter sends segment (rank - k) to the right and reduces segment (rank - k - 1) from the
 * left into place; after R - 1 steps this rank holds segment (rank + 1) whole. Step k of the all-gather
 * sends segment (rank + 1 - k) and receives segment (rank - k) straight into place.
 */
#include "ring.h"

static MPI_Count seg_count(const RingAllreduce *r, int seg) {
    return r->n / r->size + (seg < r->n % r->size ? 1 : 0);
}

static MPI_Count seg_offset(const RingAllreduce *r, int seg) {
    MPI_Count extra = r->n % r->size;
    return (MPI_Count)seg * (r->n / r->size) + (seg < extra ? seg : extra);
}

static int mod(int a, int m) {
    return ((a % m) + m) % m;
}

MPI_Count ring_scratch_elements(MPI_Count n, int size) {
    return size > 0 ? n / size + (n % size ? 1 : 0) : n;
}

MPI_Count ring_rs_scratch_elements(MPI_Count count, int size) {
    return size > 2 ? 2 * count : 0;
}

int ring_init(RingAllreduce *r, void *buf, MPI_Count n, MPI_Datatype dtype, MPI_Op op, MPI_Comm comm, int tag,
              void *tmp, CommCount *count) {
    MPI_Aint lb;
    *r = (RingAllreduce){buf, tmp, NULL, n, dtype, op, 0, comm, 0, 1, tag, 0, 0, count};
    int rc = MPI_Type_get_extent(dtype, &lb, &r->extent);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_rank(comm, &r->rank);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_size(comm, &r->size);
    return rc;
}

int ring_rs_init(RingAllreduce *r, const void *in, void *out, MPI_Count count, MPI_Datatype dtype, MPI_Op op,
                 MPI_Comm comm, int tag, void *tmp, CommCount *comm_count) {
    int rc = ring_init(r, out, 0, dtype, op, comm, tag, tmp, comm_count);
    r->in = in;
    r->n = count * r->size;   // the input's elements (the ring's segments are its blocks)
    return rc;
}

// A reduce-scatter's step k: segment rank - k - 1 goes right (at step 0 this rank's share of it from `in`,
// then the partial reduction received the step before), and segment rank - k - 2 comes from the left, into
// the scratch (alternating, as the other half is being sent) or, at the last step (rank's own), into out.
static int rs_post(RingAllreduce *r, MPI_Request *req) {
    const int R = r->size, k = r->step;
    MPI_Count seg = r->n / R, bytes = seg * r->extent;
    const char *send_from = k == 0 ? r->in + seg_offset(r, mod(r->rank - 1, R)) * r->extent
                                   : r->tmp + (size_t)((k - 1) & 1) * (size_t)bytes;
    char *recv_to = k == R - 2 ? r->buf : r->tmp + (size_t)(k & 1) * (size_t)bytes;
    int rc = MPI_Isendrecv_c(send_from, seg, r->dtype, mod(r->rank + 1, R), r->tag, recv_to, seg, r->dtype,
                             mod(r->rank - 1, R), r->tag, r->comm, req);
    if (rc == MPI_SUCCESS) {
        r->posted = 1;
        if (r->count != NULL) {
            r->count->bytes_sent += (long long)bytes;
            r->count->messages++;
        }
    }
    return rc;
}

int ring_post(RingAllreduce *r, MPI_Request *req) {
    *req = MPI_REQUEST_NULL;
    const int R = r->size, last = r->in != NULL ? R - 1 : 2 * (R - 1);
    if (r->step >= last) {
        return MPI_SUCCESS;
    }
    if (r->in != NULL) {
        return rs_post(r, req);
    }
    const int right = mod(r->rank + 1, R), left = mod(r->rank - 1, R);
    int send_seg, recv_seg;
    char *recv_to;
    if (r->step < R - 1) {  // reduce-scatter
        int k = r->step;
        send_seg = mod(r->rank - k, R), recv_seg = mod(r->rank - k - 1, R);
        recv_to = r->tmp;
    } else {                // all-gather
        int k = r->step - (R - 1);
        send_seg = mod(r->rank + 1 - k, R), recv_seg = mod(r->rank - k, R);
        recv_to = r->buf + seg_offset(r, recv_seg) * r->extent;
    }
    MPI_Count sends = seg_count(r, send_seg);
    int rc = MPI_Isendrecv_c(r->buf + seg_offset(r, send_seg) * r->extent, sends, r->dtype, right, r->tag,
                             recv_to, seg_count(r, recv_seg), r->dtype, left, r->tag, r->comm, req);
    if (rc == MPI_SUCCESS) {
        r->posted = 1;
        if (r->count != NULL) {
            r->count->bytes_sent += (long long)(sends * r->extent);
            r->count->messages++;
        }
    }
    return rc;
}

int ring_complete(RingAllreduce *r) {
    const int R = r->size;
    int rc = MPI_SUCCESS;
    if (r->posted && r->in != NULL) {   // a reduce-scatter: what arrived, with this rank's share of it
        MPI_Count seg = r->n / R, bytes = seg * r->extent;
        char *got = r->step == R - 2 ? r->buf : r->tmp + (size_t)(r->step & 1) * (size_t)bytes;
        if (seg > 0) {
            rc = MPI_Reduce_local_c(r->in + seg_offset(r, mod(r->rank - r->step - 2, R)) * r->extent, got, seg,
                                    r->dtype, r->op);
        }
    } else if (r->posted && r->step < R - 1) {
        int seg = mod(r->rank - r->step - 1, R);
        MPI_Count c = seg_count(r, seg);
        if (c > 0) {
            rc = MPI_Reduce_local_c(r->tmp, r->buf + seg_offset(r, seg) * r->extent, c, r->dtype, r->op);
        }
    }
    r->posted = 0;
    r->step++;
    return rc;
}

int ring_allreduce(void *buf, MPI_Count n, MPI_Datatype dtype, MPI_Op op, MPI_Comm comm, int tag, void *tmp,
                   CommCount *count, RingWaitFn wait, void *wait_ctx, int *mpi_rc, const char **mpi_call) {
    RingAllreduce r;
    MPI_Request req;
    int rc = ring_init(&r, buf, n, dtype, op, comm, tag, tmp, count);
    *mpi_call = "MPI_Comm_size";
    while (rc == MPI_SUCCESS) {
        *mpi_call = "MPI_Isendrecv_c";
        if ((rc = ring_post(&r, &req)) != MPI_SUCCESS || req == MPI_REQUEST_NULL) {
            break;
        }
        if (wait(&req, wait_ctx) < 0) {
            return -1;
        }
        *mpi_call = "MPI_Reduce_local_c";
        rc = ring_complete(&r);
    }
    if (rc != MPI_SUCCESS) {
        *mpi_rc = rc;
        return -2;
    }
    return 0;
}
