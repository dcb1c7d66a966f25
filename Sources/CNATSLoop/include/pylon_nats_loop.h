#ifndef PYLON_NATS_LOOP_H
#define PYLON_NATS_LOOP_H
#include <nats/nats.h>
#include <uv.h>

/* libnats's libuv adapter (nats/adapters/libuv.h) defines its functions, some not static, in
 * the header: it is included once, in pylon_nats_loop.c, and used through these. */

/* natsLibuv_Init, and registers `loop` as the loop of the calling thread (the one running
 * uv_run): the adapter then touches libuv from that thread only and reaches it from libnats's
 * threads (reconnect) through a uv_async_t. */
void pylon_nats_loop_init(uv_loop_t *loop);

/* natsOptions_SetEventLoop with the adapter's attach/read/write/detach callbacks. */
natsStatus pylon_nats_loop_attach(natsOptions *opts, uv_loop_t *loop);

/* A connected callback that does nothing (natsOptions_SetRetryOnFailedConnect: the backend
 * polls natsConnection_Status on its loop instead of reacting on a library thread). */
void pylon_nats_ignore_connected(natsConnection *nc, void *closure);

#endif
