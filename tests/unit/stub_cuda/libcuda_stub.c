/* A stand-in libcuda.so.1 for tests/unit/test_gpu_probe.py: the driver API symbols the probe uses, with the
 * real signatures (64-bit, _v2 ABI), answering from environment variables read on every call (the probe runs
 * several times in one test process):
 *   STUB_CUDA_INIT_RESULT    cuInit's CUresult (default 0)
 *   STUB_CUDA_COUNT_RESULT   cuDeviceGetCount's CUresult (default 0)
 *   STUB_CUDA_DEVICES        "NAME:MAJOR.MINOR:MIB,..." (default: none, count 0)
 *   STUB_CUDA_DRIVER_VERSION cuDriverGetVersion (default 11040)
 *   STUB_CUDA_KERNEL         ok | wrong | launch_fail | jit_fail | ctx_fail (default ok)
 *   STUB_CUDA_BAD_DEVICE     the device STUB_CUDA_KERNEL applies to (default: every device)
 *   STUB_CUDA_INIT_ACTION    hang (cuInit sleeps 600 s, as a stuck driver does) | abort (the process dies)
 * Device memory is host memory (malloc), so cuLaunchKernel really computes out[i] = a[i] * b[i] from the
 * kernel parameters and the probe's host-side check is exercised; "wrong" corrupts one element. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef int CUresult;
typedef int CUdevice;
typedef uint64_t CUdeviceptr;
typedef void *CUcontext;
typedef void *CUmodule;
typedef void *CUfunction;
typedef void *CUstream;

static int current_device = -1;
static char module_tag, function_tag;

static int env_int(const char *name, int fallback) {
    const char *value = getenv(name);
    return value && *value ? atoi(value) : fallback;
}

/* The STUB_CUDA_DEVICES entry `index`: 1 when it exists. */
static int device_entry(int index, char *name, size_t size, int *major, int *minor, long long *mib) {
    const char *spec = getenv("STUB_CUDA_DEVICES");
    char copy[4096], *save = NULL, *item;
    int i = 0;
    if (!spec || !*spec) return 0;
    snprintf(copy, sizeof copy, "%s", spec);
    for (item = strtok_r(copy, ",", &save); item; item = strtok_r(NULL, ",", &save), i++) {
        char *colon2 = strrchr(item, ':'), *colon1;
        if (i != index) continue;
        if (!colon2) return 0;
        *colon2 = '\0';
        colon1 = strrchr(item, ':');
        if (!colon1) return 0;
        *colon1 = '\0';
        if (name) snprintf(name, size, "%s", item);
        if (major && minor && sscanf(colon1 + 1, "%d.%d", major, minor) != 2) return 0;
        if (mib) *mib = atoll(colon2 + 1);
        return 1;
    }
    return 0;
}

static int device_count(void) {
    int n = 0;
    while (device_entry(n, NULL, 0, NULL, NULL, NULL)) n++;
    return n;
}

/* 1 when STUB_CUDA_KERNEL's failure `mode` applies to the current device. */
static int failing(const char *mode) {
    const char *kernel = getenv("STUB_CUDA_KERNEL");
    int bad = env_int("STUB_CUDA_BAD_DEVICE", -1);
    return kernel && strcmp(kernel, mode) == 0 && (bad < 0 || bad == current_device);
}

CUresult cuInit(unsigned int flags) {
    const char *action = getenv("STUB_CUDA_INIT_ACTION");
    if (action && strcmp(action, "hang") == 0) sleep(600);
    if (action && strcmp(action, "abort") == 0) abort();
    return flags ? 1 : env_int("STUB_CUDA_INIT_RESULT", 0);
}

CUresult cuDriverGetVersion(int *version) {
    *version = env_int("STUB_CUDA_DRIVER_VERSION", 11040);
    return 0;
}

CUresult cuGetErrorName(CUresult code, const char **name) {
    switch (code) {
    case 0: *name = "CUDA_SUCCESS"; return 0;
    case 3: *name = "CUDA_ERROR_NOT_INITIALIZED"; return 0;
    case 35: *name = "CUDA_ERROR_INSUFFICIENT_DRIVER"; return 0;
    case 100: *name = "CUDA_ERROR_NO_DEVICE"; return 0;
    case 101: *name = "CUDA_ERROR_INVALID_DEVICE"; return 0;
    case 218: *name = "CUDA_ERROR_INVALID_PTX"; return 0;
    case 500: *name = "CUDA_ERROR_NOT_FOUND"; return 0;
    case 719: *name = "CUDA_ERROR_LAUNCH_FAILED"; return 0;
    case 999: *name = "CUDA_ERROR_UNKNOWN"; return 0;
    default: *name = NULL; return 1; /* CUDA_ERROR_INVALID_VALUE, as the real one answers */
    }
}

