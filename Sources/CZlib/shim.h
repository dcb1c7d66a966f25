#ifndef PYLON_CZLIB_SHIM_H
#define PYLON_CZLIB_SHIM_H
/* zlib for Swift: PylonStore's Deflater/Inflater call deflateInit2_/inflateInit2_ directly
   (deflateInit2 and inflateInit2 are macros Swift cannot import). */
#include <zlib.h>
#endif
