#ifndef PYLON_CNATS_SHIM_H
#define PYLON_CNATS_SHIM_H
#include <nats/nats.h>
/* The libuv adapter: its functions are static in the header; libnats does the socket I/O on
 * the caller's uv loop through them (natsOptions_SetEventLoop). */
#include <nats/adapters/libuv.h>
#endif
