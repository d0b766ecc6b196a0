/* Fault injection into ONE process's NVML (the device plugin's), loaded with LD_PRELOAD on it only.
 *
 * Every call below forwards to the real libnvidia-ml.so.1 (dlopen'ed by name, or by the path in
 * GW_NVML_REAL) until a trigger file appears; nothing is ever sent to the GPU or the driver that
 * the real call would not send, and no GPU setting is touched.
 *
 * - GW_NVML_HANG_FILE: once this file exists, nvmlInit / nvmlInit_v2 / nvmlInitWithFlags block in
 *   pause() forever, like the driver bug of incident 5 (the plugin calls nvmlInit again for every
 *   GetPreferredAllocation, through go-gpuallocator). Start-up, before the file exists, is real.
 * - GW_NVML_XID_FILE: once this file exists, the next nvmlEventSetWait(_v2) returns one synthetic
 *   NVML_EVENT_TYPE_XID_CRITICAL_ERROR event for GPU index 0 whose Xid is the number in the file,
 *   and deletes the file: what the plugin's health loop would get from a real Xid, without one.
 * - GW_NVML_LOST_EVENT_FILE: once this file exists, the next nvmlEventSetWait(_v2) returns one synthetic
 *   nvmlEventTypeGpuUnavailableError event (0x4000, "GPU lost" on drivers that have it) for the GPU whose
 *   index is the number in the file (default 0), and deletes the file.
 * - GW_NVML_WAIT_LOST_FILE: while this file exists, nvmlEventSetWait(_v2) answers NVML_ERROR_GPU_IS_LOST
 *   at once, as the wait does on a node whose GPU fell off the bus (gpuwarden's NVML event child,
 *   gpuwarden.wake.nvml, and the plugin's health loop both see it). Nothing reaches the driver.
 * - While any of the three event triggers above is named (its variable set, the file present or not), a
 *   wait of T ms is the real wait in slices of at most GW_NVML_WAIT_SLICE_MS (default 20) ms, the triggers
 *   looked at before each: the real nvmlEventSetWait(_v2) sleeps until an event or its timeout and nothing
 *   can be added to a real event set from outside, so a trigger made while a caller sits in a 5 s wait
 *   (gpuwarden's default) would otherwise be seen only when that wait ends. Real events still come from
 *   the real wait, at once; a wait with no trigger variable named is the real call, unsliced.
 * - GW_NVML_LOST_FILE: while this file exists, the GPU whose index is the number in it (default 0)
 *   answers nvmlDeviceGetUUID / nvmlDeviceGetPciInfo(_v2/_v3) / nvmlDeviceGetHandleByUUID with
 *   NVML_ERROR_GPU_IS_LOST, as a GPU that fell off the bus does; the other GPUs stay real.
 *   nvmlErrorString(NVML_ERROR_GPU_IS_LOST) is "GPU is lost", as the real library says. Remove
 *   the file and the GPU is back.
 *
 * - GW_NVML_LOST_INDEX_FILE: while this file exists, nvmlDeviceGetHandleByIndex(_v2) for the GPU index written
 *   in it answers NVML_ERROR_GPU_IS_LOST (15), as NVML does for a GPU that fell off the bus; every
 *   other GPU is answered by the real library. Removing the file ends it (nothing was sent to the GPU).
 *   For a ctypes caller that dlsym()s through its own handle (gpuwarden's NVML probe child, loaded
 *   with GPUWARDEN_NVML_LIBRARY=<this .so>), link this object against the real libnvidia-ml.so.1 so
 *   the calls not defined here resolve to it:
 *     gcc -shared -fPIC -o nvml_lost.so nvml_inject_shim.c -Wl,--no-as-needed <path>/libnvidia-ml.so.1 -ldl
 *
 * The plugin resolves NVML symbols lazily through the global scope, where a preloaded object comes
 * before the library it dlopen()s, so these definitions win for the calls the plugin makes.
 *   gcc -shared -fPIC -o nvml_inject_shim.so nvml_inject_shim.c -ldl
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#define NVML_EVENT_TYPE_XID_CRITICAL_ERROR 0x8ULL
#define NVML_EVENT_TYPE_GPU_UNAVAILABLE_ERROR 0x4000ULL
#define NVML_ERROR_UNINITIALIZED 1
#define NVML_ERROR_LIBRARY_NOT_FOUND 12
#define NVML_ERROR_TIMEOUT 10
#define NVML_ERROR_GPU_IS_LOST 15

typedef void *nvmlDevice_t;
typedef void *nvmlEventSet_t;
typedef struct {
    nvmlDevice_t device;
    unsigned long long eventType, eventData;
    unsigned int gpuInstanceId, computeInstanceId;
} nvmlEventData_t;

static void *real_lib(void) {
    static void *h;
    if (!h) {
        const char *p = getenv("GW_NVML_REAL");
        h = dlopen(p && *p ? p : "libnvidia-ml.so.1", RTLD_LAZY | RTLD_GLOBAL);
    }
    return h;
}

static void *real(const char *name) {
    void *h = real_lib();
    return h ? dlsym(h, name) : NULL;
}

static int triggered(const char *env) {
    const char *f = getenv(env);
    return f && *f && access(f, F_OK) == 0;
}

static void maybe_hang(void) {
    if (triggered("GW_NVML_HANG_FILE")) {
        fprintf(stderr, "nvml_inject_shim: nvmlInit hangs now (trigger file present)\n");
        for (;;) pause();
    }
}

#define FORWARD0(name) \
    int name(void) { maybe_hang(); int (*f)(void) = real(#name); return f ? f() : NVML_ERROR_LIBRARY_NOT_FOUND; }
FORWARD0(nvmlInit)
FORWARD0(nvmlInit_v2)
int nvmlInitWithFlags(unsigned int flags) {
    maybe_hang();
    int (*f)(unsigned int) = real("nvmlInitWithFlags");
    return f ? f(flags) : NVML_ERROR_LIBRARY_NOT_FOUND;
}

/* One synthetic event of `type` read from the trigger file `env` (its number: the Xid, or the GPU index
 * for a lost GPU), which is deleted: each file is one event. */
