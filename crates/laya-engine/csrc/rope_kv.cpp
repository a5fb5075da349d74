// laya's own MLX primitive for the attention input of a step: NEOX RoPE on the q and k heads,
// and k and v written into the layer's KV buffers in place. It is MLX's extension mechanism:
// a Primitive compiled against the linked MLX's headers, with no MLX rebuild.
//
// Inputs:  heads [B, H + 2 KV, L, D] (the q heads, then the k heads, then the v heads; any
//          strides), k_buf and v_buf [B, KV, Cap, D] (row-contiguous, Cap >= offset + L).
// Outputs: 0 q [B, H, L, D], roped;
//          1, 2 the k and v buffers with positions [offset, offset + L) written: the input
//               buffers themselves when the caller says nothing else holds them, else copies;
//          3, 4 views [B, KV, offset + L, D] of them (what attention reads).
//
// One primitive stands for the split, the RoPE, the two slice updates and the two slices of
// the MLX-ops path (crates/laya-engine/src/models/rope_kv.rs), which stays the reference.
// The CUDA kernel is compiled at first use with NVRTC (the one MLX loaded) for the device's
// architecture; the CPU evaluation is plain loops (tests compare both with the ops).

#include <cmath>
#include <cstdio>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "mlx/allocator.h"
#include "mlx/array.h"
#include "mlx/backend/common/utils.h"
#include "mlx/backend/cpu/encoder.h"
#include "mlx/c/private/array.h"
#include "mlx/c/private/stream.h"
#include "mlx/primitives.h"

#include "kv_buffers.h"
#include "laya_cuda.h"

namespace mx = mlx::core;

namespace laya {

namespace {

// `view` [B, KV, len, D] over the row-contiguous buffer `buf` [B, KV, Cap, D], as MLX's
// slices are made (the same strides, the flags of what the view spans).
void prefix_view(const mx::array& buf, mx::array& view) {
  const auto& strides = buf.strides();
  auto [no_bsx_size, row_contiguous, col_contiguous] =
      mx::check_contiguity(view.shape(), strides);
  size_t data_end = 1;
  for (int i = 0; i < view.ndim(); ++i) {
    if (view.shape(i) > 0) {
      data_end += strides[i] * (view.shape(i) - 1);
    }
  }
  auto flags = buf.flags();
  flags.row_contiguous = row_contiguous;
  flags.col_contiguous = col_contiguous;
  flags.contiguous = no_bsx_size == data_end;
  view.copy_shared_buffer(buf, strides, flags, data_end, 0);
}

// The angle MLX's RoPE uses for pair `j` of `half` at position `pos`.
inline float angle(int pos, int j, int half, float log2_theta) {
  const float d = static_cast<float>(j) / static_cast<float>(half);
  return static_cast<float>(pos) * std::exp2(-d * log2_theta);
}

template <typename T>
void rope_kv_cpu(
    const T* heads,
    const int64_t* hs,
    T* q,
    T* kbuf,
    T* vbuf,
    int B,
    int H,
    int KV,
    int L,
    int D,
    int cap,
    int offset,
    float log2_theta) {
  const int half = D / 2;
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < H + 2 * KV; ++h) {
      for (int l = 0; l < L; ++l) {
        const T* x = heads + b * hs[0] + h * hs[1] + l * hs[2];
        T* o;
        if (h < H) {
          o = q + ((static_cast<int64_t>(b) * H + h) * L + l) * D;
        } else if (h < H + KV) {
          o = kbuf + ((static_cast<int64_t>(b) * KV + (h - H)) * cap + offset + l) * D;
        } else {
          o = vbuf + ((static_cast<int64_t>(b) * KV + (h - H - KV)) * cap + offset + l) * D;
        }
        for (int j = 0; j < half; ++j) {
          const float x1 = static_cast<float>(x[j * hs[3]]);
          const float x2 = static_cast<float>(x[(j + half) * hs[3]]);
          if (h < H + KV) {
            const float a = angle(offset + l, j, half, log2_theta);
            const float c = std::cos(a), s = std::sin(a);
            o[j] = static_cast<T>(x1 * c - x2 * s);
            o[j + half] = static_cast<T>(x1 * s + x2 * c);
          } else {
            o[j] = static_cast<T>(x1);
            o[j + half] = static_cast<T>(x2);
          }
        }
      }
    }
  }
}

