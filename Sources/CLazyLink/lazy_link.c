/* libcurl and libmosquitto, opened on first use.

   Each function the package calls is defined here under its own name: the first call opens
   the library (dlopen of its SONAME) and looks the function up; later calls go straight to it.
   The programs link this instead of -lcurl and -lmosquitto, so a process maps libcurl and its
   dependency tree (OpenSSL, GnuTLS, Kerberos, LDAP, libssh2, nghttp2 ...) only once it makes an
   HTTP request, and libmosquitto once it connects to a broker: the host never does, nor do
   the plugins that are idle. A library that cannot be opened stops the process with its name
   and dlerror()'s reason, as the dynamic loader would have at exec. docs/BENCHMARKS.md,
   "Footprint". */
#define CURL_DISABLE_TYPECHECK 1
#include "lazy_link.h"

#include <curl/curl.h>
#include <dlfcn.h>
#include <mosquitto.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

struct lazy_lib {
    const char *soname;
    void *handle;
};

static struct lazy_lib curl_lib = {PYLON_LAZY_CURL, NULL};
static struct lazy_lib mosquitto_lib = {PYLON_LAZY_MOSQUITTO, NULL};

static _Noreturn void lazy_fail(const char *what, const char *why) {
    fprintf(stderr, "pylon: cannot load %s: %s\n", what, why ? why : "unknown error");
    abort();
}

/* The address of `name` in `lib`, opening it first. dlopen and dlsym are thread-safe; two
   threads racing here store the same values. */
static void *lazy_resolve(struct lazy_lib *lib, const char *name) {
    void *h = __atomic_load_n(&lib->handle, __ATOMIC_ACQUIRE);
    if (!h) {
        h = dlopen(lib->soname, RTLD_NOW | RTLD_LOCAL);
        if (!h) lazy_fail(lib->soname, dlerror());
        __atomic_store_n(&lib->handle, h, __ATOMIC_RELEASE);
    }
    void *f = dlsym(h, name);
    if (!f) lazy_fail(name, dlerror());
    return f;
}

