// The K/V buffers a primitive of laya's hands back: the input buffers themselves when the
// caller says nothing else holds them (the cache's ownership token: MLX's own test,
// is_donatable, never passes for an input of a primitive with several outputs, since each
// output holds the inputs), else copies made first (a task on the CPU stream, or a node of
// MLX's CUDA graph).
#pragma once

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>

#include "mlx/allocator.h"
#include "mlx/array.h"
#include "mlx/backend/cpu/encoder.h"

#include "laya_cuda.h"

namespace laya {

// Buffers copied rather than written in place by primitives evaluated on this thread.
inline thread_local uint64_t kv_copies = 0;

// Whether `out` must be a copy of `in` (else it is made `in` itself).
inline bool kv_needs_copy(const mlx::core::array& in, mlx::core::array& out, bool in_place, const char* who) {
  if (!in.flags().row_contiguous) {
    // The cache's buffers are made row-contiguous (zeros, concatenation): a copy of bytes is a
    // copy of the array.
    throw std::runtime_error(std::string(who) + ": a KV buffer that is not row-contiguous");
  }
  if (in_place) {
    out.copy_shared_buffer(in);
    return false;
  }
  ++kv_copies;
  out.set_data(mlx::core::allocator::malloc(out.nbytes()));
  return true;
}

// `out` for buffer `in`, on the CPU stream of `enc`.
inline void kv_out_cpu(const mlx::core::array& in, mlx::core::array& out, bool in_place,
                       mlx::core::cpu::CommandEncoder& enc, const char* who) {
  namespace mx = mlx::core;
  if (kv_needs_copy(in, out, in_place, who)) {
    enc.dispatch([src = mx::array::unsafe_weak_copy(in), dst = mx::array::unsafe_weak_copy(out)]() mutable {
      std::memcpy(dst.data<char>(), src.data<char>(), src.nbytes());
    });
  }
}

#ifdef LAYA_CUDA

// `out` for buffer `in` on the CUDA stream of `enc`: a copy is a node ordered after the writers
// of `in` (its input set just before it) and before the readers of `out`.
inline void kv_out_gpu(const mlx::core::array& in, mlx::core::array& out, bool in_place,
                       mlx::core::cu::CommandEncoder& enc, const char* who) {
  namespace mx = mlx::core;
  if (!kv_needs_copy(in, out, in_place, who)) {
    return;
  }
  static const char* source = R"(
extern "C" __global__ void laya_copy_words(const unsigned int* src, unsigned int* dst, long long n) {
  const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) dst[i] = src[i];
})";
  static const CUfunction copy = cuda::kernel(cuda::compile(source, "laya_copy_words.cu", enc.device()), "laya_copy_words");
  long long words = static_cast<long long>(in.nbytes() / 4);
  const void* s = mx::gpu_ptr<void>(const_cast<mx::array&>(in));
  void* d = mx::gpu_ptr<void>(out);
  const unsigned threads = 256;
  const unsigned blocks = static_cast<unsigned>((words + threads - 1) / threads);
  enc.set_input_array(in);
  enc.set_output_array(out);
  enc.add_kernel_node(copy, dim3(blocks), dim3(threads), s, d, words);
}

#endif // LAYA_CUDA

} // namespace laya