static int synthetic_event(const char *env, unsigned long long type, unsigned long long dflt, nvmlEventData_t *e) {
    const char *path = getenv(env);
    FILE *fp = fopen(path, "r");
    unsigned long long num = dflt;
    if (fp) {
        if (fscanf(fp, "%llu", &num) != 1) num = dflt;
        fclose(fp);
    }
    unlink(path);
    unsigned int gpu = type == NVML_EVENT_TYPE_XID_CRITICAL_ERROR ? 0 : (unsigned int)num;
    int (*by_index)(unsigned int, nvmlDevice_t *) = real("nvmlDeviceGetHandleByIndex_v2");
    if (!by_index || by_index(gpu, &e->device) != 0) return NVML_ERROR_UNINITIALIZED;
    e->eventType = type;
    e->eventData = type == NVML_EVENT_TYPE_XID_CRITICAL_ERROR ? num : 0;
    e->gpuInstanceId = e->computeInstanceId = 0xFFFFFFFFu;
    fprintf(stderr, "nvml_inject_shim: synthetic event %#llx (data %llu) for GPU %u\n", type, e->eventData, gpu);
    return 0;
}

static int injected_wait(nvmlEventData_t *e) {
    if (triggered("GW_NVML_WAIT_LOST_FILE")) return NVML_ERROR_GPU_IS_LOST;
    if (triggered("GW_NVML_XID_FILE")) return synthetic_event("GW_NVML_XID_FILE", NVML_EVENT_TYPE_XID_CRITICAL_ERROR, 79, e);
    if (triggered("GW_NVML_LOST_EVENT_FILE"))
        return synthetic_event("GW_NVML_LOST_EVENT_FILE", NVML_EVENT_TYPE_GPU_UNAVAILABLE_ERROR, 0, e);
    return -1;
}

typedef int (*wait_fn)(nvmlEventSet_t, nvmlEventData_t *, unsigned int);

static int steering(void) {
    static const char *env[] = {"GW_NVML_WAIT_LOST_FILE", "GW_NVML_XID_FILE", "GW_NVML_LOST_EVENT_FILE"};
    for (unsigned i = 0; i < sizeof env / sizeof *env; i++) {
        const char *v = getenv(env[i]);
        if (v && *v) return 1;
    }
    return 0;
}

/* The wait of `ms` ms: the real one, in slices while a trigger is named (see the header), so that a
 * trigger made during a long wait is answered within a slice. Returns as the real wait does: an event
 * or an error at once, NVML_ERROR_TIMEOUT once `ms` has passed. */
