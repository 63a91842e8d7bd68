// step.cpp: the whole CALM model for B rows and T tokens per row, fused, float32: a recurrent
// step (T = 1) or a prefill (T > 1).
//
// Built with scan.cpp into one library by calmd/model/fastscan.py and driven by
// calmd/model/faststep.py. The arithmetic is that of CalmModel.step_eager in calmd/model/mamba.py,
// token after token:
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
// Weights come packed by faststep.py: every matrix transposed to (in, out), `out` padded with zero
// columns to a multiple of 8 floats and stored as panels of 32 columns, each (in, 32) panel
// contiguous. A product is then a sequence of 8-wide fused multiply-adds over a panel read front
// to back (no horizontal sums, no tails), each weight row loaded once for up to 3 positions.
// The multiply-adds are explicit FMAs, so a row's result does not depend on the rows beside it.
// The loops over channels and states are vectorised by the compiler (exp and friends through
// glibc's libmvec, as in scan.cpp).
//
// State layout (contiguous, row-major): conv (n_layers, B, K, E), ssm (n_layers, B, E, N). Row b of
// the output state continues row rows[b] of the input state (rows == nullptr: row b), so a beam
// search's reordering rides along with the step. Outputs never alias inputs.

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

// Rows [begin, end) of the batch through tokens [t0, t0 + T) of each row, all layers, in one pass
// per layer: the products run over all nb * T positions at once (a weight panel serves them all),
// the conv and the scan walk each row's positions in order. The state is read from (conv_in,
// ssm_in; row rows[b] when gathering) and written to (conv_out, ssm_out), which may be the same
// buffers when nothing is gathered. `scratch` is this worker's.
struct Run {
  const Dims& d;
  const float* const* weights;
  const int64_t* tokens;  // (batch, length)
  int64_t length;
  const int64_t* rows;  // nullptr: row b continues row b
  const float* conv_in;
  const float* ssm_in;
  int64_t batch_in;
  float* conv_out;
  float* ssm_out;
  float* logits;  // (batch, length, V), or (batch, V) with last_only
  bool last_only;
  int64_t batch;
};

