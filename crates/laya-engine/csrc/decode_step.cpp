// laya's decode step of a dense Qwen2/Qwen3 model as one MLX primitive: the embedding row,
// every layer (RMSNorm, the quantized products, RoPE with the K/V write into the cache in place,
// attention over the cache's filled length, SwiGLU, the residuals) and the head, for one token
// of one sequence.
//
// On CUDA the step is one CUDA graph of laya's own kernels, captured once for the model over
// buffers at fixed addresses and replayed every token: the host's cost of a step does not grow
// with the layer count. What changes from step to step (the token, the position, the logits'
// array, the KV buffers) goes into a small parameter block in device memory, written by one
// node of MLX's own graph just before the replay. The CPU evaluation is the same arithmetic
// in plain loops (the tests' view of the algorithm on machines without a GPU).
//
// Inputs:  0 tokens [1, 1] (int32 or uint32); then per layer its k and v buffers
//          [1, KV, Cap, D] (row-contiguous, Cap > offset).
// Outputs: 0 logits [1, vocab] f32; then per layer the k and v buffers with position `offset`
//          written: the input buffers themselves when the caller says nothing else holds them,
//          else copies.
//
// Weights are the plan's (`laya_step_plan_new`): MLX affine-quantized (4, 6 or 8 bits; groups
// of 32, 64 or 128), in the activations' float type. The ops path (crates/laya-engine/src/
// models) stays the reference; tests compare the two.

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "mlx/allocator.h"
#include "mlx/array.h"
#include "mlx/backend/cpu/encoder.h"
#include "mlx/c/private/array.h"
#include "mlx/c/private/stream.h"
#include "mlx/ops.h"
#include "mlx/primitives.h"
#include "mlx/transforms.h"

#include "kv_buffers.h"
#include "laya_cuda.h"

namespace mx = mlx::core;

namespace laya::step {

namespace {

constexpr int kMaxLayers = 128;
constexpr int kMaxGroupHeads = 8; // query heads a KV head
constexpr int kMaxHeadDim = 128;
constexpr int kSplits = 32; // position ranges attention splits the cache into

struct QLin {
  mx::array w{0.f}, scales{0.f}, biases{0.f};
  std::optional<mx::array> bias;
  int out = 0, in = 0, bits = 0, gs = 0;
};

struct Layer {
  mx::array in_norm{0.f}, post_norm{0.f};
  std::optional<mx::array> q_norm, k_norm;
  QLin qkv, o, gate_up, down;
};

struct Config {
  int hidden, heads, kv, head_dim, inter, vocab;
  float eps, theta;
};

#ifdef LAYA_CUDA
struct Gpu;
#endif

struct Plan {
  Config c;
  mx::Dtype dtype = mx::float32;
  QLin embed;
  std::vector<Layer> layers;
  std::optional<mx::array> norm;
  QLin head;
#ifdef LAYA_CUDA
  std::mutex mutex;
  std::unique_ptr<Gpu> gpu;
  ~Plan();
#endif
};

// --- The CPU evaluation: the kernels' arithmetic, in loops -------------------------------

template <typename T>
inline float rt(float v) {
  return static_cast<float>(static_cast<T>(v));
}

template <typename T>
inline float at(const mx::array& a, int64_t i) {
  return static_cast<float>(a.data<T>()[i]);
}

inline uint32_t quant(const uint32_t* row, int i, int bits) {
  const int bit = i * bits, word = bit >> 5, sh = bit & 31;
  uint32_t v = row[word] >> sh;
  if (sh + bits > 32) {
    v |= row[word + 1] << (32 - sh);
  }
  return v & ((1u << bits) - 1u);
}

// Row `row` of `q` times `x` (times `nw` elementwise when given; `ss` then gets Σ x²).
template <typename T>
float row_dot(const QLin& q, int row, const float* x, const mx::array* nw, float* ss) {
  const uint32_t* wr = q.w.data<uint32_t>() + static_cast<int64_t>(row) * (q.in * q.bits / 32);
  const int groups = q.in / q.gs;
  float acc = 0.f, sq = 0.f;
  for (int g = 0; g < groups; ++g) {
    float dq = 0.f, dx = 0.f;
    for (int i = g * q.gs; i < (g + 1) * q.gs; ++i) {
      float xv = x[i];
      if (nw) {
        sq += xv * xv;
        xv *= at<T>(*nw, i);
      }
      dq += xv * static_cast<float>(quant(wr, i, q.bits));
      dx += xv;
    }
    const int64_t s = static_cast<int64_t>(row) * groups + g;
    acc += at<T>(q.scales, s) * dq + at<T>(q.biases, s) * dx;
  }
  if (ss) {
    *ss = sq;
  }
  return acc;
}

inline float angle(int pos, int j, int half, float log2_theta) {
  return static_cast<float>(pos) * std::exp2(-(static_cast<float>(j) / half) * log2_theta);
}

template <typename T>
void step_cpu(const Plan& p, uint32_t token, int offset, std::vector<T*>& k, std::vector<T*>& v,
              const std::vector<int>& cap, float* logits) {
  const Config& c = p.c;
  const int H = c.heads, KV = c.kv, D = c.head_dim, half = D / 2, G = H / KV;
  const float lt = std::log2(c.theta), scale = 1.f / std::sqrt(static_cast<float>(D));
  std::vector<float> h(c.hidden), qkv((H + 2 * KV) * D), attn(H * D), act(c.inter);
  {
    const QLin& e = p.embed;
    token = std::min<uint32_t>(token, e.out - 1);
    const uint32_t* wr = e.w.data<uint32_t>() + static_cast<int64_t>(token) * (e.in * e.bits / 32);
    const int groups = e.in / e.gs;
    for (int i = 0; i < e.in; ++i) {
      const int64_t s = static_cast<int64_t>(token) * groups + i / e.gs;
      h[i] = rt<T>(at<T>(e.scales, s) * quant(wr, i, e.bits) + at<T>(e.biases, s));
    }
  }
  auto normed_dot = [&](const QLin& q, int row, const mx::array& nw) {
    float ss = 0.f;
    const float acc = row_dot<T>(q, row, h.data(), &nw, &ss);
    return acc / std::sqrt(ss / q.in + c.eps);
  };
  for (size_t l = 0; l < p.layers.size(); ++l) {
    const Layer& L = p.layers[l];
    for (int r = 0; r < (H + 2 * KV) * D; ++r) {
      float y = normed_dot(L.qkv, r, L.in_norm);
      if (L.qkv.bias) {
        y += at<T>(*L.qkv.bias, r);
      }
      qkv[r] = rt<T>(y);
    }
    for (int head = 0; head < H + 2 * KV; ++head) {
      float* o = qkv.data() + head * D;
      const std::optional<mx::array>& hn = head < H ? L.q_norm : L.k_norm;
      if (head < H + KV && hn) {
        float ss = 0.f;
        for (int j = 0; j < D; ++j) {
          ss += o[j] * o[j];
        }
        const float r = 1.f / std::sqrt(ss / D + c.eps);
        for (int j = 0; j < D; ++j) {
          o[j] = rt<T>(o[j] * r * at<T>(*hn, j));
        }
      }
      if (head < H + KV) {
        for (int j = 0; j < half; ++j) {
          const float a = angle(offset, j, half, lt), cs = std::cos(a), sn = std::sin(a);
          const float x1 = o[j], x2 = o[j + half];
          o[j] = rt<T>(x1 * cs - x2 * sn);
          o[j + half] = rt<T>(x1 * sn + x2 * cs);
        }
      }
      if (head >= H) {
        const int kvh = head < H + KV ? head - H : head - H - KV;
        T* buf = (head < H + KV ? k[l] : v[l]) + (static_cast<int64_t>(kvh) * cap[l] + offset) * D;
        for (int j = 0; j < D; ++j) {
          buf[j] = static_cast<T>(o[j]);
        }
      }
    }
    std::vector<float> s(offset + 1);
    for (int head = 0; head < H; ++head) {
      const int kvh = head / G;
      const T* kb = k[l] + static_cast<int64_t>(kvh) * cap[l] * D;
      const T* vb = v[l] + static_cast<int64_t>(kvh) * cap[l] * D;
      const float* q = qkv.data() + head * D;
      float m = -INFINITY;
      for (int t = 0; t <= offset; ++t) {
        float d = 0.f;
        for (int j = 0; j < D; ++j) {
          d += q[j] * scale * static_cast<float>(kb[static_cast<int64_t>(t) * D + j]);
        }
        s[t] = d;
        m = std::max(m, d);
      }
      float den = 0.f;
      for (int t = 0; t <= offset; ++t) {
        s[t] = std::exp(s[t] - m);
        den += s[t];
      }
      for (int j = 0; j < D; ++j) {
        float num = 0.f;
        for (int t = 0; t <= offset; ++t) {
          num += s[t] * static_cast<float>(vb[static_cast<int64_t>(t) * D + j]);
        }
        attn[head * D + j] = rt<T>(num / den);
      }
    }
    for (int r = 0; r < c.hidden; ++r) {
      h[r] = rt<T>(h[r] + rt<T>(row_dot<T>(L.o, r, attn.data(), nullptr, nullptr)));
    }
    for (int j = 0; j < c.inter; ++j) {
      const float g = rt<T>(normed_dot(L.gate_up, j, L.post_norm));
      const float u = rt<T>(normed_dot(L.gate_up, j + c.inter, L.post_norm));
      act[j] = rt<T>(rt<T>(g / (1.f + std::exp(-g))) * u);
    }
    for (int r = 0; r < c.hidden; ++r) {
      h[r] = rt<T>(h[r] + rt<T>(row_dot<T>(L.down, r, act.data(), nullptr, nullptr)));
    }
  }
  for (int r = 0; r < c.vocab; ++r) {
    logits[r] = rt<T>(normed_dot(p.head, r, *p.norm));
  }
}

// --- CUDA: the kernels, the graph, the replay ---------------------------------------------

#ifdef LAYA_CUDA

// Compiled with -DLAYA_T=<float|bf16|f16>, the plan's float type. No includes (NVRTC needs
// no CUDA headers): bf16 and f16 convert by hand.
const char* kSource = R"(
struct bf16 { unsigned short bits; };
struct f16 { unsigned short bits; };
__device__ inline float ld(const float* p) { return *p; }
__device__ inline void st(float* p, float v) { *p = v; }
__device__ inline float ld(const bf16* p) { return __uint_as_float(((unsigned int)p->bits) << 16); }
__device__ inline void st(bf16* p, float v) {
  unsigned int u = __float_as_uint(v);
  if ((u & 0x7fffffffu) > 0x7f800000u) { p->bits = 0x7fc0; return; }
  u += 0x7fffu + ((u >> 16) & 1u);
  p->bits = (unsigned short)(u >> 16);
}
__device__ inline float ld(const f16* p) { float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(p->bits)); return f; }
__device__ inline void st(f16* p, float v) { unsigned short h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(v)); p->bits = h; }

