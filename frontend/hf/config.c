/* frontend/hf/config.c: config.json access for the importer - key aliases,
 * nested paths, per-layer lists - and which decoder layers are MoE. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "frontend/hf/hf_cfg.h"
#include "runtime/rt_io.h"

void hf_err(hf_cfg *c, const char *fmt, ...)
{
	char msg[768];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof msg, fmt, ap);
	va_end(ap);
	rt_err_at(c->ctx, c->file, -1, "%s", msg);
	c->bad = true;
}

/* One '.'-separated path from obj; NULL if absent or null. */
static const cJSON *path_get(const cJSON *obj, const char *p, size_t len)
{
	const cJSON *v = obj;
	while (len && v) {
		const char *dot = memchr(p, '.', len);
		size_t n = dot ? (size_t)(dot - p) : len;
		char key[128];
		if (n >= sizeof key || !cJSON_IsObject(v))
			return NULL;
		memcpy(key, p, n);
		key[n] = 0;
		v = cJSON_GetObjectItemCaseSensitive(v, key);
		p += n + (dot != NULL);
		len -= n + (dot != NULL);
	}
	return v && !cJSON_IsNull(v) ? v : NULL;
}

const cJSON *hf_item(const hf_cfg *c, const char *spec, char *which, size_t n)
{
	for (const char *p = spec; *p;) {
		const char *bar = strchr(p, '|');
		size_t len = bar ? (size_t)(bar - p) : strlen(p);
		const cJSON *v = path_get(c->obj, p, len);
		if (v) {
			if (which)
				snprintf(which, n, "%.*s", (int)len, p);
			return v;
		}
		p += len + (bar != NULL);
	}
	return NULL;
}

const char *hf_default(const hf_cfg *c, const char *spec, char *which, size_t n)
{
	if (!c->defaults)
		return NULL;
	for (const char *p = spec; *p;) {
		const char *bar = strchr(p, '|');
		size_t len = bar ? (size_t)(bar - p) : strlen(p);
		for (const char *d = c->defaults; *d; d += strlen(d) + 1)
			if (strlen(d) > len && d[len] == '=' && !strncmp(d, p, len)) {
				if (which)
					snprintf(which, n, "%.*s", (int)len, p);
				return d + len + 1;
			}
		p += len + (bar != NULL);
	}
	return NULL;
}

/* A default's text as a double; NAN if it is not a number. */
static double default_num(const char *v)
{
	char *end;
	double d = strtod(v, &end);
	return *end || end == v ? NAN : d;
}

/* The integer value of v (an element [layer] if v is a list) in [lo, hi]. */
static bool int_of(hf_cfg *c, const char *key, const cJSON *v, int64_t lo, int64_t hi, int64_t *out)
{
	if (cJSON_IsArray(v)) {
		int n = cJSON_GetArraySize(v);
		if (c->layer >= n) {
			hf_err(c, "config key '%s' lists %d per-layer values; layer %lld has none", key, n,
				(long long)c->layer);
			return false;
		}
		v = cJSON_GetArrayItem(v, (int)c->layer);
	}
	double d = cJSON_IsNumber(v) ? v->valuedouble : NAN;
	if (!(d >= (double)lo && d <= (double)hi) || d != floor(d)) {
		hf_err(c, "config key '%s' must be an integer in %lld..%lld", key, (long long)lo, (long long)hi);
		return false;
	}
	*out = (int64_t)d;
	return true;
}