void run_rows(const Run& run, int64_t begin, int64_t end, int64_t t0, int64_t T, bool gather,
              std::vector<float>& scratch) {
  const Dims& d = run.d;
  const float* const* weights = run.weights;
  const int64_t D = d.D, E = d.E, N = d.N, K = d.K, R = d.R, V = d.V, H = d.H;
  const int64_t Dp = pad8(D), XZp = pad8(2 * E), Ep = pad8(E), XPp = pad8(R + 2 * N), Hp = pad8(H),
                Vp = pad8(V);
  const int64_t nb = end - begin, P = nb * T;  // positions: p = b * T + t
  const int64_t per_position = 2 * Dp + XZp + 3 * Ep + XPp + Hp + Vp;
  const int64_t size = P * per_position + E * N + K * E;
  if (static_cast<int64_t>(scratch.size()) < size) scratch.resize(size);
  float* x = scratch.data();    // (P, Dp) the residual stream
  float* u = x + P * Dp;        // (P, Dp) a norm's output
  float* xz = u + P * Dp;       // (P, XZp) in_proj: xs then z
  float* xc = xz + P * XZp;     // (P, Ep) after the conv and silu
  float* delta = xc + P * Ep;   // (P, Ep)
  float* y = delta + P * Ep;    // (P, Ep)
  float* dbc = y + P * Ep;      // (P, XPp) x_proj: dt, B, C
  float* hid = dbc + P * XPp;   // (P, Hp) the FFN's hidden layer
  float* out = hid + P * Hp;    // (P, Vp) logits before the copy out
  float* dA = out + P * Vp;     // (E, N) one position's decays
  float* window = dA + E * N;   // (K, E) one row's conv inputs, oldest first
  // Padding columns (past D, E, ...) are never read: every product reads `in` real columns.

  const float* embedding = weights[kEmbedding];
  for (int64_t b = 0; b < nb; ++b)
    for (int64_t t = 0; t < T; ++t)
      std::memcpy(x + (b * T + t) * Dp, embedding + run.tokens[(begin + b) * run.length + t0 + t] * D,
                  sizeof(float) * D);

  for (int64_t l = 0; l < d.layers; ++l) {
    const float* const* w = weights + kGlobalFields + l * kLayerFields;
    for (int64_t p = 0; p < P; ++p) rms_norm(x + p * Dp, w[kNorm1], u + p * Dp, D);
    std::memset(xz, 0, sizeof(float) * P * XZp);
    product(u, Dp, P, D, w[kInProjT], XZp, xz, XZp);
    // causal conv: shift the window by one input, then the depthwise filter
    const float* conv_w = w[kConvT];
    const float* conv_b = w[kConvBias];
    for (int64_t b = 0; b < nb; ++b) {
      const int64_t src = gather && run.rows ? run.rows[begin + b] : begin + b;
      const int64_t batch_in = gather ? run.batch_in : run.batch;
      const float* cin = (gather ? run.conv_in : run.conv_out) + (l * batch_in + src) * K * E;
      std::memcpy(window, cin, sizeof(float) * K * E);
      for (int64_t t = 0; t < T; ++t) {
        std::memmove(window, window + E, sizeof(float) * (K - 1) * E);
        std::memcpy(window + (K - 1) * E, xz + (b * T + t) * XZp, sizeof(float) * E);
        float* xcp = xc + (b * T + t) * Ep;
        // k outside and e inside, so that each loop runs over contiguous channels (vectorised)
#pragma omp simd
        for (int64_t e = 0; e < E; ++e) xcp[e] = window[e] * conv_w[e];
        for (int64_t k = 1; k < K; ++k) {
          const float* ck = window + k * E;
          const float* wk = conv_w + k * E;
#pragma omp simd
          for (int64_t e = 0; e < E; ++e) xcp[e] += ck[e] * wk[e];
        }
#pragma omp simd
        for (int64_t e = 0; e < E; ++e) xcp[e] = silu(xcp[e] + conv_b[e]);
      }
      std::memcpy(run.conv_out + (l * run.batch + begin + b) * K * E, window, sizeof(float) * K * E);
    }
    std::memset(dbc, 0, sizeof(float) * P * XPp);
    product(xc, Ep, P, E, w[kXProjT], XPp, dbc, XPp);
    for (int64_t p = 0; p < P; ++p) std::memcpy(delta + p * Ep, w[kDtBias], sizeof(float) * E);
    product(dbc, XPp, P, R, w[kDtProjT], Ep, delta, Ep);
    // selective scan: the state of each (row, channel) is N floats; the first token reads it
    // from ssm_in (the gathered row) and writes it to ssm_out, the next ones update it there
    const float* A = w[kA];
    const float* Dskip = w[kD];
    for (int64_t b = 0; b < nb; ++b) {
      float* h = run.ssm_out + (l * run.batch + begin + b) * E * N;
      const int64_t src = gather && run.rows ? run.rows[begin + b] : begin + b;
      const float* h_first = gather ? run.ssm_in + (l * run.batch_in + src) * E * N : h;
      for (int64_t t = 0; t < T; ++t) {
        const float* h_prev = t ? h : h_first;
        const int64_t p = b * T + t;
        float* dp = delta + p * Ep;
        const float* xcp = xc + p * Ep;
        const float* Bv = dbc + p * XPp + R;
        const float* Cv = Bv + N;
        const float* zp = xz + p * XZp + E;
        float* yp = y + p * Ep;
#pragma omp simd
        for (int64_t e = 0; e < E; ++e) {  // softplus, threshold 20 as torch's
          const float v = dp[e];
          dp[e] = v > 20.0f ? v : std::log1p(std::exp(v));
        }
        // the decays exp(delta A) first, in one flat loop: calling the vector exp inside the
        // loop below made the compiler spill its accumulators around every call
        for (int64_t e = 0; e < E; ++e) {
          const float de = dp[e];
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
              const float du = dp[e] * xcp[e];
              vec8 acc = {};
              for (int64_t n = 0; n < N; n += kLanes) {
                const vec8 hn = load8(dA + e * N + n) * load8(h_prev + e * N + n) + du * load8(Bv + n);
                store8(h + e * N + n, hn);
                acc += hn * load8(Cv + n);
              }
              sums[j] = acc;
            }
            store8(yp + e0, sums_of_8(sums) + load8(Dskip + e0) * load8(xcp + e0));
          }
        } else {
          for (int64_t e = 0; e < E; ++e) {
            const float du = dp[e] * xcp[e];
            const float* dAe = dA + e * N;
            const float* hp = h_prev + e * N;
            float* he = h + e * N;
            float acc = 0;
#pragma omp simd reduction(+ : acc)
            for (int64_t n = 0; n < N; ++n) {
              he[n] = dAe[n] * hp[n] + du * Bv[n];
              acc += he[n] * Cv[n];
            }
            yp[e] = acc + Dskip[e] * xcp[e];
          }
        }
#pragma omp simd
        for (int64_t e = 0; e < E; ++e) yp[e] *= silu(zp[e]);
      }
    }
    product(y, Ep, P, E, w[kOutProjT], Dp, x, Dp);  // the residual: x += out_proj(y)
    if (H) {
      for (int64_t p = 0; p < P; ++p) rms_norm(x + p * Dp, w[kNorm2], u + p * Dp, D);
      std::memset(hid, 0, sizeof(float) * P * Hp);
      product(u, Dp, P, D, w[kUpT], Hp, hid, Hp);
      for (int64_t p = 0; p < P; ++p) {
        float* hp = hid + p * Hp;
        for (int64_t i = 0; i < H; ++i) hp[i] = 0.5f * hp[i] * (1.0f + std::erf(hp[i] * 0.70710678118654752f));
      }
      product(hid, Hp, P, H, w[kDownT], Dp, x, Dp);
    }
  }
  // the head: every position, or with last_only each row's last one (the chunk that holds it)
  if (run.last_only && t0 + T < run.length) return;
  const int64_t first = run.last_only ? T - 1 : 0, heads = T - first;
  for (int64_t b = 0; b < nb; ++b)
    for (int64_t t = first; t < T; ++t)
      rms_norm(x + (b * T + t) * Dp, weights[kNormF], u + (b * heads + t - first) * Dp, D);
  std::memset(out, 0, sizeof(float) * nb * heads * Vp);
  product(u, Dp, nb * heads, D, weights[kHeadT], Vp, out, Vp);
  for (int64_t b = 0; b < nb; ++b)
    for (int64_t t = first; t < T; ++t) {
      const int64_t at = run.last_only ? begin + b : (begin + b) * run.length + t0 + t;
      std::memcpy(run.logits + at * V, out + (b * heads + t - first) * Vp, sizeof(float) * V);
    }
}