typedef LAYA_T T;
__device__ inline float rt(float v) { T t; st(&t, v); return ld(&t); }

#define MAX_LAYERS 128
#define NEG_INF (__int_as_float(0xff800000))
#define MAX_G 8

struct Params {
  const unsigned* tokens;
  float* logits;
  int offset;
  int pad;
  T* k[MAX_LAYERS];
  T* v[MAX_LAYERS];
  int cap[MAX_LAYERS];
};

struct QL {
  const unsigned* w;
  const T* s;
  const T* b;
  const T* bias;
  int out, in, gs, bits;
};

__device__ inline float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// 16 floats from p (64-byte aligned) into v.
__device__ inline void load16(const float* p, float* v) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float4 f = ((const float4*)p)[i];
    v[4 * i] = f.x; v[4 * i + 1] = f.y; v[4 * i + 2] = f.z; v[4 * i + 3] = f.w;
  }
}
__device__ inline float lo16(const bf16*, unsigned u) { return __uint_as_float(u << 16); }
__device__ inline float hi16(const bf16*, unsigned u) { return __uint_as_float(u & 0xffff0000u); }
__device__ inline float lo16(const f16*, unsigned u) { f16 h; h.bits = (unsigned short)(u & 0xffffu); return ld(&h); }
__device__ inline float hi16(const f16*, unsigned u) { f16 h; h.bits = (unsigned short)(u >> 16); return ld(&h); }
// 16 values of a 2-byte float type from p (32-byte aligned) into v.
template <typename H>
__device__ inline void load16(const H* p, float* v) {
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const uint4 u = ((const uint4*)p)[i];
    const unsigned w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) { v[8 * i + 2 * j] = lo16(p, w[j]); v[8 * i + 2 * j + 1] = hi16(p, w[j]); }
  }
}

