/*
 * strategy.c: the registry of strategies (strategy.h). It names the kinds, holds each kind's table of
 * hooks, does what every kind shares at set-up (the servers' places, scratch) and dispatches each hook
 * through the table. It is the only file that knows every strategy; none of them calls back into it.
 * It holds no communication of its own: that is comm.c's, below every strategy.
 */
#include "strategy.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// Name <-> kind <-> table.
static const struct {
    const char *name;   // as the command line spells it
    const StrategyHooks *hooks;
} KINDS[STRATEGY_KINDS] = {
    [STRATEGY_ALLREDUCE] = {"allreduce", &allreduce_hooks}, [STRATEGY_RING] = {"ring", &ring_hooks},
    [STRATEGY_CENTRAL] = {"central", &central_hooks},       [STRATEGY_PS] = {"ps", &ps_hooks},
    [STRATEGY_AVERAGE] = {"average", &average_hooks},       [STRATEGY_EASGD] = {"easgd", &easgd_hooks},
    [STRATEGY_DOWNPOUR] = {"downpour", &async_hooks},       [STRATEGY_ADAG] = {"adag", &async_hooks},
    [STRATEGY_AEASGD] = {"aeasgd", &async_hooks},           [STRATEGY_DYNSGD] = {"dynsgd", &async_hooks},
    [STRATEGY_PIPELINE] = {"pipeline", &pipeline_hooks},
};

static int known(StrategyKind kind) {
    return kind >= 0 && kind < STRATEGY_KINDS;
}

static const StrategyHooks *hooks(const Strategy *s) {
    return KINDS[s->cfg.kind].hooks;
}

int strategy_kind_of(const char *name) {
    for (int k = 0; k < STRATEGY_KINDS; k++) {
        if (strcmp(name, KINDS[k].name) == 0) return k;
    }
    return -1;
}

const char *strategy_name(StrategyKind kind) {
    return known(kind) ? KINDS[kind].name : "?";
}

// A kind has servers when its table has a hook for them; the asynchronous ones serve whole calls.
int strategy_has_servers(StrategyKind kind) {
    return known(kind) && (KINDS[kind].hooks->serve != NULL || KINDS[kind].hooks->serve_call != NULL);
}

int strategy_is_async(StrategyKind kind) {
    return known(kind) && KINDS[kind].hooks->serve_call != NULL;
}

// ---------------------------------------------------------------------------------------------------
// Set-up

// The compressor, with the model's weights as its matrices (powersgd factors them: a linear layer's
// out x in, a convolution's out_channels x in_channels * k * k, as torch's PowerSGD reshapes them). Its
// first Q comes from one seed on every rank. 0, or -2 out of memory.
static int create_compressor(Strategy *s, const Model *m) {
    CompressMatrix *mats = malloc(sizeof(CompressMatrix) * (size_t)(m->num_layers > 0 ? m->num_layers : 1));
    if (mats == NULL) {
        return -2;
    }
    int count = 0;
    for (int i = 0; i < m->num_layers; i++) {
        const Layer *L = &m->layers[i];
        long rows = L->spec.out;
        if (L->weights > 0 && rows > 0 && L->weights % rows == 0) {
            mats[count++] = (CompressMatrix){L->weight_offset, rows, L->weights / rows};
        }
    }
    int rc = compressor_create(&s->z, &s->cfg.compression, s->n, mats, count, 0x636f6d7072657373ull);
    free(mats);
    s->z.agree_each_sum = 0;   // every rank agreed the whole configuration when it was set (Engine.set_strategy)
    return rc < 0 ? -2 : 0;
}

