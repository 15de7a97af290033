/* backend-tcp/machine.c: the machine description (the fields of
 * machine.json), parsed with cJSON; a copy of the shipped file is built in.
 * Every field is required, so a variant file cannot silently fall back. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend-tcp/isa/tcp_int.h"
#include "moec/io.h"

/* The shipped backend-tcp/isa/machine.json (a copy of the project's contract). */
const char tcp_default_machine_json[] =
	"{\n"
	"  \"name\": \"RNGD (TCP), one chip\",\n"
	"  \"source\": \"FuriosaAI RNGD spec table and the furiosa-opt book (see MODEL.md); values under assumed, and the interconnect, are ours, not public\",\n"
	"  \"revision\": \"2026-11-29 (MODEL.md section 8)\",\n"
	"  \"clock_hz\": 1.0e9,\n"
	"  \"clusters\": 2,\n"
	"  \"slices_per_cluster\": 256,\n"
	"  \"lanes_per_slice\": 8,\n"
	"  \"flit_bytes\": 32,\n"
	"  \"memory\": {\n"
	"    \"hbm_bytes\": 51539607552,\n"
	"    \"hbm_bytes_per_s\": 1.5e12,\n"
	"    \"hbm_access_granule_bytes\": 256,\n"
	"    \"hbm_unaligned_read_factor\": 2.0,\n"
	"    \"hbm_unaligned_write_factor\": 50.0,\n"
	"    \"hbm_no_stack_bit_factor\": 2.0,\n"
	"    \"hbm_row_conflict_cycles\": 40,\n"
	"    \"dm_bytes_per_slice\": 524288,\n"
	"    \"dm_bytes_per_cycle_per_slice\": 128,\n"
	"    \"dmns_per_cluster\": 8,\n"
	"    \"dm_bytes_per_cycle_per_dmn\": 128,\n"
	"    \"dm_banks_per_slice\": 16,\n"
	"    \"dm_max_consecutive_same_bank\": 63,\n"
	"    \"dm_alignment_bytes\": 8,\n"
	"    \"dm_misaligned_write_factor\": 3.0,\n"
	"    \"trf_bytes_per_lane\": 8192,\n"
	"    \"vrf_bytes_per_slice\": 8192\n"
	"  },\n"
	"  \"contraction\": {\n"
	"    \"mac_bytes_per_lane_per_cycle\": 64,\n"
	"    \"macs_per_lane_per_cycle\": {\"bf16\": 32, \"f8\": 64, \"i8\": 64, \"i4\": 128},\n"
	"    \"accumulator\": {\"bf16\": \"f32\", \"f8\": \"f32\", \"i8\": \"i32\", \"i4\": \"i32\"},\n"
	"    \"tree_latency_cycles\": {\"bf16\": 5, \"f8\": 6, \"i8\": 6, \"i4\": 7},\n"
	"    \"stream_bytes_per_cycle_per_slice\": 32\n"
	"  },\n"
	"  \"peak_ops_per_s\": {\"bf16\": 262.144e12, \"f8\": 524.288e12, \"i8\": 524.288e12, \"i4\": 1048.576e12},\n"
	"  \"vector\": {\n"
	"    \"dtypes\": [\"i32\", \"f32\"],\n"
	"    \"int_elems_per_cycle\": 8,\n"
	"    \"float_elems_per_cycle\": 4,\n"
	"    \"float_alus\": [\"fma\", \"fpu\", \"exp\", \"mul0\", \"mul1\"],\n"
	"    \"alu_latency_cycles\": 1,\n"
	"    \"inter_slice_reduce_cycles\": 256\n"
	"  },\n"
	"  \"fetch\": {\n"
	"    \"max_fetch_bytes\": 32,\n"
	"    \"max_interleaved_streams\": 2,\n"
	"    \"sub_context_read_bytes\": 8,\n"
	"    \"sub_context_write_bytes\": 8\n"
	"  },\n"
	"  \"switch\": {\"flit_bytes_per_cycle\": 32, \"max_ring_size\": 256},\n"
	"  \"dma\": {\n"
	"    \"queues\": 1,\n"
	"    \"engines\": 8,\n"
	"    \"bytes_per_cycle_per_engine\": 256,\n"
	"    \"setup_cycles\": 500,\n"
	"    \"setup_overlaps_previous\": false,\n"
	"    \"hbm_to_hbm_engines\": 1,\n"
	"    \"max_packet_bytes\": 4096,\n"
	"    \"request_bytes\": 256,\n"
	"    \"dm_to_dm_serialized\": true,\n"
	"    \"replicated_dm_writes\": \"per_copy\",\n"
	"    \"index_bytes_per_pe\": 4096,\n"
	"    \"indirect\": {\"gather\": \"hbm_to_dm\", \"scatter\": \"dm_to_hbm\", \"unscaled_scatter\": false}\n"
	"  },\n"
	"  \"pcie_bytes_per_cycle\": 30,\n"
	"  \"interconnect\": {\n"
	"    \"topology\": \"switch\",\n"
	"    \"chip_link_bytes_per_s\": 3.0e10,\n"
	"    \"chip_link_latency_s\": 2.0e-6\n"
	"  },\n"
	"  \"assumed\": {\n"
	"    \"command_issue_cycles\": 240,\n"
	"    \"tuexec_fill_drain_cycles\": 32,\n"
	"    \"kernel_launch_cycles\": 2000,\n"
	"    \"kernel_end_cycles\": 600,\n"
	"    \"scalar_op_cycles\": 1,\n"
	"    \"runtime_branch_cycles\": 20,\n"
	"    \"gather_scatter_row_overhead_cycles\": 4,\n"
	"    \"sub_switch_concurrent_with_main\": true\n"
	"  }\n"
	"}\n";

