#ifndef PYLON_CHTTPPARSER_SHIM_H
#define PYLON_CHTTPPARSER_SHIM_H
#include <http_parser.h>
/* Bit-field accessors: Swift imports http_parser's bit-fields, but these keep call sites plain. */
static inline unsigned pylon_http_method(const http_parser *p) { return p->method; }
static inline unsigned pylon_http_errno(const http_parser *p) { return p->http_errno; }
static inline int pylon_http_should_keep_alive(const http_parser *p) { return http_should_keep_alive(p); }
#endif
