/* cli/stats.c: moec stats, a readable table of the library's stats
 * JSON (moe_module_stats_json) by default, the JSON itself with --json. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "moec/backend.h"
#include "moec/passes.h"

#include "cli.h"

static double num(const cJSON *o, const char *key)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
	return cJSON_IsNumber(v) ? v->valuedouble : 0;
}

static const char *str(const cJSON *o, const char *key)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
	return cJSON_IsString(v) ? v->valuestring : "";
}

/* 1234567 -> "1,234,567" */
static const char *grouped(char *buf, size_t n, double x)
{
	char digits[32];
	snprintf(digits, sizeof digits, "%.0f", x);
	size_t len = strlen(digits), at = 0;
	for (size_t i = 0; i < len && at + 2 < n; i++) {
		if (i && (len - i) % 3 == 0 && digits[i - 1] != '-')
			buf[at++] = ',';
		buf[at++] = digits[i];
	}
	buf[at] = 0;
	return buf;
}

static const char *human(char *buf, size_t n, double bytes)
{
	static const char *const unit[] = {"B", "KiB", "MiB", "GiB", "TiB"};
	int u = 0;
	while (bytes >= 1024 && u < 4)
		bytes /= 1024, u++;
	snprintf(buf, n, u ? "%.1f %s" : "%.0f %s", bytes, unit[u]);
	return buf;
}

/* host_memory of a layer (moe_host_memory_plan): what a host run of it takes */
static void print_host(FILE *f, const cJSON *l)
{
	const cJSON *h = cJSON_GetObjectItemCaseSensitive(l, "host_memory");
	char a[32], b[32], c[32], d[32];
	if (cJSON_IsNull(h))
		fprintf(f, "  %-15s not predicted (the host pipeline does not lower this layer)\n", "host memory");
	if (!cJSON_IsObject(h))
		return; /* --target=tcp: the TCP HBM line instead */
	fprintf(f, "  %-15s %s predicted peak: weights %s + packed copy %s + workspace %s", "host memory",
		human(a, sizeof a, num(h, "peak_bytes")), human(b, sizeof b, num(h, "weight_bytes")),
		human(c, sizeof c, num(h, "packed_bytes")), human(d, sizeof d, num(h, "workspace_bytes")));
	fprintf(f, " + inputs and outputs %s\n", human(a, sizeof a, num(h, "io_bytes")));
	if (num(h, "packable_bytes") > num(h, "packed_bytes"))
		fprintf(f, "  %-15s (a CPU with AVX512-BF16 adds a packed copy of %s)\n", "",
			human(a, sizeof a, num(h, "packable_bytes")));
}

static void print_layer(FILE *f, const cJSON *l)
{
	char a[32], b[32], c[32];
	fprintf(f, "layer %s (%s)\n  %-15s", str(l, "layer"), str(l, "dtype"), "dims");
	const cJSON *dims = cJSON_GetObjectItemCaseSensitive(l, "dims");
	for (const cJSON *d = dims ? dims->child : NULL; d; d = d->next)
		fprintf(f, " %s=%.0f", d->string, d->valuedouble);
	fprintf(f, "\n  %-15s %s (the worst-case grid computes %s)\n", "FLOPs", grouped(a, sizeof a, num(l, "flops")),
		grouped(b, sizeof b, num(l, "flops_grid_max")));
	fprintf(f, "  %-15s %s (%s)\n", "weight bytes", grouped(a, sizeof a, num(l, "weight_bytes")),
		human(b, sizeof b, num(l, "weight_bytes")));
	if (num(l, "quantized_weight_bytes") > 0)
		fprintf(f, "  %-15s %s (%s: packed values and scales read by dequant)\n", "quantized",
			grouped(a, sizeof a, num(l, "quantized_weight_bytes")), human(b, sizeof b, num(l, "quantized_weight_bytes")));
	fprintf(f, "  %-15s %.0f tight, %.0f seed design, %.0f vLLM\n", "grid blocks", num(l, "grid_blocks_max"),
		num(l, "grid_blocks_seed"), num(l, "grid_blocks_vllm"));
	fprintf(f, "  %-15s %s tight, %s seed design, %s vLLM\n", "block buffers",
		human(a, sizeof a, num(l, "block_buffer_bytes")), human(b, sizeof b, num(l, "block_buffer_bytes_seed")),
		human(c, sizeof c, num(l, "block_buffer_bytes_vllm")));
	print_host(f, l);
}

#define GIB(x) ((double)(x) / (1024.0 * 1024.0 * 1024.0))

/* The host's predicted memory of each layer of o's file (lowered again by
 * the host pipeline), added to its stats object as host_memory; the sum of
 * every IR value ("buffers", "buffer_bytes_total") goes: no run holds them
 * all at once. Without a lowering (a layer the host does not run) the layer
 * has no host_memory. */
