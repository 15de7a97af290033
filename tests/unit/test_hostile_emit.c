/* Names and strings from inputs never change the meaning of an output.
 *
 * The readers (.moeir text, JSON IR, .moe) refuse layer, dimension and value
 * names that are not names (ir/serial.h, ir_name_problem) with a located
 * error, and a NUL in a JSON string. The API accepts any name, so every
 * writer is tested on a module whose layer, value names and weight source
 * hold a comment closer around code, a preprocessor line, a trigraph before a
 * quote, quotes, backslashes, newlines, a tab, '%' directives and bytes
 * outside ASCII: the C compiles with the injected function absent and its
 * tables hold exactly the bytes given, and runs (the C and LLVM engines); the
 * LLVM IR parses and holds none of it; the JSON parses back to the same
 * strings; the .moeir and DOT text keep their line structure; the TCP
 * assembly and binary read back to the same source; the .moe written by
 * import-hf from a hostile config path and prefix parses to the one layer. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "moec/moec.h"
#include "hostile_util.h"

/* Everything at once. Under -std=c11 a question-mark pair and a slash is a
 * backslash (a trigraph): before a quote it would end a string literal early. */
#define EVIL                                                                                                        \
	"l*/ int moe_injected(void) { return 42; } /*\n#error injected\n?\?/\" \"q\" \\ \\\" %s%n%p ?? ?\t\x01\x7f" \
	"\xc3\xa9 */"

static const char *const evil_x = EVIL "x", *const evil_w = EVIL "w", *const evil_y = EVIL "y";

/* y = x + w on f32[2, 3], every name and the weight's source hostile */
static moe_module *evil_module(moe_ctx *c, const char *layer, const char *nx, const char *nw, const char *ny,
	const char *src)
{
	moe_module *m = moe_module_new(c);
	moe_graph *g = moe_module_add_graph(m, layer);
	int64_t s[2] = {2, 3};
	moe_id x = moe_node_new(g, MOE_OP_INPUT, NULL, 0, moe_loc_none());
	moe_node_set_type(g, x, MOE_F32, s, 2);
	moe_node_set_name(g, x, nx);
	moe_id w = moe_node_new(g, MOE_OP_WEIGHT, NULL, 0, moe_loc_none());
	moe_node_set_type(g, w, MOE_F32, s, 2);
	moe_node_set_name(g, w, nw);
	moe_node_set_str(g, w, "source", src);
	moe_id a[2] = {x, w};
	moe_id y = moe_node_new(g, MOE_OP_ADD, a, 2, moe_loc_none());
	assert_int_equal(moe_node_infer(g, y), MOE_OK);
	moe_node_set_name(g, y, ny);
	moe_graph_add_output(g, y);
	assert_int_equal(moe_module_verify(c, m), MOE_OK);
	return m;
}

static void write_file(const char *path, const char *text)
{
	FILE *f = fopen(path, "w");
	assert_non_null(f);
	assert_int_equal(fputs(text, f) >= 0, 1);
	assert_int_equal(fclose(f), 0);
}

static char *read_all(const char *path)
{
	FILE *f = fopen(path, "rb");
	assert_non_null(f);
	char *buf = NULL;
	size_t len = 0, cap = 0, n;
	char chunk[4096];
	while ((n = fread(chunk, 1, sizeof chunk, f)) > 0) {
		if (len + n + 1 > cap) {
			cap = 2 * (len + n + 1);
			buf = realloc(buf, cap);
			assert_non_null(buf);
		}
		memcpy(buf + len, chunk, n);
		len += n;
	}
	fclose(f);
	if (!buf)
		buf = calloc(1, 1);
	buf[len] = 0;
	return buf;
}

/* s as a C array initialiser of its bytes and the NUL, written without the emitter */
static void put_bytes(FILE *f, const char *var, const char *s)
{
	fprintf(f, "static const unsigned char %s[] = {", var);
	for (const unsigned char *p = (const unsigned char *)s; *p; p++)
		fprintf(f, "%u, ", *p);
	fprintf(f, "0};\n");
}

