/* cli/ep_mpi.c: the MPI transport of `moec run --ep N`
 * (docs/expert-parallel.md). One device per rank of MPI_COMM_WORLD.
 *
 * Every collective step first agrees on the ranks' state (MPI_Allreduce of
 * a failure flag), so a rank that fails (a bad checkpoint shard, a fault)
 * takes part in exactly one more agreement and leaves; the others see the
 * flag at their next step and stop with an error instead of waiting in an
 * exchange that will never complete. A rank that dies outright is MPI's to
 * handle: mpirun ends the job. Built without MPI, every entry reports that
 * --ep needs it. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"

#ifdef MOEC_HAVE_MPI
#include <mpi.h>

static int ep_rank = -1, ep_size, ep_failed_seen;

int cli_ep_net_started(void)
{
	return ep_rank >= 0;
}

int cli_ep_net_init(moe_ctx *ctx, int *rank, int *size)
{
	int inited = 0;
	MPI_Initialized(&inited);
	if (!inited && MPI_Init(NULL, NULL) != MPI_SUCCESS) {
		moe_diag(ctx, MOE_DIAG_ERROR, moe_loc_none(), "--ep: MPI_Init failed");
		return 1;
	}
	MPI_Comm_rank(MPI_COMM_WORLD, &ep_rank);
	MPI_Comm_size(MPI_COMM_WORLD, &ep_size);
	*rank = ep_rank;
	*size = ep_size;
	return 0;
}

/* The diagnostics in one write(2): the ranks share mpirun's stderr, and
 * pieces written apart interleave with another rank's (a write of up to
 * PIPE_BUF bytes to a pipe is atomic). */
static void print_whole(moe_ctx *ctx)
{
	char *buf = NULL;
	size_t len = 0;
	FILE *m = open_memstream(&buf, &len);
	if (m) {
		moe_diag_print(ctx, m);
		if (fclose(m) == 0 && len)
			(void)!write(2, buf, len);
		free(buf);
	} else {
		moe_diag_print(ctx, stderr);
	}
	fflush(stderr);
	moe_diag_clear(ctx);
}

int cli_ep_net_agree(moe_ctx *ctx, int failed)
{
	if (ep_failed_seen)
		return 1; /* already agreed to stop: no further collective */
	int any = 0;
	MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
	if (any) {
		ep_failed_seen = 1;
		if (!failed)
			moe_diag(ctx, MOE_DIAG_ERROR, moe_loc_none(), "rank %d of %d: stopping: another rank failed (its error "
				"is printed by that rank)", ep_rank, ep_size);
		/* every rank prints before a barrier they all join: mpirun stops the
		 * others as soon as one rank exits, so a message left for exit could be
		 * lost */
		print_whole(ctx);
		MPI_Barrier(MPI_COMM_WORLD);
	}
	return any;
}

int cli_ep_net_compare(moe_ctx *ctx, int failed, const uint64_t *d, int nd, int *rank, unsigned *mask)
{
	*rank = -1;
	*mask = 0;
	if (ep_failed_seen)
		return -1;
	int w = nd + 1;
	uint64_t *all = calloc((size_t)ep_size * (size_t)w + (size_t)w, sizeof *all), *mine = all + (size_t)ep_size * w;
	if (!all) {
		moe_diag(ctx, MOE_DIAG_ERROR, moe_loc_none(), "out of memory");
		print_whole(ctx);
		MPI_Abort(MPI_COMM_WORLD, 1);
	}
	mine[0] = (uint64_t)(failed != 0);
	memcpy(mine + 1, d, (size_t)nd * sizeof *d);
	MPI_Allgather(mine, w, MPI_UINT64_T, all, w, MPI_UINT64_T, MPI_COMM_WORLD);
	int any = 0;
	for (int r = 0; r < ep_size; r++)
		any |= all[(size_t)r * w] != 0;
	if (any) {
		free(all);
		ep_failed_seen = 1;
		if (!failed)
			moe_diag(ctx, MOE_DIAG_ERROR, moe_loc_none(), "rank %d of %d: stopping: another rank failed (its error "
				"is printed by that rank)", ep_rank, ep_size);
		print_whole(ctx);
		MPI_Barrier(MPI_COMM_WORLD);
		return -1;
	}
	for (int r = 1; r < ep_size && *rank < 0; r++)
		for (int f = 0; f < nd; f++)
			if (all[(size_t)r * w + 1 + f] != all[1 + f]) {
				*rank = r;
				*mask |= 1u << f;
			}
	free(all);
	if (*rank >= 0)
		ep_failed_seen = 1; /* every rank saw the same vectors: all stop here */
	return *rank >= 0;
}

void cli_ep_net_stop(moe_ctx *ctx)
{
	print_whole(ctx);
	MPI_Barrier(MPI_COMM_WORLD);
}