int64_t tcp_slices(const moe_tcp_machine *m)
{
	return m->clusters * m->slices_per_cluster;
}

int64_t tcp_trf_bytes(const moe_tcp_machine *m)
{
	return m->lanes_per_slice * m->trf_bytes_per_lane;
}

int64_t tcp_dmns_per_cluster(const moe_tcp_machine *m)
{
	return m->dmns_per_cluster < m->slices_per_cluster ? m->dmns_per_cluster : m->slices_per_cluster;
}

int64_t tcp_slices_per_dmn(const moe_tcp_machine *m)
{
	int64_t d = tcp_dmns_per_cluster(m);
	return (m->slices_per_cluster + d - 1) / d;
}

/* The slice reads what its own DM holds at fetch.sub_context_read_bytes per
 * cycle; the rest arrives over the switch at switch.flit_bytes_per_cycle into
 * the slice, after a ring of R = ceil(fp / own) slices (the copies), at most
 * switch.max_ring_size. The two paths overlap. */
int64_t tcp_sub_load_cycles(const moe_tcp_machine *m, int64_t fp, int64_t own)
{
	if (fp <= 0)
		return 0;
	if (own <= 0 || own > fp)
		own = fp;
	int64_t rd = (own + m->sub_read_bytes - 1) / m->sub_read_bytes;
	if (own == fp)
		return rd;
	int64_t R = (fp + own - 1) / own, sw = (fp + m->switch_bytes_per_cycle - 1) / m->switch_bytes_per_cycle;
	R = R < m->max_ring ? R : m->max_ring;
	return (rd > sw ? rd : sw) + R;
}

typedef struct mp {
	moe_ctx *ctx;
	const char *file;
	bool bad;
	char missing[1024]; /* every missing field, named together (a revision-2 file lacks many) */
	size_t nmiss;
} mp;

static const cJSON *field(mp *p, const cJSON *obj, const char *path, const char *key)
{
	const cJSON *f = obj ? cJSON_GetObjectItemCaseSensitive(obj, key) : NULL;
	if (!f) {
		size_t n = strlen(p->missing);
		if (n + strlen(path) + strlen(key) + 8 < sizeof p->missing)
			snprintf(p->missing + n, sizeof p->missing - n, "%s'%s%s'", n ? ", " : "", path, key);
		p->nmiss++;
	}
	return f;
}

