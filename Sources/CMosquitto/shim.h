#ifndef PYLON_CMOSQUITTO_SHIM_H
#define PYLON_CMOSQUITTO_SHIM_H
#include <mosquitto.h>
#include <mqtt_protocol.h>
#endif