int strategy_create(Strategy *s, const StrategyConfig *cfg, const SgdConfig *sgd, Comm comm, const Model *model,
                    char *err, size_t errlen) {
    const long n = model->num_params;
    const char *name = KINDS[cfg->kind].name;
    *s = (Strategy){.cfg = *cfg, .sgd = *sgd, .comm = comm, .n = n, .workers = comm.size};
    const StrategyHooks *h = hooks(s);
    const int R = comm.size;
    if (strategy_has_servers(cfg->kind)) {   // the last `servers` ranks, a shard of the parameters each
        if (cfg->servers < 1 || cfg->servers >= R) {
            snprintf(err, errlen, "strategy '%s' with %d server(s) needs more ranks than servers (at least one "
                     "worker); the group has %d", name, cfg->servers, R);
            return -1;
        }
        if (cfg->servers > n) {
            snprintf(err, errlen, "strategy '%s': %d servers but only %ld parameters to shard", name, cfg->servers,
                     n);
            return -1;
        }
        s->workers = R - cfg->servers;
        s->server = comm.rank >= s->workers;
        if (s->server) {
            int j = comm.rank - s->workers;
            s->shard_lo = shard_lo(n, cfg->servers, j);
            s->shard_hi = shard_lo(n, cfg->servers, j + 1);
        }
    }
    if (cfg->compression.kind != COMPRESS_NONE && h->compresses == NULL) {
        char what[64];
        compress_name(&cfg->compression, what, sizeof what);
        snprintf(err, errlen, "strategy '%s' takes no compression (asked for '%s'); the data-parallel "
                 "strategies do", name, what);
        return -1;
    }
    int rc = h->create != NULL ? h->create(s, model, name, err, errlen) : 0;
    if (rc == 0 && cfg->compression.kind != COMPRESS_NONE) {
        rc = create_compressor(s, model);
        if (rc == 0 && h->create_compressed != NULL) {
            rc = h->create_compressed(s);
        }
    }
    s->cfg.split = NULL;   // the caller's: the pipeline has taken what it needs
    if (rc == 0) {
        s->scratch_len = h->scratch_len != NULL ? h->scratch_len(s) : 0;
        s->scratch = calloc(s->scratch_len > 0 ? (size_t)s->scratch_len : 1, sizeof(float));
        rc = s->scratch == NULL ? -2 : 0;
    }
    if (rc < 0) {
        strategy_free(s);
        if (rc == -2) {
            snprintf(err, errlen, "out of memory for strategy '%s' on %ld parameters", name, n);
        }
        return -1;
    }
    strategy_restore(s, model->params);
    return 0;
}

void strategy_free(Strategy *s) {
    free(s->scratch);
    s->scratch = NULL;
    compressor_free(&s->z);
    if (hooks(s)->free != NULL) hooks(s)->free(s);
}

int strategy_is_server(const Strategy *s) {
    return s->server;
}

int strategy_worker_rank(const Strategy *s) {
    // ps and the asynchronous ones put their servers last, so workers keep their ranks
    return hooks(s)->worker_rank != NULL ? hooks(s)->worker_rank(s) : s->comm.rank;
}

// ---------------------------------------------------------------------------------------------------
// The hooks, through the kind's table

int strategy_step(Strategy *s, float *params, float *grads, float *momentum, int *started, long step) {
    return hooks(s)->step(s, params, grads, momentum, started, step);
}

int strategy_serve(Strategy *s, float *params, float *momentum, int *started, long step) {
    return hooks(s)->serve(s, params, momentum, started, step);
}

void strategy_begin_call(Strategy *s, int first, int last) {
    hooks(s)->begin_call(s, first, last);
}

int strategy_next_batch(Strategy *s, long *batch_index) {
    return hooks(s)->next_batch(s, batch_index);
}

int strategy_end_call(Strategy *s) {
    return hooks(s)->end_call(s);
}

int strategy_serve_call(Strategy *s, float *params, int first, int last) {
    return hooks(s)->serve_call(s, params, first, last);
}

int strategy_run_step(Strategy *s, const Dataset *ds, const int *perm, int offset, int batch, float *params,
                      float *momentum, int *started, double *loss, int *correct) {
    return hooks(s)->run_step(s, ds, perm, offset, batch, params, momentum, started, loss, correct);
}

int strategy_weights(Strategy *s, const float *params, float *out) {
    if (hooks(s)->weights == NULL) {   // every rank holds the same
        memcpy(out, params, sizeof(float) * (size_t)s->n);
        return 0;
    }
    return hooks(s)->weights(s, params, out);
}

int strategy_state(Strategy *s, const float *params, const float *momentum, int started, float *params_out,
                   float *momentum_out, int *started_out) {
    int rc = strategy_weights(s, params, params_out);
    if (rc < 0) {
        return rc;
    }
    memcpy(momentum_out, momentum, sizeof(float) * (size_t)s->n);
    *started_out = started;
    return hooks(s)->state != NULL ? hooks(s)->state(s, momentum, momentum_out, started_out) : 0;
}

void strategy_restore(Strategy *s, const float *params) {
    if (hooks(s)->restore != NULL) hooks(s)->restore(s, params);
}
