#include "moec/ir.h"
int main(void) { moe_ctx *c = moe_ctx_new(0,0); moe_ctx_free(c); return 0; }
