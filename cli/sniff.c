/* cli/sniff.c: what a file holds, by its content before its name:
 * magic bytes for binaries, top-level keys for JSON documents, the first
 * meaningful line for text. A file of a kind the command does not take gets
 * one error naming what it looks like and the command that takes it. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli.h"

#define SNIFF_BYTES 4096
/* The largest JSON IR file the layer commands read (the largest committed
 * one, tests/fuzz/corpus/irjson/gpt_oss_20b.host.json, is 36 KB). */
#define SNIFF_MAX_IR_JSON ((uint64_t)8 << 20)

static int starts(const char *p, const char *end, const char *lit)
{
	size_t n = strlen(lit);
	return (size_t)(end - p) >= n && !memcmp(p, lit, n);
}

/* The first character that is not blank or in a `#` comment line. */
static const char *skip_comments(const char *p, const char *end)
{
	while (p < end) {
		if (*p == ' ' || *p == '\t' || *p == '\r' || *p == '\n') {
			p++;
		} else if (*p == '#') {
			const char *nl = memchr(p, '\n', (size_t)(end - p));
			p = nl ? nl + 1 : end;
		} else {
			break;
		}
	}
	return p;
}

static int has_line_starting(const char *p, const char *end, const char *lit)
{
	for (const char *q = p; q < end;) {
		if (starts(q, end, lit))
			return 1;
		const char *nl = memchr(q, '\n', (size_t)(end - q));
		q = nl ? nl + 1 : end;
	}
	return 0;
}

/* The value after a top-level key's closing quote at q: true when it is the
 * string lit. */
static int value_is(const char *q, const char *end, const char *lit)
{
	while (q < end && (*q == ' ' || *q == '\t' || *q == '\r' || *q == '\n' || *q == ':'))
		q++;
	size_t n = strlen(lit);
	return q < end && *q == '"' && (size_t)(end - q) > n + 1 && !memcmp(q + 1, lit, n) && q[n + 1] == '"';
}

/* The kind of a JSON object, told by its top-level keys. One pass over the
 * text that allocates nothing (whatever its size; the command's reader
 * parses it under that reader's caps); broken JSON is told by the keys seen. */
static cli_kind json_kind(const char *data, size_t len)
{
	static const struct {
		const char *key;
		cli_kind kind;
	} keys[] = {
		{"weight_map", K_CK_INDEX}, {"model_type", K_HF_CONFIG}, {"architectures", K_HF_CONFIG},
		{"slices_per_cluster", K_MACHINE}, {"clock_hz", K_MACHINE}, {"traceEvents", K_TRACE},
		{"exchanges", K_EP_MANIFEST},
	};
	int depth = 0, rank = (int)(sizeof keys / sizeof *keys); /* the best key seen: its index */
	char prev = 0;
	int moeir = 0;
	const char *end = data + len;
	for (const char *p = data; p < end; p++) {
		char c = *p;
		if (c != '"') {
			depth += (c == '{' || c == '[') - (c == '}' || c == ']');
			if (c != ' ' && c != '\t' && c != '\r' && c != '\n')
				prev = c;
			continue;
		}
		const char *q = p + 1;
		while (q < end && *q != '"')
			q += *q == '\\' ? 2 : 1;
		if (q >= end)
			break;
		if (depth == 1 && (prev == '{' || prev == ',')) {
			size_t n = (size_t)(q - p - 1);
			if (n == 6 && !memcmp(p + 1, "format", 6) && value_is(q + 1, end, "moeir"))
				moeir = 1;
			for (int i = 0; i < rank; i++)
				if (strlen(keys[i].key) == n && !memcmp(p + 1, keys[i].key, n))
					rank = i;
		}
		p = q;
		prev = '"';
	}
	if (moeir)
		return K_IR_JSON;
	return rank < (int)(sizeof keys / sizeof *keys) ? keys[rank].kind : K_JSON;
}

static int is_safetensors(const unsigned char *u, size_t len)
{
	if (len < 10 || u[8] != '{')
		return 0;
	unsigned long long n = 0;
	for (int i = 7; i >= 0; i--)
		n = n << 8 | u[i];
	return n >= 2 && n <= 100000000ull;
}

