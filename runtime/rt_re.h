/* runtime/rt_re.h: the bounded Python `re` subset that quantization configs'
 * module lists are matched with, and the two frameworks' selection rules.
 *
 * Matching is a Pike VM over the compiled pattern: time is O(program size x
 * name length) and memory O(program size), whatever the pattern. Limits: a
 * pattern of at most RT_RE_MAX_PATTERN bytes, a program of at most
 * RT_RE_MAX_PROG instructions once counted repetition is expanded, groups
 * nested at most RT_RE_MAX_DEPTH deep, names of at most RT_RE_MAX_NAME bytes,
 * and a caller's step budget shared by every compile and match it makes. */
#ifndef MOEC_RT_RE_H
#define MOEC_RT_RE_H

#include <stddef.h>

#define RT_RE_MAX_PATTERN 4096
#define RT_RE_MAX_PROG 20000
#define RT_RE_MAX_DEPTH 64
#define RT_RE_MAX_REPEAT 1000
#define RT_RE_MAX_NAME 4096
#define RT_RE_STEPS 50000000L /* the budget of one configuration's module lists */

typedef struct rt_re rt_re;

/* Compiles a Python `re` pattern (UTF-8): literals, `.`, classes with ranges
 * and \d \w \s, `* + ? {m,n}` (greedy or lazy), `|`, `( )`, `(?: )`,
 * `(?P<name> )`, `(?# )`, `^ $ \A \Z \b \B` and escapes. NULL on a pattern
 * Python rejects, one this subset does not read (backreferences, lookaround,
 * flags, possessive repeats) or one over the limits; err then says why. */
rt_re *rt_re_compile(const char *pat, long *budget, char *err, size_t n);
void rt_re_free(rt_re *re);

/* Python's re.match(pat, s) is not None: 1 or 0; -1 when *budget ran out
 * or s is longer than RT_RE_MAX_NAME. */
int rt_re_match(const rt_re *re, const char *s, long *budget);

/* transformers' modules_to_not_convert rule (quantizers_utils'
 * should_convert_module): entry excludes module when re.match(entry + "\\.",
 * module), re.match(entry, module) or module.endswith(entry). 1 excluded,
 * 0 converted, -1 error (err says why). */
int rt_sel_hf(const char *entry, const char *module, long *budget, char *err, size_t n);

/* compressed-tensors' `ignore` rule (utils/match.py _match_name): "re:P"
 * excludes module when re.match(P, module), any other entry when it equals
 * module. 1 excluded, 0 converted, -1 error. */
int rt_sel_ct(const char *entry, const char *module, long *budget, char *err, size_t n);

#endif