// Row `row` of q times x (times nw elementwise when given; *ss then gets the warp's Σ x²),
// summed over the warp: every lane returns the whole dot product. A lane reads a chunk of the
// row at a time, 16 bytes of weights (48 at 6 bits: 64 values), and works through it 16
// values (one group's share) at a time.
template <int BITS>
__device__ float row_dot(const QL& q, int row, const float* x, const T* nw, float* ss) {
  constexpr int WORDS = BITS == 6 ? 12 : 4;
  constexpr int VALS = WORDS * 32 / BITS;
  const int chunks = q.in / VALS;
  const int groups = q.in / q.gs;
  const uint4* wr = (const uint4*)(q.w + (long long)row * (q.in * BITS / 32));
  const T* sr = q.s + (long long)row * groups;
  const T* br = q.b + (long long)row * groups;
  const int lane = threadIdx.x & 31;
  float acc = 0.f, sq = 0.f;
#pragma unroll 2
  for (int c = lane; c < chunks; c += 32) {
    unsigned wd[WORDS];
#pragma unroll
    for (int i = 0; i < WORDS / 4; ++i) {
      const uint4 u = wr[c * (WORDS / 4) + i];
      wd[4 * i] = u.x; wd[4 * i + 1] = u.y; wd[4 * i + 2] = u.z; wd[4 * i + 3] = u.w;
    }
#pragma unroll
    for (int sub = 0; sub < VALS / 16; ++sub) {
      const int base = c * VALS + sub * 16;
      float xv[16];
      load16(x + base, xv);
      if (nw) {
        float w16[16];
        load16(nw + base, w16);
#pragma unroll
        for (int k = 0; k < 16; ++k) { sq += xv[k] * xv[k]; xv[k] *= w16[k]; }
      }
      float dq = 0.f, dx = 0.f;
#pragma unroll
      for (int k = 0; k < 16; ++k) {
        const int bit = (sub * 16 + k) * BITS;
        unsigned v = wd[bit >> 5] >> (bit & 31);
        if ((bit & 31) + BITS > 32) v |= wd[(bit >> 5) + 1] << (32 - (bit & 31));
        v &= (1u << BITS) - 1u;
        dq += xv[k] * (float)v;
        dx += xv[k];
      }
      const int g = base / q.gs;
      acc += ld(sr + g) * dq + ld(br + g) * dx;
    }
  }
  acc = warp_sum(acc);
  if (nw) *ss = warp_sum(sq);
  return acc;
}

extern "C" __global__ void laya_step_set(Params* dst, Params src) {
  const unsigned* s = (const unsigned*)&src;
  unsigned* d = (unsigned*)dst;
  for (int i = threadIdx.x; i < (int)(sizeof(Params) / 4); i += blockDim.x) d[i] = s[i];
}

// The token's row of the embedding table, dequantized, into h (f32 holding T's values).
extern "C" __global__ void laya_step_embed(const Params* P, QL e, float* h) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= e.in) return;
  unsigned tok = *P->tokens;
  if (tok >= (unsigned)e.out) tok = e.out - 1;
  const unsigned* wr = e.w + (long long)tok * (e.in * e.bits / 32);
  const int bit = i * e.bits;
  unsigned v = wr[bit >> 5] >> (bit & 31);
  if ((bit & 31) + e.bits > 32) v |= wr[(bit >> 5) + 1] << (32 - (bit & 31));
  v &= (1u << e.bits) - 1u;
  const long long g = (long long)tok * (e.in / e.gs) + i / e.gs;
  h[i] = rt(ld(e.s + g) * (float)v + ld(e.b + g));
}

// One block a head of q, k and v (its D values of qkv): Qwen3's per-head norm, RoPE at the
// step's position; q into qout (f32), k and v into the layer's cache.
extern "C" __global__ void laya_step_rope(const Params* P, int layer, const float* qkv, const T* qn,
                                          const T* kn, float eps, int H, int KV, int D,
                                          float log2_theta, float* qout) {
  __shared__ float o[128];
  __shared__ float red[32];
  const int head = blockIdx.x;
  const int warp = threadIdx.x >> 5, warps = blockDim.x >> 5, lane = threadIdx.x & 31;
  for (int j = threadIdx.x; j < D; j += blockDim.x) o[j] = qkv[head * D + j];
  __syncthreads();
  const T* hn = head < H ? qn : kn;
  if (head < H + KV && hn) {
    float part = 0.f;
    for (int j = threadIdx.x; j < D; j += blockDim.x) part += o[j] * o[j];
    part = warp_sum(part);
    if (lane == 0) red[warp] = part;
    __syncthreads();
    float tot = 0.f;
    for (int w = 0; w < warps; ++w) tot += red[w];
    const float r = rsqrtf(tot / D + eps);
    for (int j = threadIdx.x; j < D; j += blockDim.x) o[j] = rt(o[j] * r * ld(hn + j));
    __syncthreads();
  }
  const int pos = P->offset, half = D / 2;
  if (head < H + KV) {
    T* kb = head < H ? nullptr : P->k[layer] + ((long long)(head - H) * P->cap[layer] + pos) * D;
    for (int j = threadIdx.x; j < half; j += blockDim.x) {
      const float a = (float)pos * exp2f(-((float)j / (float)half) * log2_theta);
      float sn, cs;
      sincosf(a, &sn, &cs);
      const float x1 = o[j], x2 = o[j + half];
      const float y1 = x1 * cs - x2 * sn, y2 = x1 * sn + x2 * cs;
      if (head < H) {
        qout[head * D + j] = rt(y1);
        qout[head * D + j + half] = rt(y2);
      } else {
        st(kb + j, y1);
        st(kb + j + half, y2);
      }
    }
  } else {
    T* vb = P->v[layer] + ((long long)(head - H - KV) * P->cap[layer] + pos) * D;
    for (int j = threadIdx.x; j < D; j += blockDim.x) st(vb + j, o[j]);
  }
}

