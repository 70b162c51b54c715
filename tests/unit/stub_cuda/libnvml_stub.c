/* A stand-in libnvidia-ml.so.1 for tests/unit/test_gpu_probe.py, answering from environment variables read
 * on every call:
 *   STUB_NVML_INIT_RESULT   nvmlInit_v2's nvmlReturn_t (default 0; 9 is "Driver Not Loaded", 18 "Driver/library
 *                           version mismatch")
 *   STUB_CUDA_DEVICES       the same list as the libcuda stub: NVML counts and names these devices
 *   STUB_NVML_DRIVER        nvmlSystemGetDriverVersion (default 470.256.02)
 *   STUB_NVML_PERSISTENCE   0 | 1 (default 1)
 *   STUB_NVML_ECC           0 | 1 | unsupported (default unsupported, as on GeForce cards)
 * Built with -DSTUB_NVML_MINIMAL it lacks nvmlDeviceGetEccMode and nvmlDeviceGetPciInfo_v3 (an old driver). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int nvmlReturn_t;
typedef void *nvmlDevice_t;

typedef struct {
    char busIdLegacy[16];
    unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;

static int initialised;

static int device_name(unsigned index, char *name, size_t size) {
    const char *spec = getenv("STUB_CUDA_DEVICES");
    char copy[4096], *save = NULL, *item;
    unsigned i = 0;
    if (!spec || !*spec) return 0;
    snprintf(copy, sizeof copy, "%s", spec);
    for (item = strtok_r(copy, ",", &save); item; item = strtok_r(NULL, ",", &save), i++) {
        if (i == index) {
            char *colon = strchr(item, ':');
            if (colon) *colon = '\0';
            if (name) snprintf(name, size, "%s", item);
            return 1;
        }
    }
    return 0;
}

static unsigned index_of(nvmlDevice_t device) { return (unsigned)((uintptr_t)device - 1); }

nvmlReturn_t nvmlInit_v2(void) {
    const char *value = getenv("STUB_NVML_INIT_RESULT");
    int result = value ? atoi(value) : 0;
    if (result == 0) initialised = 1;
    return result;
}

nvmlReturn_t nvmlShutdown(void) {
    if (!initialised) return 1; /* NVML_ERROR_UNINITIALIZED */
    initialised = 0;
    return 0;
}

const char *nvmlErrorString(nvmlReturn_t result) {
    switch (result) {
    case 0: return "Success";
    case 1: return "Uninitialized";
    case 3: return "Not Supported";
    case 9: return "Driver Not Loaded";
    case 12: return "Function Not Found";
    case 18: return "Driver/library version mismatch";
    default: return "Unknown Error";
    }
}

nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    const char *value = getenv("STUB_NVML_DRIVER");
    if (!initialised) return 1;
    snprintf(version, length, "%s", value ? value : "470.256.02");
    return 0;
}

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
    unsigned n = 0;
    if (!initialised) return 1;
    while (device_name(n, NULL, 0)) n++;
    *count = n;
    return 0;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    if (!initialised) return 1;
    if (!device_name(index, NULL, 0)) return 2; /* NVML_ERROR_INVALID_ARGUMENT */
    *device = (nvmlDevice_t)(uintptr_t)(index + 1);
    return 0;
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length) {
    return device_name(index_of(device), name, length) ? 0 : 2;
}

nvmlReturn_t nvmlDeviceGetPersistenceMode(nvmlDevice_t device, int *mode) {
    const char *value = getenv("STUB_NVML_PERSISTENCE");
    if (!device_name(index_of(device), NULL, 0)) return 2;
    *mode = value ? atoi(value) : 1;
    return 0;
}

#ifndef STUB_NVML_MINIMAL
nvmlReturn_t nvmlDeviceGetEccMode(nvmlDevice_t device, int *current, int *pending) {
    const char *value = getenv("STUB_NVML_ECC");
    if (!device_name(index_of(device), NULL, 0)) return 2;
    if (!value || strcmp(value, "unsupported") == 0) return 3;
    *current = *pending = atoi(value);
    return 0;
}

nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci) {
    unsigned index = index_of(device);
    if (!device_name(index, NULL, 0)) return 2;
    memset(pci, 0, sizeof *pci);
    pci->bus = index + 1;
    snprintf(pci->busId, sizeof pci->busId, "00000000:%02X:00.0", index + 1);
    snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "0000:%02X:00.0", index + 1);
    return 0;
}
#endif
