%define api.prefix {fe_}
%code { int fe_lex(void); void fe_error(const char *); }
%%
top: %empty ;
%%