// Attention of the query heads of one KV head over one of S ranges of the cache's positions
// [0, offset]: per query head the range's running max, sum and weighted values.
template <int E>
__device__ void attn_part(const Params* P, int layer, const float* q, float* part, int H, int KV,
                          int D, int S, float scale) {
  const int kvh = blockIdx.x, s = blockIdx.y, G = H / KV;
  const int L = P->offset + 1;
  const int chunk = (L + S - 1) / S;
  const int t0 = s * chunk, t1 = min(L, t0 + chunk);
  const int warp = threadIdx.x >> 5, warps = blockDim.x >> 5, lane = threadIdx.x & 31;
  const long long cap = P->cap[layer];
  const T* kb = P->k[layer] + (long long)kvh * cap * D;
  const T* vb = P->v[layer] + (long long)kvh * cap * D;
  float qr[MAX_G][E], acc[MAX_G][E], m[MAX_G], l[MAX_G];
#pragma unroll
  for (int g = 0; g < MAX_G; ++g) {
#pragma unroll
    for (int e = 0; e < E; ++e) {
      const int d = lane + 32 * e;
      qr[g][e] = (g < G && d < D) ? q[(kvh * G + g) * D + d] * scale : 0.f;
      acc[g][e] = 0.f;
    }
    m[g] = NEG_INF;
    l[g] = 0.f;
  }
  for (int t = t0 + warp; t < t1; t += warps) {
    float kv[E], vv[E];
#pragma unroll
    for (int e = 0; e < E; ++e) {
      const int d = lane + 32 * e;
      kv[e] = d < D ? ld(kb + (long long)t * D + d) : 0.f;
      vv[e] = d < D ? ld(vb + (long long)t * D + d) : 0.f;
    }
#pragma unroll
    for (int g = 0; g < MAX_G; ++g) {
      if (g < G) {
        float sc = 0.f;
#pragma unroll
        for (int e = 0; e < E; ++e) sc += qr[g][e] * kv[e];
        sc = warp_sum(sc);
        const float mn = fmaxf(m[g], sc);
        const float c = __expf(m[g] - mn), p = __expf(sc - mn);
        l[g] = l[g] * c + p;
#pragma unroll
        for (int e = 0; e < E; ++e) acc[g][e] = acc[g][e] * c + p * vv[e];
        m[g] = mn;
      }
    }
  }
  __shared__ float sm[4][MAX_G], sl[4][MAX_G];
  __shared__ float sa[4][MAX_G][32 * E];
#pragma unroll
  for (int g = 0; g < MAX_G; ++g) {
    if (lane == 0) { sm[warp][g] = m[g]; sl[warp][g] = l[g]; }
#pragma unroll
    for (int e = 0; e < E; ++e) sa[warp][g][lane + 32 * e] = acc[g][e];
  }
  __syncthreads();
  for (int i = threadIdx.x; i < G * D; i += blockDim.x) {
    const int g = i / D, d = i % D;
    float M = NEG_INF;
    for (int w = 0; w < warps; ++w) M = fmaxf(M, sm[w][g]);
    float a = 0.f, den = 0.f;
    if (M > NEG_INF) {
      for (int w = 0; w < warps; ++w) {
        const float f = __expf(sm[w][g] - M);
        a += sa[w][g][d] * f;
        den += sl[w][g] * f;
      }
    }
    float* out = part + ((long long)(kvh * G + g) * S + s) * (D + 2);
    out[d] = a;
    if (d == 0) { out[D] = M; out[D + 1] = den; }
  }
}

// The S ranges of each query head joined: attention's output (T's values) into out.
extern "C" __global__ void laya_step_attn_join(const float* part, float* out, int D, int S) {
  const int head = blockIdx.x;
  const float* p = part + (long long)head * S * (D + 2);
  for (int d = threadIdx.x; d < D; d += blockDim.x) {
    float M = NEG_INF;
    for (int s = 0; s < S; ++s) M = fmaxf(M, p[s * (D + 2) + D]);
    float num = 0.f, den = 0.f;
    for (int s = 0; s < S; ++s) {
      const float* r = p + s * (D + 2);
      if (r[D] > NEG_INF) {
        const float f = __expf(r[D] - M);
        num += r[d] * f;
        den += r[D + 1] * f;
      }
    }
    out[head * D + d] = rt(num / den);
  }
}

// One warp a row of q times x (x normed by nw when given). mode 0: y[row] += the product (the
// residual); 1: the logits (f32, T's values); 2: SwiGLU of rows j and j + out/2 into y[j];
// 3: the product plus q's bias into y[row] (q, k and v before RoPE).
template <int BITS>
__device__ void qmv(const Params* P, const QL& q, const float* x, const T* nw, float eps, int mode,
                    float* y) {
  const int warps = blockDim.x >> 5;
  const int row = blockIdx.x * warps + (threadIdx.x >> 5);
  const int rows = mode == 2 ? q.out / 2 : q.out;
  if (row >= rows) return;
  float ss = 0.f;
  float acc = row_dot<BITS>(q, row, x, nw, &ss);
  const float scale = nw ? rsqrtf(ss / q.in + eps) : 1.f;
  if (mode == 2) {
    const float g = rt(acc * scale);
    const float u = rt(row_dot<BITS>(q, row + rows, x, nw, &ss) * scale);
    if ((threadIdx.x & 31) == 0) y[row] = rt(rt(g / (1.f + __expf(-g))) * u);
    return;
  }
  if ((threadIdx.x & 31) != 0) return;
  if (mode == 0) {
    y[row] = rt(y[row] + rt(acc));
  } else if (mode == 1) {
    P->logits[row] = rt(acc * scale);
  } else {
    y[row] = rt(acc * scale + (q.bias ? ld(q.bias + row) : 0.f));
  }
}

#define LAYA_BITS(B)                                                                              \
  extern "C" __global__ void laya_step_qmv##B(const Params* P, QL q, const float* x, const T* nw, \
      float eps, int mode, float* y) {                                                            \
    qmv<B>(P, q, x, nw, eps, mode, y);                                                            \
  }
LAYA_BITS(4)
LAYA_BITS(6)
LAYA_BITS(8)

#define LAYA_PART(E)                                                                              \
  extern "C" __global__ void laya_step_attn_part##E(const Params* P, int layer, const float* q,   \
      float* part, int H, int KV, int D, int S, float scale) {                                    \
    attn_part<E>(P, layer, q, part, H, KV, D, S, scale);                                          \
  }
LAYA_PART(1)
LAYA_PART(2)
LAYA_PART(4)
)";

// The host's mirror of the kernels' Params and QL (the same layout: pointers, then ints).
struct Params {
  const void* tokens;
  void* logits;
  int offset;
  int pad;
  void* k[kMaxLayers];
  void* v[kMaxLayers];
  int cap[kMaxLayers];
};

struct QL {
  const void* w;
  const void* s;
  const void* b;
  const void* bias;
  int out, in, gs, bits;
};

