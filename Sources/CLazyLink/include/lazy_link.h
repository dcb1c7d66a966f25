#ifndef PYLON_LAZY_LINK_H
#define PYLON_LAZY_LINK_H
/* Libraries opened on first use, not at exec (dlopen): CLazyCurl and CLazyMosquitto define the
   functions the package calls under their own names, and the first call opens the library. A
   process that never makes an HTTP request or an MQTT connection maps neither library nor their
   dependency trees; a program that does not link CLazyCurl does not name libcurl at all. */

/* The shared objects opened on first use, by SONAME (tools/mkdeb.sh adds the package of each one
   a program's file names to that package's Depends). */
#define PYLON_LAZY_CURL "libcurl.so.4"
#define PYLON_LAZY_MOSQUITTO "libmosquitto.so.1"

struct pylon_lazy_lib {
    const char *soname;
    void *handle;
};

/* The address of `name` in `lib`, opening the library first. A library or function that cannot
   be found stops the process with its name and dlerror()'s reason, as the dynamic loader would
   have at exec. */
void *pylon_lazy_resolve(struct pylon_lazy_lib *lib, const char *name);

/* In a function named `name`: `fn`, the library's `name`, resolved once. */
#define PYLON_LAZY_FN(lib, name)                                          \
    static __typeof__(name) *fn_;                                         \
    __typeof__(name) *fn = __atomic_load_n(&fn_, __ATOMIC_ACQUIRE);       \
    if (!fn) {                                                            \
        fn = (__typeof__(name) *)pylon_lazy_resolve(&lib, #name);         \
        __atomic_store_n(&fn_, fn, __ATOMIC_RELEASE);                     \
    }

#define PYLON_LAZY(lib, ret, name, params, args) \
    ret name params {                            \
        PYLON_LAZY_FN(lib, name)                 \
        return fn args;                          \
    }
#define PYLON_LAZY_VOID(lib, name, params, args) \
    void name params {                           \
        PYLON_LAZY_FN(lib, name)                 \
        fn args;                                 \
    }
#endif