static void host_memory(moe_ctx *ctx, const opts *o, cJSON *j)
{
	cJSON *layers = cJSON_GetObjectItemCaseSensitive(j, "layers");
	for (cJSON *l = cJSON_IsArray(layers) ? layers->child : NULL; l; l = l->next) {
		cJSON_DeleteItemFromObjectCaseSensitive(l, "buffers");
		cJSON_DeleteItemFromObjectCaseSensitive(l, "buffer_bytes_total");
	}
	cJSON_DeleteItemFromObjectCaseSensitive(j, "buffers");
	cJSON_DeleteItemFromObjectCaseSensitive(j, "buffer_bytes_total");
	if ((o->target && !strcmp(o->target, "tcp")) || moe_diag_count(ctx) != 0)
		return;
	moe_module *m = cli_load(ctx, o);
	moe_run_opts ro = {.verify = 1};
	if (!m || moe_run_pipeline_text(ctx, "host", m, &ro) != MOE_OK) {
		moe_module_free(m);
		moe_diag_clear(ctx);
		cJSON_AddNullToObject(j, "host_memory");
		return;
	}
	for (size_t i = 0; i < moe_module_num_graphs(m); i++) {
		moe_host_memory hm;
		cJSON *l = cJSON_IsArray(layers) ? cJSON_GetArrayItem(layers, (int)i) : i ? NULL : j;
		if (!l || moe_host_memory_plan(ctx, moe_module_graph(m, i), NULL, &hm) != MOE_OK)
			continue;
		cJSON *h = cJSON_CreateObject();
		cJSON_AddNumberToObject(h, "peak_bytes", (double)hm.peak_bytes);
		cJSON_AddNumberToObject(h, "weight_bytes", (double)hm.weight_bytes);
		cJSON_AddNumberToObject(h, "packed_bytes", (double)hm.packed_bytes);
		cJSON_AddNumberToObject(h, "packable_bytes", (double)hm.packable_bytes);
		cJSON_AddNumberToObject(h, "workspace_bytes", (double)hm.workspace_bytes);
		cJSON_AddNumberToObject(h, "io_bytes", (double)hm.io_bytes);
		cJSON_AddItemToObject(l, "host_memory", h);
		if (l != j && i == 0)
			cJSON_AddItemToObject(j, "host_memory", cJSON_Duplicate(h, 1));
	}
	moe_diag_clear(ctx);
	moe_module_free(m);
}

/* "1.23 ms" */
static const char *secs(char *buf, size_t n, double s)
{
	if (s >= 1)
		snprintf(buf, n, "%.3g s", s);
	else if (s >= 1e-3)
		snprintf(buf, n, "%.3g ms", s * 1e3);
	else
		snprintf(buf, n, "%.3g us", s * 1e6);
	return buf;
}

/* The whole program's predicted time on expected loads (moe_tcp_predict). */
static void print_predict(const moe_tcp_prediction *p)
{
	char a[32], b[32];
	printf("TCP layer predicted %s on expected loads (uniform routing: %lld blocks, %lld experts hit), roofline %s, "
	       "%.2fx\n",
		secs(a, sizeof a, p->seconds), (long long)p->nblocks, (long long)p->stats.experts_hit,
		secs(b, sizeof b, p->stats.roofline_seconds), p->stats.roofline_ratio);
	if (p->approximated_lds + p->approximated_index_lists)
		printf("  (%lld scalar reads and %lld index lists approximated: docs/api.md, moe_tcp_predict)\n",
			(long long)p->approximated_lds, (long long)p->approximated_index_lists);
	printf("\n");
}

static void print_predict_json(const moe_tcp_prediction *p)
{
	printf("\n\t\"tcp_predict\":\t{\"loads\": \"expected\", \"seconds\": %.9g, \"roofline_seconds\": %.9g, "
	       "\"roofline_ratio\": %.6g, \"nblocks\": %lld, \"experts_hit\": %lld, \"cycles\": %lld, "
	       "\"approximated_lds\": %lld, \"approximated_index_lists\": %lld},",
		p->seconds, p->stats.roofline_seconds, p->stats.roofline_ratio, (long long)p->nblocks,
		(long long)p->stats.experts_hit, (long long)p->stats.cycles, (long long)p->approximated_lds,
		(long long)p->approximated_index_lists);
}

static const char *const floor_term[] = {"roofline", "chain", "DMA context", "main context"};
static const char *const floor_key[] = {"roofline", "chain", "dma", "main"};

/* The contract's floor (moe_tcp_floor on expected loads) against the prediction. */
static void print_floor(const moe_tcp_floor_terms *f, const moe_tcp_prediction *p)
{
	char a[32], b[32], c[32], d[32], e[32];
	double t[4] = {f->roofline_seconds, f->chain_seconds, f->dma_seconds, f->main_seconds};
	printf("TCP floor %s: launch and end %s + %s %s (%s %.1f experts hit); predicted %s, roofline %s\n",
		secs(a, sizeof a, f->seconds), secs(b, sizeof b, f->launch_end_seconds), floor_term[f->binding],
		secs(c, sizeof c, t[f->binding]), f->expected ? "expected" : "given", f->experts_hit,
		secs(d, sizeof d, p->seconds), secs(e, sizeof e, p->stats.roofline_seconds));
	printf("  %-15s roofline %s, chain %s (routing %s), DMA context %s, main context %s\n", "floor terms",
		secs(a, sizeof a, f->roofline_seconds), secs(b, sizeof b, f->chain_seconds),
		secs(c, sizeof c, f->route_seconds), secs(d, sizeof d, f->dma_seconds), secs(e, sizeof e, f->main_seconds));
	printf("  %-15s predicted/floor %.3fx, predicted/roofline %.3fx (%s above the floor)\n\n", "ratios",
		f->seconds > 0 ? p->seconds / f->seconds : 0, p->stats.roofline_ratio,
		secs(a, sizeof a, p->seconds - f->seconds));
}

