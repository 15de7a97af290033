/* backend-tcp/api.c: public entry points that glue the pieces: atomic file
 * writers, loaders that validate, the summary, stats JSON. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <string.h>

#include "backend-tcp/isa/tcp_int.h"
#include "moec/io.h"

moe_status moe_tcp_write_asm(moe_ctx *ctx, const moe_tcp_program *p, const char *path)
{
	char *s;
	size_t n;
	moe_status rc = moe_tcp_to_asm(ctx, p, &s, &n);
	if (rc != MOE_OK)
		return rc;
	rc = moe_write_file_atomic(ctx, path, s, n);
	free(s);
	return rc;
}

moe_status moe_tcp_to_binary(moe_ctx *ctx, const moe_tcp_program *p, uint8_t **out, size_t *len)
{
	(void)ctx;
	return tcp_encode(p, out, len);
}

static moe_status write_binary(moe_ctx *ctx, const moe_tcp_program *p, const char *path)
{
	uint8_t *b;
	size_t n;
	moe_status rc = tcp_encode(p, &b, &n);
	if (rc != MOE_OK)
		return rc;
	uint32_t h = ctx_defer(ctx, free, b); /* the encoder's buffer is libc's */
	rc = moe_write_output(ctx, path, MOE_OUTPUT_BINARY, b, n);
	ctx_undefer(ctx, h);
	free(b);
	return rc;
}

moe_status moe_tcp_write_binary(moe_ctx *ctx, const moe_tcp_program *p, const char *path)
{
	CTX_GUARDED(ctx, moe_status, MOE_ERR_NOMEM, write_binary(ctx, p, path));
}

static moe_tcp_program *checked(moe_ctx *ctx, const char *file, tcp_program *p, const moe_tcp_machine *m)
{
	if (!p)
		return NULL;
	moe_tcp_machine *def = NULL;
	if (!m) {
		def = moe_tcp_machine_default(ctx);
		m = def;
	}
	moe_status rc = m ? tcp_validate(ctx, p, m, file) : MOE_ERR_INTERNAL;
	if (rc == MOE_OK)
		rc = tcp_check_termination(ctx, p, file);
	moe_tcp_machine_free(ctx, def);
	if (rc != MOE_OK) {
		tcp_prog_free(p);
		return NULL;
	}
	return p;
}

static moe_tcp_program *from_binary(moe_ctx *ctx, const char *file, const uint8_t *buf, size_t len,
	const moe_tcp_machine *m)
{
	return checked(ctx, file, tcp_decode(ctx, file ? file : "<tcpb>", buf, len), m);
}

moe_tcp_program *moe_tcp_from_binary(moe_ctx *ctx, const char *file, const uint8_t *buf, size_t len,
	const moe_tcp_machine *m)
{
	CTX_GUARDED(ctx, moe_tcp_program *, NULL, from_binary(ctx, file, buf, len, m));
}

static moe_tcp_program *from_asm(moe_ctx *ctx, const char *file, const char *text, size_t len, const moe_tcp_machine *m)
{
	return checked(ctx, file, tcp_parse_asm(ctx, file, text, len), m);
}

moe_tcp_program *moe_tcp_from_asm(moe_ctx *ctx, const char *file, const char *text, size_t len,
	const moe_tcp_machine *m)
{
	CTX_GUARDED(ctx, moe_tcp_program *, NULL, from_asm(ctx, file, text, len, m));
}

static moe_tcp_program *load_binary(moe_ctx *ctx, const char *path, const moe_tcp_machine *m)
{
	char *buf;
	size_t len;
	if (moe_read_file_max(ctx, path, TCP_MAX_BINARY_BYTES, &buf, &len) != MOE_OK)
		return NULL;
	uint32_t h = ctx_defer(ctx, free, buf); /* the reader's buffer is libc's */
	moe_tcp_program *p = moe_tcp_from_binary(ctx, path, (const uint8_t *)buf, len, m);
	ctx_undefer(ctx, h);
	free(buf);
	return p;
}

