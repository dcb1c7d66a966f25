#ifndef PYLON_CLIBUV_SHIM_H
#define PYLON_CLIBUV_SHIM_H
#include <uv.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/types.h>
#include <unistd.h>
#include <string.h>
#include <errno.h>
#include <malloc.h>

/// Returns free heap memory to the system (glibc's malloc_trim).
static inline int pylon_malloc_trim(void) { return malloc_trim(0); }

/// Peer credentials of a connected Unix socket (SO_PEERCRED). Returns 0 or -errno.
static inline int pylon_peercred(int fd, int *pid, unsigned *uid, unsigned *gid) {
    /* Layout of struct ucred, which needs _GNU_SOURCE (and that would clash with Swift's Glibc module). */
    struct { pid_t pid; uid_t uid; gid_t gid; } cred;
    socklen_t len = sizeof(cred);
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) return -errno;
    *pid = cred.pid; *uid = cred.uid; *gid = cred.gid;
    return 0;
}

/// A close-on-exec stream socketpair. Returns 0 or -errno.
static inline int pylon_socketpair(int fds[2]) {
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) return -errno;
    return 0;
}

/// Sends one datagram to the systemd notify socket named by `path` (a leading '@' means the
/// abstract namespace). The plain sd_notify protocol; returns 0 or -errno.
static inline int pylon_sd_notify(const char *path, const char *msg) {
    struct sockaddr_un sa;
    memset(&sa, 0, sizeof(sa));
    sa.sun_family = AF_UNIX;
    size_t n = strlen(path);
    if (n == 0 || n >= sizeof(sa.sun_path)) return -EINVAL;
    memcpy(sa.sun_path, path, n);
    if (sa.sun_path[0] == '@') sa.sun_path[0] = 0;
    int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -errno;
    ssize_t r = sendto(fd, msg, strlen(msg), MSG_NOSIGNAL,
                       (struct sockaddr *)&sa, (socklen_t)(offsetof(struct sockaddr_un, sun_path) + n));
    int err = errno;
    close(fd);
    return r < 0 ? -err : 0;
}

/// uv_buf_t's fields differ in order across platforms; build one portably.
static inline uv_buf_t pylon_buf(char *base, size_t len) { return uv_buf_init(base, (unsigned)len); }
#endif
