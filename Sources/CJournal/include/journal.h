#ifndef PYLON_JOURNAL_H
#define PYLON_JOURNAL_H
#include <stddef.h>
#include <sys/uio.h>

/* journald's native protocol without libsystemd (journal.c): one datagram of `n` "FIELD=value"
   items to the socket at `path`. 0 on success, -errno on failure (the caller then writes the
   event to stderr, which is the journal's stream anyway). */
int pylon_journal_sendv_to(const char *path, const struct iovec *iov, int n);

/* The largest entry sent as one datagram; a larger one is refused (-EMSGSIZE) rather than
   passed in a memfd as libsystemd would. */
#define PYLON_JOURNAL_MAX_ENTRY_BYTES 262144 /* 256 KiB */
#endif
