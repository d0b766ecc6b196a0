/* A stand-in libnvidia-ml.so.1 with one fake GPU, so the real NVIDIA device plugin serves it on a
 * machine without a GPU (CI): it registers with the kubelet stand-in, lists the device and answers
 * GetPreferredAllocation / Allocate through its own code.
 *
 * Only the calls that plugin makes for one full (non-MIG) GPU are implemented; anything else the
 * plugin asks returns NVML_ERROR_NOT_SUPPORTED through the functions below or, if it is not here at
 * all, ends the plugin with "symbol lookup error" (the test then fails loudly, naming the symbol).
 * nvmlEventSetWait_v2 sleeps out its timeout and reports NVML_ERROR_TIMEOUT: a GPU that never
 * raises an Xid.
 *
 * Environment: GW_FAKE_NVML_UUID (default GPU-6a7f0b1c-0000-4000-8000-00000000f00d),
 * GW_FAKE_NVML_MINOR (default 0), GW_FAKE_NVML_UVM_MAJOR: when set, nvmlInit creates /dev/nvidia-uvm
 * and /dev/nvidia-uvm-tools (that major, minors 0 and 1) if they are missing, as the real NVML was
 * seen to do in a root plugin's own /dev (docs/validation.md run 4); without CAP_MKNOD it cannot.
 * The NVIDIA DRA kubelet plugin (gpu-kubelet-plugin, tests/support/realdra.py) loads the same library from
 * its driver root (<root>/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1) and asks one call more, answered
 * NOT_SUPPORTED below (no MIG profiles), as a GPU without MIG does.
 * Built by tests/support/realplugin.py:
 *   gcc -shared -fPIC -Wl,-soname,libnvidia-ml.so.1 -o libnvidia-ml.so.1 nvml_fake.c
 */
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <time.h>

#define OK 0
#define NOT_SUPPORTED 3
#define INVALID_ARGUMENT 2
#define NOT_FOUND 6
#define INSUFFICIENT_SIZE 7
#define TIMEOUT 10

typedef struct { int id; } dev_t_;
static dev_t_ the_gpu = {0};
typedef dev_t_ *nvmlDevice_t;

