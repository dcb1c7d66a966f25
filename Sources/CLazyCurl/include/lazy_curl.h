#ifndef PYLON_LAZY_CURL_H
#define PYLON_LAZY_CURL_H
/* Nothing to call here: lazy_curl.c defines libcurl's functions under their own names. */
#endif