QL ql(const QLin& q) {
  return QL{mx::gpu_ptr<void>(const_cast<mx::array&>(q.w)),
            mx::gpu_ptr<void>(const_cast<mx::array&>(q.scales)),
            mx::gpu_ptr<void>(const_cast<mx::array&>(q.biases)),
            q.bias ? mx::gpu_ptr<void>(const_cast<mx::array&>(*q.bias)) : nullptr,
            q.out,
            q.in,
            q.gs,
            q.bits};
}

const void* ptr(const std::optional<mx::array>& a) {
  return a ? mx::gpu_ptr<void>(const_cast<mx::array&>(*a)) : nullptr;
}

// Kernel parameters are passed by address: the node keeps a copy of each value.
struct Node {
  const char* name;
  CUfunction f;
  dim3 grid, block;
  std::vector<std::vector<char>> args;
  template <typename... A>
  Node(const char* name, CUfunction f, dim3 grid, dim3 block, A... a) : name(name), f(f), grid(grid), block(block) {
    (args.emplace_back(reinterpret_cast<const char*>(&a), reinterpret_cast<const char*>(&a) + sizeof(a)), ...);
  }
};

// The plan's GPU side: its kernels, fixed buffers and the captured step.
struct Gpu {
  CUfunction set = nullptr;
  CUdeviceptr params = 0, h = 0, qkv = 0, q = 0, part = 0, attn = 0, act = 0;
  CUgraph graph = nullptr;
  CUgraphExec exec = nullptr;
  int nodes = 0;
  // The graph's nodes, kept to replay them one by one under events (`laya_step_profile`).
  std::vector<Node> list;

  ~Gpu() {
    const auto& c = cuda::api();
    if (exec) {
      c.ctx_synchronize();
      c.graph_exec_destroy(exec);
    }
    if (graph) {
      c.graph_destroy(graph);
    }
    for (CUdeviceptr p : {params, h, qkv, q, part, attn, act}) {
      if (p) {
        c.mem_free(p);
      }
    }
  }
};

Plan::~Plan() = default;

const char* type_name(mx::Dtype t) {
  return t == mx::float32 ? "float" : t == mx::bfloat16 ? "bf16" : "f16";
}


// The step's graph over the plan's fixed buffers: one chain of kernel nodes.
void build(Plan& p, mx::cu::Device& device) {
  const auto& c = cuda::api();
  const Config& k = p.c;
  std::string t = std::string("-DLAYA_T=") + type_name(p.dtype);
  CUmodule module = cuda::compile(kSource, "laya_decode_step.cu", device, {t});
  auto gpu = std::make_unique<Gpu>();
  gpu->set = cuda::kernel(module, "laya_step_set");
  auto alloc = [&](CUdeviceptr& d, size_t bytes) {
    cuda::check(c.mem_alloc(&d, bytes), "cuMemAlloc");
    cuda::check(c.memset_d8(d, 0, bytes), "cuMemsetD8");
  };
  const int H = k.heads, KV = k.kv, D = k.head_dim;
  alloc(gpu->params, sizeof(Params));
  alloc(gpu->h, sizeof(float) * k.hidden);
  alloc(gpu->q, sizeof(float) * H * D);
  alloc(gpu->qkv, sizeof(float) * (H + 2 * KV) * D);
  alloc(gpu->part, sizeof(float) * H * kSplits * (D + 2));
  alloc(gpu->attn, sizeof(float) * H * D);
  alloc(gpu->act, sizeof(float) * k.inter);
  auto bits = [&](const char* base, int b) {
    return cuda::kernel(module, (std::string(base) + std::to_string(b)).c_str());
  };
  const int E = D <= 32 ? 1 : D <= 64 ? 2 : 4;
  CUfunction part = bits("laya_step_attn_part", E);
  CUfunction join = cuda::kernel(module, "laya_step_attn_join");
  CUfunction rope = cuda::kernel(module, "laya_step_rope");
  const void* P = reinterpret_cast<const void*>(gpu->params);
  float* hp = reinterpret_cast<float*>(gpu->h);
  float* qp = reinterpret_cast<float*>(gpu->q);
  float* qkvp = reinterpret_cast<float*>(gpu->qkv);
  float* pp = reinterpret_cast<float*>(gpu->part);
  float* ap = reinterpret_cast<float*>(gpu->attn);
  float* act = reinterpret_cast<float*>(gpu->act);
  const float eps = k.eps, lt = std::log2(k.theta), scale = 1.f / std::sqrt(static_cast<float>(D));
  const int S = kSplits;
  const dim3 warps4(128);
  auto rows = [](int n) { return dim3((n + 3) / 4); };
  std::vector<Node> nodes;
  nodes.emplace_back("embed", cuda::kernel(module, "laya_step_embed"), dim3((k.hidden + 127) / 128), warps4,
                     P, ql(p.embed), hp);
  for (int l = 0; l < static_cast<int>(p.layers.size()); ++l) {
    Layer& L = p.layers[l];
    nodes.emplace_back("qkv", bits("laya_step_qmv", L.qkv.bits), rows((H + 2 * KV) * D), warps4, P,
                       ql(L.qkv), static_cast<const float*>(hp), ptr(L.in_norm), eps, 3, qkvp);
    nodes.emplace_back("rope", rope, dim3(H + 2 * KV), warps4, P, l, static_cast<const float*>(qkvp),
                       ptr(L.q_norm), ptr(L.k_norm), eps, H, KV, D, lt, qp);
    nodes.emplace_back("attention", part, dim3(KV, S), warps4, P, l, static_cast<const float*>(qp), pp, H, KV,
                       D, S, scale);
    nodes.emplace_back("attention join", join, dim3(H), warps4, static_cast<const float*>(pp), ap, D, S);
    nodes.emplace_back("o_proj", bits("laya_step_qmv", L.o.bits), rows(k.hidden), warps4, P, ql(L.o),
                       static_cast<const float*>(ap), static_cast<const void*>(nullptr), eps, 0, hp);
    nodes.emplace_back("gate_up", bits("laya_step_qmv", L.gate_up.bits), rows(k.inter), warps4, P,
                       ql(L.gate_up), static_cast<const float*>(hp), ptr(L.post_norm), eps, 2, act);
    nodes.emplace_back("down_proj", bits("laya_step_qmv", L.down.bits), rows(k.hidden), warps4, P, ql(L.down),
                       static_cast<const float*>(act), static_cast<const void*>(nullptr), eps, 0, hp);
  }
  nodes.emplace_back("head", bits("laya_step_qmv", p.head.bits), rows(k.vocab), warps4, P, ql(p.head),
                     static_cast<const float*>(hp), ptr(p.norm), eps, 1, static_cast<float*>(nullptr));
  // The kernels read weights and norms 16 bytes at a time.
  auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  auto check_linear = [&](const QLin& q) {
    if (!aligned(ql(q).w)) {
      throw std::runtime_error("laya step: a weight not on a 16-byte boundary");
    }
  };
  check_linear(p.head);
  for (auto& L : p.layers) {
    for (const QLin* q : {&L.qkv, &L.o, &L.gate_up, &L.down}) {
      check_linear(*q);
    }
    if (!aligned(ptr(L.in_norm)) || !aligned(ptr(L.post_norm))) {
      throw std::runtime_error("laya step: a norm weight not on a 16-byte boundary");
    }
  }
  if (!aligned(ptr(p.norm))) {
    throw std::runtime_error("laya step: a norm weight not on a 16-byte boundary");
  }
  cuda::check(c.graph_create(&gpu->graph, 0), "cuGraphCreate");
  CUgraphNode prev = nullptr;
  for (auto& n : nodes) {
    std::vector<void*> args;
    for (auto& a : n.args) {
      args.push_back(a.data());
    }
    CUDA_KERNEL_NODE_PARAMS kp;
    std::memset(&kp, 0, sizeof(kp));
    kp.func = n.f;
    kp.gridDimX = n.grid.x;
    kp.gridDimY = n.grid.y;
    kp.gridDimZ = n.grid.z;
    kp.blockDimX = n.block.x;
    kp.blockDimY = n.block.y;
    kp.blockDimZ = n.block.z;
    kp.kernelParams = args.data();
    CUgraphNode node = nullptr;
    cuda::check(c.graph_add_kernel_node(&node, gpu->graph, prev ? &prev : nullptr, prev ? 1 : 0, &kp),
                "cuGraphAddKernelNode");
    prev = node;
  }
  gpu->nodes = static_cast<int>(nodes.size());
  gpu->list = std::move(nodes);
  device.make_current();
  cuda::check(c.graph_instantiate(&gpu->exec, gpu->graph, 0), "cuGraphInstantiate");
  p.gpu = std::move(gpu);
}