#ifdef LAYA_CUDA

// The kernel, one thread a pair (j, j + D/2) of one head at one position. No includes: bf16
// and f16 convert by hand (round to nearest even), so NVRTC needs no CUDA headers.
const char* kSource = R"(
__device__ inline float ld(const float* p) { return *p; }
__device__ inline void st(float* p, float v) { *p = v; }
struct bf16 { unsigned short bits; };
__device__ inline float ld(const bf16* p) { return __uint_as_float(((unsigned int)p->bits) << 16); }
__device__ inline void st(bf16* p, float v) {
  unsigned int u = __float_as_uint(v);
  if ((u & 0x7fffffffu) > 0x7f800000u) { p->bits = 0x7fc0; return; }
  u += 0x7fffu + ((u >> 16) & 1u);
  p->bits = (unsigned short)(u >> 16);
}
struct f16 { unsigned short bits; };
__device__ inline float ld(const f16* p) { float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(p->bits)); return f; }
__device__ inline void st(f16* p, float v) { unsigned short h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(v)); p->bits = h; }

template <typename T>
__device__ void rope_kv(const T* heads, long long s0, long long s1, long long s2, long long s3,
                        T* q, T* kbuf, T* vbuf, int H, int KV, int L, int D, int cap,
                        int offset, float log2_theta) {
  const int half = D / 2;
  const int j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= half) return;
  const int h = blockIdx.y;
  const int b = blockIdx.z / L, l = blockIdx.z % L;
  const T* x = heads + b * s0 + h * s1 + l * s2;
  const float x1 = ld(x + j * s3), x2 = ld(x + (j + half) * s3);
  T* o;
  if (h < H) {
    o = q + (((long long)b * H + h) * L + l) * D;
  } else if (h < H + KV) {
    o = kbuf + (((long long)b * KV + (h - H)) * cap + offset + l) * D;
  } else {
    o = vbuf + (((long long)b * KV + (h - H - KV)) * cap + offset + l) * D;
    st(o + j, x1);
    st(o + j + half, x2);
    return;
  }
  const float d = (float)j / (float)half;
  const float a = (float)(offset + l) * exp2f(-d * log2_theta);
  float s, c;
  sincosf(a, &s, &c);
  st(o + j, x1 * c - x2 * s);
  st(o + j + half, x1 * s + x2 * c);
}

#define LAYA_ROPE_KV(NAME, T)                                                              \
  extern "C" __global__ void NAME(const T* heads, long long s0, long long s1, long long s2, \
                                  long long s3, T* q, T* kbuf, T* vbuf, int H, int KV,      \
                                  int L, int D, int cap, int offset, float log2_theta) {    \
    rope_kv<T>(heads, s0, s1, s2, s3, q, kbuf, vbuf, H, KV, L, D, cap, offset, log2_theta); \
  }
LAYA_ROPE_KV(laya_rope_kv_f32, float)
LAYA_ROPE_KV(laya_rope_kv_bf16, bf16)
LAYA_ROPE_KV(laya_rope_kv_f16, f16)

)";

struct Kernels {
  CUfunction f32 = nullptr, bf16 = nullptr, f16 = nullptr;
};

// The kernels for `device`, compiled once for its architecture (a function-local static:
// initialized once, other threads wait for it).
const Kernels& kernels(mx::cu::Device& device) {
  static const Kernels k = [&] {
    CUmodule module = cuda::compile(kSource, "laya_rope_kv.cu", device);
    Kernels k;
    k.f32 = cuda::kernel(module, "laya_rope_kv_f32");
    k.bf16 = cuda::kernel(module, "laya_rope_kv_bf16");
    k.f16 = cuda::kernel(module, "laya_rope_kv_f16");
    return k;
  }();
  return k;
}