/* A finite number in [lo, hi]; integers must be whole. Every field has a
 * range so that the products the simulator and the code generator form from
 * them (cycles, bytes, slices) stay far inside int64. */
static double num_in(mp *p, const cJSON *obj, const char *path, const char *key, bool integer, double lo, double hi)
{
	const cJSON *f = field(p, obj, path, key);
	if (!f)
		return lo;
	if (!cJSON_IsNumber(f) || !isfinite(f->valuedouble) || f->valuedouble < lo || f->valuedouble > hi ||
		(integer && f->valuedouble != floor(f->valuedouble))) {
		if (!p->bad)
			moe_diag(p->ctx, MOE_DIAG_ERROR, moe_loc_file(p->ctx, p->file),
				"machine description: '%s%s' must be %s in %.17g..%.17g", path, key,
				integer ? "an integer" : "a number", lo, hi);
		p->bad = true;
		return lo;
	}
	return f->valuedouble;
}

#define K20 1048576.0 /* 2^20: latencies, rates, per-cycle widths */
#define K30 1073741824.0

/* Integer fields: [1, hi]. */
static int64_t inum(mp *p, const cJSON *obj, const char *path, const char *key, double hi)
{
	return (int64_t)num_in(p, obj, path, key, true, 1, hi);
}

static bool boolean(mp *p, const cJSON *obj, const char *path, const char *key)
{
	const cJSON *f = field(p, obj, path, key);
	if (f && !cJSON_IsBool(f) && !p->bad) {
		moe_diag(p->ctx, MOE_DIAG_ERROR, moe_loc_file(p->ctx, p->file), "machine description: '%s%s' must be true or false",
			path, key);
		p->bad = true;
	}
	return f && cJSON_IsTrue(f);
}

/* vector.float_alus: the float cluster's ALUs by name, each usable once per
 * pass; moec knows the five the book names. */
static int64_t float_alus(mp *p, const cJSON *vec)
{
	static const char *const known[] = {"fma", "fpu", "exp", "mul0", "mul1"};
	const cJSON *f = field(p, vec, "vector.", "float_alus"), *e;
	int64_t mask = 0;
	if (!f)
		return 0;
	bool ok = cJSON_IsArray(f) && cJSON_GetArraySize(f) > 0;
	cJSON_ArrayForEach(e, f)
	{
		int k = 0;
		while (ok && k < 5 && !(cJSON_IsString(e) && strcmp(e->valuestring, known[k]) == 0))
			k++;
		ok = ok && k < 5 && !(mask & (1 << k));
		if (ok)
			mask |= 1 << k;
	}
	if (!ok && !p->bad) {
		moe_diag(p->ctx, MOE_DIAG_ERROR, moe_loc_file(p->ctx, p->file),
			"machine description: 'vector.float_alus' must list distinct ALUs among fma, fpu, exp, mul0, mul1");
		p->bad = true;
	}
	return mask;
}

static const char *const mt_names[4] = {"bf16", "f8", "i8", "i4"};

/* A string field that must equal `want` (a form moec implements). */
static void str_is(mp *p, const cJSON *obj, const char *path, const char *key, const char *want)
{
	const cJSON *f = field(p, obj, path, key);
	if (f && !(cJSON_IsString(f) && strcmp(f->valuestring, want) == 0) && !p->bad) {
		moe_diag(p->ctx, MOE_DIAG_ERROR, moe_loc_file(p->ctx, p->file),
			"machine description: '%s%s' must be \"%s\" (the only form moec implements)", path, key, want);
		p->bad = true;
	}
}