static int sliced_wait(const char *name, nvmlEventSet_t set, nvmlEventData_t *e, unsigned int ms) {
    wait_fn f = (wait_fn)real(name);
    if (!f) return NVML_ERROR_LIBRARY_NOT_FOUND;
    if (!steering()) return f(set, e, ms);
    const char *s = getenv("GW_NVML_WAIT_SLICE_MS");
    unsigned int slice = s && *s ? (unsigned int)atoi(s) : 20;
    if (slice == 0) slice = 20;
    for (unsigned int left = ms;;) {
        int r = injected_wait(e);
        if (r >= 0) return r;
        unsigned int now = left < slice ? left : slice;
        r = f(set, e, now);
        if (r != NVML_ERROR_TIMEOUT || left <= now) return r;
        left -= now;
    }
}

int nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *e, unsigned int ms) {
    return sliced_wait("nvmlEventSetWait_v2", set, e, ms);
}

int nvmlEventSetWait(nvmlEventSet_t set, nvmlEventData_t *e, unsigned int ms) {
    return sliced_wait("nvmlEventSetWait", set, e, ms);
}

/* -- GW_NVML_LOST_FILE: one GPU lost ----------------------------------------------------------- */

static int lost(nvmlDevice_t d) {
    if (!triggered("GW_NVML_LOST_FILE")) return 0;
    unsigned int idx = 0;
    FILE *fp = fopen(getenv("GW_NVML_LOST_FILE"), "r");
    if (fp) {
        if (fscanf(fp, "%u", &idx) != 1) idx = 0;
        fclose(fp);
    }
    nvmlDevice_t want = NULL;
    int (*by_index)(unsigned int, nvmlDevice_t *) = real("nvmlDeviceGetHandleByIndex_v2");
    return by_index && by_index(idx, &want) == 0 && want == d;
}

const char *nvmlErrorString(int r) {
    if (r == NVML_ERROR_GPU_IS_LOST) return "GPU is lost";
    const char *(*f)(int) = real("nvmlErrorString");
    return f ? f(r) : "Unknown Error";
}

int nvmlDeviceGetUUID(nvmlDevice_t d, char *uuid, unsigned int len) {
    if (lost(d)) return NVML_ERROR_GPU_IS_LOST;
    int (*f)(nvmlDevice_t, char *, unsigned int) = real("nvmlDeviceGetUUID");
    return f ? f(d, uuid, len) : NVML_ERROR_LIBRARY_NOT_FOUND;
}

#define FORWARD_PCI(name) \
    int name(nvmlDevice_t d, void *p) { \
        if (lost(d)) return NVML_ERROR_GPU_IS_LOST; \
        int (*f)(nvmlDevice_t, void *) = real(#name); \
        return f ? f(d, p) : NVML_ERROR_LIBRARY_NOT_FOUND; \
    }
FORWARD_PCI(nvmlDeviceGetPciInfo)
FORWARD_PCI(nvmlDeviceGetPciInfo_v2)
FORWARD_PCI(nvmlDeviceGetPciInfo_v3)

int nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *d) {
    int (*f)(const char *, nvmlDevice_t *) = real("nvmlDeviceGetHandleByUUID");
    int r = f ? f(uuid, d) : NVML_ERROR_LIBRARY_NOT_FOUND;
    return r == 0 && lost(*d) ? NVML_ERROR_GPU_IS_LOST : r;
}

/* -- GW_NVML_LOST_INDEX_FILE: one GPU with no handle ------------------------------------------- */

#define NVML_ERROR_GPU_IS_LOST 15

static int lost_index(unsigned int index) {
    const char *path = getenv("GW_NVML_LOST_INDEX_FILE");
    if (!path || !*path) return 0;
    FILE *fp = fopen(path, "r");
    unsigned int want;
    int hit = 0;
    if (fp) {
        hit = fscanf(fp, "%u", &want) == 1 && want == index;
        fclose(fp);
    }
    return hit;
}

int nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *d) {
    if (lost_index(index)) return NVML_ERROR_GPU_IS_LOST;
    int (*f)(unsigned int, nvmlDevice_t *) = real("nvmlDeviceGetHandleByIndex_v2");
    return f ? f(index, d) : NVML_ERROR_LIBRARY_NOT_FOUND;
}

int nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *d) {
    if (lost_index(index)) return NVML_ERROR_GPU_IS_LOST;
    int (*f)(unsigned int, nvmlDevice_t *) = real("nvmlDeviceGetHandleByIndex");
    return f ? f(index, d) : NVML_ERROR_LIBRARY_NOT_FOUND;
}