CUresult cuDeviceGetCount(int *count) {
    int result = env_int("STUB_CUDA_COUNT_RESULT", 0);
    if (result) return result;
    *count = device_count();
    return 0;
}

CUresult cuDeviceGet(CUdevice *device, int ordinal) {
    if (ordinal < 0 || ordinal >= device_count()) return 101;
    *device = ordinal;
    return 0;
}

CUresult cuDeviceGetName(char *name, int len, CUdevice device) {
    return device_entry(device, name, (size_t)len, NULL, NULL, NULL) ? 0 : 101;
}

CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice device) {
    long long mib;
    if (!device_entry(device, NULL, 0, NULL, NULL, &mib)) return 101;
    *bytes = (size_t)mib * 1024 * 1024;
    return 0;
}

CUresult cuDeviceGetAttribute(int *value, int attribute, CUdevice device) {
    int major, minor;
    if (!device_entry(device, NULL, 0, &major, &minor, NULL)) return 101;
    if (attribute == 75) *value = major;
    else if (attribute == 76) *value = minor;
    else return 1;
    return 0;
}

CUresult cuCtxCreate_v2(CUcontext *context, unsigned int flags, CUdevice device) {
    (void)flags;
    if (device < 0 || device >= device_count()) return 101;
    current_device = device;
    if (failing("ctx_fail")) return 2; /* CUDA_ERROR_OUT_OF_MEMORY */
    *context = (CUcontext)(intptr_t)(device + 1);
    return 0;
}

CUresult cuCtxDestroy_v2(CUcontext context) {
    if (context != (CUcontext)(intptr_t)(current_device + 1)) return 201; /* CUDA_ERROR_INVALID_CONTEXT */
    current_device = -1;
    return 0;
}

CUresult cuCtxSynchronize(void) { return current_device < 0 ? 201 : 0; }

CUresult cuModuleLoadData(CUmodule *module, const void *image) {
    if (current_device < 0) return 201;
    if (failing("jit_fail") || !strstr((const char *)image, ".entry msgpu_mul(")) return 218;
    *module = &module_tag;
    return 0;
}

CUresult cuModuleGetFunction(CUfunction *function, CUmodule module, const char *name) {
    if (module != &module_tag) return 400; /* CUDA_ERROR_INVALID_HANDLE */
    if (strcmp(name, "msgpu_mul") != 0) return 500;
    *function = &function_tag;
    return 0;
}

CUresult cuMemAlloc_v2(CUdeviceptr *pointer, size_t size) {
    void *memory;
    if (current_device < 0) return 201;
    memory = malloc(size);
    if (!memory) return 2;
    memset(memory, 0xAB, size); /* never zero: a kernel that did nothing must not look right */
    *pointer = (CUdeviceptr)(uintptr_t)memory;
    return 0;
}

CUresult cuMemFree_v2(CUdeviceptr pointer) {
    free((void *)(uintptr_t)pointer);
    return 0;
}

CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t size) {
    memcpy((void *)(uintptr_t)dst, src, size);
    return 0;
}

CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t size) {
    memcpy(dst, (const void *)(uintptr_t)src, size);
    return 0;
}

/* msgpu_mul(out, a, b, n): params[i] points at each argument's value, as in the real API. */
CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                        unsigned bz, unsigned shared, CUstream stream, void **params, void **extra) {
    uint32_t *out, *a, *b, n;
    unsigned threads = gx * gy * gz * bx * by * bz, i;
    (void)shared; (void)stream; (void)extra;
    if (f != &function_tag || !params) return 400;
    if (failing("launch_fail")) return 719;
    out = (uint32_t *)(uintptr_t)*(CUdeviceptr *)params[0];
    a = (uint32_t *)(uintptr_t)*(CUdeviceptr *)params[1];
    b = (uint32_t *)(uintptr_t)*(CUdeviceptr *)params[2];
    n = *(uint32_t *)params[3];
    for (i = 0; i < threads && i < n; i++) out[i] = a[i] * b[i];
    if (failing("wrong") && n > 7) out[7] ^= 1;
    return 0;
}