int64_t hf_int(hf_cfg *c, const char *spec, bool required, int64_t def, int64_t lo, int64_t hi)
{
	char found[128] = "";
	int64_t val = def;
	for (const char *p = spec; *p;) {
		const char *bar = strchr(p, '|');
		size_t len = bar ? (size_t)(bar - p) : strlen(p);
		const cJSON *v = path_get(c->obj, p, len);
		char key[128];
		snprintf(key, sizeof key, "%.*s", (int)len, p);
		p += len + (bar != NULL);
		if (!v)
			continue;
		int64_t x;
		if (!int_of(c, key, v, lo, hi, &x))
			return def;
		if (*found && x != val) {
			hf_err(c, "config keys '%s' (%lld) and '%s' (%lld) disagree", found, (long long)val, key,
				(long long)x);
			return def;
		}
		snprintf(found, sizeof found, "%s", key);
		val = x;
	}
	const char *dv = *found ? NULL : hf_default(c, spec, found, sizeof found);
	if (dv && *dv == '@') /* the default is another key's value */
		return hf_int(c, dv + 1, required, def, lo, hi);
	if (dv) {
		double d = default_num(dv);
		if (d >= (double)lo && d <= (double)hi && d == floor(d))
			return (int64_t)d;
		*found = 0;
	}
	if (!*found && required) {
		char list[256] = "";
		size_t at = 0;
		for (const char *p = spec; *p && at < sizeof list;) {
			const char *bar = strchr(p, '|');
			size_t len = bar ? (size_t)(bar - p) : strlen(p);
			at += (size_t)snprintf(list + at, sizeof list - at, "%s'%.*s'", p == spec ? "" : " / ", (int)len, p);
			p += len + (bar != NULL);
		}
		hf_err(c, "config lacks %s", list);
	}
	return val;
}

double hf_num(hf_cfg *c, const char *spec, double def)
{
	char key[128];
	const cJSON *v = hf_item(c, spec, key, sizeof key);
	const char *dv = v ? NULL : hf_default(c, spec, NULL, 0);
	if (dv && isfinite(default_num(dv)))
		return default_num(dv);
	if (!v)
		return def;
	if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble)) {
		hf_err(c, "config key '%s' must be a number", key);
		return def;
	}
	return v->valuedouble;
}

bool hf_bool(hf_cfg *c, const char *spec, bool def)
{
	char key[128];
	const cJSON *v = hf_item(c, spec, key, sizeof key);
	const char *dv = v ? NULL : hf_default(c, spec, NULL, 0);
	if (dv)
		return !strcmp(dv, "true");
	if (!v)
		return def;
	if (!cJSON_IsBool(v)) {
		hf_err(c, "config key '%s' must be true or false", key);
		return def;
	}
	return cJSON_IsTrue(v);
}

const char *hf_str(hf_cfg *c, const char *spec, const char *def)
{
	char key[128];
	const cJSON *v = hf_item(c, spec, key, sizeof key);
	const char *dv = v ? NULL : hf_default(c, spec, NULL, 0);
	if (dv)
		return dv;
	if (!v)
		return def;
	if (!cJSON_IsString(v)) {
		hf_err(c, "config key '%s' must be a string", key);
		return def;
	}
	return v->valuestring;
}

/* ---- MoE layers ---- */

typedef struct lctx {
	hf_cfg *c;
	bool quiet;
	char *why;
	size_t n;
	char *kind;
	size_t kn;
} lctx;

/* What a layer named by a per-layer type list is (its value there). */
static void kind_of(lctx *l, const char *type)
{
	static const struct {
		const char *type, *kind;
	} kinds[] = {
		{"mamba", "a mamba layer"}, {"M", "a mamba layer"}, {"attention", "an attention layer"},
		{"*", "an attention layer"}, {"full_attention", "an attention layer"},
		{"linear_attention", "a linear attention layer"}, {"mlp", "a dense MLP layer"}, {"-", "a dense MLP layer"},
		{"dense", "a dense MLP layer"},
	};
	for (size_t i = 0; i < sizeof kinds / sizeof *kinds; i++)
		if (!strcmp(type, kinds[i].type)) {
			snprintf(l->kind, l->kn, "%s", kinds[i].kind);
			return;
		}
	snprintf(l->kind, l->kn, "a '%.40s' layer", type);
}

static void bad(lctx *l, const char *key, const char *what)
{
	if (!l->quiet)
		hf_err(l->c, "config key '%s' must be %s", key, what);
	else
		l->c->bad = true;
}

