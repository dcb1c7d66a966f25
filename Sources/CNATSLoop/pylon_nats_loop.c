#include "pylon_nats_loop.h"
#include <nats/adapters/libuv.h>

void pylon_nats_loop_init(uv_loop_t *loop) {
    natsLibuv_Init();
    natsLibuv_SetThreadLocalLoop(loop);
}

natsStatus pylon_nats_loop_attach(natsOptions *opts, uv_loop_t *loop) {
    return natsOptions_SetEventLoop(opts, (void *)loop, natsLibuv_Attach, natsLibuv_Read, natsLibuv_Write,
                                    natsLibuv_Detach);
}

void pylon_nats_ignore_connected(natsConnection *nc, void *closure) {
    (void)nc;
    (void)closure;
}