#endif // LAYA_CUDA

class DecodeStep : public mx::Primitive {
 public:
  DecodeStep(mx::Stream s, std::shared_ptr<Plan> plan, int offset, std::vector<uint8_t> in_place)
      : mx::Primitive(s), plan_(std::move(plan)), offset_(offset), in_place_(std::move(in_place)) {}

  void eval_cpu(const std::vector<mx::array>& in, std::vector<mx::array>& out) override {
    auto& enc = mx::cpu::get_command_encoder(stream());
    for (size_t i = 1; i < in.size(); ++i) {
      kv_out_cpu(in[i], out[i], in_place_[(i - 1) / 2] != 0, enc, "laya step");
    }
    out[0].set_data(mx::allocator::malloc(out[0].nbytes()));
    for (const auto& a : in) {
      enc.set_input_array(a);
    }
    std::vector<mx::array> bufs;
    for (size_t i = 1; i < out.size(); ++i) {
      bufs.push_back(mx::array::unsafe_weak_copy(out[i]));
    }
    enc.dispatch([plan = plan_, offset = offset_, tokens = mx::array::unsafe_weak_copy(in[0]),
                  logits = mx::array::unsafe_weak_copy(out[0]), bufs]() mutable {
      const uint32_t token = tokens.data<uint32_t>()[0];
      auto run = [&](auto zero) {
        using T = decltype(zero);
        std::vector<T*> k, v;
        std::vector<int> cap;
        for (size_t l = 0; l < bufs.size() / 2; ++l) {
          k.push_back(bufs[2 * l].data<T>());
          v.push_back(bufs[2 * l + 1].data<T>());
          cap.push_back(bufs[2 * l].shape(2));
        }
        step_cpu<T>(*plan, token, offset, k, v, cap, logits.data<float>());
      };
      switch (plan->dtype) {
        case mx::float32:
          run(0.f);
          break;
        case mx::bfloat16:
          run(mx::bfloat16_t(0.f));
          break;
        default:
          run(mx::float16_t(0.f));
          break;
      }
    });
  }

  void eval_gpu(const std::vector<mx::array>& in, std::vector<mx::array>& out) override {
#ifdef LAYA_CUDA
    auto& enc = mx::cu::get_command_encoder(stream());
    Plan& p = *plan_;
    {
      std::lock_guard<std::mutex> lock(p.mutex);
      if (!p.gpu) {
        build(p, enc.device());
      }
    }
    Gpu& g = *p.gpu;
    // Copies of buffers something else holds (MLX's nodes, ordered before the step).
    for (size_t i = 1; i < in.size(); ++i) {
      kv_out_gpu(in[i], out[i], in_place_[(i - 1) / 2] != 0, enc, "laya step");
    }
    out[0].set_data(mx::allocator::malloc(out[0].nbytes()));
    Params host;
    std::memset(&host, 0, sizeof(host));
    host.tokens = mx::gpu_ptr<void>(const_cast<mx::array&>(in[0]));
    host.logits = mx::gpu_ptr<void>(out[0]);
    host.offset = offset_;
    for (size_t l = 0; l < (out.size() - 1) / 2; ++l) {
      host.k[l] = mx::gpu_ptr<void>(out[1 + 2 * l]);
      host.v[l] = mx::gpu_ptr<void>(out[2 + 2 * l]);
      host.cap[l] = out[1 + 2 * l].shape(2);
    }
    enc.set_input_array(in[0]);
    for (size_t i = 1; i < out.size(); ++i) {
      enc.set_input_array(out[i]);
    }
    for (auto& o : out) {
      enc.set_output_array(o);
    }
    CUdeviceptr dst = g.params;
    enc.add_kernel_node(g.set, dim3(1), dim3(128), dst, host);
    // The parameters' node and everything before it go to the stream, then the step itself.
    enc.commit();
    enc.device().make_current();
    cudaStream_t stream = enc.stream();
    cuda::check(cuda::api().graph_launch(g.exec, reinterpret_cast<CUstream>(stream)), "cuGraphLaunch");
#else
    throw std::runtime_error("laya step: this build has no GPU kernels (not a CUDA build)");
#endif
  }

  const char* name() const override {
    return "LayaDecodeStep";
  }

  bool is_equivalent(const mx::Primitive& other) const override {
    auto* o = dynamic_cast<const DecodeStep*>(&other);
    return o && o->plan_ == plan_ && o->offset_ == offset_ && o->in_place_ == in_place_;
  }