static void parse_memory(mp *p, moe_tcp_machine *m, const cJSON *root)
{
	const cJSON *mem = field(p, root, "", "memory");
	m->hbm_bytes = num_in(p, mem, "memory.", "hbm_bytes", false, 1, 1125899906842624.0);
	m->hbm_bytes_per_s = num_in(p, mem, "memory.", "hbm_bytes_per_s", false, 1e6, 1e15);
	m->hbm_granule = inum(p, mem, "memory.", "hbm_access_granule_bytes", K20);
	m->hbm_unaligned_read = num_in(p, mem, "memory.", "hbm_unaligned_read_factor", false, 1, 1000);
	m->hbm_unaligned_write = num_in(p, mem, "memory.", "hbm_unaligned_write_factor", false, 1, 1000);
	m->hbm_no_stack_bit = num_in(p, mem, "memory.", "hbm_no_stack_bit_factor", false, 1, 1000);
	m->hbm_row_conflict = inum(p, mem, "memory.", "hbm_row_conflict_cycles", K20);
	m->dm_bytes_per_slice = inum(p, mem, "memory.", "dm_bytes_per_slice", K30);
	m->dm_bytes_per_cycle = inum(p, mem, "memory.", "dm_bytes_per_cycle_per_slice", K20);
	m->dmns_per_cluster = inum(p, mem, "memory.", "dmns_per_cluster", 65536);
	m->dmn_bytes_per_cycle = inum(p, mem, "memory.", "dm_bytes_per_cycle_per_dmn", K20);
	m->dm_banks = inum(p, mem, "memory.", "dm_banks_per_slice", K20);
	m->dm_max_same_bank = inum(p, mem, "memory.", "dm_max_consecutive_same_bank", K20);
	m->dm_align = inum(p, mem, "memory.", "dm_alignment_bytes", K20);
	m->dm_misaligned_write = num_in(p, mem, "memory.", "dm_misaligned_write_factor", false, 1, 1000);
	m->trf_bytes_per_lane = inum(p, mem, "memory.", "trf_bytes_per_lane", K30);
	m->vrf_bytes_per_slice = inum(p, mem, "memory.", "vrf_bytes_per_slice", K30);
}

static void parse_compute(mp *p, moe_tcp_machine *m, const cJSON *root)
{
	const cJSON *con = field(p, root, "", "contraction");
	m->mac_bytes_per_lane = inum(p, con, "contraction.", "mac_bytes_per_lane_per_cycle", K20);
	const cJSON *macs = field(p, con, "contraction.", "macs_per_lane_per_cycle");
	const cJSON *tree = field(p, con, "contraction.", "tree_latency_cycles");
	const cJSON *peak = field(p, root, "", "peak_ops_per_s");
	for (int i = 0; i < 4; i++) {
		m->macs_per_lane[i] = inum(p, macs, "contraction.macs_per_lane_per_cycle.", mt_names[i], K20);
		m->tree_latency[i] = inum(p, tree, "contraction.tree_latency_cycles.", mt_names[i], K20);
		m->peak_ops[i] = num_in(p, peak, "peak_ops_per_s.", mt_names[i], false, 1e6, 1e18);
	}
	m->stream_bytes_per_cycle = inum(p, con, "contraction.", "stream_bytes_per_cycle_per_slice", K20);
	const cJSON *vec = field(p, root, "", "vector");
	m->vec_int_rate = inum(p, vec, "vector.", "int_elems_per_cycle", K20);
	m->vec_float_rate = inum(p, vec, "vector.", "float_elems_per_cycle", K20);
	m->alu_latency = inum(p, vec, "vector.", "alu_latency_cycles", K20);
	m->inter_slice_reduce = inum(p, vec, "vector.", "inter_slice_reduce_cycles", K20);
	m->float_alus = float_alus(p, vec);
	const cJSON *fe = field(p, root, "", "fetch");
	m->fetch_bytes = inum(p, fe, "fetch.", "max_fetch_bytes", K20);
	m->max_streams = inum(p, fe, "fetch.", "max_interleaved_streams", 3);
	m->sub_read_bytes = inum(p, fe, "fetch.", "sub_context_read_bytes", K20);
	m->sub_write_bytes = inum(p, fe, "fetch.", "sub_context_write_bytes", K20);
	const cJSON *sw = field(p, root, "", "switch");
	m->switch_bytes_per_cycle = inum(p, sw, "switch.", "flit_bytes_per_cycle", K20);
	m->max_ring = inum(p, sw, "switch.", "max_ring_size", 65536);
}

