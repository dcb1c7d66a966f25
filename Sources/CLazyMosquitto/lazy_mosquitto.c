/* libmosquitto, opened on first use (lazy_link.h): the functions the package calls, under their
   own names. A process maps it (and the OpenSSL it links) only once it connects to a broker.
   docs/BENCHMARKS.md, "Footprint". */
#include "lazy_mosquitto.h"

#include <lazy_link.h>
#include <mosquitto.h>

static struct pylon_lazy_lib mosquitto_lib = {PYLON_LAZY_MOSQUITTO, NULL};

/* ---- libmosquitto ----------------------------------------------------------------------- */

PYLON_LAZY(mosquitto_lib, int, mosquitto_lib_init, (void), ())
PYLON_LAZY(mosquitto_lib, struct mosquitto *, mosquitto_new, (const char *id, bool clean, void *obj), (id, clean, obj))
PYLON_LAZY_VOID(mosquitto_lib, mosquitto_destroy, (struct mosquitto * m), (m))
PYLON_LAZY(mosquitto_lib, int, mosquitto_int_option, (struct mosquitto * m, enum mosq_opt_t o, int v), (m, o, v))
PYLON_LAZY(mosquitto_lib, int, mosquitto_username_pw_set, (struct mosquitto * m, const char *u, const char *p), (m, u, p))
PYLON_LAZY(mosquitto_lib, int, mosquitto_tls_set,
     (struct mosquitto * m, const char *cafile, const char *capath, const char *certfile, const char *keyfile,
      int (*pw)(char *buf, int size, int rwflag, void *userdata)),
     (m, cafile, capath, certfile, keyfile, pw))
PYLON_LAZY(mosquitto_lib, int, mosquitto_connect_async, (struct mosquitto * m, const char *host, int port, int keepalive),
     (m, host, port, keepalive))
PYLON_LAZY(mosquitto_lib, int, mosquitto_disconnect, (struct mosquitto * m), (m))
PYLON_LAZY(mosquitto_lib, int, mosquitto_socket, (struct mosquitto * m), (m))
PYLON_LAZY(mosquitto_lib, bool, mosquitto_want_write, (struct mosquitto * m), (m))
PYLON_LAZY(mosquitto_lib, int, mosquitto_loop_read, (struct mosquitto * m, int max_packets), (m, max_packets))
PYLON_LAZY(mosquitto_lib, int, mosquitto_loop_write, (struct mosquitto * m, int max_packets), (m, max_packets))
PYLON_LAZY(mosquitto_lib, int, mosquitto_loop_misc, (struct mosquitto * m), (m))
PYLON_LAZY(mosquitto_lib, int, mosquitto_subscribe, (struct mosquitto * m, int *mid, const char *sub, int qos),
     (m, mid, sub, qos))
PYLON_LAZY(mosquitto_lib, int, mosquitto_unsubscribe, (struct mosquitto * m, int *mid, const char *sub), (m, mid, sub))
PYLON_LAZY(mosquitto_lib, int, mosquitto_publish_v5,
     (struct mosquitto * m, int *mid, const char *topic, int len, const void *payload, int qos, bool retain,
      const mosquitto_property *props),
     (m, mid, topic, len, payload, qos, retain, props))
PYLON_LAZY(mosquitto_lib, int, mosquitto_property_add_int32, (mosquitto_property * *props, int id, uint32_t v),
     (props, id, v))
PYLON_LAZY_VOID(mosquitto_lib, mosquitto_property_free_all, (mosquitto_property * *props), (props))
PYLON_LAZY_VOID(mosquitto_lib, mosquitto_user_data_set, (struct mosquitto * m, void *obj), (m, obj))
PYLON_LAZY_VOID(mosquitto_lib, mosquitto_connect_with_flags_callback_set,
          (struct mosquitto * m, void (*cb)(struct mosquitto *, void *, int, int)), (m, cb))
PYLON_LAZY_VOID(mosquitto_lib, mosquitto_disconnect_callback_set, (struct mosquitto * m, void (*cb)(struct mosquitto *, void *, int)),
          (m, cb))
PYLON_LAZY_VOID(mosquitto_lib, mosquitto_message_callback_set,
          (struct mosquitto * m, void (*cb)(struct mosquitto *, void *, const struct mosquitto_message *)), (m, cb))
PYLON_LAZY_VOID(mosquitto_lib, mosquitto_publish_callback_set, (struct mosquitto * m, void (*cb)(struct mosquitto *, void *, int)),
          (m, cb))
PYLON_LAZY_VOID(mosquitto_lib, mosquitto_subscribe_callback_set,
          (struct mosquitto * m, void (*cb)(struct mosquitto *, void *, int, int, const int *)), (m, cb))
PYLON_LAZY(mosquitto_lib, const char *, mosquitto_strerror, (int e), (e))
PYLON_LAZY(mosquitto_lib, const char *, mosquitto_connack_string, (int c), (c))
PYLON_LAZY(mosquitto_lib, const char *, mosquitto_reason_string, (int c), (c))