static void print_floor_json(const moe_tcp_floor_terms *f, const moe_tcp_prediction *p)
{
	printf("\n\t\"tcp_floor\":\t{\"seconds\": %.9g, \"launch_end_seconds\": %.9g, \"roofline_seconds\": %.9g, "
	       "\"chain_seconds\": %.9g, \"route_seconds\": %.9g, \"dma_seconds\": %.9g, \"main_seconds\": %.9g, "
	       "\"binding\": \"%s\", \"loads\": \"%s\", \"tokens\": %lld, \"experts_hit\": %.6g, "
	       "\"weight_bytes\": %.17g, \"other_bytes\": %.17g, \"macs\": %.17g, \"mac_rate\": %.9g, "
	       "\"vector_elements\": %.17g, \"dma_commands\": %lld, \"main_commands\": %lld, "
	       "\"predicted_seconds\": %.9g, \"predicted_ratio\": %.6g, \"roofline_ratio\": %.6g},",
		f->seconds, f->launch_end_seconds, f->roofline_seconds, f->chain_seconds, f->route_seconds, f->dma_seconds,
		f->main_seconds, floor_key[f->binding], f->expected ? "expected" : "given", (long long)f->tokens,
		f->experts_hit, f->weight_bytes, f->other_bytes, f->macs, f->mac_rate, f->vector_elements,
		(long long)f->dma_commands, (long long)f->main_commands, p->seconds,
		f->seconds > 0 ? p->seconds / f->seconds : 0, p->stats.roofline_ratio);
}

int cli_stats(moe_ctx *ctx, const moe_module *m, const opts *o, int64_t autob, double pred, const cli_fit *fit)
{
	const char *named = o->pipeline ? moe_pipeline_named(o->pipeline) : NULL;
	char *js = moe_module_stats_json(ctx, m, named ? named : o->pipeline);
	if (!js)
		return 1;
	cJSON *j = cJSON_Parse(js);
	free(js);
	if (!cJSON_IsObject(j)) {
		cJSON_Delete(j);
		return cli_fail("internal error: the stats are not JSON%s", "");
	}
	host_memory(ctx, o, j);
	int status = 0;
	if (o->json) {
		/* block=auto's choice and its predicted block-loop time, and the HBM fit, lead the object */
		char *js2 = cJSON_Print(j);
		if (!js2) {
			cJSON_Delete(j);
			return cli_fail("out of memory%s", "");
		}
		if (autob > 0)
			printf("{\n\t\"tcp_block\":\t{\"B\": %lld, \"auto\": true, \"predicted_block_loop_seconds\": %.6g},",
				(long long)autob, pred);
		if (fit)
			printf("%s\t\"tcp_hbm\":\t{\"needed_bytes\": %lld, \"weight_bytes\": %lld, \"capacity_bytes\": %.0f, "
				"\"fits\": true},", autob > 0 ? "\n" : "{\n", (long long)fit->total, (long long)fit->weights,
				fit->capacity);
		if (fit && fit->predicted)
			print_predict_json(&fit->pred);
		if (fit && fit->predicted && fit->floored)
			print_floor_json(&fit->floor, &fit->pred);
		status = puts(js2 + (autob > 0 || fit)) < 0; /* js2 starts with its '{' */
		free(js2);
	} else {
		if (autob > 0)
			printf("TCP block size B = %lld, chosen by the cost model (block loop predicted %.3g s)\n%s",
				(long long)autob, pred, fit ? "" : "\n");
		if (fit)
			printf("TCP HBM %.2f GiB needed (weights %.2f GiB) of %.1f GiB: fits\n%s", GIB(fit->total),
				GIB(fit->weights), GIB(fit->capacity), fit->predicted ? "" : "\n");
		if (fit && fit->predicted)
			print_predict(&fit->pred);
		if (fit && fit->predicted && fit->floored)
			print_floor(&fit->floor, &fit->pred);
		const cJSON *layers = cJSON_GetObjectItemCaseSensitive(j, "layers");
		if (cJSON_IsArray(layers)) {
			for (const cJSON *l = layers->child; l; l = l->next)
				print_layer(stdout, l), fputs(l->next ? "\n" : "", stdout);
		} else {
			print_layer(stdout, j);
		}
	}
	cJSON_Delete(j);
	return status || fflush(stdout) != 0;
}
