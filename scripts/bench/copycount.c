/* Copies per message for scripts/bench.sh: an LD_PRELOAD library that counts the bytes every
 * memcpy/memmove of at least COPYCOUNT_MIN bytes moves (SQLite's and ringbag's alike: both
 * call libc), and at exit writes them, with the bytes the process handed to write(2)
 * (/proc/self/io wchar: the kernel's copy into the page cache), to $COPYCOUNT_OUT.
 * Dividing by the payload gives the copies each message costs.
 * Build: cc -O2 -shared -fPIC -o copycount.so copycount.c -ldl */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Small copies (headers, varints, 100 B rows) are not what this measures. */
#define COPYCOUNT_MIN 256

static void *(*real_memcpy)(void *, const void *, size_t);
static void *(*real_memmove)(void *, const void *, size_t);
static unsigned long long copied, calls;

/* Used until dlsym has answered (dlsym itself may copy). */
static void *slow_copy(void *d, const void *s, size_t n) {
    unsigned char *dd = d;
    const unsigned char *ss = s;
    if (dd < ss) {
        for (size_t i = 0; i < n; i++) dd[i] = ss[i];
    } else {
        for (size_t i = n; i > 0; i--) dd[i - 1] = ss[i - 1];
    }
    return d;
}

static void count(size_t n) {
    if (n >= COPYCOUNT_MIN) {
        __atomic_fetch_add(&copied, n, __ATOMIC_RELAXED);
        __atomic_fetch_add(&calls, 1, __ATOMIC_RELAXED);
    }
}

void *memcpy(void *d, const void *s, size_t n) {
    count(n);
    return real_memcpy ? real_memcpy(d, s, n) : slow_copy(d, s, n);
}

void *memmove(void *d, const void *s, size_t n) {
    count(n);
    return real_memmove ? real_memmove(d, s, n) : slow_copy(d, s, n);
}

__attribute__((constructor)) static void init(void) {
    real_memcpy = dlsym(RTLD_NEXT, "memcpy");
    real_memmove = dlsym(RTLD_NEXT, "memmove");
}

__attribute__((destructor)) static void report(void) {
    const char *out = getenv("COPYCOUNT_OUT");
    if (!out) return;
    unsigned long long wchar = 0;
    FILE *io = fopen("/proc/self/io", "r");
    if (io) {
        char key[64];
        unsigned long long v;
        while (fscanf(io, "%63[^:]: %llu\n", key, &v) == 2)
            if (strcmp(key, "wchar") == 0) wchar = v;
        fclose(io);
    }
    FILE *f = fopen(out, "w");
    if (!f) return;
    fprintf(f, "{\"user_copy_bytes\": %llu, \"user_copy_calls\": %llu, \"write_bytes\": %llu}\n",
            copied, calls, wchar);
    fclose(f);
}
