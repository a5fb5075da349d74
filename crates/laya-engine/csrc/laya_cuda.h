// What laya's CUDA primitives share: NVRTC and the CUDA driver API, found in the process (MLX
// loaded both; its CUDA runtime is linked statically, so laya calls the driver), and a kernel
// source compiled once for the device's architecture.
#pragma once

#ifdef LAYA_CUDA

#include <dlfcn.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <iterator>
#include <stdexcept>
#include <string>
#include <vector>

#include <cuda.h>

#include "mlx/backend/cuda/device.h"
#include "mlx/backend/cuda/utils.h"

namespace laya::cuda {

struct Api {
  // NVRTC
  int (*create)(void**, const char*, const char*, int, const char* const*, const char* const*) = nullptr;
  int (*compile)(void*, int, const char* const*) = nullptr;
  int (*cubin_size)(void*, size_t*) = nullptr;
  int (*cubin)(void*, char*) = nullptr;
  int (*log_size)(void*, size_t*) = nullptr;
  int (*log)(void*, char*) = nullptr;
  int (*destroy)(void**) = nullptr;
  int (*version)(int*, int*) = nullptr;
  // The driver
  CUresult (*load)(CUmodule*, const void*) = nullptr;
  CUresult (*function)(CUfunction*, CUmodule, const char*) = nullptr;
  CUresult (*mem_alloc)(CUdeviceptr*, size_t) = nullptr;
  CUresult (*mem_free)(CUdeviceptr) = nullptr;
  CUresult (*memset_d8)(CUdeviceptr, unsigned char, size_t) = nullptr;
  CUresult (*graph_create)(CUgraph*, unsigned int) = nullptr;
  CUresult (*graph_add_kernel_node)(CUgraphNode*, CUgraph, const CUgraphNode*, size_t, const CUDA_KERNEL_NODE_PARAMS*) = nullptr;
  CUresult (*graph_instantiate)(CUgraphExec*, CUgraph, unsigned long long) = nullptr;
  CUresult (*graph_launch)(CUgraphExec, CUstream) = nullptr;
  CUresult (*graph_destroy)(CUgraph) = nullptr;
  CUresult (*graph_exec_destroy)(CUgraphExec) = nullptr;
  CUresult (*ctx_synchronize)() = nullptr;
  CUresult (*launch)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream, void**, void**) = nullptr;
  CUresult (*event_create)(CUevent*, unsigned) = nullptr;
  CUresult (*event_record)(CUevent, CUstream) = nullptr;
  CUresult (*event_synchronize)(CUevent) = nullptr;
  CUresult (*event_elapsed)(float*, CUevent, CUevent) = nullptr;
  CUresult (*event_destroy)(CUevent) = nullptr;
  CUresult (*memcpy_htod)(CUdeviceptr, const void*, size_t) = nullptr;
};

inline void* find(const char* symbol, std::initializer_list<const char*> libraries) {
  if (void* f = dlsym(RTLD_DEFAULT, symbol)) {
    return f;
  }
  for (const char* lib : libraries) {
    if (void* h = dlopen(lib, RTLD_NOW | RTLD_GLOBAL)) {
      if (void* f = dlsym(h, symbol)) {
        return f;
      }
    }
  }
  throw std::runtime_error(std::string("laya: CUDA symbol not found: ") + symbol);
}

inline const Api& api() {
  static Api a = [] {
    Api a;
    auto nvrtc = {"libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"};
    auto driver = {"libcuda.so.1", "libcuda.so"};
    auto get = [](auto& f, const char* name, std::initializer_list<const char*> libs) {
      f = reinterpret_cast<std::remove_reference_t<decltype(f)>>(find(name, libs));
    };
    get(a.create, "nvrtcCreateProgram", nvrtc);
    get(a.compile, "nvrtcCompileProgram", nvrtc);
    get(a.cubin_size, "nvrtcGetCUBINSize", nvrtc);
    get(a.cubin, "nvrtcGetCUBIN", nvrtc);
    get(a.log_size, "nvrtcGetProgramLogSize", nvrtc);
    get(a.log, "nvrtcGetProgramLog", nvrtc);
    get(a.destroy, "nvrtcDestroyProgram", nvrtc);
    get(a.version, "nvrtcVersion", nvrtc);
    get(a.load, "cuModuleLoadData", driver);
    get(a.function, "cuModuleGetFunction", driver);
    get(a.mem_alloc, "cuMemAlloc_v2", driver);
    get(a.mem_free, "cuMemFree_v2", driver);
    get(a.memset_d8, "cuMemsetD8_v2", driver);
    get(a.graph_create, "cuGraphCreate", driver);
    get(a.graph_add_kernel_node, "cuGraphAddKernelNode_v2", driver);
    get(a.graph_instantiate, "cuGraphInstantiateWithFlags", driver);
    get(a.graph_launch, "cuGraphLaunch", driver);
    get(a.graph_destroy, "cuGraphDestroy", driver);
    get(a.graph_exec_destroy, "cuGraphExecDestroy", driver);
    get(a.ctx_synchronize, "cuCtxSynchronize", driver);
    get(a.launch, "cuLaunchKernel", driver);
    get(a.event_create, "cuEventCreate", driver);
    get(a.event_record, "cuEventRecord", driver);
    get(a.event_synchronize, "cuEventSynchronize", driver);
    get(a.event_elapsed, "cuEventElapsedTime", driver);
    get(a.event_destroy, "cuEventDestroy_v2", driver);
    get(a.memcpy_htod, "cuMemcpyHtoD_v2", driver);
    return a;
  }();
  return a;
}

