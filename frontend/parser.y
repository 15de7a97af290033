/* frontend/parser.y: grammar of the .moe language (docs/language.md).
 * Actions build the syntax tree of frontend/ast.h and nothing else. A syntax
 * error skips to the end of the statement, so one run reports several. */
%define api.pure full
%define api.prefix {fe_}
%define parse.error detailed
%locations
%expect 0
%parse-param {fe_parser *p} {yyscan_t scanner}
%lex-param {yyscan_t scanner}

%code requires {
#include "frontend/ast.h"
typedef void *yyscan_t;
typedef struct fe_list {
	fe_expr *head, *tail;
	int n;
} fe_list;
typedef struct fe_slist {
	fe_stmt *head, *tail;
} fe_slist;
}

%code provides {
int fe_lex(FE_STYPE *lval, FE_LTYPE *lloc, yyscan_t scanner);
}

%code {
#include <stdarg.h>
#include <string.h>

/* The parser stack beyond its first 200 entries: the context's memory. */
#define YYMALLOC(n) ctx_alloc(p->ctx, (n))
#define YYFREE(q) ctx_free(p->ctx, (q), 0)

static void fe_error(FE_LTYPE *l, fe_parser *p, yyscan_t scanner, const char *msg)
{
	(void)scanner;
	if (!p->stopped)
		fe_error_at(p, l->first_line, l->first_column, "%s", msg);
}

static fe_expr *mk(fe_parser *p, fe_ekind k, FE_LTYPE l)
{
	return fe_expr_new(p, k, l.first_line, l.first_column);
}

static fe_list one(fe_expr *e)
{
	return (fe_list){e, e, 1};
}

static fe_list append(fe_list l, fe_expr *e)
{
	if (!l.head)
		return one(e);
	l.tail->next = e;
	l.tail = e;
	l.n++;
	return l;
}

static fe_expr *with_kids(fe_parser *p, fe_expr *e, fe_list l)
{
	e->kids = l.head;
	e->nkids = l.n;
	int h = 0;
	for (const fe_expr *k = l.head; k && k != l.tail->next; k = k->next)
		h = k->height > h ? k->height : h;
	e->height = h + 1;
	if (e->height > FE_MAX_HEIGHT) {
		if (!p->too_deep)
			fe_error_at(p, e->pos.line, e->pos.col, "expression nested too deeply (more than %d levels)",
				FE_MAX_HEIGHT);
		p->too_deep = true;
		e->height = FE_MAX_HEIGHT; /* reported once */
	}
	return e;
}

static fe_expr *binop(fe_parser *p, fe_oper op, FE_LTYPE l, fe_expr *a, fe_expr *b)
{
	fe_expr *e = mk(p, FE_E_BINARY, l);
	e->op = op;
	a->next = b;
	return with_kids(p, e, (fe_list){a, b, 2});
}

static fe_expr *unop(fe_parser *p, fe_oper op, FE_LTYPE l, fe_expr *a)
{
	fe_expr *e = mk(p, FE_E_UNARY, l);
	e->op = op;
	return with_kids(p, e, one(a));
}

static fe_stmt *stmt(fe_parser *p, fe_skind k, FE_LTYPE l, const char *name)
{
	fe_stmt *s = ir_alloc(p->arena, sizeof *s);
	s->kind = k;
	s->pos = (fe_pos){l.first_line, l.first_column};
	s->name = name;
	return s;
}

static fe_slist sappend(fe_slist l, fe_stmt *s)
{
	if (!l.head)
		return (fe_slist){s, s};
	l.tail->next = s;
	l.tail = s;
	return l;
}

static fe_slist sjoin(fe_slist a, fe_slist b)
{
	if (!a.head)
		return b;
	if (!b.head)
		return a;
	a.tail->next = b.head;
	a.tail = b.tail;
	return a;
}
}

%union {
	int64_t i;
	double f;
	const char *s;
	fe_expr *e;
	fe_list l;
	fe_stmt *st;
	fe_slist sl;
}

