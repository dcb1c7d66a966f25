/* The resolver behind CLazyCurl and CLazyMosquitto (lazy_link.h). docs/BENCHMARKS.md,
   "Footprint". */
#include "lazy_link.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

static _Noreturn void lazy_fail(const char *what, const char *why) {
    fprintf(stderr, "pylon: cannot load %s: %s\n", what, why ? why : "unknown error");
    abort();
}

/* dlopen and dlsym are thread-safe; two threads racing here store the same values. */
void *pylon_lazy_resolve(struct pylon_lazy_lib *lib, const char *name) {
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
