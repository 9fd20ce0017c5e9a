/*
 * pipeline.c: model parallelism. The model's layers are split into P contiguous stages over ranks;
 * with R = P x D ranks, rank p * D + d runs stage p of replica d (a replica's stages are D ranks
 * apart, a stage's replicas neighbours, as Megatron-LM lays them out). Each batch of a replica is cut
 * into M micro-batches; activations go forward and their gradients back with nonblocking point-to-point,
 * every wait through the caller's wait loop. Two schedules:
 *   gpipe  all M forwards, then all M backwards (a stage holds the activations of all M);
 *   1f1b   PipeDream-flush: stage p runs min(P - 1 - p, M) forwards, then alternates one forward and
 *          one backward, then drains: it holds at most min(P - p, M) micro-batches' activations.
 * Both compute the same gradients, in the same order: the sum over micro-batches, each the gradient of
 * its mean loss / M, is the gradient of the batch's mean loss, as one process with the whole batch
 * takes it. A stage computes and updates only its layers' slice of the flat buffers, with its own
 * gradient accumulator; the replicas of a stage then all-reduce that slice (a communicator per stage)
 * and take the same SGD step. The last stage reads the labels itself.
 *
 * Micro-batch j lives in slot j % slots (slots = M or min(P - p, M)): the micro-batches in flight are
 * always consecutive, so slots are taken and freed in order. Receives are posted as early as a slot
 * allows: an input as soon as its slot is free, an output's gradient right after the output is sent.
 * Every message of a step is received within that step, and every send is complete when it returns.
 * On the timeline (args stage: this stage, micro: the micro-batch) each micro-batch's compute is a
 * "micro-batch forward" or "micro-batch backward" (cat "compute", its batch's gathering and the loss
 * included); waiting for a neighbour's activations or gradients is "stage recv", and posting a send or
 * waiting for one to complete (before its slot is reused, or at the step's end) "stage send" (cat
 * "sync"). Then "gradient sync" (the all-reduce over replicas, args TL_EXCHANGE and the stage) and
 * "update".
 * Its hooks are the table at the end (hooks.h); the communication is comm.c's.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm.h"
#include "engine/data.h"
#include "engine/model.h"
#include "engine/sgd.h"
#include "hooks.h"

enum { TAG_ACT = 9, TAG_GRAD = 10, TAG_GATHER = 11 };
enum { F = 0, B = 1, UPDATE = 2 };   // PipelineEvent kinds
enum { RECV_IN, RECV_GRAD, SEND_OUT, SEND_DIN };

typedef struct {
    float **act;         // [layers + 1]: act[0] the stage's input, act[k + 1] layer k's output
    float **cols;        // [layers]: convolutions' im2col, kept from forward for backward
    int32_t **argmax;    // [layers]: max-pools' choices
    float *dout;         // the gradient of the output: received, or the loss's on the last stage
    float *din;          // the gradient of the input, sent back (stages > 0)
    int32_t *labels;     // last stage
    MPI_Request req[4];  // RECV_IN, RECV_GRAD, SEND_OUT, SEND_DIN
    int micro;           // the micro-batch it holds, or -1
} Slot;

struct Pipeline {
    int P, p, D, d, M, schedule;
    int lo, hi, layers;          // this stage: model layers [lo, hi)
    long *off;                   // [P + 1]: stage q owns parameters [off[q], off[q + 1])
    long len;                    // off[p + 1] - off[p]
    int prev, next;              // neighbour ranks in the strategy's communicator, -1 at the ends
    MPI_Comm dp_comm;            // this stage's D replicas (MPI_COMM_NULL when D = 1)
    const Model *model;
    int mb, nslots;              // slots for micro-batches of mb examples (allocated at the first step)
    Slot *slots;
    float **dact;                // [layers + 1]: backward's scratch between the stage's layers
    float *scratch;              // a convolution's GEMM output
    float *grads;                // [len]: the step's gradient, summed over micro-batches
    int in_flight, peak;
    PipelineStats stats;
    PipelineEvent *trace;        // [2 M + 1]: the last step's forwards, backwards and update
    int trace_len;
};

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static const Layer *layer(const Pipeline *pl, int k) {
    return &pl->model->layers[pl->lo + k];
}

// The span from t of this stage's micro-batch j on the timeline (t == 0: not recording).
static inline void tl_micro(const Pipeline *pl, int64_t t, const char *cat, const char *name, int j) {
    if (t) pd_tl_span(t, cat, name, 2, PD_TL_INT("stage", pl->p), PD_TL_INT("micro", j));
}

// ---------------------------------------------------------------------------------------------------
// Set-up

// Its messages name the strategy themselves: there is one pipeline.
static int pipeline_create(Strategy *s, const Model *m, const char *name, char *err, size_t errlen) {
    (void)name;
    const StrategyConfig *cfg = &s->cfg;
    const int R = s->comm.size, P = cfg->stages, L = m->num_layers;
    if (P < 1 || R % P != 0) {
        snprintf(err, errlen, "strategy 'pipeline': %d stages must divide the group's %d ranks (R = stages x "
                 "replicas)", P, R);
        return -1;
    }
    if (P > L) {
        snprintf(err, errlen, "strategy 'pipeline': %d stages but the model has only %d layers", P, L);
        return -1;
    }
    if (cfg->micro_batches < 1) {
        snprintf(err, errlen, "strategy 'pipeline': micro_batches must be >= 1; got %d", cfg->micro_batches);
        return -1;
    }
    if (cfg->split == NULL || cfg->split[0] != 0 || cfg->split[P] != L) {
        snprintf(err, errlen, "strategy 'pipeline': the split must run from layer 0 to layer %d", L);
        return -1;
    }
    for (int q = 0; q < P; q++) {
        if (cfg->split[q + 1] <= cfg->split[q]) {
            snprintf(err, errlen, "strategy 'pipeline': stage %d gets no layers (the split's boundaries must "
                     "strictly increase)", q);
            return -1;
        }
    }
    Pipeline *pl = calloc(1, sizeof(Pipeline));
    if (pl == NULL || (pl->off = malloc(sizeof(long) * (size_t)(P + 1))) == NULL) {
        free(pl);
        snprintf(err, errlen, "out of memory for the pipeline");
        return -1;
    }
    s->pipe = pl;
    pl->model = m;
    pl->P = P, pl->D = R / P, pl->M = cfg->micro_batches, pl->schedule = cfg->schedule;
    pl->p = s->comm.rank / pl->D, pl->d = s->comm.rank % pl->D;
    pl->lo = cfg->split[pl->p], pl->hi = cfg->split[pl->p + 1], pl->layers = pl->hi - pl->lo;
    for (int q = 0; q <= P; q++) {   // a stage's parameters: from its first layer's to the next stage's
        pl->off[q] = cfg->split[q] < L ? m->layers[cfg->split[q]].weight_offset : m->num_params;
    }
    pl->len = pl->off[pl->p + 1] - pl->off[pl->p];
    pl->prev = pl->p > 0 ? s->comm.rank - pl->D : -1;
    pl->next = pl->p < P - 1 ? s->comm.rank + pl->D : -1;
    pl->dp_comm = MPI_COMM_NULL;
    s->workers = pl->D;
    if (pl->D > 1) {   // collective over the group, right after its communicator was duplicated
        int rc = MPI_Comm_split(s->comm.comm, pl->p, pl->d, &pl->dp_comm);
        if (rc != MPI_SUCCESS) {
            pl->dp_comm = MPI_COMM_NULL;
            snprintf(err, errlen, "MPI_Comm_split failed (error %d) making the stages' communicators", rc);
            return -1;
        }
    }
    pl->grads = calloc((size_t)(pl->len > 0 ? pl->len : 1), sizeof(float));
    pl->trace = calloc((size_t)(2 * pl->M + 1), sizeof(PipelineEvent));
    pl->stats.stage = pl->p, pl->stats.replica = pl->d, pl->stats.first_layer = pl->lo, pl->stats.last_layer = pl->hi;
    pl->stats.parameters = pl->len;
    if (pl->grads == NULL || pl->trace == NULL) {
        snprintf(err, errlen, "out of memory for the pipeline");
        return -1;
    }
    return 0;
}

static void free_slots(Pipeline *pl) {
    for (int i = 0; pl->slots != NULL && i < pl->nslots; i++) {
        Slot *sl = &pl->slots[i];
        for (int k = 0; k <= pl->layers; k++) {
            if (sl->act) free(sl->act[k]);
            if (k < pl->layers && sl->cols) free(sl->cols[k]);
            if (k < pl->layers && sl->argmax) free(sl->argmax[k]);
        }
        free(sl->act), free(sl->cols), free(sl->argmax), free(sl->dout), free(sl->din), free(sl->labels);
    }
    free(pl->slots);
    pl->slots = NULL;
    for (int k = 0; pl->dact != NULL && k <= pl->layers; k++) free(pl->dact[k]);
    free(pl->dact);
    free(pl->scratch);
    pl->dact = NULL, pl->scratch = NULL;
    pl->nslots = 0, pl->mb = 0;
}

static void pipeline_free(Strategy *s) {
    Pipeline *pl = s->pipe;
    if (pl == NULL) return;
    free_slots(pl);
    int finalized = 1;
    MPI_Finalized(&finalized);
    if (pl->dp_comm != MPI_COMM_NULL && !finalized) MPI_Comm_free(&pl->dp_comm);
    free(pl->off), free(pl->grads), free(pl->trace);
    free(pl);
    s->pipe = NULL;
}

// Zeroed memory, its size added to *total (what the stage holds is measured, not estimated).
static void *counted(size_t bytes, long *total) {
    *total += (long)bytes;
    return calloc(1, bytes > 0 ? bytes : 1);
}

// The slots and scratch for micro-batches of mb examples. Returns 0, or -1 (out of memory).
static int alloc_slots(Pipeline *pl, int mb) {
    free_slots(pl);
    const int nslots = pl->schedule == SCHEDULE_1F1B ? (pl->P - pl->p < pl->M ? pl->P - pl->p : pl->M) : pl->M;
    const int nl = pl->layers, first = pl->p == 0, last = pl->p == pl->P - 1;
    const size_t f = sizeof(float);
    pl->mb = mb, pl->nslots = nslots;
    pl->slots = calloc((size_t)nslots, sizeof(Slot));
    pl->dact = calloc((size_t)nl + 1, sizeof(float *));
    if (pl->slots == NULL || pl->dact == NULL) return -1;
    long scratch = 0, work = 0;
    for (int k = 1; k < nl; k++) {   // dact[0] and dact[nl] are a slot's din and dout
        if ((pl->dact[k] = counted(f * (size_t)mb * (size_t)layer_input_floats(layer(pl, k)), &work)) == NULL) {
            return -1;
        }
    }
    for (int k = 0; k < nl; k++) {
        if (layer(pl, k)->spec.type == LAYER_CONV2D) {
            long need = conv_tmp_floats(&layer(pl, k)->conv, mb);
            scratch = need > scratch ? need : scratch;
        }
    }
    if ((pl->scratch = counted(f * (size_t)scratch, &work)) == NULL) return -1;
    pl->stats.workspace_bytes = work;
    for (int i = 0; i < nslots; i++) {
        Slot *sl = &pl->slots[i];
        long bytes = 0;
        sl->micro = -1;
        for (int r = 0; r < 4; r++) sl->req[r] = MPI_REQUEST_NULL;
        sl->act = calloc((size_t)nl + 1, sizeof(float *));
        sl->cols = calloc((size_t)nl, sizeof(float *));
        sl->argmax = calloc((size_t)nl, sizeof(int32_t *));
        if (sl->act == NULL || sl->cols == NULL || sl->argmax == NULL) return -1;
        if ((sl->act[0] = counted(f * (size_t)mb * (size_t)layer_input_floats(layer(pl, 0)), &bytes)) == NULL) {
            return -1;
        }
        for (int k = 0; k < nl; k++) {
            const Layer *Lk = layer(pl, k);
            if ((sl->act[k + 1] = counted(f * (size_t)mb * (size_t)layer_output_floats(Lk), &bytes)) == NULL) {
                return -1;
            }
            if (Lk->spec.type == LAYER_CONV2D &&
                (sl->cols[k] = counted(f * (size_t)conv_cols_floats(&Lk->conv, mb), &bytes)) == NULL) {
                return -1;
            }
            if (Lk->spec.type == LAYER_MAXPOOL2D &&
                (sl->argmax[k] = counted(sizeof(int32_t) * (size_t)mb * (size_t)layer_output_floats(Lk),
                                         &bytes)) == NULL) {
                return -1;
            }
        }
        if ((sl->dout = counted(f * (size_t)mb * (size_t)layer_output_floats(layer(pl, nl - 1)), &bytes)) == NULL ||
            (!first && (sl->din = counted(f * (size_t)mb * (size_t)layer_input_floats(layer(pl, 0)), &bytes)) ==
                           NULL) ||
            (last && (sl->labels = counted(sizeof(int32_t) * (size_t)mb, &bytes)) == NULL)) {
            return -1;
        }
        pl->stats.slot_bytes = bytes;   // the same for every slot
    }
    pl->stats.slots = nslots;
    return 0;
}

// ---------------------------------------------------------------------------------------------------
// One step

typedef struct {
    Strategy *s;
    Pipeline *pl;
    const Dataset *ds;
    const int *perm;
    int offset;            // the replica's batch: perm[offset .. offset + M mb)
    double loss;
    int correct;
} Step;

static int wait_idle(Step *st, MPI_Request *req) {
    double t0 = now();
    int rc = comm_wait(&st->s->comm, req);
    st->pl->stats.idle += now() - t0;
    return rc;
}

// A slot for micro-batch j: the one it had if a receive was posted into it, else its turn's, once the
// sends of the micro-batch it last held are complete (they are, by then: the step receives them).
static int take_slot(Step *st, int j, Slot **out) {
    Pipeline *pl = st->pl;
    Slot *sl = &pl->slots[j % pl->nslots];
    if (sl->micro != j) {
        int rc;
        int64_t t = pd_tl_begin();   // a span only when sends were in flight
        if (t && sl->req[SEND_OUT] == MPI_REQUEST_NULL && sl->req[SEND_DIN] == MPI_REQUEST_NULL) t = 0;
        if ((rc = wait_idle(st, &sl->req[SEND_OUT])) == 0) rc = wait_idle(st, &sl->req[SEND_DIN]);
        tl_micro(pl, t, "sync", "stage send", j - pl->nslots);   // the slot's last micro-batch, this step's
        if (rc < 0) return rc;
        sl->micro = j;
        if (++pl->in_flight > pl->peak) pl->peak = pl->in_flight;
        if (pl->prev >= 0) {
            long n = (long)pl->mb * layer_input_floats(layer(pl, 0));
            if ((rc = comm_irecv(&st->s->comm, sl->act[0], n, pl->prev, TAG_ACT, &sl->req[RECV_IN])) < 0) return rc;
        }
    }
    *out = sl;
    return 0;
}

// Post the next inputs' receives into the slots already free (stages > 0).
static int post_inputs(Step *st, int *next_in) {
    Pipeline *pl = st->pl;
    while (pl->prev >= 0 && *next_in < pl->M && pl->slots[*next_in % pl->nslots].micro == -1) {
        Slot *sl;
        int rc = take_slot(st, (*next_in)++, &sl);
        if (rc < 0) return rc;
    }
    return 0;
}

// A micro-batch's compute, into the step's own trace (pipeline_report) and, while one records, the
// timeline (from the same clock readings: CLOCK_MONOTONIC, as timeline.h's).
static void record(Pipeline *pl, int kind, int micro, double t0, double t1) {
    if (kind != UPDATE && pd_tl_recording()) {
        pd_tl_span_to((int64_t)(t0 * 1e9), (int64_t)(t1 * 1e9), "compute",
                      kind == F ? "micro-batch forward" : "micro-batch backward", 2, PD_TL_INT("stage", pl->p),
                      PD_TL_INT("micro", micro));
    }
    if (pl->trace_len < 2 * pl->M + 1) {
        pl->trace[pl->trace_len++] = (PipelineEvent){kind, micro, t0, t1};
    }
}

static int forward(Step *st, int j, const float *params, int *next_in) {
    Pipeline *pl = st->pl;
    const int nl = pl->layers, last = pl->next < 0;
    Slot *sl;
    int rc;
    if ((rc = take_slot(st, j, &sl)) < 0) return rc;
    if (pl->prev >= 0) {
        const int64_t t = pd_tl_begin();
        rc = wait_idle(st, &sl->req[RECV_IN]);
        tl_micro(pl, t, "sync", "stage recv", j);
        if (rc < 0) return rc;
    }
    double t0 = now();
    batch_gather(pl->prev < 0 ? sl->act[0] : NULL, last ? sl->labels : NULL, st->ds, st->perm,
                 st->offset + j * pl->mb, pl->mb);
    for (int k = 0; k < nl; k++) {
        layer_forward(layer(pl, k), params, sl->act[k], sl->act[k + 1], sl->cols[k], sl->argmax[k], pl->scratch,
                      pl->mb);
    }
    if (last) {
        int right = 0;
        const long n = (long)pl->mb * pl->model->classes;
        st->loss += log_softmax_nll(sl->act[nl], sl->labels, sl->dout, pl->mb, pl->model->classes, &right) / pl->M;
        st->correct += right;
        const float scale = 1.0f / (float)pl->M;   // each micro-batch's mean loss counts 1/M of the batch's
        for (long i = 0; i < n; i++) sl->dout[i] *= scale;
    }
    double t1 = now();
    pl->stats.busy += t1 - t0;
    record(pl, F, j, t0, t1);
    if (!last) {
        long n = (long)pl->mb * layer_output_floats(layer(pl, nl - 1));
        const int64_t t = pd_tl_begin();
        rc = comm_isend(&st->s->comm, sl->act[nl], n, pl->next, TAG_ACT, &sl->req[SEND_OUT]);
        tl_micro(pl, t, "sync", "stage send", j);
        if (rc < 0 || (rc = comm_irecv(&st->s->comm, sl->dout, n, pl->next, TAG_GRAD, &sl->req[RECV_GRAD])) < 0) {
            return rc;
        }
    }
    return post_inputs(st, next_in);
}

static int backward(Step *st, int j, const float *params, int *next_in) {
    Pipeline *pl = st->pl;
    const int nl = pl->layers;
    Slot *sl = &pl->slots[j % pl->nslots];
    int rc;
    if (pl->next >= 0) {
        const int64_t t = pd_tl_begin();
        rc = wait_idle(st, &sl->req[RECV_GRAD]);
        tl_micro(pl, t, "sync", "stage recv", j);
        if (rc < 0) return rc;
    }
    double t0 = now();
    for (int k = nl - 1; k >= 0; k--) {
        const Layer *Lk = layer(pl, k);
        const float *dy = k == nl - 1 ? sl->dout : pl->dact[k + 1];
        float *dx = k > 0 ? pl->dact[k] : sl->din;   // NULL on the first stage: nobody needs it
        // the first micro-batch writes the stage's gradient, the others add to it
        layer_backward(Lk, params, pl->grads + (Lk->weight_offset - pl->off[pl->p]), sl->act[k], sl->act[k + 1], dy,
                       dx, sl->cols[k], sl->argmax[k], pl->scratch, pl->mb, j > 0);
    }
    double t1 = now();
    pl->stats.busy += t1 - t0;
    record(pl, B, j, t0, t1);
    if (pl->prev >= 0) {
        long n = (long)pl->mb * layer_input_floats(layer(pl, 0));
        const int64_t t = pd_tl_begin();
        rc = comm_isend(&st->s->comm, sl->din, n, pl->prev, TAG_GRAD, &sl->req[SEND_DIN]);
        tl_micro(pl, t, "sync", "stage send", j);
        if (rc < 0) return rc;
    }
    sl->micro = -1;
    pl->in_flight--;
    return post_inputs(st, next_in);
}

// Requests of every slot: waited for at the end of a step, parked when a step fails.
static int finish_requests(Step *st, int failed) {
    Pipeline *pl = st->pl;
    int rc = 0;
    for (int i = 0; i < pl->nslots; i++) {
        MPI_Request *reqs = pl->slots[i].req;
        if (failed || rc < 0) {
            comm_park_all(&st->s->comm, 4, reqs);
        } else {
            // what is left are the sends of the slot's last micro-batch (every receive was waited for)
            int64_t t = pd_tl_begin();
            if (t && reqs[SEND_OUT] == MPI_REQUEST_NULL && reqs[SEND_DIN] == MPI_REQUEST_NULL) t = 0;
            double t0 = now();
            rc = comm_waitall(&st->s->comm, 4, reqs);
            pl->stats.idle += now() - t0;
            tl_micro(pl, t, "sync", "stage send", i + pl->nslots * ((pl->M - 1 - i) / pl->nslots));   // its last
        }
        pl->slots[i].micro = -1;
    }
    pl->in_flight = 0;
    return rc;
}

// The stage's slice of the gradients, summed over its replicas (counted on the strategy's comm).
static int replicas_allreduce(Strategy *s, float *buf, long n) {
    Pipeline *pl = s->pipe;
    if (pl->D == 1) return 0;
    Comm dp = s->comm;
    dp.comm = pl->dp_comm, dp.rank = pl->d, dp.size = pl->D;
    dp.count = (CommCount){0, 0}, dp.seconds = 0.0;
    int rc = comm_allreduce_sum(&dp, buf, n);
    s->comm.count.bytes_sent += dp.count.bytes_sent;
    s->comm.count.messages += dp.count.messages;
    s->comm.seconds += dp.seconds;
    s->comm.mpi_rc = dp.mpi_rc, s->comm.mpi_call = dp.mpi_call;
    return rc;
}

// The timeline's id of this stage's replicas (their all-reduce): the strategy's group's, mixed with the
// stage, so that it is the same on a stage's replicas and differs from stage to stage (below 2^48, as
// calls.c's ids, for JSON readers that hold numbers as doubles).
static long long stage_group(const Strategy *s) {
    const unsigned long long h = ((unsigned long long)s->trace_group ^ 0x5354414745ull) * 1099511628211ull +
                                 (unsigned long long)s->pipe->p;
    return (long long)((h ^ (h >> 48)) & ((1ull << 48) - 1));
}

static int pipeline_run_step(Strategy *s, const Dataset *ds, const int *perm, int offset, int batch, float *params,
                             float *momentum, int *started, double *loss, int *correct) {
    Pipeline *pl = s->pipe;
    if (batch % pl->M != 0) {   // the caller checks; a wrong batch here would read past the slots
        return comm_fail(&s->comm, MPI_ERR_ARG, "the pipeline's micro-batches (the batch must divide into them)");
    }
    if (pl->mb != batch / pl->M && alloc_slots(pl, batch / pl->M) < 0) {
        free_slots(pl);
        return comm_fail(&s->comm, MPI_ERR_NO_MEM, "malloc (the pipeline's activation slots)");
    }
    Step st = {s, pl, ds, perm, offset, 0.0, 0};
    const int M = pl->M;
    int rc = 0, next_in = 0, f = 0, b = 0;
    pl->trace_len = 0, pl->peak = 0;
    double start = now();
    rc = post_inputs(&st, &next_in);
    // gpipe: every forward first; 1f1b: the warm-up forwards, then one forward and one backward
    const int warm = pl->schedule == SCHEDULE_1F1B ? (pl->P - 1 - pl->p < M ? pl->P - 1 - pl->p : M) : M;
    while (rc == 0 && f < warm) rc = forward(&st, f++, params, &next_in);
    while (rc == 0 && f < M) {
        if ((rc = forward(&st, f++, params, &next_in)) == 0) rc = backward(&st, b++, params, &next_in);
    }
    while (rc == 0 && b < M) rc = backward(&st, b++, params, &next_in);
    int finished = finish_requests(&st, rc < 0);
    if (rc == 0) rc = finished;
    if (rc < 0) {
        return rc;
    }
    const long number = s->trace_step++;
    double t0 = now();
    int64_t t = pd_tl_begin();   // (a span only when there are replicas to exchange with)
    if (t && pl->D == 1) t = 0;
    rc = replicas_allreduce(s, pl->grads, pl->len);
    // the stage's replicas exchange apart from the other stages': a group id of their own
    if (t) pd_tl_span(t, "sync", "gradient sync", 3, PD_TL_INT("group", stage_group(s)), PD_TL_INT("seq", number),
                      PD_TL_INT("stage", pl->p));
    if (rc < 0) {
        return rc;
    }
    double t1 = now();
    pl->stats.sync += t1 - t0;
    const long lo = pl->off[pl->p];   // the mean over replicas: 1/D inside the update's pass
    t = pd_tl_begin();
    sgd_step_scaled(&s->sgd, 1.0f / (float)pl->D, params + lo, pl->grads, momentum + lo, started, pl->len);
    if (t) pd_tl_span(t, "compute", "update", 0);
    double t2 = now();
    pl->stats.busy += t2 - t1;
    record(pl, UPDATE, -1, t0, t2);
    pl->stats.steps++;
    pl->stats.step_seconds += t2 - start;
    if (pl->peak > pl->stats.peak_slots) pl->stats.peak_slots = pl->peak;
    *loss = st.loss;
    *correct = st.correct;
    return 0;
}

// ---------------------------------------------------------------------------------------------------
// The whole model, for evaluation and checkpoints

// Every stage's slice of src (replica 0's: the replicas hold the same) into out[n] on every rank.
static int pipeline_gather(Strategy *s, const float *src, float *out) {
    Pipeline *pl = s->pipe;
    Comm *c = &s->comm;
    int rc = 0;
    if (c->rank == 0 || pl->d == 0) {
        const int posts = c->rank == 0 ? pl->P - 1 : 1;
        MPI_Request *reqs = malloc(sizeof(MPI_Request) * (size_t)(posts > 0 ? posts : 1));
        if (reqs == NULL) {
            return comm_fail(c, MPI_ERR_NO_MEM, "malloc (gathering the stages)");
        }
        for (int i = 0; i < posts; i++) reqs[i] = MPI_REQUEST_NULL;
        if (c->rank == 0) {
            memcpy(out, src, sizeof(float) * (size_t)pl->len);
            for (int q = 1; q < pl->P && rc == 0; q++) {
                rc = comm_irecv(c, out + pl->off[q], pl->off[q + 1] - pl->off[q], q * pl->D, TAG_GATHER, &reqs[q - 1]);
            }
        } else {
            rc = comm_isend(c, src + pl->off[pl->p], pl->len, 0, TAG_GATHER, &reqs[0]);
        }
        rc = rc < 0 ? (comm_park_all(c, posts, reqs), rc) : comm_waitall(c, posts, reqs);
        free(reqs);
    }
    return rc == 0 ? comm_bcast(c, out, s->n, 0) : rc;
}

static int pipeline_weights(Strategy *s, const float *params, float *out) {
    return pipeline_gather(s, params, out);
}

// Each stage holds its slice's momentum; every stage has started alike.
static int pipeline_state(Strategy *s, const float *momentum, float *momentum_out, int *started_out) {
    (void)started_out;
    return pipeline_gather(s, momentum, momentum_out);
}

// The replica: its data shard.
static int pipeline_worker_rank(const Strategy *s) {
    return s->comm.rank % s->workers;
}

// ---------------------------------------------------------------------------------------------------
// The table, and the measurements the glue reads

const StrategyHooks pipeline_hooks = {.create = pipeline_create, .free = pipeline_free,
                                      .worker_rank = pipeline_worker_rank, .run_step = pipeline_run_step,
                                      .weights = pipeline_weights, .state = pipeline_state};

const PipelineStats *pipeline_stats(const Strategy *s) {
    return s->pipe ? &s->pipe->stats : NULL;
}

int pipeline_trace(const Strategy *s, const PipelineEvent **events) {
    *events = s->pipe ? s->pipe->trace : NULL;
    return s->pipe ? s->pipe->trace_len : 0;
}