%token END 0 "end of file"
%token <s> IDENT "identifier"
%token <i> INT "integer"
%token <f> FLOAT "number"
%token <s> STRING "string"
%token NL "newline"
%token LAYER "layer" DIM "dim" PARAM "param" DTYPE "dtype"
%token INPUT "input" WEIGHT "weight" OUTPUT "output"
%token EQEQ "==" NEQ "!=" LEQ "<=" GEQ ">=" SHL "<<" SAR ">>" SHR ">>>"

%left '|'
%left '^'
%left '&'
%left EQEQ NEQ
%left '<' LEQ '>' GEQ
%left SHL SAR SHR
%left '+' '-'
%left '*' '/' '%'
%precedence UNARY

%type <s> name
%type <e> expr primary arg list
%type <l> exprs args opt_args opt_exprs
%type <st> stmt decl
%type <sl> items defs pdefs

%%

file:
	%empty
	| file NL
	| file layer
	| file error NL { if (moe_diag_limit_reached(p->ctx)) YYABORT; yyerrok; }
	;

layer:
	LAYER name '{' items '}' {
		fe_layer *y = ir_alloc(p->arena, sizeof *y);
		y->name = $2;
		y->pos = (fe_pos){@2.first_line, @2.first_column};
		y->stmts = $4.head;
		*p->tail = y;
		p->tail = &y->next;
	}
	;

items:
	%empty { $$ = (fe_slist){NULL, NULL}; }
	| items sep { $$ = $1; }
	| items decl sep { $$ = sappend($1, $2); }
	| items stmt sep { $$ = sappend($1, $2); }
	| items DIM defs sep { $$ = sjoin($1, $3); }
	| items PARAM pdefs sep { $$ = sjoin($1, $3); }
	| items error sep { if (moe_diag_limit_reached(p->ctx)) YYABORT; $$ = $1; yyerrok; }
	;

sep: NL | ';' ;

defs:
	name '=' expr { $$ = (fe_slist){NULL, NULL}; fe_stmt *s = stmt(p, FE_S_DIM, @1, $1); s->value = $3; $$ = sappend($$, s); }
	| defs ',' name '=' expr { fe_stmt *s = stmt(p, FE_S_DIM, @3, $3); s->value = $5; $$ = sappend($1, s); }
	;

pdefs:
	name '=' expr { $$ = (fe_slist){NULL, NULL}; fe_stmt *s = stmt(p, FE_S_PARAM, @1, $1); s->value = $3; $$ = sappend($$, s); }
	| pdefs ',' name '=' expr { fe_stmt *s = stmt(p, FE_S_PARAM, @3, $3); s->value = $5; $$ = sappend($1, s); }
	;

decl:
	DTYPE name { $$ = stmt(p, FE_S_DTYPE, @2, NULL); $$->type = $2; $$->type_pos = $$->pos; }
	| INPUT name ':' list { $$ = stmt(p, FE_S_INPUT, @2, $2); $$->shape = $4; }
	| INPUT name ':' name list {
		$$ = stmt(p, FE_S_INPUT, @2, $2);
		$$->type = $4;
		$$->type_pos = (fe_pos){@4.first_line, @4.first_column};
		$$->shape = $5;
	}
	| WEIGHT name ':' list '=' STRING {
		$$ = stmt(p, FE_S_WEIGHT, @2, $2);
		$$->shape = $4;
		$$->source = $6;
		$$->source_pos = (fe_pos){@6.first_line, @6.first_column};
	}
	| WEIGHT name ':' name list '=' STRING {
		$$ = stmt(p, FE_S_WEIGHT, @2, $2);
		$$->type = $4;
		$$->type_pos = (fe_pos){@4.first_line, @4.first_column};
		$$->shape = $5;
		$$->source = $7;
		$$->source_pos = (fe_pos){@7.first_line, @7.first_column};
	}
	| OUTPUT exprs {
		$$ = stmt(p, FE_S_OUTPUT, @1, NULL);
		$$->value = $2.head;
	}
	;

stmt:
	name '=' expr { $$ = stmt(p, FE_S_BIND, @1, $1); $$->value = $3; }
	;

