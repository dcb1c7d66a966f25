#ifndef PYLON_CPQ_SHIM_H
#define PYLON_CPQ_SHIM_H
#include <libpq-fe.h>
#endif