moe_tcp_program *moe_tcp_load_binary(moe_ctx *ctx, const char *path, const moe_tcp_machine *m)
{
	CTX_GUARDED(ctx, moe_tcp_program *, NULL, load_binary(ctx, path, m));
}

moe_status moe_tcp_print_summary(const moe_tcp_program *p, FILE *out)
{
	static const char *const sp[TCP_NSPACE] = {"hbm", "dm", "trf", "vrf"};
	int64_t per[TCP_NCTX] = {0}, bytes[TCP_NSPACE] = {0};
	for (uint32_t i = 0; i < p->ncode; i++)
		per[tcp_op_ctx[p->code[i].op]]++;
	for (uint32_t i = 0; i < p->nt; i++)
		bytes[p->t[i].space] += p->t[i].numel * (int64_t)moe_dtype_size((moe_dtype)p->t[i].dtype);
	uint32_t npacked = 0;
	for (uint32_t i = 0; i < p->nt; i++)
		npacked += p->t[i].kind == TCP_T_PACKED;
	fprintf(out, "tcpb version %u\nsections: meta, tensors (%u), constants (%lld bytes), code (%u instructions: "
		"control %lld, main %lld, sub %lld, dma %lld), prep (%zu bytes: %u packed weights)\n",
		TCP_TCPB_VERSION, p->nt, (long long)p->nconst, p->ncode, (long long)per[0], (long long)per[1],
		(long long)per[2], (long long)per[3], p->prep_len, npacked);
	for (int s = 0; s < TCP_NSPACE; s++)
		fprintf(out, "%s bytes: %lld\n", sp[s], (long long)bytes[s]);
	fprintf(out, "layer: T=%lld K=%lld E=%lld B=%lld grid blocks=%lld\n", (long long)p->moe_T, (long long)p->moe_K,
		(long long)p->moe_E, (long long)p->moe_B, (long long)p->moe_G);
	if (p->tier_n > 0)
		fprintf(out, "decode tier: n_tokens = %lld runs the layer compiled for T = 1\n", (long long)p->tier_n);
	for (uint32_t i = 0; i < p->nt; i++) {
		const tcp_tensor *t = &p->t[i];
		if (t->kind == TCP_T_SCRATCH)
			continue;
		fprintf(out, "tensor %%%u %s %s %s [", i,
			tcp_kind_names[t->kind],
			t->name, moe_dtype_name((moe_dtype)t->dtype));
		for (int k = 0; k < t->rank; k++)
			fprintf(out, "%s%lld", k ? ", " : "", (long long)t->shape[k]);
		fprintf(out, "]");
		if (t->source[0])
			fprintf(out, " = \"%s\"", t->source);
		fprintf(out, "\n");
	}
	if (p->prep_len) {
		/* the checkpoint weights the packed ones are computed from */
		moe_module *iface = moe_tcp_interface(p->ctx, p);
		const moe_graph *g = iface ? moe_module_graph(iface, 0) : NULL;
		for (moe_id i = 0; g && i < g->nnodes; i++) {
			const ir_node *n = N(g, i);
			bool direct = false;
			for (uint32_t k = 0; k < p->nt && !direct; k++)
				direct = p->t[k].kind == TCP_T_WEIGHT && !strcmp(p->t[k].name, n->name);
			if (n->op != MOE_OP_WEIGHT || direct)
				continue;
			fprintf(out, "packs from weight %s %s [", n->name, moe_dtype_name((moe_dtype)n->dtype));
			for (int k = 0; k < n->rank; k++)
				fprintf(out, "%s%lld", k ? ", " : "", (long long)n->shape[k]);
			fprintf(out, "] = \"%s\"\n", ir_attr_str(n, "source", ""));
		}
		moe_module_free(iface);
	}
	return ferror(out) ? MOE_ERR_IO : MOE_OK;
}

