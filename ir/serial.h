/* ir/serial.h: helpers shared by the IR printers and readers (text, JSON, dot).
 * Internal to the library. */
#ifndef MOEC_IR_SERIAL_H
#define MOEC_IR_SERIAL_H

#include "ir/ir.h"

/* Version written after `moeir` and in the JSON "version" field. */
#define IR_TEXT_VERSION 1
/* Operands per node accepted by the readers (ir_copy_node's limit). */
#define IR_MAX_ARGS 64
/* Longest output of ir_fmt_float, NUL included. */
#define IR_FLOAT_BUF 32

/* Names the readers accept (docs/ir.md, "Names"). A layer or dimension name
 * is an identifier [A-Za-z_][A-Za-z0-9_]*, as in the .moe language; a value
 * (node) name is an identifier that may also hold '.', '+' and '-' after its
 * first byte (the names passes derive: "ep.3", "w1+w3", "n_tokens.tier").
 * At most IR_NAME_MAX bytes. The API accepts any name; every writer quotes or
 * escapes what it prints, so a name never changes the meaning of an output. */
#define IR_NAME_MAX 256
typedef enum ir_name_kind { IR_NAME_LAYER, IR_NAME_DIM, IR_NAME_VALUE } ir_name_kind;
/* NULL when s is a name of kind k, else what is wrong ("is not an identifier ..."). */
const char *ir_name_problem(ir_name_kind k, const char *s);

/* Shortest text that strtod reads back as exactly v; always contains '.',
 * 'e', "inf" or "nan" so a reader sees a float. Returns buf. */
const char *ir_fmt_float(double v, char buf[IR_FLOAT_BUF]);

/* `dtype[d0, d1]` of a recorded type, for messages. */
void ir_fmt_type(moe_dtype t, int rank, const int64_t *shape, char *buf, size_t len);

/* Give a node read back from a file its recorded type, run shape inference and
 * check that the inferred type is the recorded one. Diagnostics go to the
 * node's location. */
moe_status ir_read_finish_node(moe_ctx *ctx, moe_graph *g, moe_id id, moe_dtype t, int rank,
	const int64_t *shape);

#endif