static void parse_dma(mp *p, moe_tcp_machine *m, const cJSON *root)
{
	const cJSON *dma = field(p, root, "", "dma");
	m->dma_queues = (int64_t)num_in(p, dma, "dma.", "queues", true, 1, 1); /* one in-order tdma queue */
	m->dma_engines = inum(p, dma, "dma.", "engines", 1024);
	m->dma_bytes_per_cycle = inum(p, dma, "dma.", "bytes_per_cycle_per_engine", K20);
	m->dma_setup = inum(p, dma, "dma.", "setup_cycles", K20);
	m->setup_overlaps = boolean(p, dma, "dma.", "setup_overlaps_previous");
	m->hbm2hbm_engines = inum(p, dma, "dma.", "hbm_to_hbm_engines", 1024);
	m->dma_max_packet = inum(p, dma, "dma.", "max_packet_bytes", K30);
	m->dma_request = inum(p, dma, "dma.", "request_bytes", K30);
	m->dm_to_dm_serialized = boolean(p, dma, "dma.", "dm_to_dm_serialized");
	str_is(p, dma, "dma.", "replicated_dm_writes", "per_copy");
	m->index_bytes_per_pe = inum(p, dma, "dma.", "index_bytes_per_pe", K30);
	const cJSON *ind = field(p, dma, "dma.", "indirect");
	str_is(p, ind, "dma.indirect.", "gather", "hbm_to_dm");
	str_is(p, ind, "dma.indirect.", "scatter", "dm_to_hbm");
	m->unscaled_scatter = boolean(p, ind, "dma.indirect.", "unscaled_scatter");
	m->pcie_bytes_per_cycle = inum(p, root, "", "pcie_bytes_per_cycle", K20);
	const cJSON *ic = field(p, root, "", "interconnect");
	m->link_bytes_per_s = num_in(p, ic, "interconnect.", "chip_link_bytes_per_s", false, 1e3, 1e15);
	m->link_latency_s = num_in(p, ic, "interconnect.", "chip_link_latency_s", false, 1e-12, 1);
	const cJSON *as = field(p, root, "", "assumed");
	m->issue_cycles = inum(p, as, "assumed.", "command_issue_cycles", K20);
	m->fill_drain = inum(p, as, "assumed.", "tuexec_fill_drain_cycles", K20);
	m->launch_cycles = inum(p, as, "assumed.", "kernel_launch_cycles", K20);
	m->end_cycles = inum(p, as, "assumed.", "kernel_end_cycles", K20);
	m->scalar_cycles = inum(p, as, "assumed.", "scalar_op_cycles", K20);
	m->branch_cycles = inum(p, as, "assumed.", "runtime_branch_cycles", K20);
	m->row_overhead = inum(p, as, "assumed.", "gather_scatter_row_overhead_cycles", K20);
	m->sub_switch_concurrent = boolean(p, as, "assumed.", "sub_switch_concurrent_with_main");
}

/* Fields of an older revision that revision 3 removed: a file carrying one
 * was written for another model, and is named as such. */
static bool removed_fields(mp *p, const cJSON *root)
{
	static const char *const old[][2] = {{"fetch", "dual_channel_fetch_bytes"},
		{"assumed", "trf_load_bytes_per_cycle_per_slice"}};
	for (size_t i = 0; i < sizeof old / sizeof *old; i++) {
		const cJSON *o = cJSON_GetObjectItemCaseSensitive(root, old[i][0]);
		if (o && cJSON_GetObjectItemCaseSensitive(o, old[i][1])) {
			moe_diag(p->ctx, MOE_DIAG_ERROR, moe_loc_file(p->ctx, p->file),
				"machine description: '%s.%s' belongs to revision 2 of the machine model, which revision 3 "
				"removed (docs/tcp-model.md); update the file to revision 3",
				old[i][0], old[i][1]);
			return true;
		}
	}
	return false;
}