typedef struct {
    char busIdLegacy[16];
    unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;

typedef struct { unsigned long long total, free, used; } nvmlMemory_t;

typedef struct {
    nvmlDevice_t device;
    unsigned long long eventType, eventData;
    unsigned int gpuInstanceId, computeInstanceId;
} nvmlEventData_t;

static const char *env_or(const char *name, const char *def) {
    const char *v = getenv(name);
    return v && *v ? v : def;
}

static int copy_str(char *dst, unsigned int len, const char *src) {
    if (!dst) return INVALID_ARGUMENT;
    if (strlen(src) + 1 > len) return INSUFFICIENT_SIZE;
    strcpy(dst, src);
    return OK;
}

static int is_gpu(nvmlDevice_t d) { return d == &the_gpu; }

static int init(void) {
    const char *major = getenv("GW_FAKE_NVML_UVM_MAJOR");
    if (major && *major) {  /* best effort, errors ignored, like the driver's node creation */
        mknod("/dev/nvidia-uvm", S_IFCHR | 0666, makedev((unsigned)atoi(major), 0));
        mknod("/dev/nvidia-uvm-tools", S_IFCHR | 0666, makedev((unsigned)atoi(major), 1));
    }
    return OK;
}
int nvmlInit(void) { return init(); }
int nvmlInit_v2(void) { return init(); }
int nvmlInitWithFlags(unsigned int flags) { (void)flags; return init(); }
int nvmlShutdown(void) { return OK; }
const char *nvmlErrorString(int r) {
    switch (r) {
    case OK: return "Success";
    case NOT_SUPPORTED: return "Not Supported";
    case TIMEOUT: return "Timeout";
    case NOT_FOUND: return "Not Found";
    default: return "Unknown Error";
    }
}

int nvmlSystemGetDriverVersion(char *v, unsigned int len) { return copy_str(v, len, "570.999.01"); }
int nvmlSystemGetNVMLVersion(char *v, unsigned int len) { return copy_str(v, len, "12.570.999.01"); }
int nvmlSystemGetCudaDriverVersion(int *v) { *v = 12080; return OK; }
int nvmlSystemGetCudaDriverVersion_v2(int *v) { *v = 12080; return OK; }

int nvmlDeviceGetCount(unsigned int *n) { *n = 1; return OK; }
int nvmlDeviceGetCount_v2(unsigned int *n) { *n = 1; return OK; }
int nvmlDeviceGetHandleByIndex(unsigned int i, nvmlDevice_t *d) {
    if (i != 0) return INVALID_ARGUMENT;
    *d = &the_gpu;
    return OK;
}
int nvmlDeviceGetHandleByIndex_v2(unsigned int i, nvmlDevice_t *d) { return nvmlDeviceGetHandleByIndex(i, d); }
int nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *d) {
    if (!uuid || strcmp(uuid, env_or("GW_FAKE_NVML_UUID", "GPU-6a7f0b1c-0000-4000-8000-00000000f00d"))) return NOT_FOUND;
    *d = &the_gpu;
    return OK;
}
int nvmlDeviceGetUUID(nvmlDevice_t d, char *uuid, unsigned int len) {
    if (!is_gpu(d)) return INVALID_ARGUMENT;
    return copy_str(uuid, len, env_or("GW_FAKE_NVML_UUID", "GPU-6a7f0b1c-0000-4000-8000-00000000f00d"));
}
int nvmlDeviceGetName(nvmlDevice_t d, char *name, unsigned int len) {
    (void)d;
    return copy_str(name, len, "NVIDIA H100 80GB HBM3 (gpuwarden fake)");
}
int nvmlDeviceGetIndex(nvmlDevice_t d, unsigned int *i) { (void)d; *i = 0; return OK; }
int nvmlDeviceGetMinorNumber(nvmlDevice_t d, unsigned int *m) {
    (void)d;
    *m = (unsigned int)atoi(env_or("GW_FAKE_NVML_MINOR", "0"));
    return OK;
}
static int pci(nvmlPciInfo_t *p) {
    memset(p, 0, sizeof *p);
    strcpy(p->busIdLegacy, "0000:00:1e.0");
    strcpy(p->busId, "00000000:00:1E.0");
    p->bus = 0; p->device = 0x1e; p->pciDeviceId = 0x233010de; p->pciSubSystemId = 0x16c110de;
    return OK;
}
int nvmlDeviceGetPciInfo(nvmlDevice_t d, nvmlPciInfo_t *p) { (void)d; return pci(p); }
int nvmlDeviceGetPciInfo_v2(nvmlDevice_t d, nvmlPciInfo_t *p) { (void)d; return pci(p); }
int nvmlDeviceGetPciInfo_v3(nvmlDevice_t d, nvmlPciInfo_t *p) { (void)d; return pci(p); }
int nvmlDeviceGetMemoryInfo(nvmlDevice_t d, nvmlMemory_t *m) {
    (void)d;
    m->total = 80ULL << 30; m->free = 80ULL << 30; m->used = 0;
    return OK;
}
int nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t d, void *m) { (void)d; (void)m; return NOT_SUPPORTED; }
int nvmlDeviceGetCudaComputeCapability(nvmlDevice_t d, int *major, int *minor) {
    (void)d; *major = 9; *minor = 0;
    return OK;
}
int nvmlDeviceGetArchitecture(nvmlDevice_t d, unsigned int *a) { (void)d; *a = 9; return OK; } /* Hopper */
int nvmlDeviceGetBrand(nvmlDevice_t d, int *b) { (void)d; *b = 2; return OK; }
int nvmlDeviceGetMigMode(nvmlDevice_t d, unsigned int *cur, unsigned int *pend) {
    (void)d; (void)cur; (void)pend;
    return NOT_SUPPORTED;
}
int nvmlDeviceIsMigDeviceHandle(nvmlDevice_t d, unsigned int *is) { (void)d; *is = 0; return OK; }
int nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t d, unsigned int *n) { (void)d; *n = 0; return OK; }
int nvmlDeviceGetNumaNodeId(nvmlDevice_t d, unsigned int *n) { (void)d; (void)n; return NOT_SUPPORTED; }
int nvmlDeviceGetTopologyCommonAncestor(nvmlDevice_t a, nvmlDevice_t b, int *l) {
    (void)a; (void)b; (void)l;
    return NOT_SUPPORTED;
}
int nvmlDeviceGetNvLinkState(nvmlDevice_t d, unsigned int link, int *s) {
    (void)d; (void)link; (void)s;
    return NOT_SUPPORTED;
}
int nvmlDeviceGetSupportedEventTypes(nvmlDevice_t d, unsigned long long *t) {
    (void)d;
    *t = 0x8 | 0x2 | 0x1; /* XidCriticalError | DoubleBitEcc | SingleBitEcc */
    return OK;
}

typedef struct { int unused; } evset_t;
static evset_t the_set;
int nvmlEventSetCreate(evset_t **s) { *s = &the_set; return OK; }
int nvmlEventSetFree(evset_t *s) { (void)s; return OK; }
int nvmlDeviceRegisterEvents(nvmlDevice_t d, unsigned long long t, evset_t *s) {
    (void)d; (void)t; (void)s;
    return OK;
}
int nvmlEventSetWait_v2(evset_t *s, nvmlEventData_t *e, unsigned int ms) {
    (void)s; (void)e;
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
    return TIMEOUT;
}
int nvmlEventSetWait(evset_t *s, nvmlEventData_t *e, unsigned int ms) { return nvmlEventSetWait_v2(s, e, ms); }

/* the DRA kubelet plugin's MIG profile walk: a GPU without MIG profiles */
int nvmlDeviceGetGpuInstanceProfileInfo(nvmlDevice_t d, unsigned int profile, void *info) {
    (void)d; (void)profile; (void)info;
    return NOT_SUPPORTED;
}