 private:

  std::shared_ptr<Plan> plan_;
  int offset_;
  // Per layer: whether its buffers may be written in place.
  std::vector<uint8_t> in_place_;
};

// --- Building a plan from the model's arrays ----------------------------------------------

[[noreturn]] void bad(const std::string& what) {
  throw std::invalid_argument("laya step: " + what);
}

// The linear at arrays[i..i+3) (weight, scales, biases, bias or empty) of `out` x `in`.
QLin linear(const std::vector<std::optional<mx::array>>& a, size_t i, int out, int in, mx::Dtype t,
            const char* what) {
  if (!a[i] || !a[i + 1] || !a[i + 2]) {
    bad(std::string(what) + ": not a quantized linear");
  }
  QLin q{*a[i], *a[i + 1], *a[i + 2], a[i + 3], out, in, 0, 0};
  if (q.w.dtype() != mx::uint32 || q.w.ndim() != 2 || q.w.shape(0) != out ||
      (q.w.shape(1) * 32) % in != 0) {
    bad(std::string(what) + ": the weight is not [out, in * bits / 32] uint32");
  }
  q.bits = q.w.shape(1) * 32 / in;
  if (q.bits != 4 && q.bits != 6 && q.bits != 8) {
    bad(std::string(what) + ": " + std::to_string(q.bits) + " bits (4, 6 and 8 are laya's)");
  }
  if (q.scales.ndim() != 2 || q.scales.shape(0) != out || in % q.scales.shape(1) != 0 ||
      q.biases.shape() != q.scales.shape()) {
    bad(std::string(what) + ": scales and biases are not [out, in / group]");
  }
  // A lane of the kernels reads 16 bytes of a row at a time (48 at 6 bits): 16, 32 or 64 values.
  const int chunk = (q.bits == 6 ? 12 : 4) * 32 / q.bits;
  if (in % chunk != 0) {
    bad(std::string(what) + ": rows of " + std::to_string(in) + " values (a multiple of " + std::to_string(chunk) + " at " + std::to_string(q.bits) + " bits)");
  }
  q.gs = in / q.scales.shape(1);
  if (q.gs != 32 && q.gs != 64 && q.gs != 128) {
    bad(std::string(what) + ": group size " + std::to_string(q.gs));
  }
  if (q.scales.dtype() != t || q.biases.dtype() != t || (q.bias && (q.bias->dtype() != t || q.bias->size() != static_cast<size_t>(out)))) {
    bad(std::string(what) + ": scales, biases and bias must be the activations' type");
  }
  return q;
}

mx::array vec(const std::vector<std::optional<mx::array>>& a, size_t i, int n, mx::Dtype t, const char* what) {
  if (!a[i] || a[i]->size() != static_cast<size_t>(n) || a[i]->dtype() != t) {
    bad(std::string(what) + ": a norm weight of " + std::to_string(n) + " of the activations' type");
  }
  return *a[i];
}

} // namespace

} // namespace laya::step

using laya::step::Plan;

// Array order: embed (w, s, b, -), then per layer in_norm, post_norm, q_norm or empty, k_norm or
// empty, qkv (w, s, b, bias or empty), o (w, s, b, -), gate_up (w, s, b, -), down (w, s, b, -);
// then the final norm and the head (w, s, b, -). 4 + 20 L + 5 arrays. Empty arrays are absent.
// dims: hidden, heads, kv heads, head dim, intermediate, vocab, layers.
extern "C" int laya_step_plan_new(
    void** plan_out,
    const mlx_array* arrays,
    size_t n,
    const int* dims,
    float eps,
    float theta,
    char* error,
    size_t error_len) {
  using namespace laya::step;
  try {
    const int hidden = dims[0], H = dims[1], KV = dims[2], D = dims[3], inter = dims[4],
              vocab = dims[5], layers = dims[6];
    if (layers < 1 || layers > kMaxLayers) {
      bad("1 to " + std::to_string(kMaxLayers) + " layers");
    }
    if (n != static_cast<size_t>(4 + 20 * layers + 5)) {
      bad("the arrays do not match the layer count");
    }
    if (KV < 1 || H % KV != 0 || H / KV > kMaxGroupHeads || D % 2 != 0 || D > kMaxHeadDim) {
      bad("heads: H a multiple of KV, at most 8 query heads a KV head, an even head size up to 128");
    }
    std::vector<std::optional<mx::array>> a;
    for (size_t i = 0; i < n; ++i) {
      if (arrays[i].ctx) {
        a.push_back(mlx_array_get_(arrays[i]));
      } else {
        a.push_back(std::nullopt);
      }
    }
    for (auto& x : a) {
      if (x) {
        mx::eval(*x);
        if (!x->flags().row_contiguous) {
          *x = mx::contiguous(*x);
          mx::eval(*x);
        }
      }
    }
    auto plan = std::make_shared<Plan>();
    plan->c = Config{hidden, H, KV, D, inter, vocab, eps, theta};
    if (!a[1]) {
      bad("the embedding is not quantized");
    }
    const mx::Dtype t = a[1]->dtype();
    if (t != mx::float32 && t != mx::bfloat16 && t != mx::float16) {
      bad("the activations' type must be f32, bf16 or f16");
    }
    plan->dtype = t;
    plan->embed = linear(a, 0, vocab, hidden, t, "embedding");
    size_t i = 4;
    for (int l = 0; l < layers; ++l, i += 20) {
      Layer L{vec(a, i, hidden, t, "input norm"),
              vec(a, i + 1, hidden, t, "post-attention norm"),
              a[i + 2] ? std::optional(vec(a, i + 2, D, t, "q norm")) : std::nullopt,
              a[i + 3] ? std::optional(vec(a, i + 3, D, t, "k norm")) : std::nullopt,
              linear(a, i + 4, (H + 2 * KV) * D, hidden, t, "qkv"),
              linear(a, i + 8, hidden, H * D, t, "o_proj"),
              linear(a, i + 12, 2 * inter, hidden, t, "gate_up"),
              linear(a, i + 16, hidden, inter, t, "down_proj")};
      plan->layers.push_back(std::move(L));
    }
    plan->norm = vec(a, i, hidden, t, "final norm");
    plan->head = linear(a, i + 1, vocab, hidden, t, "head");
    *plan_out = new std::shared_ptr<Plan>(std::move(plan));
  } catch (std::exception& e) {
    if (error && error_len) {
      std::snprintf(error, error_len, "%s", e.what());
    }
    return 1;
  }
  return 0;
}