#endif // LAYA_CUDA

class RopeKvWrite : public mx::Primitive {
 public:
  RopeKvWrite(mx::Stream s, int heads, int kv_heads, int offset, float theta, bool in_place)
      : mx::Primitive(s),
        heads_(heads),
        kv_(kv_heads),
        offset_(offset),
        log2_theta_(std::log2(theta)),
        in_place_(in_place) {}

  void eval_cpu(const std::vector<mx::array>& in, std::vector<mx::array>& out) override {
    const auto& heads = in[0];
    auto& q = out[0];
    q.set_data(mx::allocator::malloc(q.nbytes()));
    auto& enc = mx::cpu::get_command_encoder(stream());
    // The copies, if any, and the write run as the stream's tasks, after the inputs are ready.
    for (int i : {1, 2}) {
      kv_out_cpu(in[i], out[i], in_place_, enc, "laya rope_kv");
    }
    prefix_view(out[1], out[3]);
    prefix_view(out[2], out[4]);
    const int B = heads.shape(0), L = heads.shape(2), D = heads.shape(3);
    const int cap = out[1].shape(2);
    std::vector<int64_t> hs(heads.strides().begin(), heads.strides().end());
    enc.set_input_array(heads);
    enc.dispatch([heads = mx::array::unsafe_weak_copy(heads),
                  q = mx::array::unsafe_weak_copy(q),
                  k = mx::array::unsafe_weak_copy(out[1]),
                  v = mx::array::unsafe_weak_copy(out[2]),
                  hs,
                  B,
                  H = heads_,
                  KV = kv_,
                  L,
                  D,
                  cap,
                  offset = offset_,
                  lt = log2_theta_]() mutable {
      switch (heads.dtype()) {
        case mx::float32:
          rope_kv_cpu(heads.data<float>(), hs.data(), q.data<float>(), k.data<float>(),
                      v.data<float>(), B, H, KV, L, D, cap, offset, lt);
          break;
        case mx::bfloat16:
          rope_kv_cpu(heads.data<mx::bfloat16_t>(), hs.data(), q.data<mx::bfloat16_t>(),
                      k.data<mx::bfloat16_t>(), v.data<mx::bfloat16_t>(), B, H, KV, L, D, cap,
                      offset, lt);
          break;
        default:
          rope_kv_cpu(heads.data<mx::float16_t>(), hs.data(), q.data<mx::float16_t>(),
                      k.data<mx::float16_t>(), v.data<mx::float16_t>(), B, H, KV, L, D, cap,
                      offset, lt);
          break;
      }
    });
  }

  void eval_gpu(const std::vector<mx::array>& in, std::vector<mx::array>& out) override {
#ifdef LAYA_CUDA
    auto& enc = mx::cu::get_command_encoder(stream());
    const Kernels& k = kernels(enc.device());
    // The encoder orders a node after the nodes that wrote the arrays set as its inputs since
    // the node before it: so each node's inputs are set just before it.
    const auto& heads = in[0];
    auto& q = out[0];
    q.set_data(mx::allocator::malloc(q.nbytes()));
    for (int i : {1, 2}) {
      kv_out_gpu(in[i], out[i], in_place_, enc, "laya rope_kv");
    }
    prefix_view(out[1], out[3]);
    prefix_view(out[2], out[4]);
    // After the copies, if any: the write goes into the buffers they fill.
    enc.set_input_array(heads);
    enc.set_input_array(out[1]);
    enc.set_input_array(out[2]);
    for (int i : {0, 1, 2}) {
      enc.set_output_array(out[i]);
    }
    // Kernel arguments are passed by address: plain (non-const) locals.
    int B = heads.shape(0), L = heads.shape(2), D = heads.shape(3);
    int cap = out[1].shape(2);
    const auto& st = heads.strides();
    long long s0 = st[0], s1 = st[1], s2 = st[2], s3 = st[3];
    const void* hp = mx::gpu_ptr<void>(heads);
    void* qp = mx::gpu_ptr<void>(q);
    void* kp = mx::gpu_ptr<void>(out[1]);
    void* vp = mx::gpu_ptr<void>(out[2]);
    int H = heads_, KV = kv_, offset = offset_;
    float lt = log2_theta_;
    const int half = D / 2;
    const unsigned threads = half < 128 ? static_cast<unsigned>(half) : 128u;
    dim3 grid((half + threads - 1) / threads, H + 2 * KV, B * L);
    CUfunction f = heads.dtype() == mx::float32 ? k.f32
        : heads.dtype() == mx::bfloat16         ? k.bf16
                                                : k.f16;
    enc.add_kernel_node(
        f, grid, dim3(threads), hp, s0, s1, s2, s3, qp, kp, vp, H, KV, L, D, cap, offset, lt);
#else
    throw std::runtime_error("laya rope_kv: this build has no GPU kernel (not a CUDA build)");
#endif
  }