inline void check(CUresult r, const char* what) {
  if (r != CUDA_SUCCESS) {
    throw std::runtime_error(std::string("laya: ") + what + " failed (CUresult " + std::to_string(r) + ")");
  }
}

// Milliseconds laya's kernels took to compile and load in this process, all sources together.
inline std::atomic<double> compile_ms{0.0};

// `source` compiled by NVRTC with `options`: the binary for the device.
inline std::vector<char> compile_cubin(const char* source, const char* name, const std::vector<std::string>& options) {
  const Api& c = api();
  void* prog = nullptr;
  if (c.create(&prog, source, name, 0, nullptr, nullptr) != 0) {
    throw std::runtime_error(std::string("laya: nvrtcCreateProgram failed for ") + name);
  }
  std::vector<const char*> argv;
  for (const auto& o : options) {
    argv.push_back(o.c_str());
  }
  if (c.compile(prog, static_cast<int>(argv.size()), argv.data()) != 0) {
    size_t n = 0;
    c.log_size(prog, &n);
    std::string log(n, '\0');
    c.log(prog, log.data());
    c.destroy(&prog);
    throw std::runtime_error(std::string("laya: ") + name + " did not compile: " + log);
  }
  size_t n = 0;
  c.cubin_size(prog, &n);
  std::vector<char> cubin(n);
  c.cubin(prog, cubin.data());
  c.destroy(&prog);
  return cubin;
}

// Where compiled kernels are kept between processes: $LAYA_CACHE_DIR/kernels, else laya's
// folder in $XDG_CACHE_HOME or ~/.cache (the cache folder of the rest of laya). Empty: none.
inline std::filesystem::path kernel_cache() {
  namespace fs = std::filesystem;
  if (const char* d = std::getenv("LAYA_CACHE_DIR"); d && *d) {
    return fs::path(d) / "kernels";
  }
  if (const char* d = std::getenv("XDG_CACHE_HOME"); d && *d) {
    return fs::path(d) / "laya" / "kernels";
  }
  if (const char* d = std::getenv("HOME"); d && *d) {
    return fs::path(d) / ".cache" / "laya" / "kernels";
  }
  return {};
}

inline std::vector<char> read_file(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return in ? std::vector<char>(std::istreambuf_iterator<char>(in), {}) : std::vector<char>{};
}

// Writes `bytes` to `p` whole or not at all (a temporary file renamed); failures are ignored:
// the cache only saves the next process a compile.
inline void write_file(const std::filesystem::path& p, const std::vector<char>& bytes) {
  std::error_code ec;
  std::filesystem::create_directories(p.parent_path(), ec);
  auto tmp = p;
  tmp += ".tmp" + std::to_string(getpid());
  {
    std::ofstream out(tmp, std::ios::binary);
    if (!out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()))) {
      std::filesystem::remove(tmp, ec);
      return;
    }
  }
  std::filesystem::rename(tmp, p, ec);
  if (ec) {
    std::filesystem::remove(tmp, ec);
  }
}

// `source` compiled for `device`'s architecture with `options` and loaded: its module. The
// binary is kept in kernel_cache() under a hash of the source, the options and the NVRTC
// version, so a process after the first loads it without compiling.
inline CUmodule compile(const char* source, const char* name, mlx::core::cu::Device& device,
                        const std::vector<std::string>& options = {}) {
  const auto start = std::chrono::steady_clock::now();
  const Api& c = api();
  std::vector<std::string> all{
      "--gpu-architecture=sm_" + std::to_string(device.compute_capability_major()) +
          std::to_string(device.compute_capability_minor()),
      "--std=c++17"};
  all.insert(all.end(), options.begin(), options.end());
  int major = 0, minor = 0;
  c.version(&major, &minor);
  std::string key = std::string(source) + "\n" + std::to_string(major) + "." + std::to_string(minor);
  for (const auto& o : all) {
    key += "\n" + o;
  }
  const auto dir = kernel_cache();
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016zx", std::hash<std::string>{}(key));
  const auto cached = dir.empty() ? dir : dir / (std::string(name) + "-" + hex + ".cubin");
  std::vector<char> cubin = cached.empty() ? std::vector<char>{} : read_file(cached);
  device.make_current();
  CUmodule module = nullptr;
  // A kept binary that does not load (cut short, another driver's) is compiled again.
  if (cubin.empty() || c.load(&module, cubin.data()) != CUDA_SUCCESS) {
    cubin = compile_cubin(source, name, all);
    if (!cached.empty()) {
      write_file(cached, cubin);
    }
    device.make_current();
    check(c.load(&module, cubin.data()), "cuModuleLoadData");
  }
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  compile_ms.fetch_add(ms);
  return module;
}

inline CUfunction kernel(CUmodule module, const char* name) {
  CUfunction f = nullptr;
  if (api().function(&f, module, name) != CUDA_SUCCESS) {
    throw std::runtime_error(std::string("laya: no kernel ") + name);
  }
  return f;
}

} // namespace laya::cuda

#endif // LAYA_CUDA