const char *moe_tcp_engine_name(int e)
{
	static const char *const n[MOE_TCP_NENGINES] = {"control", "main", "sub", "dma", "contraction", "vector"};
	return e >= 0 && e < MOE_TCP_NENGINES ? n[e] : "?";
}

char *moe_tcp_stats_json(moe_ctx *ctx, const moe_tcp_stats *s)
{
	(void)ctx;
	cJSON *o = cJSON_CreateObject();
	cJSON_AddNumberToObject(o, "simulated_seconds", s->simulated_seconds);
	cJSON_AddNumberToObject(o, "roofline_seconds", s->roofline_seconds);
	cJSON_AddNumberToObject(o, "roofline_ratio", s->roofline_ratio);
	cJSON_AddNumberToObject(o, "cycles", (double)s->cycles);
	cJSON *b = cJSON_AddObjectToObject(o, "busy_cycles");
	for (int e = 0; e < MOE_TCP_NENGINES; e++)
		cJSON_AddNumberToObject(b, moe_tcp_engine_name(e), (double)s->busy_cycles[e]);
	cJSON_AddNumberToObject(o, "hbm_read_bytes", (double)s->hbm_read_bytes);
	cJSON_AddNumberToObject(o, "hbm_write_bytes", (double)s->hbm_write_bytes);
	cJSON_AddNumberToObject(o, "blocks_executed", (double)s->blocks_executed);
	cJSON_AddNumberToObject(o, "blocks_skipped", (double)s->blocks_skipped);
	cJSON_AddNumberToObject(o, "blocks_max", (double)s->blocks_max);
	cJSON_AddNumberToObject(o, "experts_hit", (double)s->experts_hit);
	cJSON_AddNumberToObject(o, "flops", s->flops);
	cJSON_AddNumberToObject(o, "commands", (double)s->commands);
	cJSON_AddNumberToObject(o, "instructions", (double)s->instructions);
	cJSON_AddNumberToObject(o, "expert_seconds", s->expert_seconds);
	cJSON_AddNumberToObject(o, "routing_seconds", s->routing_seconds);
	cJSON_AddNumberToObject(o, "routing_share", s->simulated_seconds > 0 ? s->routing_seconds / s->simulated_seconds : 0);
	cJSON *rb = cJSON_AddObjectToObject(o, "routing_busy_cycles");
	for (int e = MOE_TCP_ENGINE_MAIN; e < MOE_TCP_NENGINES; e++)
		cJSON_AddNumberToObject(rb, moe_tcp_engine_name(e), (double)s->routing_busy_cycles[e]);
	cJSON_AddBoolToObject(o, "timing_only", s->timing_only);
	cJSON_AddNumberToObject(o, "expert_start_seconds", s->expert_start_seconds);
	char *r = cJSON_Print(o);
	cJSON_Delete(o);
	return r;
}

void moe_tcp_program_hbm(const moe_tcp_program *p, int64_t *total, int64_t *weights)
{
	int64_t top = 0, w = 0;
	for (uint32_t i = 0; p && i < p->nt; i++) {
		const tcp_tensor *t = &p->t[i];
		if (t->space != TCP_HBM)
			continue;
		int64_t bytes = t->numel * (int64_t)moe_dtype_size((moe_dtype)t->dtype);
		if (t->addr + bytes > top)
			top = t->addr + bytes;
		if (t->kind == TCP_T_WEIGHT || t->kind == TCP_T_PACKED)
			w += bytes;
	}
	if (total)
		*total = top;
	if (weights)
		*weights = w;
}

double moe_tcp_machine_hbm_capacity(moe_ctx *ctx, const moe_tcp_machine *m)
{
	if (m)
		return m->hbm_bytes;
	moe_tcp_machine *d = moe_tcp_machine_default(ctx);
	double c = d ? d->hbm_bytes : 0;
	moe_tcp_machine_free(ctx, d);
	return c;
}
