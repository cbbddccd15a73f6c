// The current device's properties, read once per device and cached: every
// custom call asks for them (to plan its workspace and its launch), and host
// work on that path delays each launch. Shared by the top-k, routing and
// indexer launchers.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <mutex>

#include "jax_topk/gpu_compat.h"

namespace jax_topk::cuda {

struct DeviceInfo {
  int device = 0;
  int sm_count = 1;
  int64_t l2_bytes = 0;
  int max_shared_optin = 0;  // dynamic shared memory a block may opt into
  bool clusters = false;  // thread-block clusters (compute capability 9.0 and newer)
  bool bulk_copies = false;  // cp.async.bulk and mbarrier transaction counts (the same chips)
  bool dependent_launches = false;  // programmatic dependent launch (dependent_launch.cuh; the same chips)
  bool sm90a_code = false;  // runs arch-specific sm_90a code (wgmma.cuh): compute capability 9.0 exactly
};

inline gpuError_t read_device(int device, DeviceInfo* info) {
  int sms = 0, l2 = 0, major = 0, minor = 0, shared = 0;
  gpuError_t err;
  if ((err = gpuDeviceGetAttribute(&sms, gpuDevAttrMultiProcessorCount, device)) != gpuSuccess) return err;
  if ((err = gpuDeviceGetAttribute(&l2, gpuDevAttrL2CacheSize, device)) != gpuSuccess) return err;
  if ((err = gpuDeviceGetAttribute(&major, gpuDevAttrComputeCapabilityMajor, device)) != gpuSuccess) return err;
  if ((err = gpuDeviceGetAttribute(&minor, gpuDevAttrComputeCapabilityMinor, device)) != gpuSuccess) return err;
  if ((err = gpuDeviceGetAttribute(&shared, gpuDevAttrMaxSharedMemoryPerBlockOptin, device)) != gpuSuccess) return err;
  info->device = device;
  info->sm_count = sms > 0 ? sms : 1;
  info->l2_bytes = l2;
  info->max_shared_optin = shared;
#if defined(JAX_TOPK_HAS_CLUSTERS)
  info->clusters = major >= 9;
  info->sm90a_code = major == 9 && minor == 0;
#else
  info->clusters = false;  // (AMD reports gfx9 chips as major 9)
#endif
  info->bulk_copies = info->clusters;
  // JAX_TOPK_NO_DEPENDENT_LAUNCH (any value): ordinary launches, for A/B measurements only.
  info->dependent_launches = info->clusters && std::getenv("JAX_TOPK_NO_DEPENDENT_LAUNCH") == nullptr;
  return gpuSuccess;
}

inline gpuError_t query_device(DeviceInfo* info) {
  constexpr int kCachedDevices = 64;
  static std::mutex mutex;
  static DeviceInfo cache[kCachedDevices];
  static bool cached[kCachedDevices] = {};
  int device = 0;
  gpuError_t err = gpuGetDevice(&device);
  if (err != gpuSuccess) return err;
  if (device < 0 || device >= kCachedDevices) return read_device(device, info);
  std::lock_guard<std::mutex> lock(mutex);
  if (!cached[device]) {
    if ((err = read_device(device, &cache[device])) != gpuSuccess) return err;
    cached[device] = true;
  }
  *info = cache[device];
  return gpuSuccess;
}

}  // namespace jax_topk::cuda
