#ifndef PYLON_CSYSTEMD_SHIM_H
#define PYLON_CSYSTEMD_SHIM_H
/* libsystemd (Debian libsystemd-dev): native journal entries. sd_journal_sendv takes an array of
   "FIELD=value" iovecs, so no variadic call is needed. */
#include <systemd/sd-journal.h>
#include <sys/uio.h>
#endif
