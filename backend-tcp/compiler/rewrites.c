/* backend-tcp/compiler/rewrites.c: the schedule rewrite table (rewrites.def)
 * and the driver step that runs it (rewrites.h). */
#include <string.h>

#include "backend-tcp/compiler/dmplan.h"
#include "backend-tcp/compiler/rewrites.h"
#include "backend-tcp/compiler/sched_time.h"
#include "moec/tcp.h"

const ts_rewrite ts_rewrites[] = {
#define REWRITE(id, name, stage, needs, benefit, summary)                                   \
	{name, summary, stage, needs, ts_rw_##id##_applies, benefit, ts_rw_##id##_apply},
#include "backend-tcp/compiler/rewrites.def"
#undef REWRITE
};
const int ts_nrewrites = (int)(sizeof ts_rewrites / sizeof *ts_rewrites);

/* one bit per row in tcp_sched.ran and the switches */
_Static_assert(sizeof ts_rewrites / sizeof *ts_rewrites <= 64, "at most 64 rewrite rows");

int ts_rewrite_find(const char *name, size_t len)
{
	for (int k = 0; k < ts_nrewrites; k++)
		if (strlen(ts_rewrites[k].name) == len && !memcmp(ts_rewrites[k].name, name, len))
			return k;
	return -1;
}

bool ts_rw_finish(tcp_sched *c, const ts_env *e, const char *name)
{
	int r = ts_rewrite_find(name, strlen(name));
	if (r < 0 || e->off >> r & 1 || !ts_rewrites[r].applies(c, e))
		return true;
	return ts_rewrites[r].apply(c, e, (uint16_t)(r + 1)) == MOE_OK;
}

ts_id ts_op_sibling(tcp_sched *s, ts_id like, const tcp_insn *in, uint32_t at, ts_id skip, uint16_t feature)
{
	ts_id rg = s->op[like].region, p = ts_add_op(s, TS_NONE, in, s->op[like].phase);
	s->op[p].region = rg;
	s->op[p].node = s->op[like].node;
	s->op[p].feature = feature;
	ts_region_insert(s, rg, at, TS_ITEM_OP | p);
	for (uint32_t j = 0; j < s->op[like].ndep; j++)
		if (s->op[like].dep[j] != skip)
			ts_add_dep(s, p, s->op[like].dep[j], s->op[like].dist[j]);
	return p;
}

void ts_diag_truncate(moe_ctx *ctx, size_t n0)
{
	size_t n = moe_diag_count(ctx);
	if (n <= n0)
		return;
	moe_diag_kind *kind = ctx_alloc(ctx, (n0 + 1) * sizeof *kind);
	moe_loc *loc = ctx_alloc(ctx, (n0 + 1) * sizeof *loc);
	char **msg = ctx_alloc(ctx, (n0 + 1) * sizeof *msg);
	for (size_t i = 0; i < n0; i++) {
		const char *m;
		moe_diag_get(ctx, i, &kind[i], &loc[i], &m);
		msg[i] = ctx_alloc(ctx, strlen(m) + 1);
		memcpy(msg[i], m, strlen(m) + 1);
	}
	moe_diag_clear(ctx);
	for (size_t i = 0; i < n0; i++) {
		moe_diag(ctx, kind[i], loc[i], "%s", msg[i]);
		ctx_free(ctx, msg[i], strlen(msg[i]) + 1);
	}
	ctx_free(ctx, kind, 0);
	ctx_free(ctx, loc, 0);
	ctx_free(ctx, msg, 0);
}

/* A trial's key: what the trial is a function of, with its machine. A copy
 * of the schedule (ts_clone) where the stage's schedule verified (every
 * rewrite that runs is verified after it, so a copy reads back as the text
 * would), else its text. */
typedef struct trial_key {
	tcp_sched *copy;
	char *text;
	size_t len;
} trial_key;

/* The unchanged schedule's trial, kept while the driver runs one stage: the
 * rows that do not apply leave the schedule as it was, so the next row's
 * base trial is this one when its key is the same. */
typedef struct base_trial {
	const moe_tcp_machine *m;
	moe_ctx *ctx;
	trial_key key;
	/* the last text ts_trial_text printed in the stage (a verified one's)
	 * and a copy of its schedule, which reads back as that text would */
	trial_key printed;
	int64_t cycles;
	/* the last priced trial's row applied to an equal copy of the schedule
	 * (before placement): the stage takes it when it runs that row */
	tcp_sched *applied;
	int applied_row;
	/* the last row trial's row and prediction: the stage's schedule, where
	 * it takes that row, reads back as that trial's copy did */
	int tried_row;
	int64_t tried_cycles;
	bool verified;            /* the stage's schedule verified at its start */
	struct base_trial *outer; /* the enclosing stage's, restored after this one */
} base_trial;
static _Thread_local base_trial *kept;

/* a throw out of the stage: its blocks are freed by the throw */
static void unkeep(void *arg)
{
	kept = ((base_trial *)arg)->outer;
}

static void key_free(moe_ctx *ctx, trial_key *k)
{
	if (k->text)
		ctx_free(ctx, k->text, k->len + 1);
	tcp_sched_free(k->copy);
	*k = (trial_key){NULL, NULL, 0};
}

static void forget(base_trial *b)
{
	key_free(b->ctx, &b->key);
}

/* s, predicted at cycles, as b's unchanged schedule */
static void keep_base(base_trial *b, const tcp_sched *s, int64_t cycles)
{
	forget(b);
	b->m = s->m;
	b->key.copy = ts_clone(s);
	b->cycles = cycles;
}

static void forget_applied(base_trial *b)
{
	tcp_sched_free(b->applied);
	b->applied = NULL;
	b->applied_row = -1;
}

char *ts_trial_text(const tcp_sched *s, size_t *len)
{
	size_t n0 = moe_diag_count(s->ctx);
	char *text = NULL;
	*len = 0;
	moe_status ps = tcp_sched_print(s, &text, len);
	if (ps == MOE_OK) {
		if (kept && kept->verified && kept->ctx == s->ctx) {
			key_free(s->ctx, &kept->printed);
			kept->printed.copy = ts_clone(s);
			if (kept->printed.copy) {
				kept->printed.text = ctx_alloc(s->ctx, *len + 1);
				memcpy(kept->printed.text, text, *len + 1);
				kept->printed.len = *len;
			}
		}
		return text;
	}
	if (text)
		ctx_free(s->ctx, text, *len + 1);
	ts_diag_truncate(s->ctx, n0);
	if (ps == MOE_ERR_NOMEM)
		ctx_throw(s->ctx, *len + 1);
	return NULL;
}

/* s's key (false: its text did not print) */
static bool key_of(const tcp_sched *s, trial_key *k)
{
	*k = (trial_key){NULL, NULL, 0};
	if (kept && kept->verified && kept->ctx == s->ctx)
		k->copy = ts_clone(s);
	if (!k->copy)
		k->text = ts_trial_text(s, &k->len);
	return k->copy || k->text;
}

static bool key_same(const trial_key *a, const trial_key *b)
{
	if (a->copy || b->copy)
		return a->copy && b->copy && ts_same(a->copy, b->copy);
	return a->text && b->text && a->len == b->len && !memcmp(a->text, b->text, a->len);
}

/* The trial t on copy c (freed): fn, then with t->price placement,
 * verification and the prediction. */
static int64_t trial_on(const tcp_sched *s, tcp_sched *c, const ts_trial *t, size_t n0)
{
	int64_t cy = -1;
	if (c && (!t->fn || t->fn(c, t->arg))) {
		if (!t->price)
			cy = 0;
		else {
			c->reuse = c->reuse > t->reuse ? c->reuse : t->reuse;
			bool late = t->verify_at >= 0;
			if (tcp_dm_place(c) == MOE_OK && (late || tcp_sched_verify(c) == MOE_OK))
				cy = tcp_sched_predict(s->ctx, c, NULL, NULL);
			if (late && cy >= 0 && cy <= t->verify_at && tcp_sched_verify(c) != MOE_OK)
				cy = -1;
		}
	}
	tcp_sched_free(c);
	ts_diag_truncate(s->ctx, n0);
	return cy;
}

int64_t ts_trial_run(const tcp_sched *s, const char *text, size_t len, const ts_trial *t)
{
	size_t n0 = moe_diag_count(s->ctx);
	const trial_key *p = kept && kept->ctx == s->ctx ? &kept->printed : NULL;
	if (p && p->copy && p->len == len && !memcmp(p->text, text, len)) {
		tcp_sched *c = ts_clone(p->copy); /* the text read back, without reading it */
		if (c)
			return trial_on(s, c, t, n0);
	}
	return trial_on(s, tcp_sched_parse(s->ctx, s->m, t->what, text, len), t, n0);
}

/* The trial t on key k: on its copy (taken: k->copy becomes NULL) unless
 * keep, then on a fresh copy of s; else on its text read back. */
static int64_t trial_key_run(const tcp_sched *s, trial_key *k, const ts_trial *t, bool keep)
{
	if (!k->copy)
		return ts_trial_run(s, k->text, k->len, t);
	tcp_sched *c = keep ? ts_clone(s) : k->copy;
	if (!keep)
		k->copy = NULL;
	return trial_on(s, c, t, moe_diag_count(s->ctx));
}

int64_t ts_trial_of(const tcp_sched *s, const ts_trial *t)
{
	trial_key k;
	if (!key_of(s, &k))
		return -1;
	int64_t cy = trial_key_run(s, &k, t, false);
	key_free(s->ctx, &k);
	return cy;
}

typedef struct row_arg {
	const ts_env *e;
	int row;
	tcp_sched **keep; /* a copy of the result, when not NULL */
} row_arg;

/* row applied to the copy, which must still verify */
static bool apply_row(tcp_sched *c, void *arg)
{
	const row_arg *r = arg;
	bool ok = ts_rewrites[r->row].apply(c, r->e, (uint16_t)(r->row + 1)) == MOE_OK && tcp_sched_verify(c) == MOE_OK;
	if (ok && r->keep)
		*r->keep = ts_clone(c);
	return ok;
}

/* The predicted cycles of a copy of s, row applied first when row >= 0;
 * -1 when it fails (ts_trial_run). The unchanged schedule's (row < 0) is
 * kept for the stage (base_trial), with its key. */
static int64_t trial(const tcp_sched *s, const ts_env *e, int row, int64_t verify_at)
{
	base_trial *b = row < 0 && kept && kept->ctx == s->ctx ? kept : NULL;
	/* s equal to the kept copy field for field: so would its copy be */
	if (b && b->m == s->m && b->verified && b->key.copy && ts_same(b->key.copy, s))
		return b->cycles;
	trial_key k;
	if (!key_of(s, &k))
		return -1;
	if (b && b->m == s->m && key_same(&b->key, &k)) {
		key_free(s->ctx, &k);
		return b->cycles;
	}
	/* the result is kept for the stage where the trial runs on a copy equal
	 * to s field for field (so the row applied to s gives the same) */
	tcp_sched *applied = NULL;
	bool keep = row >= 0 && kept && kept->ctx == s->ctx && k.copy && ts_same(k.copy, s);
	row_arg r = {e, row, keep ? &applied : NULL};
	ts_trial t = ts_trial_for(e, "<rewrite trial>", row < 0 ? NULL : apply_row, &r, true);
	t.verify_at = row < 0 ? -1 : verify_at;
	int64_t cy = trial_key_run(s, &k, &t, b != NULL);
	if (keep) {
		forget_applied(kept);
		kept->applied = applied, kept->applied_row = row;
	}
	if (row >= 0 && kept && kept->ctx == s->ctx)
		kept->tried_row = row, kept->tried_cycles = cy;
	if (b) {
		forget(b);
		b->m = s->m, b->key = k, b->cycles = cy;
	} else {
		key_free(s->ctx, &k);
	}
	return cy;
}

int64_t ts_rw_base_cycles(const tcp_sched *s, const ts_env *e)
{
	return trial(s, e, -1, -1);
}

typedef struct param_arg {
	ts_param_fn fn;
	const ts_env *e;
	uint16_t feature;
	int64_t param;
} param_arg;

static bool param_copy(tcp_sched *c, void *arg)
{
	const param_arg *a = arg;
	return a->fn(c, a->e, a->feature, a->param);
}

int64_t ts_price_param(const tcp_sched *s, const ts_env *e, const char *what, ts_param_fn fn, uint16_t feature,
	int64_t param)
{
	param_arg a = {fn, e, feature, param};
	ts_trial t = ts_trial_for(e, what, param_copy, &a, true);
	return ts_trial_of(s, &t);
}

int64_t ts_price_ascending(const tcp_sched *s, const ts_env *e, const char *what, ts_param_fn fn, uint16_t feature,
	int64_t lo, int64_t hi)
{
	int64_t best = lo, least = -1;
	for (int64_t p = lo; p <= hi; p++) {
		int64_t c = ts_price_param(s, e, what, fn, feature, p);
		if (c >= 0 && (least < 0 || c < least)) {
			least = c;
			best = p;
		} else if (c >= 0)
			break;
	}
	return best;
}

uint32_t ts_loop_segment(const tcp_sched *s, uint32_t *lead)
{
	const ts_region *top = &s->rg[s->top];
	uint32_t end = 0, k = 0;
	while (end < top->nitem && TS_ITEM_KIND(top->item[end]) != TS_ITEM_RG)
		end++;
	while (k < end && (TS_ITEM_KIND(top->item[k]) == TS_ITEM_SC ||
		(TS_ITEM_KIND(top->item[k]) == TS_ITEM_OP && s->op[TS_ITEM_ID(top->item[k])].ndep == 0)))
		k++;
	*lead = k;
	return end;
}

uint32_t ts_segment_reorder(const tcp_sched *s, uint32_t lead, uint32_t end, const uint8_t *mv, ts_land land,
	uint32_t *out)
{
	const ts_region *top = &s->rg[s->top];
	uint32_t floor = 0, n = 0, moved = 0; /* items before floor stay before every moved op */
	for (uint32_t k = lead; k < end; k++) {
		uint32_t it = top->item[k], at = n;
		if (TS_ITEM_KIND(it) == TS_ITEM_OP && mv[TS_ITEM_ID(it)]) {
			const ts_op *op = &s->op[TS_ITEM_ID(it)];
			at = land == TS_LAND_IN_ORDER ? floor++ : floor;
			for (uint32_t i = floor; land == TS_LAND_AFTER_DEPS && i < n; i++)
				for (uint32_t j = 0; j < op->ndep; j++)
					if (TS_ITEM_KIND(out[i]) == TS_ITEM_OP && TS_ITEM_ID(out[i]) == op->dep[j])
						at = i + 1 > at ? i + 1 : at;
		}
		memmove(out + at + 1, out + at, (n - at) * sizeof *out);
		out[at] = it;
		n++;
		if (TS_ITEM_KIND(it) == TS_ITEM_SC)
			floor = n;
	}
	for (uint32_t k = 0; k < n; k++)
		moved += out[k] != top->item[lead + k];
	return moved;
}

/* The row's trial verifies its placed copy only where the row would be
 * taken (with < base, or with <= base where equal counts): otherwise a copy
 * that fails verification and one that is slower give the same answer. */
double ts_benefit_by_prediction(const tcp_sched *s, const ts_env *e, int row)
{
	int64_t base = trial(s, e, -1, -1), with = base < 0 ? -1 : trial(s, e, row, base - 1);
	return base < 0 || with < 0 ? 0.0 : (double)(base - with);
}

double ts_benefit_not_slower(const tcp_sched *s, const ts_env *e, int row)
{
	int64_t base = trial(s, e, -1, -1), with = base < 0 ? -1 : trial(s, e, row, base);
	if (base < 0 || with < 0)
		return 0.0;
	return base == with ? 0.5 : (double)(base - with);
}

double ts_benefit_self(const tcp_sched *s, const ts_env *e, int row)
{
	(void)s, (void)e, (void)row;
	return 1.0;
}

static moe_status opts(moe_ctx *ctx, const char *text, ts_env *e)
{
	for (const char *p = text ? text : ""; *p;) {
		size_t n = strcspn(p, ",");
		char sign = *p;
		if ((n == 13 && !strncmp(p, "reuse=ordered", n)) || (n == 15 && !strncmp(p, "reuse=unordered", n))) {
			e->reuse = n == 13 ? TS_REUSE_ORDERED : TS_REUSE_UNORDERED;
			p += n;
			p += *p == ',';
			continue;
		}
		int k = n > 1 && (sign == '-' || sign == '+') ? ts_rewrite_find(p + 1, n - 1) : -1;
		if (k < 0) {
			size_t cap = 1;
			for (int i = 0; i < ts_nrewrites; i++)
				cap += strlen(ts_rewrites[i].name) + 2;
			char *known = ctx_alloc(ctx, cap);
			for (int i = 0; i < ts_nrewrites; i++) {
				if (i)
					strcat(known, ", ");
				strcat(known, ts_rewrites[i].name);
			}
			bool signed_ = n > 1 && (sign == '-' || sign == '+');
			moe_diag(ctx, MOE_DIAG_ERROR, moe_loc_none(),
				"--tcp-opt: %s '%.*s' (each item is -NAME or +NAME, comma-separated; the rewrites: %s)",
				signed_ ? "unknown rewrite" : "malformed item", (int)(signed_ ? n - 1 : n), signed_ ? p + 1 : p,
				known);
			ctx_free(ctx, known, cap);
			return MOE_ERR_INVALID;
		}
		uint64_t bit = 1ull << k;
		e->on = sign == '+' ? e->on | bit : e->on & ~bit;
		e->off = sign == '-' ? e->off | bit : e->off & ~bit;
		p += n;
		p += *p == ',';
	}
	return MOE_OK;
}

moe_status ts_rewrite_opts(moe_ctx *ctx, const char *text, ts_env *e)
{
	CTX_GUARDED(ctx, moe_status, MOE_ERR_NOMEM, opts(ctx, text, e));
}

bool ts_rewrites_enabled(const ts_env *e, int stage)
{
	for (int k = 0; k < ts_nrewrites; k++)
		if (ts_rewrites[k].stage == stage && !(e->off >> k & 1))
			return true;
	return false;
}

static moe_status rewrites_run(tcp_sched *s, const ts_env *e, int stage)
{
	for (int k = 0; k < ts_nrewrites; k++) {
		const ts_rewrite *r = &ts_rewrites[k];
		int need = r->needs ? ts_rewrite_find(r->needs, strlen(r->needs)) : -1;
		if (r->stage != stage || e->off >> k & 1 || (r->needs && (need < 0 || !(s->ran >> need & 1))))
			continue;
		forget_applied(kept);
		kept->tried_row = -1;
		if (!r->applies(s, e) || (!(e->on >> k & 1) && !(r->benefit(s, e, k) > 0)))
			continue;
		moe_status st = MOE_OK;
		/* the trial's result (s unchanged since), which verified */
		bool verified = kept->applied && kept->applied_row == k;
		int64_t cycles = kept->tried_row == k ? kept->tried_cycles : -1;
		if (verified)
			ts_swap(s, kept->applied);
		else
			st = r->apply(s, e, (uint16_t)(k + 1));
		forget_applied(kept);
		if (st == MOE_ERR_UNSUPPORTED)
			continue; /* declined, s unchanged */
		if (st == MOE_OK && stage == TS_RW_PEEP && s->reuse == TS_REUSE_ORDERED) {
			ts_reuse_edges(s); /* the reuse order in the order the rewrite left */
			verified = false;
			cycles = -1;
		}
		if (st != MOE_OK || (!verified && tcp_sched_verify(s) != MOE_OK)) {
			moe_diag(s->ctx, MOE_DIAG_ERROR, moe_loc_none(),
				"tcp: the schedule after rewrite '%s' does not verify (a moec bug)", r->name);
			return MOE_ERR_INVALID;
		}
		s->ran |= 1ull << k;
		/* s is the copy that trial placed and predicted: the next row's
		 * base trial is that one */
		if (cycles >= 0 && kept->verified)
			keep_base(kept, s, cycles);
	}
	return MOE_OK;
}

moe_status ts_rewrites_run(tcp_sched *s, const ts_env *e, int stage)
{
	base_trial b = {.ctx = s->ctx, .outer = kept, .applied_row = -1, .tried_row = -1};
	uint32_t h = ctx_defer(s->ctx, unkeep, &b);
	size_t n0 = moe_diag_count(s->ctx);
	b.verified = tcp_sched_verify(s) == MOE_OK;
	ts_diag_truncate(s->ctx, n0);
	/* the stage runs on s as it reads back (ts_clone names and numbers its
	 * scalars in walk order): a trial's copy is then s field for field, so
	 * a priced row's applied copy is what the row applied to s gives */
	if (b.verified) {
		tcp_sched *c = ts_clone(s);
		if (c) {
			ts_swap(s, c);
			tcp_sched_free(c);
		}
	}
	kept = &b;
	moe_status st = rewrites_run(s, e, stage);
	ctx_undefer(s->ctx, h);
	kept = b.outer;
	forget(&b);
	forget_applied(&b);
	key_free(s->ctx, &b.printed);
	return st;
}

int moe_tcp_rewrite_info(uint32_t i, const char **name, const char **summary)
{
	if (i >= (uint32_t)ts_nrewrites)
		return 0;
	if (name)
		*name = ts_rewrites[i].name;
	if (summary)
		*summary = ts_rewrites[i].summary;
	return 1;
}

/* run[j]: the ops; at[o]: j + 1 for op o of the run. */
void ts_split_classes(tcp_sched *s, ts_id body, uint32_t i0, uint32_t m, ts_id count, const int64_t *bound, uint32_t n,
	const uint8_t *cut, bool case_bufs, uint16_t feature)
{
	ts_id nop0 = s->nop;
	ts_id *run = ctx_alloc(s->ctx, m * sizeof *run), *cp = ctx_alloc(s->ctx, (size_t)m * n * sizeof *cp);
	uint32_t *at = ctx_alloc(s->ctx, (nop0 + 1) * sizeof *at);
	for (uint32_t j = 0; j < m; j++) {
		run[j] = TS_ITEM_ID(s->rg[body].item[i0 + j]);
		at[run[j]] = j + 1;
	}
	ts_region *b = &s->rg[body];
	memmove(b->item + i0, b->item + i0 + m, (b->nitem - i0 - m) * sizeof *b->item);
	b->nitem -= m;
	/* a span buffer living within the run: one per case, so cases do not
	 * overlap their spans (the last case keeps the original) */
	ts_id nbuf0 = s->nbuf, *bmap = ctx_alloc(s->ctx, (size_t)nbuf0 * n * sizeof *bmap);
	for (ts_id t = 0; t < nbuf0; t++) {
		const ts_buf *bf = &s->buf[t];
		bool own = case_bufs && bf->life == TS_LIFE_SPAN && bf->first < nop0 && bf->last < nop0 && at[bf->first] && at[bf->last];
		for (uint32_t k = 0; k < n; k++) {
			bmap[(size_t)k * nbuf0 + t] = t;
			if (own && k + 1 < n) {
				ts_buf keep = s->buf[t];
				ts_id nt = ts_add_buf(s, keep.name, keep.space, keep.kind, (moe_dtype)keep.dtype, keep.rank, keep.shape);
				s->buf[nt] = keep;
				bmap[(size_t)k * nbuf0 + t] = nt;
			}
		}
	}
	ts_id cls = ts_add_classes(s, body, i0, count, bound, n);
	for (uint32_t k = 0; k < n; k++) {
		ts_id cs = TS_ITEM_ID(s->rg[cls].item[k]);
		for (uint32_t j = 0; j < m; j++) {
			if (k + 1 == n) { /* the last case: the originals */
				cp[k * m + j] = run[j];
				s->op[run[j]].region = cs;
				ts_region_push(s, cs, TS_ITEM_OP | run[j]);
				continue;
			}
			tcp_insn in = s->op[run[j]].in;
			if (cut[run[j]] && in.dim[0] > bound[k])
				in.dim[0] = bound[k];
			for (int w = 0; w < TCP_NVIEW; w++)
				if (in.v[w].t >= 0 && (ts_id)in.v[w].t < nbuf0)
					in.v[w].t = (int32_t)bmap[(size_t)k * nbuf0 + (ts_id)in.v[w].t];
			ts_id o = ts_add_op(s, cs, &in, s->op[run[j]].phase);
			s->op[o].node = s->op[run[j]].node;
			s->op[o].feature = feature;
			cp[k * m + j] = o;
		}
	}
	/* the copies' dependencies, then the originals' on the other cases */
	for (uint32_t j = 0; j < m; j++) {
		uint32_t nd = s->op[run[j]].ndep;
		for (uint32_t d = 0; d < nd; d++) {
			ts_id y = s->op[run[j]].dep[d];
			int dist = s->op[run[j]].dist[d];
			uint32_t jy = y < nop0 ? at[y] : 0;
			for (uint32_t k = 0; k + 1 < n; k++) {
				if (!jy)
					ts_add_dep(s, cp[k * m + j], y, dist);
				else if (!dist)
					ts_add_dep(s, cp[k * m + j], cp[k * m + jy - 1], 0);
				else
					for (uint32_t kk = 0; kk < n; kk++)
						ts_add_dep(s, cp[k * m + j], cp[kk * m + jy - 1], 1);
			}
			if (jy && dist)
				for (uint32_t kk = 0; kk + 1 < n; kk++)
					ts_add_dep(s, run[j], cp[kk * m + jy - 1], 1);
		}
	}
	/* every other op that waits for an op of the run waits for its copies */
	for (ts_id q = 0; q < nop0; q++) {
		if (at[q])
			continue;
		uint32_t nd = s->op[q].ndep;
		for (uint32_t d = 0; d < nd; d++) {
			ts_id x = s->op[q].dep[d];
			int dist = s->op[q].dist[d];
			if (x < nop0 && at[x])
				for (uint32_t k = 0; k + 1 < n; k++)
					ts_add_dep(s, q, cp[k * m + at[x] - 1], dist);
		}
	}
	for (ts_id t = 0; t < nbuf0; t++) {
		ts_buf *bf = &s->buf[t];
		if (bf->life != TS_LIFE_SPAN || bf->first >= nop0 || !at[bf->first])
			continue;
		if (bmap[t] == t) { /* live past the run: from its first case's copy */
			bf->first = cp[at[bf->first] - 1];
			continue;
		}
		for (uint32_t k = 0; k + 1 < n; k++) {
			ts_buf *nb = &s->buf[bmap[(size_t)k * nbuf0 + t]];
			nb->first = cp[k * m + at[bf->first] - 1];
			nb->last = cp[k * m + at[bf->last] - 1];
		}
	}
	ctx_free(s->ctx, bmap, 0);
	ctx_free(s->ctx, run, 0);
	ctx_free(s->ctx, cp, 0);
	ctx_free(s->ctx, at, 0);
}

void ts_drop_ops(tcp_sched *s, const uint8_t *drop)
{
	ts_id *map = ctx_alloc(s->ctx, (s->nop + 1) * sizeof *map);
	ts_id n = 0;
	for (ts_id o = 0; o < s->nop; o++)
		map[o] = drop[o] ? TS_NONE : n++;
	for (ts_id o = 0; o < s->nop; o++) {
		if (map[o] == TS_NONE)
			continue;
		ts_op *p = &s->op[o];
		uint32_t keep = 0;
		for (uint32_t j = 0; j < p->ndep; j++)
			if (map[p->dep[j]] != TS_NONE) {
				p->dep[keep] = map[p->dep[j]];
				p->dist[keep++] = p->dist[j];
			}
		p->ndep = keep;
		if (s->op_line)
			s->op_line[map[o]] = s->op_line[o];
		s->op[map[o]] = *p;
	}
	for (ts_id r = 0; r < s->nrg; r++) {
		ts_region *g = &s->rg[r];
		uint32_t keep = 0;
		for (uint32_t k = 0; k < g->nitem; k++) {
			uint32_t it = g->item[k];
			if (TS_ITEM_KIND(it) == TS_ITEM_OP) {
				if (map[TS_ITEM_ID(it)] == TS_NONE)
					continue;
				it = TS_ITEM_OP | map[TS_ITEM_ID(it)];
			}
			g->item[keep++] = it;
		}
		g->nitem = keep;
	}
	for (ts_id b = 0; b < s->nbuf; b++) {
		ts_buf *f = &s->buf[b];
		if (f->life != TS_LIFE_SPAN)
			continue;
		f->first = f->first == TS_NONE ? TS_NONE : map[f->first];
		f->last = f->last == TS_NONE ? TS_NONE : map[f->last];
	}
	s->nop = n;
	ctx_free(s->ctx, map, 0);
}

bool ts_same_view(const tcp_view *x, const tcp_view *y, int nd)
{
	if (x->t != y->t || x->reg != y->reg || x->base != y->base || (x->reg >= 0 && x->scale != y->scale))
		return false;
	for (int k = 0; k < nd; k++)
		if (x->stride[k] != y->stride[k])
			return false;
	return true;
}

int64_t ts_insn_numel(const tcp_insn *in)
{
	int64_t n = 1;
	for (int k = 0; k < in->ndim; k++)
		n *= in->dim[k];
	return n;
}

bool ts_view_contiguous(const tcp_view *v, int nd, const int64_t *dim)
{
	int64_t st = 1;
	for (int k = nd; k-- > 0;) {
		if (dim[k] > 1 && v->stride[k] != st)
			return false;
		st *= dim[k];
	}
	return true;
}

void ts_drop_ops_to(tcp_sched *s, const uint8_t *drop, ts_id to, const uint32_t *pos)
{
	for (ts_id b = 0; b < s->nbuf; b++) {
		ts_buf *f = &s->buf[b];
		if (f->life != TS_LIFE_SPAN)
			continue;
		if (f->first != TS_NONE && drop[f->first])
			f->first = to;
		if (f->last != TS_NONE && drop[f->last])
			f->last = to;
		if (f->first != TS_NONE && f->last != TS_NONE && pos[f->last] < pos[f->first])
			f->last = f->first;
	}
	ts_drop_ops(s, drop);
}

void ts_drop_unused_bufs(tcp_sched *s, const uint8_t *cand)
{
	uint32_t *map = ctx_alloc(s->ctx, (s->nbuf + 1) * sizeof *map);
	uint8_t *used = ctx_alloc(s->ctx, s->nbuf + 1);
	memset(used, 0, s->nbuf + 1);
	for (ts_id o = 0; o < s->nop; o++)
		for (int w = 0; w < TCP_NVIEW; w++)
			if (s->op[o].in.v[w].t >= 0)
				used[s->op[o].in.v[w].t] = 1;
	for (ts_id c = 0; c < s->nsc; c++)
		if (s->sc[c].kind == TS_SC_SPM_LD && s->sc[c].buf != TS_NONE)
			used[s->sc[c].buf] = 1;
	uint32_t n = 0;
	for (ts_id b = 0; b < s->nbuf; b++) {
		map[b] = n;
		if (cand[b] && !used[b])
			continue;
		s->buf[n] = s->buf[b];
		if (s->buf_line)
			s->buf_line[n] = s->buf_line[b];
		n++;
	}
	for (ts_id o = 0; o < s->nop; o++)
		for (int w = 0; w < TCP_NVIEW; w++)
			if (s->op[o].in.v[w].t >= 0)
				s->op[o].in.v[w].t = (int32_t)map[s->op[o].in.v[w].t];
	for (ts_id c = 0; c < s->nsc; c++)
		if (s->sc[c].kind == TS_SC_SPM_LD && s->sc[c].buf != TS_NONE)
			s->sc[c].buf = map[s->sc[c].buf];
	s->nbuf = n;
	ctx_free(s->ctx, used, 0);
	ctx_free(s->ctx, map, 0);
}

int64_t ts_item_index(const tcp_sched *s, ts_id rg, ts_id r, uint32_t it)
{
	for (int d = 0; r != rg && r < s->nrg && d < 256; d++) {
		it = TS_ITEM_RG | r;
		r = s->rg[r].parent;
	}
	if (r != rg)
		return -1;
	for (uint32_t k = 0; k < s->rg[rg].nitem; k++)
		if (s->rg[rg].item[k] == it)
			return k;
	return -1;
}

int64_t ts_op_index(const tcp_sched *s, ts_id rg, ts_id o)
{
	return ts_item_index(s, rg, s->op[o].region, TS_ITEM_OP | o);
}

void ts_op_drop_deps(ts_op *q, const uint8_t *drop)
{
	uint32_t keep = 0;
	for (uint32_t j = 0; j < q->ndep; j++)
		if (!drop[q->dep[j]]) {
			q->dep[keep] = q->dep[j];
			q->dist[keep++] = q->dist[j];
		}
	q->ndep = keep;
}

void ts_view_fixed_row(const tcp_insn *in, tcp_view *v, int32_t t, int64_t base)
{
	v->t = t;
	v->base = base;
	v->reg = -1;
	v->scale = 0;
	for (int k = 0; k + 1 < in->ndim; k++)
		v->stride[k] = 0;
}

bool ts_buf_gathered_only(const tcp_sched *s, int32_t t)
{
	for (ts_id o = 0; o < s->nop; o++)
		if (ts_op_reads(&s->op[o], t) && s->op[o].in.op != TCP_OP_DMA_GATHER)
			return false;
	for (ts_id c = 0; c < s->nsc; c++)
		if (s->sc[c].kind == TS_SC_SPM_LD && s->sc[c].buf == (ts_id)t)
			return false;
	return true;
}

void ts_split_on_nb(tcp_sched *s, ts_id rg, uint32_t at, ts_id o, uint16_t feature)
{
	enum { NB_CLASSES = 32 };
	int64_t bound[NB_CLASSES + 1];
	uint32_t n = ts_even_bounds(s->loop[0].G, NB_CLASSES, bound);
	uint8_t *cut = ctx_alloc(s->ctx, s->nop + 1);
	memset(cut, 0, s->nop + 1);
	cut[o] = 1;
	ts_split_classes(s, rg, at, 1, s->loop[0].nb, bound, n, cut, false, feature);
	ctx_free(s->ctx, cut, 0);
}

void ts_buf_uses(const tcp_sched *s, ts_id b, uint32_t *nw, uint32_t *nr, ts_id *w, ts_id *r)
{
	*nw = *nr = 0;
	*w = *r = TS_NONE;
	for (ts_id o = 0; o < s->nop; o++) {
		if (ts_op_writes(&s->op[o], (int32_t)b))
			++*nw, *w = o;
		if (ts_op_reads(&s->op[o], (int32_t)b))
			++*nr, *r = o;
	}
}

bool ts_offsets_pass(const tcp_sched *s, ts_id ibh, int64_t row_bytes, int64_t n, ts_id *cp, ts_id *ib, ts_id *vb)
{
	uint32_t nw, nr;
	ts_id w, r;
	ts_buf_uses(s, ibh, &nw, &nr, &w, &r);
	if (nw != 1)
		return false;
	const tcp_insn *c = &s->op[w].in;
	if (c->op != TCP_OP_DMA_COPY || c->v[TCP_V_S0].t < 0)
		return false;
	*cp = w;
	*ib = (ts_id)c->v[TCP_V_S0].t;
	ts_buf_uses(s, *ib, &nw, &nr, &w, &r);
	if (nw != 1 || nr != 1 || r != *cp || ts_buf_spm_read(s, *ib))
		return false;
	*vb = w;
	const tcp_insn *v = &s->op[w].in;
	return v->op == TCP_OP_TU_VEC && v->nstep == 1 && v->step[0].op == TCP_V_IMUL && v->step[0].x == TCP_SRC_V &&
	       v->step[0].y == TCP_SRC_IMM && (int64_t)v->step[0].imm == row_bytes && v->ndim == 1 && v->dim[0] == n;
}

bool ts_buf_read_per_block(const tcp_sched *s, const ts_loop *l, int32_t t, int64_t p, const uint8_t *skip)
{
	if (ts_buf_spm_read(s, (ts_id)t))
		return false;
	for (ts_id o = 0; o < s->nop; o++) {
		if (skip && skip[o])
			continue;
		const tcp_insn *in = &s->op[o].in;
		if (in->v[TCP_V_DST].t == t)
			return false;
		for (int k = TCP_V_S0; k < TCP_NVIEW; k++) {
			const tcp_view *v = &in->v[k];
			if (v->t != t)
				continue;
			if (!ts_region_within(s, s->op[o].region, l->body) || v->reg < 0 || (ts_id)v->reg != l->g ||
				v->scale != p)
				return false;
			int64_t lo, hi;
			ts_view_span(in, v, &lo, &hi);
			if (lo < 0 || hi > p)
				return false;
		}
	}
	return true;
}

bool ts_view_strides(const tcp_view *v, int n, const int64_t *st)
{
	for (int k = 0; k < n; k++)
		if (v->stride[k] != st[k])
			return false;
	return true;
}

int64_t ts_granule_words(const tcp_sched *s)
{
	int64_t w = s->m->hbm_granule / 4;
	return w < 1 ? 1 : w;
}

void ts_set_insn(tcp_sched *s, ts_id o, const tcp_insn *in, uint16_t feature)
{
	ts_op *p = &s->op[o];
	in = in ? in : &p->in;
	uint8_t ph = p->in.phase;
	p->in = *in;
	p->in.phase = ph;
	p->ctx = tcp_op_ctx[p->in.op];
	p->cost = 0;
	p->feature = feature;
}

ts_layout ts_layout_spread(const tcp_sched *s, ts_layout lay, int64_t n)
{
	int64_t per = lay.nslices * (int64_t)lay.copies, f = s->m->flit_bytes;
	lay.slice_bytes = ((n + per - 1) / per + f - 1) / f * f;
	if (!lay.slice_bytes)
		lay.slice_bytes = f;
	return lay;
}

uint32_t ts_even_bounds(int64_t n, int64_t parts, int64_t *b)
{
	int64_t step = (n + parts - 1) / parts;
	uint32_t k = 0;
	for (int64_t h = step; h < n; h += step)
		b[k++] = h;
	b[k++] = n;
	return k;
}

/* Where the speculative fetches go in the top region: right after the last
 * DMA command that stands before the first DMA command depending, directly
 * or through other ops, on a contraction (routing's results all come from
 * the router's: the dispatch's byte offsets, the experts' staging) or
 * staging scalars; at the region's start when there is none. The DMA
 * commands before that point (the copies of x and the router's weights and
 * biases, const-tier's dispatch by a constant list) are what routing or the
 * dispatch read first; after them the DMA context would wait for routing,
 * and the control processor issues the fetches as early as program order
 * allows. */
uint32_t ts_spec_insert_at(const tcp_sched *s, moe_ctx *ctx)
{
	const ts_region *top = &s->rg[s->top];
	bool *late = ctx_alloc(ctx, s->nop + 1);
	memset(late, 0, s->nop + 1);
	uint32_t at = 0;
	for (uint32_t k = 0; k < top->nitem; k++) {
		uint32_t it = top->item[k];
		if (TS_ITEM_KIND(it) == TS_ITEM_RG)
			break;
		if (TS_ITEM_KIND(it) != TS_ITEM_OP)
			continue;
		ts_id o = TS_ITEM_ID(it);
		const ts_op *op = &s->op[o];
		for (uint32_t j = 0; j < op->ndep; j++)
			late[o] |= op->dep[j] < s->nop && late[op->dep[j]];
		late[o] |= op->in.op == TCP_OP_TU_CONTRACT;
		if (op->ctx != TCP_CTX_DMA)
			continue;
		if (late[o] || op->in.op == TCP_OP_DMA_SPM)
			break;
		at = k + 1;
	}
	ctx_free(ctx, late, 0);
	return at;
}

uint32_t ts_spec_guard(tcp_sched *s, ts_id rg, ts_id gd, const ts_id *ops, const ts_id *sp, uint32_t n)
{
	ts_region *r = &s->rg[rg];
	uint32_t keep = 0, gat = UINT32_MAX;
	for (uint32_t k = 0; k < r->nitem; k++) {
		uint32_t it = r->item[k];
		bool mv = false;
		for (uint32_t i = 0; i < n && TS_ITEM_KIND(it) == TS_ITEM_OP; i++)
			mv |= TS_ITEM_ID(it) == ops[i];
		if (mv) {
			if (gat == UINT32_MAX)
				gat = keep;
			continue;
		}
		r->item[keep++] = it;
	}
	r->nitem = keep;
	for (uint32_t i = 0; i < n; i++) {
		ts_region_push(s, gd, TS_ITEM_OP | ops[i]);
		s->op[ops[i]].region = gd;
	}
	/* the slots are live from the speculative copy on */
	for (uint32_t i = 0; i < n; i++) {
		ts_buf *b = &s->buf[s->op[ops[i]].in.v[TCP_V_DST].t];
		if (b->life == TS_LIFE_LOOP || b->life == TS_LIFE_BLOCK) {
			b->life = TS_LIFE_SPAN;
			b->first = sp[i];
			b->last = ops[i];
		}
	}
	return gat;
}

bool ts_buf_touched_outside(const tcp_sched *s, ts_id b, ts_id loop_rg)
{
	for (ts_id o = 0; o < s->nop; o++) {
		if (ts_region_within(s, s->op[o].region, loop_rg))
			continue;
		if (ts_op_writes(&s->op[o], (int32_t)b) || ts_op_reads(&s->op[o], (int32_t)b))
			return true;
	}
	return false;
}

bool ts_buf_written(const tcp_sched *s, ts_id b)
{
	for (ts_id o = 0; o < s->nop; o++)
		if (ts_op_writes(&s->op[o], (int32_t)b))
			return true;
	return false;
}

ts_id ts_spec_copy(tcp_sched *s, const tcp_insn *in, ts_id like, uint32_t at, uint16_t feature)
{
	ts_id o = ts_add_op(s, TS_NONE, in, s->op[like].phase);
	s->op[o].region = s->top;
	s->op[o].feature = feature;
	s->op[o].node = s->op[like].node;
	ts_region_insert(s, s->top, at, TS_ITEM_OP | o);
	return o;
}

void ts_spec_waiters(tcp_sched *s, const ts_id *ops, const ts_id *sp, uint32_t n, ts_id nop0)
{
	for (ts_id o = 0; o < nop0; o++)
		for (uint32_t i = 0; i < n; i++)
			if (o == ops[i] || ts_op_has_dep(&s->op[o], ops[i], 0) || ts_op_has_dep(&s->op[o], ops[i], 1) ||
				ts_op_writes(&s->op[o], s->op[ops[i]].in.v[TCP_V_DST].t))
				ts_add_dep_once(s, o, sp[i], 0);
}

uint32_t ts_deps_union(const tcp_sched *s, const ts_id *ops, uint32_t n, uint8_t *mark)
{
	uint32_t u = 0;
	for (int pass = 0; pass < 2; pass++)
		for (uint32_t j = 0; j < n; j++)
			for (uint32_t k = 0; k < s->op[ops[j]].ndep; k++) {
				ts_id d = s->op[ops[j]].dep[k];
				size_t m = (size_t)(d < s->nop ? d : s->nop) * 2 + (s->op[ops[j]].dist[k] != 0);
				u += !pass && !mark[m];
				mark[m] = (uint8_t)!pass;
			}
	return u;
}