cli_kind cli_sniff(const char *data, size_t len)
{
	const unsigned char *u = (const unsigned char *)data;
	const char *end = data + len;
	if (len >= 8 && !memcmp(data, "MOECTCPB", 8))
		return K_TCPB;
	if (len >= 6 && !memcmp(data, "\x93NUMPY", 6))
		return K_NPY;
	if (len >= 4 && !memcmp(data, "\x7f" "ELF", 4))
		return K_ELF;
	if (is_safetensors(u, len))
		return K_SAFETENSORS;
	if (memchr(data, 0, len < SNIFF_BYTES ? len : SNIFF_BYTES))
		return K_BINARY;
	const char *p = data;
	while (p < end && (*p == ' ' || *p == '\t' || *p == '\r' || *p == '\n'))
		p++;
	if (p < end && *p == '{')
		return json_kind(data, len);
	if (starts(p, end, "tcps "))
		return K_TCPS;
	if (starts(p, end, "; ModuleID") || has_line_starting(p, end, "target datalayout"))
		return K_LLVM_IR;
	if (starts(p, end, "/*") || starts(p, end, "//"))
		return K_C;
	const char *q = skip_comments(p, end);
	if (starts(q, end, "moeir"))
		return K_MOEIR;
	if (starts(q, end, "tcpsched "))
		return K_TSCHED;
	if (!starts(q, end, "layer") && (has_line_starting(p, end, "#include") || has_line_starting(p, end, "#define")))
		return K_C;
	return K_MOE;
}

int cli_sniff_file(moe_ctx *ctx, const char *path, cli_kind *kind)
{
	*kind = K_UNREAD;
	struct stat st;
	/* standard input, FIFOs and devices: the reader decides (and refuses
	 * what is not a regular file) without this blocking on them first */
	if (!strcmp(path, "-") || stat(path, &st) != 0 || !S_ISREG(st.st_mode))
		return 0;
	FILE *f = fopen(path, "rb");
	if (!f) {
		moe_diag(ctx, MOE_DIAG_ERROR, moe_loc_file(ctx, path), "cannot read: %s", strerror(errno));
		return 1;
	}
	char head[SNIFF_BYTES];
	size_t n = fread(head, 1, sizeof head, f);
	fclose(f);
	cli_kind k = cli_sniff(head, n);
	if (n == sizeof head && k == K_JSON) {
		/* JSON is told by its keys: read it whole ("format": "moeir" in the
		 * head decides at once) */
		char *text = NULL;
		size_t len = 0;
		if (moe_read_file_max(ctx, path, CLI_MAX_SOURCE, &text, &len) != MOE_OK)
			return 1;
		k = cli_sniff(text, len);
		free(text);
	}
	*kind = k;
	return 0;
}

/* What each kind is, and which command takes it. */
static const struct {
	const char *desc, *use;
} kinds[] = {
	[K_UNREAD] = {"a file that is not a regular file", "a regular file"},
	[K_MOE] = {"a .moe layer", "`moec check|ir|stats|compile|run`"},
	[K_MOEIR] = {"textual IR (.moeir)", "`moec check|ir|stats|compile|run`"},
	[K_IR_JSON] = {"JSON IR", "`moec check|ir|stats|compile|run`"},
	[K_JSON] = {"JSON of no kind moec knows", "`moec --help`"},
	[K_TCPB] = {"a compiled TCP binary (.tcpb)", "`moec check` or `moec run`"},
	[K_TCPS] = {"TCP assembly (.tcps)", "`moec check` or `moec run` (--target=tcp)"},
	[K_NPY] = {"a NumPy array (.npy)", "`moec run LAYER --input FILE`"},
	[K_SAFETENSORS] = {"a safetensors checkpoint", "`moec run LAYER --weights FILE`"},
	[K_CK_INDEX] = {"a sharded checkpoint's index", "`moec run LAYER --weights FILE`"},
	[K_HF_CONFIG] = {"a HuggingFace config.json", "`moec import-hf FILE -o LAYER.moe`"},
	[K_MACHINE] = {"a TCP machine description", "`--machine FILE` with `moec compile`, `run` or `check`"},
	[K_TRACE] = {"a trace written by `moec run --trace`", "Perfetto (ui.perfetto.dev) to view it"},
	[K_C] = {"C source", "`moec check` on the .moe it came from"},
	[K_LLVM_IR] = {"LLVM IR", "`moec check` on the .moe it came from"},
	[K_ELF] = {"an object file", "`moec check` on the .moe it came from"},
	[K_BINARY] = {"a binary file, not a layer (.moe, .moeir or JSON IR)", "`moec --help`"},
	[K_EP_MANIFEST] = {"the manifest of `moec compile --ep` (OUT.ep.json)", "`moec check FILE`"},
	[K_TSCHED] = {"a TCP schedule (.tsched)", "`moec check|compile|run` with --target=tcp"},
};

/* Why a file import-hf was given holds no JSON at all, or NULL: empty, blank,
 * or opened by a UTF-8 byte-order mark (which Python's json refuses too). */