static void test_readers_refuse_names(void **st)
{
	(void)st;
	static const struct {
		const char *text, *where, *what;
	} bad[] = {
		{"moeir 1\nlayer @\"a*/ b /*\" dtype=f32 {\n}\n", "t.moeir:2:7: error:", "layer name"},
		{"moeir 1\nlayer @l dtype=f32 {\n  dims \"T\\n\"=2\n}\n", "t.moeir:3:8: error:", "dimension name"},
		{"moeir 1\nlayer @l dtype=f32 {\n  %0 = input \"x*/\" : f32[2]\n  output %0\n}\n", "t.moeir:3:14: error:",
			"value name"},
		{"moeir 1\nlayer @l dtype=f32 {\n  %0 = input \"\" : f32[2]\n}\n", "t.moeir:3:14: error:", "value name"},
	};
	for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
		moe_ctx *c = moe_ctx_new(NULL, NULL);
		assert_null(moe_module_parse_text(c, "t.moeir", bad[i].text, strlen(bad[i].text)));
		char *d = NULL;
		size_t dl = 0;
		FILE *f = open_memstream(&d, &dl);
		moe_diag_print(c, f);
		fclose(f);
		if (!strstr(d, bad[i].where) || !strstr(d, bad[i].what))
			fail_msg("case %zu: %s", i, d);
		free(d);
		moe_ctx_free(c);
	}
	/* JSON: located at the offending value's key (or at the NUL's escape) */
	static const struct {
		const char *text, *at, *path, *what;
	} jbad[] = {
		{"{\"format\": \"moeir\", \"version\": 1, \"layers\": [{\"name\": \"a*/b\", \"dtype\": \"f32\", \"nodes\": [],"
		 " \"outputs\": []}]}",
			"\"name\": \"a*/b", "layers[0].name:", "layer name"},
		{"{\"format\": \"moeir\", \"version\": 1, \"layers\": [{\"name\": \"l\", \"dtype\": \"f32\", \"dims\": [{\"name\":"
		 " \"T T\", \"value\": 2}], \"nodes\": [], \"outputs\": []}]}",
			"\"name\": \"T T", "layers[0].dims[0].name:", "dimension name"},
		{"{\"format\": \"moeir\", \"version\": 1, \"layers\": [{\"name\": \"l\", \"dtype\": \"f32\", \"nodes\": [{\"id\": 0,"
		 " \"op\": \"input\", \"name\": \"x\\ny\", \"args\": [], \"dtype\": \"f32\", \"shape\": [2], \"attrs\": {}}],"
		 " \"outputs\": [0]}]}",
			"\"name\": \"x\\ny", "layers[0].nodes[0].name:", "value name"},
		/* cJSON would cut the string at the NUL: the source read would not be the one written */
		{"{\"format\": \"moeir\", \"version\": 1, \"layers\": [{\"name\": \"l\", \"dtype\": \"f32\", \"nodes\": [{\"id\": 0,"
		 " \"op\": \"weight\", \"name\": \"w\", \"args\": [], \"dtype\": \"f32\", \"shape\": [2], \"attrs\": {\"source\":"
		 " {\"str\": \"a\\u0000*/b\"}}}], \"outputs\": [0]}]}",
			"\\u0000", "error:", "NUL byte in a JSON string"},
	};
	for (size_t i = 0; i < sizeof jbad / sizeof *jbad; i++) {
		moe_ctx *c = moe_ctx_new(NULL, NULL);
		assert_null(moe_module_parse_json(c, "j.json", jbad[i].text, strlen(jbad[i].text)));
		char *d = NULL, where[64];
		size_t dl = 0;
		FILE *f = open_memstream(&d, &dl);
		moe_diag_print(c, f);
		fclose(f);
		const char *at = strstr(jbad[i].text, jbad[i].at);
		assert_non_null(at);
		snprintf(where, sizeof where, "j.json:1:%d: error:", (int)(at - jbad[i].text) + 1);
		if (!strstr(d, where) || !strstr(d, jbad[i].path) || !strstr(d, jbad[i].what))
			fail_msg("JSON case %zu: want %s: %s", i, where, d);
		free(d);
		moe_ctx_free(c);
	}
	/* the escape of a backslash before u0000 is no NUL */
	moe_ctx *c = moe_ctx_new(NULL, NULL);
	const char *ok = "{\"format\": \"moeir\", \"version\": 1, \"layers\": [{\"name\": \"l\", \"dtype\": \"f32\", \"nodes\":"
			 " [{\"id\": 0, \"op\": \"weight\", \"name\": \"w.0+1-2\", \"args\": [], \"dtype\": \"f32\", \"shape\": [2],"
			 " \"attrs\": {\"source\": {\"str\": \"a\\\\u0000b\"}}}], \"outputs\": [0]}]}";
	moe_module *m = moe_module_parse_json(c, "j.json", ok, strlen(ok));
	if (!m)
		moe_diag_print(c, stderr);
	assert_non_null(m);
	assert_string_equal(moe_node_get_str(moe_module_graph(m, 0), 0, "source"), "a\\u0000b");
	moe_module_free(m);
	/* a .moe: names are identifiers by the grammar; a raw NUL in a string is an error */
	const char moe[] = "layer l {\n  dim T = 2\n  input x : [T]\n  weight w : [T] = \"a\0b\"\n  y = x + w\n  output y\n}\n";
	assert_null(moe_parse_moe(c, "n.moe", moe, sizeof moe - 1, NULL));
	assert_non_null(strstr(last_error(c), "0x00"));
	moe_ctx_free(c);
}

