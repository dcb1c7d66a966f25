/* libcurl, opened on first use (lazy_link.h): the functions the package calls, under their own
   names. A process maps libcurl and its dependency tree (OpenSSL, GnuTLS, Kerberos, LDAP,
   libssh2, nghttp2 ...) only once it makes an HTTP request: the host never does, nor do idle
   plugins. docs/BENCHMARKS.md, "Footprint". */
#define CURL_DISABLE_TYPECHECK 1
#include "lazy_curl.h"

#include <curl/curl.h>
#include <lazy_link.h>
#include <stdarg.h>

static struct pylon_lazy_lib curl_lib = {PYLON_LAZY_CURL, NULL};

/* ---- libcurl ---------------------------------------------------------------------------- */

PYLON_LAZY(curl_lib, CURLcode, curl_global_init, (long flags), (flags))
PYLON_LAZY(curl_lib, CURL *, curl_easy_init, (void), ())
PYLON_LAZY_VOID(curl_lib, curl_easy_cleanup, (CURL *h), (h))
PYLON_LAZY(curl_lib, const char *, curl_easy_strerror, (CURLcode c), (c))
PYLON_LAZY(curl_lib, struct curl_slist *, curl_slist_append, (struct curl_slist *l, const char *s), (l, s))
PYLON_LAZY_VOID(curl_lib, curl_slist_free_all, (struct curl_slist *l), (l))
PYLON_LAZY(curl_lib, CURLM *, curl_multi_init, (void), ())
PYLON_LAZY(curl_lib, CURLMcode, curl_multi_cleanup, (CURLM *m), (m))
PYLON_LAZY(curl_lib, CURLMcode, curl_multi_add_handle, (CURLM *m, CURL *h), (m, h))
PYLON_LAZY(curl_lib, CURLMcode, curl_multi_remove_handle, (CURLM *m, CURL *h), (m, h))
PYLON_LAZY(curl_lib, CURLMcode, curl_multi_assign, (CURLM *m, curl_socket_t s, void *p), (m, s, p))
PYLON_LAZY(curl_lib, CURLMsg *, curl_multi_info_read, (CURLM *m, int *left), (m, left))
PYLON_LAZY(curl_lib, CURLMcode, curl_multi_socket_action, (CURLM *m, curl_socket_t s, int ev, int *running),
     (m, s, ev, running))

/* The variadic three: the option's number says its argument's type (CURLOPTTYPE_*: long below
   10000, then object and function pointers, curl_off_t from 30000, blobs from 40000), as
   libcurl itself reads it. curl_easy_getinfo's argument is always a pointer. */
CURLcode curl_easy_setopt(CURL *h, CURLoption o, ...) {
    PYLON_LAZY_FN(curl_lib, curl_easy_setopt)
    va_list ap;
    va_start(ap, o);
    CURLcode r;
    if (o < CURLOPTTYPE_OBJECTPOINT) r = fn(h, o, va_arg(ap, long));
    else if (o < CURLOPTTYPE_OFF_T) r = fn(h, o, va_arg(ap, void *));
    else if (o < CURLOPTTYPE_BLOB) r = fn(h, o, va_arg(ap, curl_off_t));
    else r = fn(h, o, va_arg(ap, void *));
    va_end(ap);
    return r;
}

CURLMcode curl_multi_setopt(CURLM *m, CURLMoption o, ...) {
    PYLON_LAZY_FN(curl_lib, curl_multi_setopt)
    va_list ap;
    va_start(ap, o);
    CURLMcode r;
    if (o < CURLOPTTYPE_OBJECTPOINT) r = fn(m, o, va_arg(ap, long));
    else if (o < CURLOPTTYPE_OFF_T) r = fn(m, o, va_arg(ap, void *));
    else r = fn(m, o, va_arg(ap, curl_off_t));
    va_end(ap);
    return r;
}

CURLcode curl_easy_getinfo(CURL *h, CURLINFO i, ...) {
    PYLON_LAZY_FN(curl_lib, curl_easy_getinfo)
    va_list ap;
    va_start(ap, i);
    CURLcode r = fn(h, i, va_arg(ap, void *));
    va_end(ap);
    return r;
}