static const char *not_json(const char *path)
{
	char head[SNIFF_BYTES];
	FILE *f = fopen(path, "rb");
	if (!f)
		return NULL;
	size_t n = fread(head, 1, sizeof head, f);
	fclose(f);
	if (!n)
		return "the file is empty";
	if (n >= 3 && !memcmp(head, "\xef\xbb\xbf", 3))
		return n == 3 ? "the file holds only a UTF-8 byte-order mark"
			      : "the file starts with a UTF-8 byte-order mark, which JSON does not allow";
	if (n < sizeof head && skip_comments(head, head + n) == head + n && !memchr(head, '#', n))
		return "the file holds only whitespace";
	return NULL;
}

int cli_check_kind(moe_ctx *ctx, const opts *o)
{
	cli_kind k = o->kind;
	if (k == K_UNREAD)
		return 0;
	int layer = k == K_MOE || k == K_MOEIR || k == K_IR_JSON || k == K_JSON;
	int ok = o->cmdbit == C_IMPORT ? k == K_HF_CONFIG || k == K_JSON
		 : o->cmdbit & (C_CHECK | C_RUN) ? layer || k == K_TCPB || (k == K_EP_MANIFEST && o->cmdbit == C_CHECK) ||
			k == K_TCPS || k == K_TSCHED
		 : o->cmdbit == C_COMPILE ? layer || k == K_TSCHED
		 : layer;
	struct stat st;
	if (ok && o->cmdbit != C_IMPORT && (k == K_IR_JSON || k == K_JSON) && strcmp(o->file, "-") &&
		!stat(o->file, &st) && (uint64_t)st.st_size > SNIFF_MAX_IR_JSON) {
		moe_diag(ctx, MOE_DIAG_ERROR, moe_loc_file(ctx, o->file),
			"JSON IR of %lld bytes exceeds the limit of %llu bytes (parsing JSON costs about 40 bytes of "
			"memory per byte)", (long long)st.st_size, (unsigned long long)SNIFF_MAX_IR_JSON);
		return 1;
	}
	if (ok)
		return 0;
	const char *why = o->cmdbit == C_IMPORT ? not_json(o->file) : NULL;
	if (why) {
		moe_diag(ctx, MOE_DIAG_ERROR, moe_loc_file(ctx, o->file), "%s; a HuggingFace config.json is a JSON object",
			why);
		return 1;
	}
	moe_diag(ctx, MOE_DIAG_ERROR, moe_loc_file(ctx, o->file), "this looks like %s%s; use %s", kinds[k].desc,
		o->cmdbit == C_IMPORT ? ", not a HuggingFace config.json" : "", kinds[k].use);
	return 1;
}

/* The kinds an option value is refused as: those that are surely another
 * option's (a file of no known kind is left to the reader's message). */
static int wrong_for(const char *opt, cli_kind k)
{
	switch (k) {
	case K_TCPB: case K_TCPS: case K_HF_CONFIG: case K_MACHINE: case K_TRACE: case K_IR_JSON: case K_ELF:
	case K_LLVM_IR: case K_C: case K_EP_MANIFEST:
		return 1;
	case K_NPY: return !strcmp(opt, "--weights");
	case K_SAFETENSORS: case K_CK_INDEX: return !strcmp(opt, "--input");
	default: return 0;
	}
}

/* Each item of a comma-separated path list (NAME=path items when named). */
static int check_list(moe_ctx *ctx, const char *opt, const char *list, int named)
{
	if (!list)
		return 0;
	char *copy = strdup(list);
	int bad = !copy;
	for (char *save = NULL, *p = copy ? strtok_r(copy, ",", &save) : NULL; p; p = strtok_r(NULL, ",", &save)) {
		const char *eq = named ? strchr(p, '=') : NULL, *path = eq ? eq + 1 : p;
		struct stat st;
		if (stat(path, &st) != 0 || !S_ISREG(st.st_mode))
			continue; /* a directory of shards, a missing file: the reader says */
		FILE *f = fopen(path, "rb");
		if (!f)
			continue;
		char head[SNIFF_BYTES];
		size_t n = fread(head, 1, sizeof head, f);
		fclose(f);
		cli_kind k = cli_sniff(head, n);
		if (!wrong_for(opt, k))
			continue;
		moe_diag(ctx, MOE_DIAG_ERROR, moe_loc_file(ctx, path), "%s takes %s; this looks like %s; use %s", opt,
			!strcmp(opt, "--weights") ? "a checkpoint (.safetensors, *.index.json or their directory)" :
						    "the layer's input as .npy",
			kinds[k].desc, kinds[k].use);
		bad = 1;
	}
	free(copy);
	return bad;
}

int cli_check_values(moe_ctx *ctx, const opts *o)
{
	return check_list(ctx, "--weights", o->weights, 0) | check_list(ctx, "--input", o->input, 1);
}