static bool have(const char *tool)
{
	char cmd[256];
	snprintf(cmd, sizeof cmd, "command -v %s > /dev/null 2>&1", tool);
	return system(cmd) == 0;
}

/* The symbol prefix the emitted C uses: "moe_<cname>". */
static char *c_symbol(const char *text)
{
	const char *p = strstr(text, "\nsize_t moe_");
	assert_non_null(p);
	p += 8;
	const char *q = strstr(p, "_workspace_size(void)");
	assert_non_null(q);
	return strndup(p, (size_t)(q - p));
}

static void test_c_output_is_inert(void **st)
{
	(void)st;
	moe_ctx *c = moe_ctx_new(NULL, NULL);
	moe_module *m = evil_module(c, EVIL, evil_x, evil_w, evil_y, EVIL);
	moe_graph *g = moe_module_graph(m, 0);
	char *text = NULL;
	assert_int_equal(moe_emit_c_string(c, g, &text), MOE_OK);
	/* the only lines that start with '#' are the prelude's own */
	for (const char *l = text; l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL)
		if (*l == '#')
			assert_true(!strncmp(l, "#include <", 10) || !strncmp(l, "#if", 3) || !strncmp(l, "#define MOE_", 12) ||
				!strncmp(l, "#else", 5) || !strncmp(l, "#endif", 6));
	char *sym = c_symbol(text);
	char dir[] = "/tmp/moec_hostile_emitXXXXXX";
	assert_non_null(mkdtemp(dir));
	char lay[128], drv[128], exe[128], cmd[1024];
	snprintf(lay, sizeof lay, "%s/layer.c", dir);
	snprintf(drv, sizeof drv, "%s/main.c", dir);
	snprintf(exe, sizeof exe, "%s/t", dir);
	write_file(lay, text);
	FILE *f = fopen(drv, "w");
	assert_non_null(f);
	fprintf(f, "#include <stdio.h>\n#include \"layer.c\"\n");
	fprintf(f, "extern int moe_injected(void) __attribute__((weak));\n");
	put_bytes(f, "nx", evil_x);
	put_bytes(f, "nw", evil_w);
	put_bytes(f, "ny", evil_y);
	put_bytes(f, "src", EVIL);
	fprintf(f,
		"int main(void)\n{\n"
		"\tif (moe_injected) return 10;\n"
		"\tif (strcmp(%1$s_inputs[0].name, (const char *)nx)) return 11;\n"
		"\tif (strcmp(%1$s_weights[0].name, (const char *)nw)) return 12;\n"
		"\tif (strcmp(%1$s_weights[0].source, (const char *)src)) return 13;\n"
		"\tif (strcmp(%1$s_outputs[0].name, (const char *)ny)) return 14;\n"
		"\tfloat x[6] = {1, 2, 3, 4, 5, 6}, w[6] = {10, 20, 30, 40, 50, 60}, y[6] = {0};\n"
		"\tstatic char work[4096];\n"
		"\tconst void *in[1] = {x}, *ws[1] = {w};\n\tvoid *out[1] = {y};\n"
		"\tif (%1$s_workspace_size() > sizeof work || %1$s(in, ws, out, work)) return 15;\n"
		"\tfor (int i = 0; i < 6; i++) if (y[i] != x[i] + w[i]) return 16;\n"
		"\treturn 0;\n}\n",
		sym);
	assert_int_equal(fclose(f), 0);
	const char *cc = getenv("MOEC_CC");
	snprintf(cmd, sizeof cmd, "%s -std=c11 -o %s %s -lm", cc && *cc ? cc : "cc", exe, drv);
	int rc = system(cmd);
	if (rc != 0)
		fail_msg("the emitted C does not compile (%d):\n%s", rc, text);
	rc = system(exe);
	assert_true(WIFEXITED(rc));
	assert_int_equal(WEXITSTATUS(rc), 0);
	/* a file on disk, through the API's writer, is the same text */
	char cf[160];
	snprintf(cf, sizeof cf, "%s/out.c", dir);
	assert_int_equal(moe_emit_c_file(c, g, cf), MOE_OK);
	char *disk = read_all(cf);
	assert_string_equal(disk, text);
	free(disk);
	/* LLVM IR: parses, and the names reach it only as the symbol's sanitised part */
	char ll[160];
	snprintf(ll, sizeof ll, "%s/out.ll", dir);
	assert_int_equal(moe_emit_llvm_ir(c, g, ll), MOE_OK);
	char *lt = read_all(ll);
	assert_null(strstr(lt, "@moe_injected("));
	assert_null(strstr(lt, "\n#"));
	free(lt);
	const char *as = have("llvm-as-19") ? "llvm-as-19" : have("/usr/lib/llvm-19/bin/llvm-as") ? "/usr/lib/llvm-19/bin/llvm-as" :
			 have("llvm-as")    ? "llvm-as" :
						 NULL;
	if (as) {
		snprintf(cmd, sizeof cmd, "%s -o /dev/null %s", as, ll);
		assert_int_equal(system(cmd), 0);
	} else {
		fprintf(stderr, "llvm-as not found: the .ll is not parsed back\n");
	}
	/* both host engines run the layer under its hostile names */
	moe_tensor_map *b = moe_tensor_map_new(c);
	int64_t s[2] = {2, 3};
	moe_tensor *tx = moe_tensor_new(c, MOE_F32, 2, s), *tw = moe_tensor_new(c, MOE_F32, 2, s);
	for (int i = 0; i < 6; i++) {
		((float *)tx->data)[i] = (float)i;
		((float *)tw->data)[i] = (float)(100 * i);
	}
	assert_int_equal(moe_tensor_map_set(b, evil_x, tx), MOE_OK);
	assert_int_equal(moe_tensor_map_set(b, evil_w, tw), MOE_OK);
	for (int e = 0; e < 2; e++) {
		moe_host_opts o;
		moe_host_opts_init(&o);
		o.engine = e ? MOE_HOST_C : MOE_HOST_LLVM;
		o.no_cache = 1;
		moe_tensor *out[1] = {NULL};
		moe_status rs = moe_host_run_opts(c, g, b, &o, out, NULL);
		if (rs != MOE_OK)
			moe_diag_print(c, stderr);
		assert_int_equal(rs, MOE_OK);
		for (int i = 0; i < 6; i++)
			assert_true(((float *)out[0]->data)[i] == (float)(101 * i));
		moe_tensor_free(c, out[0]);
	}
	moe_tensor_map_free(b);
	snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
	assert_int_equal(system(cmd), 0);
	free(sym);
	moe_free(c, text);
	moe_module_free(m);
	moe_ctx_free(c);
}

