// What laya's primitives share with the Rust side: the time their kernels took to compile and
// the K/V buffers they copied.

#include <cstdint>

#include "kv_buffers.h"
#include "laya_cuda.h"

// Milliseconds laya's CUDA kernels took to compile (or load from laya's cache) in this process
// (0: not yet, or not a CUDA build).
extern "C" double laya_primitives_compile_ms() {
#ifdef LAYA_CUDA
  return laya::cuda::compile_ms.load();
#else
  return 0.0;
#endif
}

// K/V buffers laya's primitives evaluated on this thread copied rather than wrote in place.
extern "C" uint64_t laya_kv_copies() {
  return laya::kv_copies;
}
