// step.cpp: one recurrent inference step of the whole CALM model, fused, for B rows, float32.
//
// Built with scan.cpp into one library by calmd/model/fastscan.py and driven by
// calmd/model/faststep.py. The arithmetic is that of CalmModel.step_eager in calmd/model/mamba.py:
//
//   x = embedding[token]
//   per layer:  u = RMSNorm(x) * norm1;  (xs, z) = in_proj(u)
//               conv = conv[1:] ++ xs;   xc = silu(sum_k conv[k] * w[k] + bias)
//               (dt, B, C) = x_proj(xc); delta = softplus(dt_proj(dt) + dt_bias)
//               h = exp(delta * A) * h + delta * xc * B;  y = <h, C> + D * xc;  y *= silu(z)
//               x += out_proj(y);   with an FFN: x += down(gelu(up(RMSNorm(x) * norm2)))
//   logits = head(RMSNorm(x) * norm_f)
//
// Why: the eager step is ~15 small torch ops per layer, each costing more in dispatch than its
// arithmetic at these sizes (nano: 128 x 256 matrices, 1-12 rows). Here a step is one call.
//
// Weights come packed by faststep.py: every matrix transposed to (in, out) with `out` padded with
// zero columns to a multiple of 8 floats, so that a product is a sequence of 8-wide
// multiply-adds over contiguous weight rows (no horizontal sums, no tails), each weight row loaded
// once for up to 3 batch rows. The loops over channels and states are vectorised by the compiler
// (exp and friends through glibc's libmvec, as in scan.cpp).
//
// State layout (contiguous, row-major): conv (n_layers, B, K, E), ssm (n_layers, B, E, N). Row b of
// the output state continues row rows[b] of the input state (rows == nullptr: row b), so a beam
// search's reordering can ride along with the step. Outputs never alias inputs.

#include <cmath>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>
#if defined(__AVX__) && defined(__FMA__)
#include <immintrin.h>
#endif

