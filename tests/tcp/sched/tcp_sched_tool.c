/* tests/tcp/sched/tcp_sched_tool.c: reads a schedule's text form (.tsched,
 * docs/tcp-compiler.md 4.2), verifies it and prints it on stdout; the lit
 * tests of tests/lit/tcp/sched drive it. A test tool, not installed.
 *
 *   tcp_sched_tool [--no-machine | --machine M.json] [--roundtrip] [--schedule] [--predict] [--tcpb OUT.tcpb] [--asm] FILE
 *
 * --no-machine reads without a machine (no capacity checks, any machine
 * line); --machine reads the machine description M.json (as `moec
 * --machine`); otherwise the built-in machine. --roundtrip also parses the printed
 * text again and fails unless printing it gives the same bytes. --tcpb and
 * --asm select the program (tcp_sched_isel, which places what is not placed)
 * and write it as a .tcpb / print its assembly instead of the schedule.
 * --schedule places the buffers, costs the ops and runs the list scheduler
 * (schedule.h) first. --predict prints, instead of the schedule, the
 * schedule's timeline (sched_time.h) and the simulator's prediction of the
 * program selected from it (moe_tcp_predict_order: its accesses ordered by
 * bytes when the schedule's reuse is ordered), both on the expected loads:
 * `timeline C cycles, N blocks` and `simulator C cycles, N blocks`, then one
 * line per op `@ID ctx start end` of the timeline.
 * Exit 0, or 1 with `file:line:col: error:` diagnostics on stderr. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend-tcp/compiler/dmplan.h"
#include "backend-tcp/compiler/isel.h"
#include "backend-tcp/compiler/sched_time.h"
#include "backend-tcp/compiler/schedule.h"

static char *slurp(const char *path, size_t *n)
{
	FILE *f = fopen(path, "rb");
	if (!f)
		return NULL;
	size_t cap = 1 << 16, len = 0;
	char *buf = malloc(cap);
	for (size_t r; buf && (r = fread(buf + len, 1, cap - len, f)) > 0;) {
		len += r;
		if (len == cap && cap < TS_MAX_TEXT_BYTES + 1) {
			char *nb = realloc(buf, cap * 2);
			if (!nb) {
				free(buf);
				buf = NULL;
				break;
			}
			buf = nb;
			cap *= 2;
		} else if (len == cap) {
			break;
		}
	}
	fclose(f);
	*n = len;
	return buf;
}

/* The program of schedule s: written to tcpb, its assembly printed. */
static int select_program(moe_ctx *ctx, tcp_sched *s, const char *tcpb, bool asm_)
{
	tcp_program *p = tcp_sched_isel(ctx, s);
	int rc = !p;
	if (!rc && tcpb)
		rc = moe_tcp_write_binary(ctx, p, tcpb) != MOE_OK;
	char *text = NULL;
	size_t len = 0;
	if (!rc && asm_)
		rc = moe_tcp_to_asm(ctx, p, &text, &len) != MOE_OK || fwrite(text, 1, len, stdout) != len;
	moe_free(ctx, text);
	tcp_prog_free(p);
	return rc;
}

/* --predict: the timeline against the simulator's prediction, expected loads */
static int predict(moe_ctx *ctx, tcp_sched *s)
{
	ts_timeline tl;
	if (tcp_dm_place(s) != MOE_OK || tcp_sched_predict(ctx, s, NULL, &tl) < 0)
		return 1;
	tcp_program *p = tcp_sched_isel(ctx, s);
	moe_tcp_prediction pr;
	int rc = !p || moe_tcp_predict_order(ctx, p, s->m, NULL, s->reuse == TS_REUSE_ORDERED, &pr) != MOE_OK;
	if (!rc) {
		printf("timeline %lld cycles, %lld blocks\n", (long long)tl.cycles, (long long)tl.nblocks);
		printf("simulator %lld cycles, %lld blocks\n", (long long)pr.stats.cycles, (long long)pr.nblocks);
		for (ts_id i = 0; i < s->nop; i++)
			printf("@%u %s %lld %lld\n", i, tcp_ctx_names[s->op[i].ctx], (long long)tl.start[i], (long long)tl.end[i]);
	}
	tcp_prog_free(p);
	ts_timeline_free(ctx, s, &tl);
	return rc;
}

