#ifndef PYLON_CSYSTEMD_SHIM_H
#define PYLON_CSYSTEMD_SHIM_H
/* libsystemd's journal header (Debian libsystemd-dev) for sd_journal_sendv's declaration; the
   function itself is CJournal's (Sources/CJournal/journal.c), so libsystemd is not linked.
   It takes an array of "FIELD=value" iovecs, so no variadic call is needed. */
#include <systemd/sd-journal.h>
#include <sys/uio.h>
#endif
