/* Native journal entries without libsystemd.

   PylonCore calls sd_journal_sendv (Log+Output.swift) when stderr is the journal stream. It is
   defined here, so the programs do not link libsystemd: that library and what it links
   (libgcrypt, libgpg-error, liblz4, liblzma, libzstd, libcap) were mapped by every process,
   with their relocated data, for one function the host alone calls (docs/BENCHMARKS.md,
   "Footprint"). The protocol is journald's (systemd's journal-send.c, "Native Journal
   Protocol"): one datagram to /run/systemd/journal/socket; a field whose value holds a newline
   is sent as the name, a newline, its length as 64-bit little-endian and the value; every
   field ends with a newline. An entry larger than one datagram is refused here (libsystemd
   would pass it in a memfd): the caller writes it to stderr instead, which journald reads too. */
#include "journal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#define SD_JOURNAL_SUPPRESS_LOCATION 1 /* the plain function, not the macro that adds CODE_FILE */
#include <systemd/sd-journal.h>
#include <unistd.h>

#define JOURNAL_SOCKET "/run/systemd/journal/socket"
/* Fields per entry: what fits in one sendmsg (each field takes up to 4 iovecs). */
#define MAX_FIELDS 256

static int journal_fd = -1;

/* One datagram socket per process, made on first use (close-on-exec: children do not keep it). */
static int journal_socket(void) {
    int fd = __atomic_load_n(&journal_fd, __ATOMIC_ACQUIRE);
    if (fd >= 0) return fd;
    fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -errno;
    int expected = -1;
    if (!__atomic_compare_exchange_n(&journal_fd, &expected, fd, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
        close(fd);
        return expected;
    }
    return fd;
}

int pylon_journal_sendv_to(const char *path, const struct iovec *iov, int n) {
    if (!path || !iov || n <= 0 || n > MAX_FIELDS) return -EINVAL;
    struct sockaddr_un sa;
    memset(&sa, 0, sizeof(sa));
    sa.sun_family = AF_UNIX;
    size_t plen = strlen(path);
    if (plen >= sizeof(sa.sun_path)) return -ENAMETOOLONG;
    memcpy(sa.sun_path, path, plen);

    static const char newline = '\n';
    struct iovec out[MAX_FIELDS * 4];
    uint8_t lengths[MAX_FIELDS][8];
    int k = 0;
    size_t total = 0;
    for (int i = 0; i < n; i++) {
        const char *f = iov[i].iov_base;
        size_t len = iov[i].iov_len;
        const char *eq = memchr(f, '=', len);
        if (!eq || eq == f) return -EINVAL;
        size_t name = (size_t)(eq - f), vlen = len - name - 1;
        if (memchr(eq + 1, '\n', vlen)) {
            /* NAME\n<le64 length>value\n */
            uint64_t v = vlen;
            for (int b = 0; b < 8; b++) lengths[i][b] = (uint8_t)(v >> (8 * b));
            out[k++] = (struct iovec){(void *)f, name};
            out[k++] = (struct iovec){(void *)&newline, 1};
            out[k++] = (struct iovec){lengths[i], 8};
            out[k++] = (struct iovec){(void *)(eq + 1), vlen};
            total += name + 1 + 8 + vlen;
        } else {
            out[k++] = (struct iovec){(void *)f, len};
            total += len;
        }
        out[k++] = (struct iovec){(void *)&newline, 1};
        total += 1;
    }
    if (total > PYLON_JOURNAL_MAX_ENTRY_BYTES) return -EMSGSIZE;

    int fd = journal_socket();
    if (fd < 0) return fd;
    struct msghdr mh;
    memset(&mh, 0, sizeof(mh));
    mh.msg_name = &sa;
    mh.msg_namelen = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + plen);
    mh.msg_iov = out;
    mh.msg_iovlen = (size_t)k;
    ssize_t r;
    do r = sendmsg(fd, &mh, MSG_NOSIGNAL);
    while (r < 0 && errno == EINTR);
    return r < 0 ? -errno : 0;
}

/* libsystemd's name and signature (<systemd/sd-journal.h>), so Log+Output.swift is unchanged. */
int sd_journal_sendv(const struct iovec *iov, int n) { return pylon_journal_sendv_to(JOURNAL_SOCKET, iov, n); }