namespace {

constexpr int64_t kLanes = 8;
typedef float vec8 __attribute__((vector_size(kLanes * sizeof(float))));  // GCC lowers it to the CPU's width

inline vec8 load8(const float* p) {
  vec8 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

inline void store8(float* p, vec8 v) { std::memcpy(p, &v, sizeof v); }

// acc + x * w, always fused where the CPU has FMA. Left to the compiler, one of the block shapes
// below came out as a multiply and an add: a row's result then depended on the batch it ran in.
inline vec8 multiply_add(float x, vec8 w, vec8 acc) {
#if defined(__AVX__) && defined(__FMA__)
  return _mm256_fmadd_ps(_mm256_set1_ps(x), w, acc);
#else
  return acc + x * w;
#endif
}

// The horizontal sums of s[0], ..., s[7], as one vector.
inline vec8 sums_of_8(const vec8* s) {
#if defined(__AVX__)
  const __m256 t0 = _mm256_hadd_ps(s[0], s[1]), t1 = _mm256_hadd_ps(s[2], s[3]);
  const __m256 t2 = _mm256_hadd_ps(s[4], s[5]), t3 = _mm256_hadd_ps(s[6], s[7]);
  const __m256 u0 = _mm256_hadd_ps(t0, t1), u1 = _mm256_hadd_ps(t2, t3);  // quarter sums per half
  return _mm256_permute2f128_ps(u0, u1, 0x20) + _mm256_permute2f128_ps(u0, u1, 0x31);
#else
  vec8 out;
  for (int j = 0; j < kLanes; ++j) {
    float sum = 0;
    for (int i = 0; i < kLanes; ++i) sum += s[j][i];
    out[j] = sum;
  }
  return out;
#endif
}

inline int64_t pad8(int64_t n) { return (n + kLanes - 1) / kLanes * kLanes; }

// Y[r, o] += sum_i X[r, i] * WT[i, o] for RB rows and OV * 8 columns, all accumulators in registers.
template <int RB, int OV>
void product_block(const float* X, int64_t ldx, const float* WT, int64_t ldw, float* Y, int64_t ldy,
                   int64_t in) {
  vec8 acc[RB][OV];
  for (int r = 0; r < RB; ++r)
    for (int v = 0; v < OV; ++v) acc[r][v] = load8(Y + r * ldy + v * kLanes);
  for (int64_t i = 0; i < in; ++i) {
    const float* w = WT + i * ldw;
    vec8 wv[OV];
    for (int v = 0; v < OV; ++v) wv[v] = load8(w + v * kLanes);
    for (int r = 0; r < RB; ++r) {
      const float xr = X[r * ldx + i];
      for (int v = 0; v < OV; ++v) acc[r][v] = multiply_add(xr, wv[v], acc[r][v]);
    }
  }
  for (int r = 0; r < RB; ++r)
    for (int v = 0; v < OV; ++v) store8(Y + r * ldy + v * kLanes, acc[r][v]);
}

template <int OV>
void product_columns(const float* X, int64_t ldx, int64_t rows, int64_t in, const float* WT,
                     int64_t ldw, float* Y, int64_t ldy) {
  int64_t r = 0;
  for (; r + 3 <= rows; r += 3) product_block<3, OV>(X + r * ldx, ldx, WT, ldw, Y + r * ldy, ldy, in);
  if (rows - r == 2) product_block<2, OV>(X + r * ldx, ldx, WT, ldw, Y + r * ldy, ldy, in);
  if (rows - r == 1) product_block<1, OV>(X + r * ldx, ldx, WT, ldw, Y + r * ldy, ldy, in);
}

constexpr int64_t kPanel = 4 * kLanes;  // the columns of one panel (see faststep.py)

// Y (rows, ldy) += X (rows, in; row stride ldx) @ W, with W packed as panels: the columns
// [o, o + 32) of the transposed (in, out_padded) matrix stored contiguously, (in, 32) each, the
// last panel as narrow as what is left. A panel is read front to back once per call (the
// prefetcher's favourite) and stays in L1 while every row block uses it.
void product(const float* X, int64_t ldx, int64_t rows, int64_t in, const float* W,
             int64_t out_padded, float* Y, int64_t ldy) {
  int64_t o = 0;
  for (; o + kPanel <= out_padded; o += kPanel)
    product_columns<4>(X, ldx, rows, in, W + o * in, kPanel, Y + o, ldy);
  const int64_t rest = out_padded - o;
  switch (rest / kLanes) {
    case 3: product_columns<3>(X, ldx, rows, in, W + o * in, rest, Y + o, ldy); break;
    case 2: product_columns<2>(X, ldx, rows, in, W + o * in, rest, Y + o, ldy); break;
    case 1: product_columns<1>(X, ldx, rows, in, W + o * in, rest, Y + o, ldy); break;
    default: break;
  }
}

inline float silu(float v) { return v / (1.0f + std::exp(-v)); }

// out = x * rsqrt(mean(x^2) + eps) * weight, as calmd.model.mamba.RMSNorm
void rms_norm(const float* x, const float* weight, float* out, int64_t dim) {
  float sum = 0;
#pragma omp simd reduction(+ : sum)
  for (int64_t i = 0; i < dim; ++i) sum += x[i] * x[i];
  const float scale = 1.0f / std::sqrt(sum / static_cast<float>(dim) + 1e-5f);
#pragma omp simd
  for (int64_t i = 0; i < dim; ++i) out[i] = x[i] * scale * weight[i];
}

struct Dims {
  int64_t D, layers, E, N, K, R, V, H;  // H: the FFN's hidden width, 0 without one
};

// Per layer, in this order, the pointers faststep.py packs (see LAYER_FIELDS there).
enum LayerField {
  kNorm1, kInProjT, kConvT, kConvBias, kXProjT, kDtProjT, kDtBias, kA, kD, kOutProjT,
  kNorm2, kUpT, kDownT, kLayerFields
};
enum GlobalField { kEmbedding, kHeadT, kNormF, kGlobalFields };

// Rows [begin, end) of the batch, all layers; `scratch` is this worker's.
void step_rows(const Dims& d, const float* const* weights, const int64_t* tokens, const int64_t* rows,
               const float* conv_in, const float* ssm_in, int64_t batch_in, float* conv_out,
               float* ssm_out, float* logits, int64_t batch, int64_t begin, int64_t end,
               std::vector<float>& scratch) {
  const int64_t D = d.D, E = d.E, N = d.N, K = d.K, R = d.R, V = d.V, H = d.H;
  const int64_t Dp = pad8(D), XZp = pad8(2 * E), Ep = pad8(E), XPp = pad8(R + 2 * N), Hp = pad8(H),
                Vp = pad8(V);
  const int64_t nb = end - begin;
  const int64_t per_row = 2 * Dp + XZp + 3 * Ep + XPp + Hp + Vp;
  if (static_cast<int64_t>(scratch.size()) < nb * per_row + E * N) scratch.resize(nb * per_row + E * N);
  float* x = scratch.data();    // (nb, Dp) the residual stream
  float* u = x + nb * Dp;       // (nb, Dp) a norm's output
  float* xz = u + nb * Dp;      // (nb, XZp) in_proj: xs then z
  float* xc = xz + nb * XZp;    // (nb, Ep) after the conv and silu
  float* delta = xc + nb * Ep;  // (nb, Ep)
  float* y = delta + nb * Ep;   // (nb, Ep)
  float* dbc = y + nb * Ep;     // (nb, XPp) x_proj: dt, B, C
  float* hid = dbc + nb * XPp;  // (nb, Hp) the FFN's hidden layer
  float* out = hid + nb * Hp;   // (nb, Vp) logits before the copy out
  float* dA = out + nb * Vp;    // (E, N) one row's decays
  // Padding columns (past D, E, ...) are never read: every product reads `in` real columns.

  const float* embedding = weights[kEmbedding];
  for (int64_t b = 0; b < nb; ++b) std::memcpy(x + b * Dp, embedding + tokens[begin + b] * D, sizeof(float) * D);

  for (int64_t l = 0; l < d.layers; ++l) {
    const float* const* w = weights + kGlobalFields + l * kLayerFields;
    for (int64_t b = 0; b < nb; ++b) rms_norm(x + b * Dp, w[kNorm1], u + b * Dp, D);
    std::memset(xz, 0, sizeof(float) * nb * XZp);
    product(u, Dp, nb, D, w[kInProjT], XZp, xz, XZp);
    // causal conv: shift the window by one input, then the depthwise filter
    const float* conv_w = w[kConvT];
    const float* conv_b = w[kConvBias];
    for (int64_t b = 0; b < nb; ++b) {
      const int64_t src = rows ? rows[begin + b] : begin + b;
      const float* cin = conv_in + (l * batch_in + src) * K * E;
      float* cout = conv_out + (l * batch + begin + b) * K * E;
      std::memcpy(cout, cin + E, sizeof(float) * (K - 1) * E);
      std::memcpy(cout + (K - 1) * E, xz + b * XZp, sizeof(float) * E);
      float* xcb = xc + b * Ep;
      // k outside and e inside, so that each loop runs over contiguous channels (vectorised)
#pragma omp simd
      for (int64_t e = 0; e < E; ++e) xcb[e] = cout[e] * conv_w[e];
      for (int64_t k = 1; k < K; ++k) {
        const float* ck = cout + k * E;
        const float* wk = conv_w + k * E;
#pragma omp simd
        for (int64_t e = 0; e < E; ++e) xcb[e] += ck[e] * wk[e];
      }
#pragma omp simd
      for (int64_t e = 0; e < E; ++e) xcb[e] = silu(xcb[e] + conv_b[e]);
    }
    std::memset(dbc, 0, sizeof(float) * nb * XPp);
    product(xc, Ep, nb, E, w[kXProjT], XPp, dbc, XPp);
    for (int64_t b = 0; b < nb; ++b) std::memcpy(delta + b * Ep, w[kDtBias], sizeof(float) * E);
    product(dbc, XPp, nb, R, w[kDtProjT], Ep, delta, Ep);
    // selective scan, one step: the state of each (row, channel) is N floats
    const float* A = w[kA];
    const float* Dskip = w[kD];
    for (int64_t b = 0; b < nb; ++b) {
      const int64_t src = rows ? rows[begin + b] : begin + b;
      const float* hin = ssm_in + (l * batch_in + src) * E * N;
      float* hout = ssm_out + (l * batch + begin + b) * E * N;
      float* db = delta + b * Ep;
      const float* xcb = xc + b * Ep;
      const float* Bv = dbc + b * XPp + R;
      const float* Cv = Bv + N;
      const float* zb = xz + b * XZp + E;
      float* yb = y + b * Ep;
#pragma omp simd
      for (int64_t e = 0; e < E; ++e) {  // softplus, threshold 20 as torch's
        const float v = db[e];
        db[e] = v > 20.0f ? v : std::log1p(std::exp(v));
      }
      // the decays exp(delta A) first, in one flat loop: calling the vector exp inside the loop
      // below made the compiler spill its accumulators around every call
      for (int64_t e = 0; e < E; ++e) {
        const float de = db[e];
        const float* a = A + e * N;
        float* dAe = dA + e * N;
#pragma omp simd
        for (int64_t n = 0; n < N; ++n) dAe[n] = de * a[n];
      }
#pragma omp simd
      for (int64_t i = 0; i < E * N; ++i) dA[i] = std::exp(dA[i]);
      if (N % kLanes == 0 && E % kLanes == 0) {
        // 8 channels at a time, so that their 8 sums over n are reduced together
        for (int64_t e0 = 0; e0 < E; e0 += kLanes) {
          vec8 sums[kLanes];
          for (int j = 0; j < kLanes; ++j) {
            const int64_t e = e0 + j;
            const float du = db[e] * xcb[e];
            vec8 acc = {};
            for (int64_t n = 0; n < N; n += kLanes) {
              const vec8 h = load8(dA + e * N + n) * load8(hin + e * N + n) + du * load8(Bv + n);
              store8(hout + e * N + n, h);
              acc += h * load8(Cv + n);
            }
            sums[j] = acc;
          }
          store8(yb + e0, sums_of_8(sums) + load8(Dskip + e0) * load8(xcb + e0));
        }
      } else {
        for (int64_t e = 0; e < E; ++e) {
          const float du = db[e] * xcb[e];
          const float* dAe = dA + e * N;
          const float* h0 = hin + e * N;
          float* h1 = hout + e * N;
          float acc = 0;
#pragma omp simd reduction(+ : acc)
          for (int64_t n = 0; n < N; ++n) {
            h1[n] = dAe[n] * h0[n] + du * Bv[n];
            acc += h1[n] * Cv[n];
          }
          yb[e] = acc + Dskip[e] * xcb[e];
        }
      }
#pragma omp simd
      for (int64_t e = 0; e < E; ++e) yb[e] *= silu(zb[e]);
    }
    product(y, Ep, nb, E, w[kOutProjT], Dp, x, Dp);  // the residual: x += out_proj(y)
    if (H) {
      for (int64_t b = 0; b < nb; ++b) rms_norm(x + b * Dp, w[kNorm2], u + b * Dp, D);
      std::memset(hid, 0, sizeof(float) * nb * Hp);
      product(u, Dp, nb, D, w[kUpT], Hp, hid, Hp);
      for (int64_t b = 0; b < nb; ++b) {
        float* hb = hid + b * Hp;
        for (int64_t i = 0; i < H; ++i) hb[i] = 0.5f * hb[i] * (1.0f + std::erf(hb[i] * 0.70710678118654752f));
      }
      product(hid, Hp, nb, H, w[kDownT], Dp, x, Dp);
    }
  }
  for (int64_t b = 0; b < nb; ++b) rms_norm(x + b * Dp, weights[kNormF], u + b * Dp, D);
  std::memset(out, 0, sizeof(float) * nb * Vp);
  product(u, Dp, nb, D, weights[kHeadT], Vp, out, Vp);
  for (int64_t b = 0; b < nb; ++b) std::memcpy(logits + (begin + b) * V, out + b * Vp, sizeof(float) * V);
}

}  // namespace

extern "C" {

// Returns 0, or -1 - b for the first row b whose token (or source row) is out of range; nothing
// is written then. dims: d_model, n_layers, d_inner, d_state, d_conv, dt_rank, vocab, ffn hidden.
// Above 16 rows and with threads > 1 the rows are split over threads (the daemon's beams, at
// most a dozen rows, always run on the calling thread).
int calm_step_f32(const int64_t* dims, const float* const* weights, const int64_t* tokens,
                  const int64_t* rows, const float* conv_in, const float* ssm_in, int64_t batch_in,
                  float* conv_out, float* ssm_out, float* logits, int64_t batch, int threads) {
  const Dims d{dims[0], dims[1], dims[2], dims[3], dims[4], dims[5], dims[6], dims[7]};
  for (int64_t b = 0; b < batch; ++b) {
    if (tokens[b] < 0 || tokens[b] >= d.V) return static_cast<int>(-1 - b);
    if (rows && (rows[b] < 0 || rows[b] >= batch_in)) return static_cast<int>(-1 - b);
  }
  constexpr int64_t kRowsPerThreadAtLeast = 16;
  int workers = threads;
  if (batch <= kRowsPerThreadAtLeast) workers = 1;
  if (workers > batch) workers = static_cast<int>(batch);
  if (workers <= 1) {
    thread_local std::vector<float> scratch;
    step_rows(d, weights, tokens, rows, conv_in, ssm_in, batch_in, conv_out, ssm_out, logits, batch,
              0, batch, scratch);
    return 0;
  }
  std::vector<std::thread> pool;
  pool.reserve(workers);
  for (int w = 0; w < workers; ++w) {
    const int64_t begin = batch * w / workers, end = batch * (w + 1) / workers;
    pool.emplace_back([=, &d] {
      std::vector<float> scratch;
      step_rows(d, weights, tokens, rows, conv_in, ssm_in, batch_in, conv_out, ssm_out, logits,
                batch, begin, end, scratch);
    });
  }
  for (auto& t : pool) t.join();
  return 0;
}

}  // extern "C"