extern "C" void laya_step_plan_free(void* plan) {
  delete static_cast<std::shared_ptr<Plan>*>(plan);
}

// Where a step's GPU time goes: the last step's kernels replayed one by one under events (the
// caches of that step must still be alive; its token and logits are replaced by scratch
// buffers), the ms of each kind of kernel summed, as "kind ms" lines in `out`.
extern "C" int laya_step_profile(void* plan_handle, char* out, size_t out_len, char* error, size_t error_len) {
  try {
#ifdef LAYA_CUDA
    auto& p = **static_cast<std::shared_ptr<Plan>*>(plan_handle);
    std::lock_guard<std::mutex> lock(p.mutex);
    if (!p.gpu) {
      throw std::runtime_error("laya step: no step has run on a GPU");
    }
    const auto& c = laya::cuda::api();
    laya::step::Gpu& g = *p.gpu;
    laya::cuda::check(c.ctx_synchronize(), "cuCtxSynchronize");
    CUdeviceptr token = 0, logits = 0;
    laya::cuda::check(c.mem_alloc(&token, 16), "cuMemAlloc");
    laya::cuda::check(c.memset_d8(token, 0, 16), "cuMemsetD8");
    laya::cuda::check(c.mem_alloc(&logits, sizeof(float) * p.c.vocab), "cuMemAlloc");
    void* ptrs[2] = {reinterpret_cast<void*>(token), reinterpret_cast<void*>(logits)};
    laya::cuda::check(c.memcpy_htod(g.params, ptrs, sizeof(ptrs)), "cuMemcpyHtoD");
    std::vector<CUevent> ev(g.list.size() + 1);
    for (auto& e : ev) {
      laya::cuda::check(c.event_create(&e, 0), "cuEventCreate");
    }
    laya::cuda::check(c.event_record(ev[0], nullptr), "cuEventRecord");
    for (size_t i = 0; i < g.list.size(); ++i) {
      auto& n = g.list[i];
      std::vector<void*> args;
      for (auto& a : n.args) {
        args.push_back(a.data());
      }
      laya::cuda::check(c.launch(n.f, n.grid.x, n.grid.y, n.grid.z, n.block.x, n.block.y, n.block.z, 0,
                           nullptr, args.data(), nullptr),
                  "cuLaunchKernel");
      laya::cuda::check(c.event_record(ev[i + 1], nullptr), "cuEventRecord");
    }
    laya::cuda::check(c.event_synchronize(ev.back()), "cuEventSynchronize");
    std::vector<std::pair<std::string, double>> sums;
    for (size_t i = 0; i < g.list.size(); ++i) {
      float ms = 0.f;
      laya::cuda::check(c.event_elapsed(&ms, ev[i], ev[i + 1]), "cuEventElapsedTime");
      auto it = std::find_if(sums.begin(), sums.end(), [&](auto& s) { return s.first == g.list[i].name; });
      if (it == sums.end()) {
        sums.emplace_back(g.list[i].name, ms);
      } else {
        it->second += ms;
      }
    }
    for (auto& e : ev) {
      c.event_destroy(e);
    }
    c.mem_free(token);
    c.mem_free(logits);
    std::string text;
    for (auto& [name, ms] : sums) {
      text += name + " " + std::to_string(ms) + "\n";
    }
    std::snprintf(out, out_len, "%s", text.c_str());
#else
    (void)plan_handle;
    (void)out;
    (void)out_len;
    throw std::runtime_error("laya step: profiling needs a CUDA build");
#endif
  } catch (std::exception& e) {
    if (error && error_len) {
      std::snprintf(error, error_len, "%s", e.what());
    }
    return 1;
  }
  return 0;
}

// The step's kernel nodes once the plan's graph is built on a GPU (0 before).
extern "C" int laya_step_plan_nodes(void* plan) {
#ifdef LAYA_CUDA
  auto& p = **static_cast<std::shared_ptr<Plan>*>(plan);
  std::lock_guard<std::mutex> lock(p.mutex);
  return p.gpu ? p.gpu->nodes : 0;
#else
  (void)plan;
  return 0;
#endif
}

// One decode step: outs[0] the logits [1, vocab] f32, outs[1 + 2l], outs[2 + 2l] layer l's
// k and v buffers with position `offset` written. `bufs` holds 2 L buffers, k then v a layer;
// `in_place` L flags: whether layer l's may be written in place (nothing else holds them).
extern "C" int laya_step_run(
    mlx_array* outs,
    void* plan_handle,
    const mlx_array tokens_c,
    const mlx_array* bufs,
    size_t n_bufs,
    const uint8_t* in_place,
    int offset,
    const mlx_stream s,
    char* error,
    size_t error_len) {
  using namespace laya::step;
  try {
    auto plan = *static_cast<std::shared_ptr<Plan>*>(plan_handle);
    const Config& c = plan->c;
    const auto& tokens = mlx_array_get_(tokens_c);
    if (tokens.size() != 1 || (tokens.dtype() != mx::int32 && tokens.dtype() != mx::uint32)) {
      bad("one token, int32 or uint32");
    }
    if (n_bufs != 2 * plan->layers.size()) {
      bad("a k and a v buffer for every layer");
    }
    std::vector<mx::array> inputs{mx::reshape(tokens, {1})};
    std::vector<mx::Shape> shapes{mx::Shape{1, c.vocab}};
    std::vector<mx::Dtype> dtypes{mx::float32};
    for (size_t i = 0; i < n_bufs; ++i) {
      const auto& b = mlx_array_get_(bufs[i]);
      if (b.ndim() != 4 || b.shape(0) != 1 || b.shape(1) != c.kv || b.shape(3) != c.head_dim ||
          b.shape(2) <= offset || offset < 0) {
        bad("the buffers must be [1, KV, Cap, D] with Cap > offset");
      }
      if (b.dtype() != plan->dtype) {
        bad("the buffers must be of the activations' type");
      }
      inputs.push_back(b);
      shapes.push_back(b.shape());
      dtypes.push_back(b.dtype());
    }
    auto& stream = mlx_stream_get_(s);
    auto prim = std::make_shared<DecodeStep>(
        stream, plan, offset, std::vector<uint8_t>(in_place, in_place + n_bufs / 2));
    auto arrays = mx::array::make_arrays(std::move(shapes), dtypes, prim, std::move(inputs));
    for (size_t i = 0; i < arrays.size(); ++i) {
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