/* Element L of the list `key`: 1 = an element, 0 = the key is absent, -1 = error (not a list / too short). */
static int elem(lctx *l, const char *key, int64_t L, const cJSON **out)
{
	const cJSON *v = hf_item(l->c, key, NULL, 0);
	if (!v)
		return 0;
	bool pattern = !strcmp(key, "hybrid_override_pattern"); /* a string, one character per layer */
	if (pattern ? !cJSON_IsString(v) : !cJSON_IsArray(v)) {
		bad(l, key, pattern ? "a string" : "a per-layer list");
		return -1;
	}
	if (cJSON_IsArray(v) && L >= cJSON_GetArraySize(v)) {
		if (!l->quiet)
			hf_err(l->c, "config key '%s' has %d entries; layer %lld has none", key, cJSON_GetArraySize(v),
				(long long)L);
		return -1;
	}
	*out = cJSON_IsArray(v) ? cJSON_GetArrayItem(v, (int)L) : v;
	return 1;
}

/* 1 if the integer list `key` contains L, 0 if not, -1 if absent or bad. */
static int list_has(lctx *l, const char *key, int64_t L)
{
	const cJSON *v = hf_item(l->c, key, NULL, 0);
	if (!v)
		return -1;
	if (!cJSON_IsArray(v)) {
		bad(l, key, "a list of layer indices");
		return -1;
	}
	for (const cJSON *e = v->child; e; e = e->next) {
		if (!cJSON_IsNumber(e) || e->valuedouble != floor(e->valuedouble)) {
			bad(l, key, "a list of layer indices");
			return -1;
		}
		if (e->valuedouble == (double)L) /* no cast: the entry may exceed int64 */
			return 1;
	}
	return 0;
}

static int64_t opt_int(lctx *l, const char *key, int64_t def, int64_t lo)
{
	const cJSON *v = hf_item(l->c, key, NULL, 0);
	const char *dv = v ? NULL : hf_default(l->c, key, NULL, 0);
	if (dv && default_num(dv) >= (double)lo && default_num(dv) == floor(default_num(dv)))
		return (int64_t)default_num(dv);
	if (!v)
		return def;
	if (!cJSON_IsNumber(v) || !(v->valuedouble >= (double)lo && v->valuedouble <= (double)HF_MAX_DIM) ||
		v->valuedouble != floor(v->valuedouble)) {
		char what[64];
		snprintf(what, sizeof what, "an integer in %lld..2147483647", (long long)lo);
		bad(l, key, what);
		return def;
	}
	return (int64_t)v->valuedouble;
}

#define DENSE(...) (snprintf(l->why, l->n, __VA_ARGS__), 0)

/* The per-layer type lists: 1 MoE, 0 dense, 2 no list, -1 error. */
static int by_lists(lctx *l, unsigned rules, int64_t L)
{
	const cJSON *e;
	int k;
	if ((rules & HF_L_TYPES) && (k = elem(l, "mlp_layer_types", L, &e)) != 0) {
		if (k < 0 || !cJSON_IsString(e))
			return k < 0 ? -1 : (bad(l, "mlp_layer_types", "a list of \"sparse\" / \"dense\""), -1);
		return !strcmp(e->valuestring, "sparse") ? 1 : DENSE("mlp_layer_types[%lld] is '%s'", (long long)L,
			e->valuestring);
	}
	if ((rules & HF_L_BLOCKS) && (k = elem(l, "layers_block_type", L, &e)) != 0) {
		if (k < 0 || !cJSON_IsString(e))
			return k < 0 ? -1 : (bad(l, "layers_block_type", "a list of block type names"), -1);
		if (!strcmp(e->valuestring, "moe"))
			return 1;
		kind_of(l, e->valuestring);
		return DENSE("layers_block_type[%lld] is '%s'", (long long)L, e->valuestring);
	}
	if ((rules & HF_L_BLOCKS) && (k = elem(l, "hybrid_override_pattern", L, &e)) != 0) {
		if (k < 0 || !cJSON_IsString(e))
			return k < 0 ? -1 : (bad(l, "hybrid_override_pattern", "a string"), -1);
		if ((int64_t)strlen(e->valuestring) <= L)
			return DENSE("hybrid_override_pattern has no character for it");
		char ch = e->valuestring[L], t[2] = {ch, 0};
		if (ch == 'E')
			return 1;
		kind_of(l, t);
		return DENSE("hybrid_override_pattern[%lld] is '%c', not 'E'", (long long)L, ch);
	}
	return 2;
}

