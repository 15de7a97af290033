/* tests/unit/grid_brute.h: the brute-force side of the grid-bound tests
 * (test_grid_pipeline.c, test_expert_parallel.c). */
#ifndef MOEC_TEST_GRID_BRUTE_H
#define MOEC_TEST_GRID_BRUTE_H

#include <string.h>

/* Can T tokens each pick K distinct experts so that expert e gets c[e]
 * (E <= 8)? Checked constructively: give each token the K experts with the
 * most remaining demand (the greedy order is optimal for equal row sums). */
static int feasible(int T, int K, int E, const int *c)
{
	int r[8];
	memcpy(r, c, sizeof(int) * (size_t)E);
	for (int t = 0; t < T; t++) {
		int used[8] = {0};
		for (int k = 0; k < K; k++) {
			int best = -1;
			for (int e = 0; e < E; e++)
				if (!used[e] && r[e] > 0 && (best < 0 || r[e] > r[best]))
					best = e;
			if (best < 0)
				return 0;
			used[best] = 1;
			r[best]--;
		}
	}
	for (int e = 0; e < E; e++)
		if (r[e])
			return 0;
	return 1;
}

#endif