  const char* name() const override {
    return "LayaRopeKvWrite";
  }

  bool is_equivalent(const mx::Primitive& other) const override {
    auto* o = dynamic_cast<const RopeKvWrite*>(&other);
    return o && o->heads_ == heads_ && o->kv_ == kv_ && o->offset_ == offset_ &&
        o->log2_theta_ == log2_theta_ && o->in_place_ == in_place_;
  }

 private:
  int heads_;
  int kv_;
  int offset_;
  float log2_theta_;
  bool in_place_;
};

} // namespace

} // namespace laya

extern "C" int laya_rope_kv_write(
    mlx_array* outs,
    const mlx_array heads_c,
    const mlx_array k_buf_c,
    const mlx_array v_buf_c,
    int n_heads,
    int n_kv_heads,
    int offset,
    float theta,
    int in_place,
    const mlx_stream s,
    char* error,
    size_t error_len) {
  try {
    const auto& heads = mlx_array_get_(heads_c);
    const auto& k_buf = mlx_array_get_(k_buf_c);
    const auto& v_buf = mlx_array_get_(v_buf_c);
    if (heads.ndim() != 4 || heads.shape(1) != n_heads + 2 * n_kv_heads || heads.shape(3) % 2) {
      throw std::invalid_argument("laya rope_kv: heads must be [B, H + 2 KV, L, D] with D even");
    }
    const int B = heads.shape(0), L = heads.shape(2), D = heads.shape(3);
    if (k_buf.shape() != v_buf.shape() || k_buf.ndim() != 4 || k_buf.shape(0) != B ||
        k_buf.shape(1) != n_kv_heads || k_buf.shape(3) != D ||
        k_buf.shape(2) < offset + L || offset < 0) {
      throw std::invalid_argument("laya rope_kv: the buffers must be [B, KV, Cap, D] with Cap >= offset + L");
    }
    auto dt = heads.dtype();
    if ((dt != mx::float32 && dt != mx::bfloat16 && dt != mx::float16) || k_buf.dtype() != dt ||
        v_buf.dtype() != dt) {
      throw std::invalid_argument("laya rope_kv: heads and buffers must share a float dtype (f32, bf16, f16)");
    }
    auto& stream = mlx_stream_get_(s);
    auto prim = std::make_shared<laya::RopeKvWrite>(stream, n_heads, n_kv_heads, offset, theta, in_place != 0);
    mx::Shape view{B, n_kv_heads, offset + L, D};
    auto arrays = mx::array::make_arrays(
        {mx::Shape{B, n_heads, L, D}, k_buf.shape(), v_buf.shape(), view, view},
        {dt, dt, dt, dt, dt},
        prim,
        {heads, k_buf, v_buf});
    for (int i = 0; i < 5; ++i) {
      mlx_array_set_(outs[i], arrays[i]);
    }
  } catch (std::exception& e) {
    if (error && error_len) {
      std::snprintf(error, error_len, "%s", e.what());
    }
    return 1;
  }
  return 0;
}
