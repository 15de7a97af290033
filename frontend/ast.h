/* frontend/ast.h: syntax tree of a .moe file, built by the parser's actions.
 * Every node lives in one arena owned by the parse; nothing is freed alone.
 * The tree holds syntax only: names are resolved and shapes checked when it
 * is lowered to IR (frontend/lower.c). */
#ifndef MOEC_FE_AST_H
#define MOEC_FE_AST_H

#include "ir/ir.h"

typedef enum fe_ekind {
	FE_E_INT,    /* i */
	FE_E_FLOAT,  /* f */
	FE_E_STR,    /* s */
	FE_E_NAME,   /* s */
	FE_E_UNARY,  /* op, kids[0] */
	FE_E_BINARY, /* op, kids[0], kids[1] */
	FE_E_CALL,   /* s = callee, kids = arguments (FE_E_KWARG for name=value) */
	FE_E_LIST,   /* kids = items */
	FE_E_KWARG   /* s = key, kids[0] = value */
} fe_ekind;

/* operators of FE_E_UNARY / FE_E_BINARY */
typedef enum fe_oper {
	FE_NEG, FE_BNOT,
	FE_ADD, FE_SUB, FE_MUL, FE_DIV, FE_MOD,
	FE_OR, FE_XOR, FE_AND, FE_EQ, FE_NE, FE_LT, FE_LE, FE_GT, FE_GE,
	FE_SHL, FE_SAR, FE_SHR
} fe_oper;

typedef struct fe_pos {
	int line, col;
} fe_pos;

typedef struct fe_expr fe_expr;
struct fe_expr {
	fe_ekind kind;
	fe_oper op;
	fe_pos pos; /* the operator, the callee, or the start of a literal/name */
	int64_t i;
	double f;
	const char *s;
	fe_expr *kids; /* first child; children are chained through next */
	int nkids;
	int height;    /* 1 + the greatest height of the children; at most FE_MAX_HEIGHT */
	fe_expr *next;
};

typedef enum fe_skind {
	FE_S_DIM,    /* name = value */
	FE_S_PARAM,  /* name = value */
	FE_S_DTYPE,  /* type */
	FE_S_INPUT,  /* name : type? [shape] */
	FE_S_WEIGHT, /* name : type? [shape] = source */
	FE_S_BIND,   /* name = value */
	FE_S_OUTPUT  /* value = first of a chain of expressions */
} fe_skind;

typedef struct fe_stmt fe_stmt;
struct fe_stmt {
	fe_skind kind;
	fe_pos pos;       /* the defined name (or the keyword) */
	const char *name;
	const char *type; /* dtype name or NULL */
	fe_pos type_pos;
	fe_expr *value;
	fe_expr *shape;   /* FE_E_LIST */
	const char *source;
	fe_pos source_pos;
	fe_stmt *next;
};

typedef struct fe_layer fe_layer;
struct fe_layer {
	const char *name;
	fe_pos pos;
	fe_stmt *stmts;
	fe_layer *next;
};

/* Limits that keep every recursive walk of an expression (lowering,
 * constant evaluation) shallow: operator nesting, and open brackets (checked
 * by the lexer, before Bison's own stack of 10,000 runs out). */
#define FE_MAX_HEIGHT 1000
#define FE_MAX_BRACKETS 256

/* State shared by the lexer and the parser of one file. */
typedef struct fe_parser {
	moe_ctx *ctx;
	ir_arena *arena;
	const char *file; /* interned */
	fe_layer *layers, **tail;
	int nerrors;
	int depth; /* open ( and [ : newlines inside them are not statement ends */
	bool too_deep; /* the nesting error was reported */
	bool stopped;  /* the lexer ended the parse after an error: no more syntax errors */
	int line, col;
} fe_parser;

void fe_error_at(fe_parser *p, int line, int col, const char *fmt, ...) MOE_PRINTF(4, 5);
fe_expr *fe_expr_new(fe_parser *p, fe_ekind k, int line, int col);
/* Parse text into p->layers; returns the number of syntax errors. */
int fe_parse_text(fe_parser *p, const char *text, size_t len);

#endif
