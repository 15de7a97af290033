/* interp/ep_sim.c: a simulated expert-parallel run (docs/expert-parallel.md).
 *
 * Each of the ep per-device programs runs on the interpreter in its own
 * thread with its own context; an all_to_all is two barriers around a copy:
 * every device posts its send buffer and counts, waits for all, copies the
 * rows addressed to it in device order, and waits again so that no send
 * buffer is freed while another device reads it. A device that fails (a
 * run-time fault, a binding error) marks the run failed and wakes the
 * others, whose exchanges then return an error: no device waits forever. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "interp/interp.h"

typedef struct post {
	const void *send;
	const int64_t *counts;
	size_t row_bytes;
} post;

typedef struct sim {
	int ep;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	int arrived;
	uint64_t generation;
	int failed; /* device + 1 of the first failure, 0 while none */
	post *posts;
} sim;

typedef struct device {
	sim *s;
	int rank;
	moe_exchange x;
	moe_ctx *ctx;
	const moe_graph *g;
	const moe_tensor_map *bind;
	moe_tensor **out; /* the caller's: copies of own[] in its context */
	moe_tensor *own[16];
	moe_status st;
} device;

static void fail(sim *s, int rank)
{
	pthread_mutex_lock(&s->mu);
	if (!s->failed)
		s->failed = rank + 1;
	pthread_cond_broadcast(&s->cv);
	pthread_mutex_unlock(&s->mu);
}

/* Waits until every device arrives; false when some device failed. */
static bool barrier(sim *s)
{
	pthread_mutex_lock(&s->mu);
	uint64_t gen = s->generation;
	if (++s->arrived == s->ep) {
		s->arrived = 0;
		s->generation++;
		pthread_cond_broadcast(&s->cv);
	}
	while (gen == s->generation && !s->failed)
		pthread_cond_wait(&s->cv, &s->mu);
	bool ok = !s->failed;
	pthread_mutex_unlock(&s->mu);
	return ok;
}

static moe_status peer_failed(device *d, moe_ctx *ctx)
{
	moe_diag(ctx, MOE_DIAG_ERROR, moe_loc_none(), "device %d: stopping: device %d failed", d->rank, d->s->failed - 1);
	return MOE_ERR_RUNTIME;
}

static moe_status sim_all_to_all(void *ud, moe_ctx *ctx, const void *send, const int64_t *counts, size_t row_bytes,
	void *recv, int64_t cap, int64_t *got)
{
	device *d = ud;
	sim *s = d->s;
	s->posts[d->rank] = (post){send, counts, row_bytes};
	if (!barrier(s))
		return peer_failed(d, ctx);
	int64_t at = 0;
	moe_status st = MOE_OK;
	for (int src = 0; src < s->ep && st == MOE_OK; src++) {
		const post *p = &s->posts[src];
		int64_t off = 0;
		for (int j = 0; j < d->rank; j++)
			off += p->counts[j];
		int64_t n = p->counts[d->rank];
		if (p->row_bytes != row_bytes || n > cap - at) {
			moe_diag(ctx, MOE_DIAG_ERROR, moe_loc_none(),
				"device %d: all_to_all: device %d sends %lld rows of %zu bytes, the receive buffer holds %lld of %zu",
				d->rank, src, (long long)n, p->row_bytes, (long long)(cap - at), row_bytes);
			st = MOE_ERR_RUNTIME;
			break;
		}
		if (n)
			memcpy((char *)recv + (size_t)at * row_bytes, (const char *)p->send + (size_t)off * row_bytes,
				(size_t)n * row_bytes);
		at += n;
	}
	*got = at;
	if (st != MOE_OK) {
		fail(s, d->rank);
		return st;
	}
	if (!barrier(s))
		return peer_failed(d, ctx);
	return MOE_OK;
}

static void *device_main(void *arg)
{
	device *d = arg;
	d->st = moe_graph_num_outputs(d->g) > 16 ? MOE_ERR_UNSUPPORTED : ir_interp_run_verified(d->ctx, d->g, d->bind, &d->x, d->own);
	if (d->st != MOE_OK)
		fail(d->s, d->rank);
	return NULL;
}

