/* A stand-in libnvidia-ml.so.1 with NVML's event API, for the NVML event source (gpuwarden.wake.nvml).
 * Two GPUs (FAKE_NVML_GPUS to change). Built by the test with -Wl,-soname,libnvidia-ml.so.1; never
 * installed. What it does is steered by files and variables the test sets:
 *   FAKE_NVML_HANG_FILE    while it exists, nvmlInitWithFlags blocks forever (incident 5)
 *   FAKE_NVML_LOST_GPU     this GPU index has no handle: NVML_ERROR_GPU_IS_LOST
 *   FAKE_NVML_INIT_RC      nvmlInitWithFlags answers this code
 *   FAKE_NVML_SUPPORTED    the event types every GPU supports (default 0xC00F); "none": NOT_SUPPORTED
 *   FAKE_NVML_REGISTERED   a file: one line "<gpu> <mask>" per nvmlDeviceRegisterEvents
 *   FAKE_NVML_EVENT_FILE   when it appears, holding "<gpu> <type> <data> [<count>]", the next waits return
 *                          that event <count> times (default 1); the file is removed
 *   FAKE_NVML_LOST_FILE    while it exists, the wait answers NVML_ERROR_GPU_IS_LOST at once
 *   FAKE_NVML_WAIT_HANG_FILE  while it exists, the wait blocks forever
 *   FAKE_NVML_CRASH_FILE   when it appears, the wait removes it and the process aborts
 * With none of the trigger files named, the wait just sleeps its timeout (the idle cost is ours alone). */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef struct { char busIdLegacy[16]; unsigned domain, bus, device, pciDeviceId, pciSubSystemId; char busId[32]; } pci_t;
typedef struct { void *device; unsigned long long type, data; unsigned gi, ci; } event_t;
static int devs[8] = {0, 1, 2, 3, 4, 5, 6, 7};
static int evset;
static unsigned pend_gpu, pend_left;
static unsigned long long pend_type, pend_data;

static int present(const char *env) { const char *p = getenv(env); return p && *p && access(p, F_OK) == 0; }
static unsigned gpus(void) { const char *e = getenv("FAKE_NVML_GPUS"); unsigned n = e ? (unsigned)atoi(e) : 2; return n > 8 ? 8 : n; }

int nvmlInitWithFlags(unsigned flags) {
    (void)flags;
    while (present("FAKE_NVML_HANG_FILE")) pause();
    const char *e = getenv("FAKE_NVML_INIT_RC");
    return e ? atoi(e) : 0;
}
int nvmlInit_v2(void) { return nvmlInitWithFlags(0); }
int nvmlShutdown(void) { return 0; }
const char *nvmlErrorString(int r) {
    return r == 15 ? "GPU is lost" : r == 9 ? "Driver Not Loaded" : r == 3 ? "Not Supported" : "Unknown Error";
}
int nvmlDeviceGetCount_v2(unsigned *c) { *c = gpus(); return 0; }
/* FAKE_NVML_LOST_GPU: that GPU's handle answers NVML_ERROR_GPU_IS_LOST, as a GPU off the bus does */
int nvmlDeviceGetHandleByIndex_v2(unsigned i, void **h) {
    const char *lost = getenv("FAKE_NVML_LOST_GPU");
    if (i >= gpus()) return 2;
    if (lost && (unsigned)atoi(lost) == i) return 15;
    *h = &devs[i];
    return 0;
}
int nvmlDeviceGetPciInfo_v3(void *h, pci_t *p) {
    memset(p, 0, sizeof *p);
    p->bus = 0x18 + *(int *)h;
    snprintf(p->busId, sizeof p->busId, "00000000:%02X:00.0", p->bus);
    return 0;
}
int nvmlDeviceGetSupportedEventTypes(void *h, unsigned long long *types) {
    (void)h;
    const char *e = getenv("FAKE_NVML_SUPPORTED");
    if (e && strcmp(e, "none") == 0) return 3;
    *types = e ? strtoull(e, NULL, 0) : 0xC00FULL;
    return 0;
}
int nvmlEventSetCreate(void **set) { *set = &evset; return 0; }
int nvmlEventSetFree(void *set) { (void)set; return 0; }
int nvmlDeviceRegisterEvents(void *h, unsigned long long mask, void *set) {
    (void)set;
    const char *path = getenv("FAKE_NVML_REGISTERED");
    FILE *fp = path ? fopen(path, "a") : NULL;
    if (fp) { fprintf(fp, "%d %llu\n", *(int *)h, mask); fclose(fp); }
    return 0;
}

static int take_trigger(void) {
    const char *path = getenv("FAKE_NVML_EVENT_FILE");
    FILE *fp = path ? fopen(path, "r") : NULL;
    if (!fp) return 0;
    unsigned n = 1;
    int got = fscanf(fp, "%u %llu %llu %u", &pend_gpu, &pend_type, &pend_data, &n);
    fclose(fp);
    unlink(path);
    pend_left = got >= 3 ? (got == 4 ? n : 1) : 0;
    return pend_left > 0;
}

/* With no trigger file named, the wait sleeps its whole timeout, as the real one blocks: what is measured
 * then is the event child's own cost (bench/wake_sources.py). */
static int steered(void) {
    static const char *env[] = {"FAKE_NVML_EVENT_FILE", "FAKE_NVML_LOST_FILE", "FAKE_NVML_WAIT_HANG_FILE",
                                "FAKE_NVML_CRASH_FILE"};
    for (unsigned i = 0; i < sizeof env / sizeof *env; i++)
        if (getenv(env[i])) return 1;
    return 0;
}

int nvmlEventSetWait_v2(void *set, event_t *e, unsigned ms) {
    (void)set;
    if (!steered()) {
        struct timespec t = {ms / 1000, (long)(ms % 1000) * 1000000L};
        nanosleep(&t, NULL);
        return 10;
    }
    for (unsigned waited = 0;; waited += 5) {
        if (present("FAKE_NVML_CRASH_FILE")) { unlink(getenv("FAKE_NVML_CRASH_FILE")); abort(); }
        while (present("FAKE_NVML_WAIT_HANG_FILE")) pause();
        if (present("FAKE_NVML_LOST_FILE")) return 15;
        if (pend_left || take_trigger()) {
            pend_left--;
            e->device = &devs[pend_gpu % 8];
            e->type = pend_type;
            e->data = pend_data;
            e->gi = e->ci = 0xFFFFFFFFu;
            return 0;
        }
        if (waited >= ms) return 10; /* NVML_ERROR_TIMEOUT */
        struct timespec t = {0, 5 * 1000 * 1000};
        nanosleep(&t, NULL);
    }
}