/* keywords other than `layer` at the start of a statement may still name values */
name:
	IDENT
	| LAYER { $$ = "layer"; }
	| DTYPE { $$ = "dtype"; }
	| INPUT { $$ = "input"; }
	| WEIGHT { $$ = "weight"; }
	| OUTPUT { $$ = "output"; }
	| DIM { $$ = "dim"; }
	| PARAM { $$ = "param"; }
	;

exprs:
	expr { $$ = one($1); }
	| exprs ',' expr { $$ = append($1, $3); }
	;

opt_exprs:
	%empty { $$ = (fe_list){NULL, NULL, 0}; }
	| exprs
	| exprs ','
	;

expr:
	primary
	| '-' expr %prec UNARY { $$ = unop(p, FE_NEG, @1, $2); }
	| '~' expr %prec UNARY { $$ = unop(p, FE_BNOT, @1, $2); }
	| expr '+' expr { $$ = binop(p, FE_ADD, @2, $1, $3); }
	| expr '-' expr { $$ = binop(p, FE_SUB, @2, $1, $3); }
	| expr '*' expr { $$ = binop(p, FE_MUL, @2, $1, $3); }
	| expr '/' expr { $$ = binop(p, FE_DIV, @2, $1, $3); }
	| expr '%' expr { $$ = binop(p, FE_MOD, @2, $1, $3); }
	| expr '|' expr { $$ = binop(p, FE_OR, @2, $1, $3); }
	| expr '^' expr { $$ = binop(p, FE_XOR, @2, $1, $3); }
	| expr '&' expr { $$ = binop(p, FE_AND, @2, $1, $3); }
	| expr EQEQ expr { $$ = binop(p, FE_EQ, @2, $1, $3); }
	| expr NEQ expr { $$ = binop(p, FE_NE, @2, $1, $3); }
	| expr '<' expr { $$ = binop(p, FE_LT, @2, $1, $3); }
	| expr LEQ expr { $$ = binop(p, FE_LE, @2, $1, $3); }
	| expr '>' expr { $$ = binop(p, FE_GT, @2, $1, $3); }
	| expr GEQ expr { $$ = binop(p, FE_GE, @2, $1, $3); }
	| expr SHL expr { $$ = binop(p, FE_SHL, @2, $1, $3); }
	| expr SAR expr { $$ = binop(p, FE_SAR, @2, $1, $3); }
	| expr SHR expr { $$ = binop(p, FE_SHR, @2, $1, $3); }
	;

primary:
	INT { $$ = mk(p, FE_E_INT, @1); $$->i = $1; }
	| FLOAT { $$ = mk(p, FE_E_FLOAT, @1); $$->f = $1; }
	| STRING { $$ = mk(p, FE_E_STR, @1); $$->s = $1; }
	| name { $$ = mk(p, FE_E_NAME, @1); $$->s = $1; }
	| name '(' opt_args ')' { $$ = with_kids(p, mk(p, FE_E_CALL, @1), $3); $$->s = $1; }
	| '(' expr ')' { $$ = $2; }
	| list
	;

list:
	'[' opt_exprs ']' { $$ = with_kids(p, mk(p, FE_E_LIST, @1), $2); }
	;

opt_args:
	%empty { $$ = (fe_list){NULL, NULL, 0}; }
	| args
	| args ','
	;

args:
	arg { $$ = one($1); }
	| args ',' arg { $$ = append($1, $3); }
	;

arg:
	expr
	| name '=' expr { $$ = with_kids(p, mk(p, FE_E_KWARG, @1), one($3)); $$->s = $1; }
	;

%%

void fe_error_at(fe_parser *p, int line, int col, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	ctx_vdiag(p->ctx, MOE_DIAG_ERROR, moe_loc_at(p->ctx, p->file, line, col), fmt, ap);
	va_end(ap);
	p->nerrors++;
}

fe_expr *fe_expr_new(fe_parser *p, fe_ekind k, int line, int col)
{
	fe_expr *e = ir_alloc(p->arena, sizeof *e);
	e->kind = k;
	e->pos = (fe_pos){line, col};
	e->height = 1;
	return e;
}
