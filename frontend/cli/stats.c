/* frontend/cli/stats.c: moec stats, a readable table of the library's stats
 * JSON (moe_module_stats_json) by default, the JSON itself with --json. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "moec/passes.h"

#include "frontend/cli/cli.h"

#define TOP_BUFFERS 5

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

static int by_bytes(const void *a, const void *b)
{
	double x = num(*(const cJSON *const *)a, "bytes"), y = num(*(const cJSON *const *)b, "bytes");
	return x < y ? 1 : x > y ? -1 : 0;
}

static void print_buffers(FILE *f, const cJSON *bufs, double total)
{
	int n = cJSON_GetArraySize(bufs);
	char a[32], b[32];
	fprintf(f, "  %-15s %s (%s) in %d values", "buffers", grouped(a, sizeof a, total), human(b, sizeof b, total), n);
	if (n <= 0) {
		fputc('\n', f);
		return;
	}
	const cJSON **v = malloc((size_t)n * sizeof *v);
	if (!v) {
		fputc('\n', f);
		return;
	}
	int k = 0;
	for (const cJSON *it = bufs->child; it && k < n; it = it->next)
		v[k++] = it;
	qsort(v, (size_t)k, sizeof *v, by_bytes);
	fprintf(f, "; the largest:\n");
	for (int i = 0; i < k && i < TOP_BUFFERS; i++)
		fprintf(f, "  %-15s %-6s %-12s %-10s %s\n", "", str(v[i], "value"), *str(v[i], "name") ? str(v[i], "name") : "-",
			str(v[i], "op"), human(a, sizeof a, num(v[i], "bytes")));
	free(v);
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
	print_buffers(f, cJSON_GetObjectItemCaseSensitive(l, "buffers"), num(l, "buffer_bytes_total"));
}

#define GIB(x) ((double)(x) / (1024.0 * 1024.0 * 1024.0))

int cli_stats(moe_ctx *ctx, const moe_module *m, const opts *o, int64_t autob, double pred, const cli_fit *fit)
{
	const char *named = o->pipeline ? moe_pipeline_named(o->pipeline) : NULL;
	char *js = moe_module_stats_json(ctx, m, named ? named : o->pipeline);
	if (!js)
		return 1;
	int status = 0;
	if (o->json) {
		/* block=auto: the choice and its predicted block-loop time lead the object */
		if (autob > 0 && js[0] == '{')
			printf("{\n\t\"tcp_block\":\t{\"B\": %lld, \"auto\": true, \"predicted_block_loop_seconds\": %.6g},",
				(long long)autob, pred);
		if (fit && js[0] == '{')
			printf("%s\t\"tcp_hbm\":\t{\"needed_bytes\": %lld, \"weight_bytes\": %lld, \"capacity_bytes\": %.0f, "
				"\"fits\": true},", autob > 0 ? "\n" : "{\n", (long long)fit->total, (long long)fit->weights,
				fit->capacity);
		status = puts(js + ((autob > 0 || fit) && js[0] == '{')) < 0;
	} else {
		if (autob > 0)
			printf("TCP block size B = %lld, chosen by the cost model (block loop predicted %.3g s)\n%s",
				(long long)autob, pred, fit ? "" : "\n");
		if (fit)
			printf("TCP HBM %.2f GiB needed (weights %.2f GiB) of %.1f GiB: fits\n\n", GIB(fit->total),
				GIB(fit->weights), GIB(fit->capacity));
		cJSON *j = cJSON_Parse(js);
		const cJSON *layers = cJSON_GetObjectItemCaseSensitive(j, "layers");
		if (!j) {
			status = cli_fail("internal error: the stats are not JSON%s", "");
		} else if (cJSON_IsArray(layers)) {
			for (const cJSON *l = layers->child; l; l = l->next)
				print_layer(stdout, l), fputs(l->next ? "\n" : "", stdout);
		} else {
			print_layer(stdout, j);
		}
		cJSON_Delete(j);
	}
	free(js);
	return status || fflush(stdout) != 0;
}
