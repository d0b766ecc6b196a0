/* A stand-in libnvidia-ml.so.1 whose nvmlInit never returns, like the driver bug of incident 5.
 * Built with -Wl,-soname,libnvidia-ml.so.1 and loaded only by gpuwarden's probe child
 * (GPUWARDEN_NVML_LIBRARY), never installed system-wide. */
#include <unistd.h>

static int hang(void) { for (;;) pause(); return 0; }
int nvmlInit(void) { return hang(); }
int nvmlInit_v2(void) { return hang(); }
int nvmlInitWithFlags(unsigned int flags) { (void)flags; return hang(); }
int nvmlShutdown(void) { return 0; }
const char *nvmlErrorString(int r) { (void)r; return "shim"; }