static const cJSON *jget(const cJSON *o, const char *k)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
	assert_non_null(v);
	return v;
}

static void test_ir_writers_are_inert(void **st)
{
	(void)st;
	moe_ctx *c = moe_ctx_new(NULL, NULL);
	moe_module *m = evil_module(c, EVIL, evil_x, evil_w, evil_y, EVIL);
	/* JSON: the same strings come back through a JSON parser */
	char *j = moe_module_to_json(m);
	assert_non_null(j);
	cJSON *root = cJSON_Parse(j);
	assert_non_null(root);
	const cJSON *l = cJSON_GetArrayItem(jget(root, "layers"), 0);
	assert_string_equal(jget(l, "name")->valuestring, EVIL);
	const cJSON *nodes = jget(l, "nodes");
	assert_string_equal(jget(cJSON_GetArrayItem(nodes, 0), "name")->valuestring, evil_x);
	assert_string_equal(jget(cJSON_GetArrayItem(nodes, 1), "name")->valuestring, evil_w);
	assert_string_equal(jget(cJSON_GetArrayItem(nodes, 2), "name")->valuestring, evil_y);
	const cJSON *a = jget(jget(cJSON_GetArrayItem(nodes, 1), "attrs"), "source");
	assert_string_equal(jget(a, "str")->valuestring, EVIL);
	cJSON_Delete(root);
	/* and moec's reader refuses the names, located */
	assert_null(moe_module_parse_json(c, "e.json", j, strlen(j)));
	assert_non_null(strstr(last_error(c), "layer name"));
	moe_free(c, j);
	/* text: one line per node whatever the names; the reader refuses the layer name */
	char *t = NULL;
	size_t tl = 0;
	FILE *f = open_memstream(&t, &tl);
	assert_int_equal(moe_module_print(m, f), MOE_OK);
	fclose(f);
	size_t lines = 0;
	for (const char *p = t; *p; p++)
		lines += *p == '\n';
	assert_int_equal(lines, 7); /* moeir, layer, 3 nodes, output, } */
	moe_diag_clear(c);
	assert_null(moe_module_parse_text(c, "e.moeir", t, tl));
	assert_non_null(strstr(last_error(c), "layer name"));
	free(t);
	/* DOT: the same lines as with plain names, each with balanced quotes */
	char *d1 = NULL, *d2 = NULL;
	size_t n1 = 0, n2 = 0;
	moe_module *plain = evil_module(c, "l", "x", "w", "y", "w.src");
	f = open_memstream(&d1, &n1);
	assert_int_equal(moe_module_print_dot(m, f), MOE_OK);
	fclose(f);
	f = open_memstream(&d2, &n2);
	assert_int_equal(moe_module_print_dot(plain, f), MOE_OK);
	fclose(f);
	size_t l1 = 0, l2 = 0;
	for (const char *p = d1; *p; p++)
		l1 += *p == '\n';
	for (const char *p = d2; *p; p++)
		l2 += *p == '\n';
	assert_int_equal(l1, l2);
	int quotes = 0;
	for (const char *p = d1; *p; p++) {
		if (*p == '\\' && p[1])
			p++;
		else if (*p == '"')
			quotes++;
		else if (*p == '\n')
			assert_int_equal(quotes % 2, 0);
	}
	free(d1);
	free(d2);
	/* valid names with a hostile source read back the same, text and JSON */
	moe_module *v = evil_module(c, "l", "x", "w.0+a-b", "y", EVIL);
	t = NULL;
	f = open_memstream(&t, &tl);
	assert_int_equal(moe_module_print(v, f), MOE_OK);
	fclose(f);
	moe_module *back = moe_module_parse_text(c, "v.moeir", t, tl);
	if (!back)
		moe_diag_print(c, stderr);
	assert_non_null(back);
	assert_string_equal(moe_node_get_str(moe_module_graph(back, 0), 1, "source"), EVIL);
	assert_string_equal(moe_node_name(moe_module_graph(back, 0), 1), "w.0+a-b");
	moe_module_free(back);
	free(t);
	j = moe_module_to_json(v);
	back = moe_module_parse_json(c, "v.json", j, strlen(j));
	assert_non_null(back);
	assert_string_equal(moe_node_get_str(moe_module_graph(back, 0), 1, "source"), EVIL);
	moe_module_free(back);
	moe_free(c, j);
	moe_module_free(v);
	moe_module_free(plain);
	moe_module_free(m);
	moe_ctx_free(c);
}

