#ifndef PYLON_CZLIB_SHIM_H
#define PYLON_CZLIB_SHIM_H
#include <zlib.h>
/* deflateInit2/inflateInit2 are macros. windowBits 15+16 selects the gzip wrapper. */
static inline int pylon_deflate_init_gzip(z_stream *s, int level) {
    return deflateInit2(s, level, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY);
}
static inline int pylon_inflate_init_gzip(z_stream *s) { return inflateInit2(s, 15 + 16); }
#endif
