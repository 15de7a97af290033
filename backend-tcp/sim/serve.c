/* backend-tcp/serve.c: a serving program's token count (docs/semantics.md
 * section 7) is checked before the simulator runs: the n_tokens input must
 * lie in 0..T, T the token rows of the program's other inputs. */
#include <string.h>

#include "backend-tcp/isa/tcp_int.h"

moe_status tcp_tokens_check(moe_ctx *ctx, const tcp_program *p, const moe_tensor_map *b)
{
	int64_t T = -1;
	int32_t nt = -1;
	for (uint32_t i = 0; i < p->nt; i++) {
		const tcp_tensor *t = &p->t[i];
		if (t->kind != TCP_T_INPUT || !t->name)
			continue;
		if (!strcmp(t->name, MOE_TOKENS_INPUT))
			nt = (int32_t)i;
		else if (t->rank >= 1 && t->shape[0] > T)
			T = t->shape[0];
	}
	if (nt < 0)
		return MOE_OK;
	const moe_tensor *v = b ? moe_tensor_map_get(b, MOE_TOKENS_INPUT) : NULL;
	if (!v || v->dtype != MOE_I32 || v->rank != 0 || !v->data || v->nbytes != sizeof(int32_t))
		return MOE_OK; /* the binding check reports it */
	int32_t n;
	memcpy(&n, v->data, sizeof n);
	if (n < 0 || (T >= 0 && n > T)) {
		moe_diag(ctx, MOE_DIAG_ERROR, moe_loc_none(), "input '%s' is %d, outside 0..%lld (the program's token rows T)",
			MOE_TOKENS_INPUT, (int)n, (long long)(T < 0 ? 0 : T));
		return MOE_ERR_INVALID;
	}
	return MOE_OK;
}