/* Copies device d's diagnostics to ctx, each prefixed with the device. */
static void copy_diags(moe_ctx *ctx, const device *d)
{
	for (size_t i = 0; i < moe_diag_count(d->ctx); i++) {
		moe_diag_kind k;
		moe_loc l;
		const char *m;
		moe_diag_get(d->ctx, i, &k, &l, &m);
		moe_loc at = l.file ? moe_loc_at(ctx, l.file, l.line, l.col) : moe_loc_none();
		if (!strncmp(m, "device ", 7))
			moe_diag(ctx, k, at, "%s", m);
		else
			moe_diag(ctx, k, at, "device %d: %s", d->rank, m);
	}
}

moe_status moe_ep_sim_run(moe_ctx *ctx, int ep, const moe_graph *const *g, const moe_tensor_map *const *bind,
	moe_tensor **const *out)
{
	if (!ctx || ep < 1 || ep > 4096 || !g || !bind || !out)
		return MOE_ERR_INVALID;
	for (int r = 0; r < ep; r++)
		for (uint32_t i = 0; i < moe_graph_num_outputs(g[r]); i++)
			out[r][i] = NULL;
	/* verified here, on one thread: verification works on a copy made in the graph's context */
	for (int r = 0; r < ep; r++)
		if (moe_graph_verify(ctx, g[r]) != MOE_OK)
			return MOE_ERR_INVALID;
	sim s = {.ep = ep};
	device *dev = calloc((size_t)ep, sizeof *dev);
	pthread_t *th = calloc((size_t)ep, sizeof *th);
	s.posts = calloc((size_t)ep, sizeof *s.posts);
	if (!dev || !th || !s.posts) {
		free(dev);
		free(th);
		free(s.posts);
		moe_diag(ctx, MOE_DIAG_ERROR, moe_loc_none(), "out of memory");
		return MOE_ERR_NOMEM;
	}
	pthread_mutex_init(&s.mu, NULL);
	pthread_cond_init(&s.cv, NULL);
	int started = 0;
	moe_status st = MOE_OK;
	for (int r = 0; r < ep; r++) {
		device *d = &dev[r];
		*d = (device){&s, r, {ep, r, sim_all_to_all, d}, moe_ctx_new(NULL, NULL), g[r], bind[r], out[r], {0}, MOE_OK};
		if (!d->ctx || pthread_create(&th[r], NULL, device_main, d)) {
			moe_diag(ctx, MOE_DIAG_ERROR, moe_loc_none(), "device %d: cannot start its thread", r);
			fail(&s, r);
			st = MOE_ERR_RUNTIME;
			break;
		}
		started++;
	}
	for (int r = 0; r < started; r++)
		pthread_join(th[r], NULL);
	/* the device that failed first, then the others' diagnostics */
	int first = s.failed ? s.failed - 1 : -1;
	if (first >= 0 && first < started)
		copy_diags(ctx, &dev[first]);
	for (int r = 0; r < started; r++) {
		if (r != first)
			copy_diags(ctx, &dev[r]);
		if (dev[r].st != MOE_OK && st == MOE_OK)
			st = dev[r].st;
	}
	/* the outputs, copied into the caller's context (contexts own their blocks) */
	for (int r = 0; r < started; r++)
		for (uint32_t i = 0; i < moe_graph_num_outputs(g[r]) && i < 16; i++) {
			moe_tensor *t = dev[r].own[i];
			if (t && st == MOE_OK) {
				out[r][i] = moe_tensor_new(ctx, t->dtype, t->rank, t->shape);
				if (out[r][i])
					memcpy(out[r][i]->data, t->data, t->nbytes);
				else
					st = MOE_ERR_NOMEM;
			}
			moe_tensor_free(dev[r].ctx, t);
		}
	for (int r = 0; r < ep; r++)
		if (dev[r].ctx)
			moe_ctx_free(dev[r].ctx);
	if (st != MOE_OK)
		for (int r = 0; r < started; r++)
			for (uint32_t i = 0; i < moe_graph_num_outputs(g[r]); i++) {
				moe_tensor_free(ctx, out[r][i]);
				out[r][i] = NULL;
			}
	pthread_cond_destroy(&s.cv);
	pthread_mutex_destroy(&s.mu);
	free(dev);
	free(th);
	free(s.posts);
	return st;
}