/* The function pointer `fn` for `name`, resolved once. */
#define LAZY_FN(lib, name)                                            \
    static __typeof__(name) *fn_;                                     \
    __typeof__(name) *fn = __atomic_load_n(&fn_, __ATOMIC_ACQUIRE);   \
    if (!fn) {                                                        \
        fn = (__typeof__(name) *)lazy_resolve(&lib, #name);           \
        __atomic_store_n(&fn_, fn, __ATOMIC_RELEASE);                 \
    }

#define LAZY(lib, ret, name, params, args) \
    ret name params {                      \
        LAZY_FN(lib, name)                 \
        return fn args;                    \
    }
#define LAZY_VOID(lib, name, params, args) \
    void name params {                     \
        LAZY_FN(lib, name)                 \
        fn args;                           \
    }

/* ---- libcurl ---------------------------------------------------------------------------- */

LAZY(curl_lib, CURLcode, curl_global_init, (long flags), (flags))
LAZY(curl_lib, CURL *, curl_easy_init, (void), ())
LAZY_VOID(curl_lib, curl_easy_cleanup, (CURL *h), (h))
LAZY(curl_lib, const char *, curl_easy_strerror, (CURLcode c), (c))
LAZY(curl_lib, struct curl_slist *, curl_slist_append, (struct curl_slist *l, const char *s), (l, s))
LAZY_VOID(curl_lib, curl_slist_free_all, (struct curl_slist *l), (l))
LAZY(curl_lib, CURLM *, curl_multi_init, (void), ())
LAZY(curl_lib, CURLMcode, curl_multi_cleanup, (CURLM *m), (m))
LAZY(curl_lib, CURLMcode, curl_multi_add_handle, (CURLM *m, CURL *h), (m, h))
LAZY(curl_lib, CURLMcode, curl_multi_remove_handle, (CURLM *m, CURL *h), (m, h))
LAZY(curl_lib, CURLMcode, curl_multi_assign, (CURLM *m, curl_socket_t s, void *p), (m, s, p))
LAZY(curl_lib, CURLMsg *, curl_multi_info_read, (CURLM *m, int *left), (m, left))
LAZY(curl_lib, CURLMcode, curl_multi_socket_action, (CURLM *m, curl_socket_t s, int ev, int *running),
     (m, s, ev, running))

/* The variadic three: the option's number says its argument's type (CURLOPTTYPE_*: long below
   10000, then object and function pointers, curl_off_t from 30000, blobs from 40000), as
   libcurl itself reads it. curl_easy_getinfo's argument is always a pointer. */
CURLcode curl_easy_setopt(CURL *h, CURLoption o, ...) {
    LAZY_FN(curl_lib, curl_easy_setopt)
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
    LAZY_FN(curl_lib, curl_multi_setopt)
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
    LAZY_FN(curl_lib, curl_easy_getinfo)
    va_list ap;
    va_start(ap, i);
    CURLcode r = fn(h, i, va_arg(ap, void *));
    va_end(ap);
    return r;
}

/* ---- libmosquitto ----------------------------------------------------------------------- */

LAZY(mosquitto_lib, int, mosquitto_lib_init, (void), ())
LAZY(mosquitto_lib, struct mosquitto *, mosquitto_new, (const char *id, bool clean, void *obj), (id, clean, obj))
LAZY_VOID(mosquitto_lib, mosquitto_destroy, (struct mosquitto * m), (m))
LAZY(mosquitto_lib, int, mosquitto_int_option, (struct mosquitto * m, enum mosq_opt_t o, int v), (m, o, v))
LAZY(mosquitto_lib, int, mosquitto_username_pw_set, (struct mosquitto * m, const char *u, const char *p), (m, u, p))
LAZY(mosquitto_lib, int, mosquitto_tls_set,
     (struct mosquitto * m, const char *cafile, const char *capath, const char *certfile, const char *keyfile,
      int (*pw)(char *buf, int size, int rwflag, void *userdata)),
     (m, cafile, capath, certfile, keyfile, pw))
LAZY(mosquitto_lib, int, mosquitto_connect_async, (struct mosquitto * m, const char *host, int port, int keepalive),
     (m, host, port, keepalive))
LAZY(mosquitto_lib, int, mosquitto_disconnect, (struct mosquitto * m), (m))
LAZY(mosquitto_lib, int, mosquitto_socket, (struct mosquitto * m), (m))
LAZY(mosquitto_lib, bool, mosquitto_want_write, (struct mosquitto * m), (m))
LAZY(mosquitto_lib, int, mosquitto_loop_read, (struct mosquitto * m, int max_packets), (m, max_packets))
LAZY(mosquitto_lib, int, mosquitto_loop_write, (struct mosquitto * m, int max_packets), (m, max_packets))
LAZY(mosquitto_lib, int, mosquitto_loop_misc, (struct mosquitto * m), (m))
LAZY(mosquitto_lib, int, mosquitto_subscribe, (struct mosquitto * m, int *mid, const char *sub, int qos),
     (m, mid, sub, qos))
LAZY(mosquitto_lib, int, mosquitto_unsubscribe, (struct mosquitto * m, int *mid, const char *sub), (m, mid, sub))
LAZY(mosquitto_lib, int, mosquitto_publish_v5,
     (struct mosquitto * m, int *mid, const char *topic, int len, const void *payload, int qos, bool retain,
      const mosquitto_property *props),
     (m, mid, topic, len, payload, qos, retain, props))
LAZY(mosquitto_lib, int, mosquitto_property_add_int32, (mosquitto_property * *props, int id, uint32_t v),
     (props, id, v))
LAZY_VOID(mosquitto_lib, mosquitto_property_free_all, (mosquitto_property * *props), (props))
LAZY_VOID(mosquitto_lib, mosquitto_user_data_set, (struct mosquitto * m, void *obj), (m, obj))
LAZY_VOID(mosquitto_lib, mosquitto_connect_with_flags_callback_set,
          (struct mosquitto * m, void (*cb)(struct mosquitto *, void *, int, int)), (m, cb))
LAZY_VOID(mosquitto_lib, mosquitto_disconnect_callback_set, (struct mosquitto * m, void (*cb)(struct mosquitto *, void *, int)),
          (m, cb))
LAZY_VOID(mosquitto_lib, mosquitto_message_callback_set,
          (struct mosquitto * m, void (*cb)(struct mosquitto *, void *, const struct mosquitto_message *)), (m, cb))
LAZY_VOID(mosquitto_lib, mosquitto_publish_callback_set, (struct mosquitto * m, void (*cb)(struct mosquitto *, void *, int)),
          (m, cb))
LAZY_VOID(mosquitto_lib, mosquitto_subscribe_callback_set,
          (struct mosquitto * m, void (*cb)(struct mosquitto *, void *, int, int, const int *)), (m, cb))
LAZY(mosquitto_lib, const char *, mosquitto_strerror, (int e), (e))
LAZY(mosquitto_lib, const char *, mosquitto_connack_string, (int c), (c))
LAZY(mosquitto_lib, const char *, mosquitto_reason_string, (int c), (c))
