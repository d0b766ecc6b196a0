/* A stand-in libnvidia-ml.so.1 with two GPUs and fixed answers, for comparing gpuwarden's ctypes
 * NVML client with nvidia-ml-py (pynvml) on the same library. GPU 1 answers NOT_SUPPORTED (3) where
 * a GPU without MIG or row remapping does. FAKE_NVML_INIT_RC makes nvmlInitWithFlags fail.
 * Built with -Wl,-soname,libnvidia-ml.so.1 by the test; never installed. */
#include <stdlib.h>
#include <string.h>
#include <stdio.h>

typedef struct { char busIdLegacy[16]; unsigned domain, bus, device, pciDeviceId, pciSubSystemId; char busId[32]; } pci_t;
typedef struct { int i; } dev_t_;
static dev_t_ devs[2] = {{0}, {1}};
#define DEV(h) (((dev_t_ *)(h))->i)

int nvmlInitWithFlags(unsigned int flags) { const char *e = getenv("FAKE_NVML_INIT_RC"); (void)flags; return e ? atoi(e) : 0; }
int nvmlInit_v2(void) { return nvmlInitWithFlags(0); }
int nvmlShutdown(void) { return 0; }
const char *nvmlErrorString(int r) { return r == 9 ? "Driver Not Loaded" : r == 999 ? "Unknown Error" : "Some Error"; }
static int put(char *buf, unsigned len, const char *s) { if (strlen(s) + 1 > len) return 7; strcpy(buf, s); return 0; }
int nvmlSystemGetDriverVersion(char *b, unsigned n) { return put(b, n, "580.159.04"); }
int nvmlSystemGetNVMLVersion(char *b, unsigned n) { return put(b, n, "13.580.159.04"); }
int nvmlSystemGetCudaDriverVersion_v2(int *v) { *v = 13000; return 0; }
int nvmlDeviceGetCount_v2(unsigned *c) { *c = 2; return 0; }
int nvmlDeviceGetHandleByIndex_v2(unsigned i, void **h) { if (i > 1) return 2; *h = &devs[i]; return 0; }
int nvmlDeviceGetName(void *h, char *b, unsigned n) { return put(b, n, DEV(h) ? "NVIDIA A100-SXM4-80GB" : "NVIDIA H100 80GB HBM3"); }
int nvmlDeviceGetUUID(void *h, char *b, unsigned n) { return put(b, n, DEV(h) ? "GPU-11111111-2222-3333-4444-555555555555" : "GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"); }
int nvmlDeviceGetMinorNumber(void *h, unsigned *m) { *m = DEV(h) ? 7 : 0; return 0; }
int nvmlDeviceGetPciInfo_v3(void *h, pci_t *p) {
    memset(p, 0, sizeof *p);
    p->domain = 0; p->bus = DEV(h) ? 0x1b : 0x18; p->pciDeviceId = 0x233010de;
    snprintf(p->busId, sizeof p->busId, "00000000:%02X:00.0", p->bus);
    snprintf(p->busIdLegacy, sizeof p->busIdLegacy, "0000:%02X:00.0", p->bus);
    return 0;
}
int nvmlDeviceGetMigMode(void *h, unsigned *cur, unsigned *pend) { if (DEV(h)) return 3; *cur = 1; *pend = 0; return 0; }
int nvmlDeviceGetPersistenceMode(void *h, int *s) { *s = DEV(h) ? 0 : 1; return 0; }
int nvmlDeviceGetComputeMode(void *h, int *m) { *m = DEV(h) ? 3 : 0; return 0; }
int nvmlDeviceGetRetiredPagesPendingStatus(void *h, int *s) { if (DEV(h)) return 3; *s = 0; return 0; }
int nvmlDeviceGetRemappedRows(void *h, unsigned *c, unsigned *u, unsigned *p, unsigned *f) {
    if (DEV(h)) return 3; *c = 2; *u = 1; *p = 1; *f = 0; return 0;
}
int nvmlDeviceGetCurrPcieLinkGeneration(void *h, unsigned *g) { *g = DEV(h) ? 4 : 5; return 0; }
int nvmlDeviceGetMaxPcieLinkGeneration(void *h, unsigned *g) { (void)h; *g = 5; return 0; }
int nvmlDeviceGetCurrPcieLinkWidth(void *h, unsigned *w) { *w = DEV(h) ? 8 : 16; return 0; }
int nvmlDeviceGetMaxPcieLinkWidth(void *h, unsigned *w) { (void)h; *w = 16; return 0; }
int nvmlDeviceGetTotalEccErrors(void *h, unsigned t, unsigned c, unsigned long long *n) {
    if (t != 1 || c != 0) return 2; *n = DEV(h) ? 0ULL : 12345678901ULL; return 0;
}
typedef struct { unsigned long long total, free, used; } mem_t;
int nvmlDeviceGetMemoryInfo(void *h, mem_t *m) {
    m->total = 85520809984ULL; m->free = DEV(h) ? 80000000000ULL : 21692416ULL; m->used = m->total - m->free; return 0;
}
/* nvmlProcessInfo_t (v2): GPU 0 has a graphics client (pid 523, 1.5 GiB) and a compute one that is also a graphics
 * client (pid 499: C+G) whose memory NVML cannot report; GPU 1 has none. Answers INSUFFICIENT_SIZE (7) with the
 * count to a NULL array, as NVML does. */
typedef struct { unsigned pid; unsigned long long used; unsigned gi, ci; } proc_t;
static int procs(void *h, unsigned *n, proc_t *a, const proc_t *src, unsigned k) {
    if (DEV(h)) { *n = 0; return 0; }
    if (!a || *n < k) { *n = k; return 7; }
    memcpy(a, src, k * sizeof *a); *n = k; return 0;
}
int nvmlDeviceGetGraphicsRunningProcesses_v3(void *h, unsigned *n, proc_t *a) {
    static const proc_t g[2] = {{523, 1563582464ULL, 0xFFFFFFFF, 0xFFFFFFFF}, {499, 0xFFFFFFFFFFFFFFFFULL, 0xFFFFFFFF, 0xFFFFFFFF}};
    return procs(h, n, a, g, 2);
}
int nvmlDeviceGetComputeRunningProcesses_v3(void *h, unsigned *n, proc_t *a) {
    static const proc_t c[1] = {{499, 83399540736ULL, 0xFFFFFFFF, 0xFFFFFFFF}};
    return procs(h, n, a, c, 1);
}