/* The router's source as a .moe string literal and as the bytes it means. */
#define TCP_SRC_MOE "r*/ \\\"q\\\" \\\\ ?\?/\\\" %s%n \\n#x\\t"
#define TCP_SRC "r*/ \"q\" \\ ?\?/\" %s%n \n#x\t"

static void test_tcp_assembly_is_inert(void **st)
{
	(void)st;
	moe_ctx *c = moe_ctx_new(NULL, NULL);
	assert_int_equal(moe_tcp_register_passes(c), MOE_OK);
	const char *text = "layer small {\n"
			   "  dim T = 3, D = 8, F = 4, E = 5, K = 2, B = 2\n"
			   "  input x : [T, D]\n"
			   "  weight router : [E, D] = \"" TCP_SRC_MOE "\"\n"
			   "  weight wg : [E, F, D] = \"g.{e}\"\n"
			   "  weight wu : [E, F, D] = \"u.{e}\"\n"
			   "  weight wd : [E, D, F] = \"d.{e}\"\n"
			   "  logits = einsum(\"td,ed->te\", x, router)\n"
			   "  p = softmax(logits, axis=1)\n"
			   "  idx = topk(p, k=K)\n"
			   "  top = take_along(p, idx, axis=1)\n"
			   "  y = experts(x, idx, top, gate=wg, up=wu, down=wd, act=\"swiglu\", block=B)\n"
			   "  output y\n"
			   "}\n";
	moe_module *m = moe_parse_moe(c, "s.moe", text, strlen(text), NULL);
	if (!m)
		moe_diag_print(c, stderr);
	assert_non_null(m);
	assert_int_equal(moe_run_pipeline_text(c, "tcp", m, NULL), MOE_OK);
	moe_tcp_program *p = moe_tcp_compile(c, moe_module_graph(m, 0), NULL);
	if (!p)
		moe_diag_print(c, stderr);
	assert_non_null(p);
	char *as;
	size_t al;
	assert_int_equal(moe_tcp_to_asm(c, p, &as, &al), MOE_OK);
	/* every line is one the format defines: the source made no line of its own */
	static const char *const starts[] = {"tcps ", "meta ", "tensor ", "prep ", "const ", "@"};
	for (const char *l = as; *l; l = strchr(l, '\n') + 1) {
		assert_non_null(strchr(l, '\n'));
		bool known = false;
		for (size_t i = 0; i < sizeof starts / sizeof *starts; i++)
			known |= !strncmp(l, starts[i], strlen(starts[i]));
		if (!known)
			fail_msg("unexpected line: %.80s", l);
	}
	/* assembly and binary read back to the same source */
	moe_tcp_program *pa = moe_tcp_from_asm(c, "s.tcps", as, al, NULL);
	if (!pa)
		moe_diag_print(c, stderr);
	assert_non_null(pa);
	uint8_t *bin;
	size_t bl;
	assert_int_equal(moe_tcp_to_binary(c, pa, &bin, &bl), MOE_OK);
	moe_tcp_program *pb = moe_tcp_from_binary(c, "s.tcpb", bin, bl, NULL);
	assert_non_null(pb);
	const moe_tcp_program *progs[2] = {pa, pb};
	for (int k = 0; k < 2; k++) {
		moe_module *im = moe_tcp_interface(c, progs[k]);
		assert_non_null(im);
		moe_graph *g = moe_module_graph(im, 0);
		bool found = false;
		for (moe_id i = 0; i < moe_graph_num_nodes(g); i++)
			if (moe_node_name(g, i) && !strcmp(moe_node_name(g, i), "router")) {
				assert_string_equal(moe_node_get_str(g, i, "source"), TCP_SRC);
				found = true;
			}
		assert_true(found);
		moe_module_free(im);
	}
	moe_tcp_program_free(pb);
	moe_free(c, bin);
	moe_tcp_program_free(pa);
	moe_free(c, as);
	moe_tcp_program_free(p);
	moe_module_free(m);
	moe_ctx_free(c);
}

