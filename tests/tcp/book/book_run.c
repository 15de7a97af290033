/* tests/tcp/book/book_run.c: runs one worked example of the furiosa-opt book,
 * written as a moec TCP program (.tcps), on the simulator and checks its time
 * against the book's figure (docs/tcp-model.md section 9).
 *
 * The program's comment lines carry the check:
 *   # figure: N         the book's cycles (required)
 *   # fixed: K          K Tensor Unit commands: the book's pipeline figures
 *                       leave out each command's issue and fill/drain, so
 *                       K x (command_issue_cycles + tuexec_fill_drain_cycles)
 *                       is added to N
 *   # machine: A => B   the built-in machine.json with text A replaced by B
 *                       (an example that the book states for one slice)
 * The simulated time is the first command's start to the last command's end
 * (the book's figures have no kernel launch and end). It passes within 15%
 * of the expected figure or 150 cycles, whichever is larger. With --print it
 * prints "span expected first-start cycles" and does not judge
 * (bench/book_table.py, tests/lit/tcp/contract.test). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend-tcp/sim/sim_int.h"

static char *slurp(const char *path, size_t *n)
{
	FILE *f = fopen(path, "rb");
	if (!f)
		return NULL;
	fseek(f, 0, SEEK_END);
	long len = ftell(f);
	rewind(f);
	char *b = malloc((size_t)len + 1);
	if (b && fread(b, 1, (size_t)len, f) != (size_t)len) {
		free(b);
		b = NULL;
	}
	fclose(f);
	if (b)
		b[len] = 0;
	*n = (size_t)len;
	return b;
}

/* text with the first `from` replaced by `to`; NULL when absent */
static char *replace(const char *text, const char *from, const char *to)
{
	const char *at = strstr(text, from);
	if (!at)
		return NULL;
	size_t n = strlen(text) - strlen(from) + strlen(to) + 1;
	char *r = malloc(n);
	snprintf(r, n, "%.*s%s%s", (int)(at - text), text, to, at + strlen(from));
	return r;
}

/* The machine of the example: the built-in one with its `# machine:` edits. */
static char *machine_text(const char *prog)
{
	char *m = strdup(tcp_default_machine_json);
	for (const char *l = prog; (l = strstr(l, "# machine: ")) != NULL; l++) {
		char line[512], *arrow;
		const char *e = strchr(l, '\n');
		size_t n = e ? (size_t)(e - l) : strlen(l);
		if (n >= sizeof line)
			n = sizeof line - 1;
		memcpy(line, l + 11, n - 11);
		line[n - 11] = 0;
		if (!(arrow = strstr(line, " => "))) {
			fprintf(stderr, "malformed '# machine:' line: %s\n", line);
			free(m);
			return NULL;
		}
		*arrow = 0;
		char *r = replace(m, line, arrow + 4);
		if (!r) {
			fprintf(stderr, "'# machine:' text not in machine.json: %s\n", line);
			free(m);
			return NULL;
		}
		free(m);
		m = r;
	}
	return m;
}

static long field(const char *prog, const char *key, long dflt)
{
	const char *at = strstr(prog, key);
	return at ? strtol(at + strlen(key), NULL, 10) : dflt;
}

int main(int argc, char **argv)
{
	bool print = argc == 3 && strcmp(argv[1], "--print") == 0;
	const char *path = argv[argc - 1];
	size_t n;
	char *prog = argc >= 2 ? slurp(path, &n) : NULL;
	if (!prog) {
		fprintf(stderr, "usage: tcp_book [--print] EXAMPLE.tcps\n");
		return 2;
	}
	long figure = field(prog, "# figure: ", -1), fixed = field(prog, "# fixed: ", 0);
	char *mt = machine_text(prog);
	moe_ctx *ctx = moe_ctx_new(NULL, NULL);
	moe_tcp_machine *m = mt ? moe_tcp_machine_parse(ctx, "book machine", mt, strlen(mt)) : NULL;
	moe_tcp_program *p = m ? moe_tcp_from_asm(ctx, path, prog, n, m) : NULL;
	moe_tcp_run_opts o = {0};
	o.machine = m;
	o.timing_only = 1;
	moe_tcp_stats st;
	tev *ev = NULL;
	size_t nev = 0;
	if (figure < 0 || !p || tcp_run_events(ctx, p, NULL, &o, NULL, &st, &ev, &nev) != MOE_OK || nev == 0) {
		moe_diag_print(ctx, stderr);
		fprintf(stderr, "%s: %s\n", path, figure < 0 ? "no '# figure:' line" : "does not run");
		return 1;
	}
	int64_t first = ev[0].start, last = 0;
	for (size_t i = 0; i < nev; i++) {
		first = ev[i].start < first ? ev[i].start : first;
		last = ev[i].end > last ? ev[i].end : last;
	}
	double want = (double)figure + (double)fixed * (double)(m->issue_cycles + m->fill_drain);
	double got = (double)(last - first), tol = want * 0.15 > 150 ? want * 0.15 : 150;
	int rc = 0;
	if (print) { /* span, expected, the first command's start, the run's cycles (launch and end included) */
		printf("%lld %.0f %lld %lld\n", (long long)(last - first), want, (long long)first, (long long)st.cycles);
	} else {
		rc = !(got >= want - tol && got <= want + tol);
		printf("%s: book %ld cycles (+ %ld x %lld fixed) = %.0f, simulated %.0f (%+.1f%%, tolerance %.0f): %s\n", path,
			figure, fixed, (long long)(m->issue_cycles + m->fill_drain), want, got, 100.0 * (got - want) / want, tol,
			rc ? "FAIL" : "ok");
	}
	ctx_free(ctx, ev, 0);
	moe_tcp_program_free(p);
	moe_tcp_machine_free(ctx, m);
	moe_ctx_free(ctx);
	free(mt);
	free(prog);
	return rc;
}