static bool derived_ok(mp *p, const moe_tcp_machine *m)
{
	if (p->nmiss) {
		moe_diag(p->ctx, MOE_DIAG_ERROR, moe_loc_file(p->ctx, p->file),
			"machine description: missing field%s %s%s", p->nmiss > 1 ? "s" : "", p->missing,
			p->nmiss > 3 ? " (a revision-2 file? revision 3 is required: docs/tcp-model.md)" : "");
		return false;
	}
	if (p->bad)
		return false;
	/* each factor is bounded above, so these products cannot wrap */
	if (tcp_slices(m) > 65536) {
		moe_diag(p->ctx, MOE_DIAG_ERROR, moe_loc_file(p->ctx, p->file),
			"machine description: clusters x slices_per_cluster = %lld exceeds 65536 slices",
			(long long)tcp_slices(m));
		return false;
	}
	if (m->flit_bytes % 4) {
		moe_diag(p->ctx, MOE_DIAG_ERROR, moe_loc_file(p->ctx, p->file),
			"machine description: flit_bytes = %lld must be a multiple of 4 (the 32-bit lane word)",
			(long long)m->flit_bytes);
		return false;
	}
	return true;
}

static moe_tcp_machine *machine_parse(moe_ctx *ctx, const char *file, const char *text, size_t len)
{
	moe_tcp_machine *m = ctx_alloc(ctx, sizeof *m); /* before the cJSON tree: a throw must not leak it */
	cJSON *root = cJSON_ParseWithLength(text, len);
	if (!root || !cJSON_IsObject(root)) {
		moe_diag(ctx, MOE_DIAG_ERROR, moe_loc_file(ctx, file), "machine description is not a JSON object");
		cJSON_Delete(root);
		ctx_free(ctx, m, sizeof *m);
		return NULL;
	}
	mp p = {ctx, file, false, "", 0};
	const cJSON *nm = cJSON_GetObjectItemCaseSensitive(root, "name");
	snprintf(m->name, sizeof m->name, "%s", cJSON_IsString(nm) ? nm->valuestring : "unnamed");
	p.bad = removed_fields(&p, root);
	m->clock_hz = num_in(&p, root, "", "clock_hz", false, 1e6, 1e11);
	m->clusters = inum(&p, root, "", "clusters", 65536);
	m->slices_per_cluster = inum(&p, root, "", "slices_per_cluster", 65536);
	m->lanes_per_slice = inum(&p, root, "", "lanes_per_slice", 64);
	m->flit_bytes = inum(&p, root, "", "flit_bytes", 4096);
	parse_memory(&p, m, root);
	parse_compute(&p, m, root);
	parse_dma(&p, m, root);
	cJSON_Delete(root);
	if (!derived_ok(&p, m)) {
		ctx_free(ctx, m, sizeof *m);
		return NULL;
	}
	return m;
}

moe_tcp_machine *moe_tcp_machine_default(moe_ctx *ctx)
{
	return moe_tcp_machine_parse(ctx, "<built-in machine.json>", tcp_default_machine_json,
		sizeof tcp_default_machine_json - 1);
}

moe_tcp_machine *moe_tcp_machine_parse(moe_ctx *ctx, const char *file, const char *text, size_t len)
{
	CTX_GUARDED(ctx, moe_tcp_machine *, NULL, machine_parse(ctx, file, text, len));
}

static moe_tcp_machine *machine_load(moe_ctx *ctx, const char *path)
{
	char *buf;
	size_t len;
	if (moe_read_file_max(ctx, path, TCP_MAX_MACHINE_BYTES, &buf, &len) != MOE_OK)
		return NULL;
	uint32_t d = ctx_defer(ctx, free, buf); /* the text is malloc'd */
	moe_tcp_machine *m = machine_parse(ctx, path, buf, len);
	ctx_undefer(ctx, d);
	free(buf);
	return m;
}

moe_tcp_machine *moe_tcp_machine_load(moe_ctx *ctx, const char *path)
{
	CTX_GUARDED(ctx, moe_tcp_machine *, NULL, machine_load(ctx, path));
}

void moe_tcp_machine_free(moe_ctx *ctx, moe_tcp_machine *m)
{
	if (m)
		ctx_free(ctx, m, sizeof *m);
}
