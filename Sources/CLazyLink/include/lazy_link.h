#ifndef PYLON_LAZY_LINK_H
#define PYLON_LAZY_LINK_H
/* libcurl and libmosquitto are opened on first use (lazy_link.c), not at exec: a process that
   never makes an HTTP request or an MQTT connection maps neither library nor their dependency
   trees. Nothing to call here: the functions keep their libraries' names and signatures. */

/* The shared objects opened on first use, by SONAME (tools/mkdeb.sh adds their packages to the
   Depends of the packages that ship programs linking this). */
#define PYLON_LAZY_CURL "libcurl.so.4"
#define PYLON_LAZY_MOSQUITTO "libmosquitto.so.1"
#endif