// A worker's rows through every token, in chunks of positions that keep the scratch small (a
// 768-token prefill would otherwise need ~6 MB per row); the first chunk gathers.
void run_all(const Run& run, int64_t begin, int64_t end, std::vector<float>& scratch) {
  constexpr int64_t kChunkPositions = 256;
  const int64_t nb = end - begin;
  const int64_t chunk = nb >= kChunkPositions ? 1 : kChunkPositions / nb;
  for (int64_t t0 = 0; t0 < run.length; t0 += chunk) {
    const int64_t T = run.length - t0 < chunk ? run.length - t0 : chunk;
    run_rows(run, begin, end, t0, T, t0 == 0, scratch);
  }
}

}  // namespace

extern "C" {

// Every row through `length` tokens (tokens: (batch, length)): a step is length 1, a prefill more.
// Returns 0, or -1 - b for the first row b with a token (or source row) out of range; nothing
// is written then. dims: d_model, n_layers, d_inner, d_state, d_conv, dt_rank, vocab, ffn hidden.
// logits: (batch, length, V), or (batch, V) for each row's last token with last_only. Above 16
// rows and with threads > 1 the rows are split over threads (the daemon's beams, at most a dozen
// rows, always run on the calling thread).
int calm_step_f32(const int64_t* dims, const float* const* weights, const int64_t* tokens,
                  int64_t length, const int64_t* rows, const float* conv_in, const float* ssm_in,
                  int64_t batch_in, float* conv_out, float* ssm_out, float* logits, int last_only,
                  int64_t batch, int threads) {
  const Dims d{dims[0], dims[1], dims[2], dims[3], dims[4], dims[5], dims[6], dims[7]};
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t t = 0; t < length; ++t)
      if (tokens[b * length + t] < 0 || tokens[b * length + t] >= d.V) return static_cast<int>(-1 - b);
    if (rows && (rows[b] < 0 || rows[b] >= batch_in)) return static_cast<int>(-1 - b);
  }
  if (length < 1 || batch < 1) return 0;
  const Run run{d, weights, tokens, length, rows, conv_in, ssm_in, batch_in, conv_out, ssm_out,
                logits, last_only != 0, batch};
  constexpr int64_t kRowsPerThreadAtLeast = 16;
  int workers = threads;
  if (batch <= kRowsPerThreadAtLeast) workers = 1;
  if (workers > batch) workers = static_cast<int>(batch);
  if (workers <= 1) {
    thread_local std::vector<float> scratch;
    run_all(run, 0, batch, scratch);
    return 0;
  }
  std::vector<std::thread> pool;
  pool.reserve(workers);
  for (int w = 0; w < workers; ++w) {
    const int64_t begin = batch * w / workers, end = batch * (w + 1) / workers;
    pool.emplace_back([&run, begin, end] {
      std::vector<float> scratch;
      run_all(run, begin, end, scratch);
    });
  }
  for (auto& t : pool) t.join();
  return 0;
}

}  // extern "C"