static int by_keys(lctx *l, unsigned rules, int64_t L, int64_t nl)
{
	if ((rules & HF_L_MLP_ONLY) && list_has(l, "mlp_only_layers", L) == 1)
		return DENSE("listed in mlp_only_layers");
	if (rules & HF_L_SPARSE_STEP) {
		int64_t step = opt_int(l, "decoder_sparse_step", 1, 1);
		if ((L + 1) % step)
			return DENSE("decoder_sparse_step = %lld: MoE layers have (layer + 1) %% %lld == 0", (long long)step,
				(long long)step);
	}
	if (rules & HF_L_FIRST_K) {
		int64_t k = opt_int(l, "first_k_dense_replace", 0, 0);
		if (L < k)
			return DENSE("the first %lld layers are dense (first_k_dense_replace)", (long long)k);
	}
	if (rules & HF_L_FREQ) {
		const cJSON *v = hf_item(l->c, "moe_layer_freq", NULL, 0);
		if (cJSON_IsArray(v)) {
			const cJSON *e;
			if (elem(l, "moe_layer_freq", L, &e) < 0)
				return -1;
			if (!cJSON_IsNumber(e))
				return bad(l, "moe_layer_freq", "an integer or a per-layer 0/1 list"), -1;
			if (e->valuedouble == 0)
				return DENSE("moe_layer_freq[%lld] is 0", (long long)L);
		} else {
			int64_t freq = opt_int(l, "moe_layer_freq", 1, 1);
			if (L % freq)
				return DENSE("moe_layer_freq = %lld", (long long)freq);
		}
	}
	if (rules & HF_L_LLAMA4) {
		int has = list_has(l, "moe_layers", L);
		if (has == 0)
			return DENSE("not in moe_layers");
		int64_t step = opt_int(l, "interleave_moe_layer_step", 1, 1);
		if (has < 0 && (L + 1) % step)
			return DENSE("interleave_moe_layer_step = %lld: MoE layers have (layer + 1) %% %lld == 0",
				(long long)step, (long long)step);
	}
	if (rules & HF_L_JAMBA) {
		int64_t period = opt_int(l, "expert_layer_period", 2, 1), off = opt_int(l, "expert_layer_offset", 1, 0);
		if (L % period != off)
			return DENSE("expert_layer_period = %lld, expert_layer_offset = %lld", (long long)period,
				(long long)off);
	}
	if (rules & HF_L_ERNIE) {
		int64_t start = opt_int(l, "moe_layer_start_index", 0, 0), end = opt_int(l, "moe_layer_end_index", -1, -1);
		int64_t iv = opt_int(l, "moe_layer_interval", 1, 1);
		if (end < 0)
			end = nl > 0 ? nl - 1 : HF_MAX_DIM;
		if (L < start || L > end || (L + 1) % iv)
			return DENSE("moe_layer_start_index = %lld, moe_layer_end_index = %lld, moe_layer_interval = %lld",
				(long long)start, (long long)end, (long long)iv);
	}
	return 1;
}

int hf_layer_kind(hf_cfg *c, const hf_family *f, int64_t L, int64_t nl, bool quiet, char *why, size_t n,
	char *kind, size_t kn)
{
	char ignored[64];
	lctx l = {c, quiet, why, n, kind ? kind : ignored, kind ? kn : sizeof ignored};
	snprintf(l.kind, l.kn, "a dense MLP layer");
	bool was_bad = c->bad;
	int k = by_lists(&l, f->layers, L);
	if (k == 2)
		k = by_keys(&l, f->layers, L, nl);
	if (quiet)
		c->bad = was_bad;
	return k;
}