static void test_import_hf_moe_is_inert(void **st)
{
	(void)st;
	moe_ctx *c = moe_ctx_new(NULL, NULL);
	char *json = read_all(MOEC_SOURCE_DIR "/tests/fixtures/hf/mixtral/config.json");
	/* the config's name (its path) goes into a comment, the prefix into strings */
	const char *name = "cfg.json\n}\nlayer evil {\n  dim T = 1\n*/ \"";
	moe_import_opts o = {0};
	o.dtype = MOE_F32;
	o.prefix = "p\"q\\r%s.{layer}.";
	char *moe = NULL;
	moe_status s = moe_import_hf_text(c, name, json, strlen(json), &o, &moe);
	if (s)
		moe_diag_print(c, stderr);
	assert_int_equal(s, MOE_OK);
	assert_null(strstr(moe, "\nlayer evil"));
	moe_module *m = moe_parse_moe(c, "out.moe", moe, strlen(moe), NULL);
	if (!m)
		moe_diag_print(c, stderr);
	assert_non_null(m);
	assert_int_equal(moe_module_num_graphs(m), 1);
	moe_graph *g = moe_module_graph(m, 0);
	assert_string_equal(moe_graph_name(g), "mixtral_layer0");
	int weights = 0;
	for (moe_id i = 0; i < moe_graph_num_nodes(g); i++)
		if (moe_node_op(g, i) == MOE_OP_WEIGHT) {
			const char *src = moe_node_get_str(g, i, "source");
			assert_non_null(src);
			if (strncmp(src, "p\"q\\r%s.0.", strlen("p\"q\\r%s.0."))) /* {layer} is the layer index */
				fail_msg("source '%s' does not start with the prefix", src);
			weights++;
		}
	assert_true(weights >= 4);
	moe_module_free(m);
	moe_free(c, moe);
	/* a control byte cannot be written in a .moe string: refused */
	o.prefix = "p\x01.{layer}.";
	moe = NULL;
	assert_int_not_equal(moe_import_hf_text(c, "cfg.json", json, strlen(json), &o, &moe), MOE_OK);
	assert_null(moe);
	assert_non_null(strstr(last_error(c), "prefix"));
	free(json);
	moe_ctx_free(c);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_readers_refuse_names),
		cmocka_unit_test(test_c_output_is_inert),
		cmocka_unit_test(test_ir_writers_are_inert),
		cmocka_unit_test(test_tcp_assembly_is_inert),
		cmocka_unit_test(test_import_hf_moe_is_inert),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