moe_status cli_ep_all_to_all(void *ud, moe_ctx *ctx, const void *send, const int64_t *counts, size_t row_bytes,
	void *recv, int64_t cap, int64_t *got)
{
	(void)ud;
	*got = 0;
	if (cli_ep_net_agree(ctx, 0))
		return MOE_ERR_RUNTIME;
	int n = ep_size, bad = 0;
	int *sc = calloc((size_t)n * 4, sizeof *sc), *rc = sc + n, *sd = sc + 2 * n, *rd = sc + 3 * n;
	if (!sc)
		bad = 1;
	for (int j = 0; !bad && j < n; j++) {
		int64_t bytes = counts[j] * (int64_t)row_bytes, off = j ? sd[j - 1] + (int64_t)sc[j - 1] : 0;
		bad = bytes > INT32_MAX || off + bytes > INT32_MAX;
		if (!bad)
			sc[j] = (int)bytes, sd[j] = (int)off;
	}
	/* an agreement before the counts: a rank that cannot take part says so here */
	if (cli_ep_net_agree(ctx, bad)) {
		if (bad)
			moe_diag(ctx, MOE_DIAG_ERROR, moe_loc_none(), "rank %d: all_to_all: the rows to send exceed 2 GiB "
				"per exchange (MPI counts are int)", ep_rank);
		free(sc);
		return MOE_ERR_RUNTIME;
	}
	MPI_Alltoall(sc, 1, MPI_INT, rc, 1, MPI_INT, MPI_COMM_WORLD);
	int64_t total = 0;
	for (int j = 0; j < n; j++) {
		rd[j] = (int)total;
		total += rc[j];
	}
	bad = total > cap * (int64_t)row_bytes || total > INT32_MAX;
	if (cli_ep_net_agree(ctx, bad)) {
		if (bad)
			moe_diag(ctx, MOE_DIAG_ERROR, moe_loc_none(), "rank %d: all_to_all: %lld bytes arrive, the receive buffer "
				"holds %lld rows of %zu bytes", ep_rank, (long long)total, (long long)cap, row_bytes);
		free(sc);
		return MOE_ERR_RUNTIME;
	}
	MPI_Alltoallv(send, sc, sd, MPI_BYTE, recv, rc, rd, MPI_BYTE, MPI_COMM_WORLD);
	*got = row_bytes ? total / (int64_t)row_bytes : 0;
	free(sc);
	return MOE_OK;
}

int cli_ep_net_gather(moe_ctx *ctx, const void *mine, size_t bytes, void *all, size_t all_bytes)
{
	int n = ep_size, b = (int)bytes, bad = bytes > INT32_MAX || all_bytes > INT32_MAX;
	if (cli_ep_net_agree(ctx, bad))
		return 1;
	int *rc = calloc((size_t)n * 2, sizeof *rc), *rd = rc ? rc + n : NULL;
	if (!rc) {
		moe_diag(ctx, MOE_DIAG_ERROR, moe_loc_none(), "out of memory");
		MPI_Abort(MPI_COMM_WORLD, 1);
	}
	MPI_Gather(&b, 1, MPI_INT, rc, 1, MPI_INT, 0, MPI_COMM_WORLD);
	for (int j = 0, at = 0; ep_rank == 0 && j < n; j++) {
		rd[j] = at;
		at += rc[j];
	}
	MPI_Gatherv(mine, b, MPI_BYTE, all, rc, rd, MPI_BYTE, 0, MPI_COMM_WORLD);
	free(rc);
	return 0;
}

void cli_ep_net_finish(void)
{
	int fin = 0;
	MPI_Finalized(&fin);
	if (ep_rank >= 0 && !fin)
		MPI_Finalize();
}

#else

int cli_ep_net_started(void)
{
	return 0;
}

int cli_ep_net_init(moe_ctx *ctx, int *rank, int *size)
{
	*rank = 0;
	*size = 1;
	moe_diag(ctx, MOE_DIAG_ERROR, moe_loc_none(), "--ep needs moec built with MPI (Debian: openmpi-bin libopenmpi-dev, "
		"then configure again); this moec was built without it");
	return 1;
}

int cli_ep_net_agree(moe_ctx *ctx, int failed)
{
	(void)ctx;
	return failed;
}

int cli_ep_net_compare(moe_ctx *ctx, int failed, const uint64_t *d, int nd, int *rank, unsigned *mask)
{
	(void)ctx, (void)d, (void)nd;
	*rank = -1;
	*mask = 0;
	return failed ? -1 : 0;
}

void cli_ep_net_stop(moe_ctx *ctx)
{
	(void)ctx;
}

moe_status cli_ep_all_to_all(void *ud, moe_ctx *ctx, const void *send, const int64_t *counts, size_t row_bytes,
	void *recv, int64_t cap, int64_t *got)
{
	(void)ud, (void)send, (void)counts, (void)row_bytes, (void)recv, (void)cap;
	*got = 0;
	moe_diag(ctx, MOE_DIAG_ERROR, moe_loc_none(), "--ep needs moec built with MPI");
	return MOE_ERR_UNSUPPORTED;
}

int cli_ep_net_gather(moe_ctx *ctx, const void *mine, size_t bytes, void *all, size_t all_bytes)
{
	(void)ctx, (void)mine, (void)bytes, (void)all, (void)all_bytes;
	return 1;
}

void cli_ep_net_finish(void)
{
}

#endif
