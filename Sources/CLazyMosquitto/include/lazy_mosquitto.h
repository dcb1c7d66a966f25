#ifndef PYLON_LAZY_MOSQUITTO_H
#define PYLON_LAZY_MOSQUITTO_H
/* Nothing to call here: lazy_mosquitto.c defines libmosquitto's functions under their own names. */
#endif