static int run(moe_ctx *ctx, const moe_tcp_machine *m, const char *path, bool roundtrip, const char *tcpb, bool asm_,
	bool sched, bool pred)
{
	size_t n;
	char *text = slurp(path, &n);
	if (!text) {
		fprintf(stderr, "%s: error: cannot read the file\n", path);
		return 1;
	}
	tcp_sched *s = tcp_sched_parse(ctx, m, path, text, n);
	free(text);
	if (!s)
		return 1;
	if (sched && (tcp_dm_place(s) != MOE_OK || tcp_sched_cost(ctx, s) != MOE_OK || tcp_sched_schedule(ctx, s) != MOE_OK ||
			     tcp_sched_verify(s) != MOE_OK)) {
		tcp_sched_free(s);
		return 1;
	}
	if (pred) {
		int rc = predict(ctx, s);
		tcp_sched_free(s);
		return rc;
	}
	if (tcpb || asm_) {
		int rc = select_program(ctx, s, tcpb, asm_);
		tcp_sched_free(s);
		return rc;
	}
	char *out = NULL, *again = NULL;
	size_t len = 0, len2 = 0;
	int rc = tcp_sched_print(s, &out, &len) == MOE_OK ? 0 : 1;
	if (!rc && roundtrip) {
		tcp_sched *t = tcp_sched_parse(ctx, m, "<printed>", out, len);
		rc = !t || tcp_sched_print(t, &again, &len2) != MOE_OK;
		if (!rc && (len != len2 || memcmp(out, again, len))) {
			fprintf(stderr, "%s: error: print -> parse -> print differs\n", path);
			rc = 1;
		}
		ctx_free(ctx, again, len2);
		/* the copy without text is the one read back from the text */
		tcp_sched *c = rc ? NULL : ts_clone(s);
		if (!rc && (!c || !ts_same(c, t))) {
			fprintf(stderr, "%s: error: ts_clone differs from print -> parse\n", path);
			rc = 1;
		}
		tcp_sched_free(c);
		tcp_sched_free(t);
	}
	if (!rc && fwrite(out, 1, len, stdout) != len)
		rc = 1;
	ctx_free(ctx, out, len);
	tcp_sched_free(s);
	return rc;
}

int main(int argc, char **argv)
{
	bool machine = true, roundtrip = false, asm_ = false, sched = false, pred = false;
	const char *path = NULL, *tcpb = NULL, *mpath = NULL;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--no-machine"))
			machine = false;
		else if (!strcmp(argv[i], "--machine") && i + 1 < argc)
			mpath = argv[++i];
		else if (!strcmp(argv[i], "--roundtrip"))
			roundtrip = true;
		else if (!strcmp(argv[i], "--asm"))
			asm_ = true;
		else if (!strcmp(argv[i], "--schedule"))
			sched = true;
		else if (!strcmp(argv[i], "--predict"))
			pred = true;
		else if (!strcmp(argv[i], "--tcpb") && i + 1 < argc)
			tcpb = argv[++i];
		else if (!path && argv[i][0] != '-')
			path = argv[i];
		else {
			fprintf(stderr, "usage: tcp_sched_tool [--no-machine | --machine M.json] [--roundtrip] [--schedule] [--predict] [--tcpb OUT.tcpb] [--asm] FILE\n");
			return 2;
		}
	}
	if (!path) {
		fprintf(stderr, "usage: tcp_sched_tool [--no-machine | --machine M.json] [--roundtrip] [--schedule] [--predict] [--tcpb OUT.tcpb] [--asm] FILE\n");
		return 2;
	}
	moe_ctx *ctx = moe_ctx_new(NULL, NULL);
	if (!ctx)
		return 1;
	moe_ctx_set_diag_prefix(ctx, "tcp_sched_tool");
	if (mpath && !machine) {
		fprintf(stderr, "tcp_sched_tool: --machine and --no-machine exclude each other\n");
		moe_ctx_free(ctx);
		return 2;
	}
	moe_tcp_machine *m = !machine ? NULL : mpath ? moe_tcp_machine_load(ctx, mpath) : moe_tcp_machine_default(ctx);
	if ((tcpb || asm_ || sched || pred) && !machine) {
		fprintf(stderr, "tcp_sched_tool: --tcpb, --asm, --schedule and --predict need the machine (not --no-machine)\n");
		return 2;
	}
	int rc = machine && !m ? 1 : run(ctx, m, path, roundtrip, tcpb, asm_, sched, pred);
	moe_diag_print(ctx, stderr);
	if (m)
		moe_tcp_machine_free(ctx, m);
	moe_ctx_free(ctx);
	return rc;
}
