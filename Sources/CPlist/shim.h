#ifndef PYLON_CPLIST_SHIM_H
#define PYLON_CPLIST_SHIM_H
/* libplist (XML and binary property lists). */
#include <plist/plist.h>
#endif
