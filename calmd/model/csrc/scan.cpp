// scan.cpp: the fused selective scan for CPUs, forward and backward, float and double.
//
// Built on first use by calmd/model/fastscan.py (g++ -O3 -march=native, cached per machine) and called
// through ctypes with raw pointers to contiguous tensors; no torch or Python headers, so it
// compiles in about a second. The arithmetic is that of selective_scan_ref in calmd/model/mamba.py:
//
//   h_t = exp(delta_t * A) * h_{t-1} + delta_t * u_t * B_t        (per batch row b, channel e)
//   y_t = <h_t, C_t> + D * u_t
//
// Why it is faster than the chunked PyTorch path: every (b, e) pair runs its whole sequence with
// its state (N floats) in registers, so a (T, B, E, N) tensor is never written to memory; the
// backward pass recomputes the states of one (b, e) pair into a small per-thread buffer (L x N)
// and walks it backwards. The loops over n are vectorised (exp through glibc's libmvec).
//
// Shapes (all contiguous, row-major):
//   u, delta, y, gy, gu, gdelta   (B, E, L)
//   A, gA                         (E, N)
//   Bt, Ct, gBt, gCt              (B, L, N)   time-major per row, so that n is contiguous
//   D, gD                         (E)
//   h0, h_last, gh_last, gh0      (B, E, N)
// gBt and gCt sum over e; gA and gD over b. Work is split over threads by (b, e) pairs in the
// forward pass and by batch rows in the backward pass (so that no two threads add to the same
// gBt/gCt entry); gA and gD are summed per thread, then added up.

#include <cmath>
#include <cstdint>
#include <thread>
#include <vector>

namespace {

template <typename F>
void parallel_for(int64_t count, int threads, F&& body) {
  if (threads <= 1 || count <= 1) {
    body(0, int64_t{0}, count);
    return;
  }
  if (threads > count) threads = static_cast<int>(count);
  std::vector<std::thread> pool;
  pool.reserve(threads);
  for (int w = 0; w < threads; ++w) {
    const int64_t begin = count * w / threads, end = count * (w + 1) / threads;
    pool.emplace_back([&body, w, begin, end] { body(w, begin, end); });
  }
  for (auto& t : pool) t.join();
}

template <typename T>
void forward(const T* u, const T* delta, const T* A, const T* Bt, const T* Ct, const T* D,
             const T* h0, T* y, T* h_last, int64_t batch, int64_t E, int64_t L, int64_t N,
             int threads) {
  parallel_for(batch * E, threads, [&](int, int64_t begin, int64_t end) {
    std::vector<T> h(N);
    for (int64_t be = begin; be < end; ++be) {
      const int64_t b = be / E, e = be % E;
      const T* u_row = u + be * L;
      const T* d_row = delta + be * L;
      const T* a = A + e * N;
      const T* B_row = Bt + b * L * N;
      const T* C_row = Ct + b * L * N;
      T* y_row = y + be * L;
      for (int64_t n = 0; n < N; ++n) h[n] = h0[be * N + n];
      for (int64_t t = 0; t < L; ++t) {
        const T d = d_row[t], du = d * u_row[t];
        const T* Bv = B_row + t * N;
        const T* Cv = C_row + t * N;
        T acc = 0;
#pragma omp simd reduction(+ : acc)
        for (int64_t n = 0; n < N; ++n) {
          h[n] = std::exp(d * a[n]) * h[n] + du * Bv[n];
          acc += h[n] * Cv[n];
        }
        y_row[t] = acc + D[e] * u_row[t];
      }
      for (int64_t n = 0; n < N; ++n) h_last[be * N + n] = h[n];
    }
  });
}

template <typename T>
void backward(const T* u, const T* delta, const T* A, const T* Bt, const T* Ct, const T* D,
              const T* h0, const T* gy, const T* gh_last, T* gu, T* gdelta, T* gA, T* gBt,
              T* gCt, T* gD, T* gh0, int64_t batch, int64_t E, int64_t L, int64_t N,
              int threads) {
  const int workers = static_cast<int>(threads < batch ? threads : (batch > 0 ? batch : 1));
  std::vector<std::vector<T>> gA_part(workers, std::vector<T>(E * N, T(0)));
  std::vector<std::vector<T>> gD_part(workers, std::vector<T>(E, T(0)));
  // gBt and gCt are sums over e: start from zero
  for (int64_t i = 0; i < batch * L * N; ++i) gBt[i] = gCt[i] = 0;
  parallel_for(batch, workers, [&](int w, int64_t begin, int64_t end) {
    std::vector<T> states(L * N), dA(L * N), g(N);
    T* gA_w = gA_part[w].data();
    T* gD_w = gD_part[w].data();
    for (int64_t b = begin; b < end; ++b) {
      const T* B_row = Bt + b * L * N;
      const T* C_row = Ct + b * L * N;
      T* gB_row = gBt + b * L * N;
      T* gC_row = gCt + b * L * N;
      for (int64_t e = 0; e < E; ++e) {
        const int64_t be = b * E + e;
        const T* u_row = u + be * L;
        const T* d_row = delta + be * L;
        const T* gy_row = gy + be * L;
        const T* a = A + e * N;
        const T* h_init = h0 + be * N;
        // recompute this pair's states and decays
        for (int64_t t = 0; t < L; ++t) {
          const T d = d_row[t], du = d * u_row[t];
          const T* Bv = B_row + t * N;
          const T* prev = t ? states.data() + (t - 1) * N : h_init;
          T* cur = states.data() + t * N;
          T* dAt = dA.data() + t * N;
#pragma omp simd
          for (int64_t n = 0; n < N; ++n) {
            dAt[n] = std::exp(d * a[n]);
            cur[n] = dAt[n] * prev[n] + du * Bv[n];
          }
        }
        // walk back: g = dL/dh_t, carried through the decay
        for (int64_t n = 0; n < N; ++n) g[n] = gh_last[be * N + n];
        T* gA_e = gA_w + e * N;
        T gD_acc = 0;
        for (int64_t t = L - 1; t >= 0; --t) {
          const T d = d_row[t], ut = u_row[t], du = d * ut, gyt = gy_row[t];
          const T* Bv = B_row + t * N;
          const T* Cv = C_row + t * N;
          const T* cur = states.data() + t * N;
          const T* prev = t ? states.data() + (t - 1) * N : h_init;
          const T* dAt = dA.data() + t * N;
          T* gBv = gB_row + t * N;
          T* gCv = gC_row + t * N;
          T sum_decay = 0, sum_B = 0;
#pragma omp simd reduction(+ : sum_decay, sum_B)
          for (int64_t n = 0; n < N; ++n) {
            const T gn = g[n] + gyt * Cv[n];
            gCv[n] += gyt * cur[n];
            const T g_dA = gn * prev[n] * dAt[n];  // dL/d(delta_t A_n)
            sum_decay += g_dA * a[n];
            gA_e[n] += g_dA * d;
            sum_B += gn * Bv[n];
            gBv[n] += gn * du;
            g[n] = gn * dAt[n];
          }
          gdelta[be * L + t] = sum_decay + sum_B * ut;
          gu[be * L + t] = sum_B * d + gyt * D[e];
          gD_acc += gyt * ut;
        }
        for (int64_t n = 0; n < N; ++n) gh0[be * N + n] = g[n];
        gD_w[e] += gD_acc;
      }
    }
  });
  for (int64_t i = 0; i < E * N; ++i) {
    T s = 0;
    for (int w = 0; w < workers; ++w) s += gA_part[w][i];
    gA[i] = s;
  }
  for (int64_t i = 0; i < E; ++i) {
    T s = 0;
    for (int w = 0; w < workers; ++w) s += gD_part[w][i];
    gD[i] = s;
  }
}

}  // namespace

extern "C" {

// 2: the library holds calm_step_f32 (step.cpp) too; 3: calm_forest_f64 (forest.cpp)
int calm_scan_abi_version() { return 3; }

#define CALM_SCAN_API(T, SUFFIX)                                                               \
  void calm_scan_forward_##SUFFIX(const T* u, const T* delta, const T* A, const T* Bt,         \
                                  const T* Ct, const T* D, const T* h0, T* y, T* h_last,       \
                                  int64_t batch, int64_t E, int64_t L, int64_t N, int threads) { \
    forward<T>(u, delta, A, Bt, Ct, D, h0, y, h_last, batch, E, L, N, threads);                \
  }                                                                                            \
  void calm_scan_backward_##SUFFIX(const T* u, const T* delta, const T* A, const T* Bt,        \
                                   const T* Ct, const T* D, const T* h0, const T* gy,          \
                                   const T* gh_last, T* gu, T* gdelta, T* gA, T* gBt, T* gCt,  \
                                   T* gD, T* gh0, int64_t batch, int64_t E, int64_t L,         \
                                   int64_t N, int threads) {                                   \
    backward<T>(u, delta, A, Bt, Ct, D, h0, gy, gh_last, gu, gdelta, gA, gBt, gCt, gD, gh0,    \
                batch, E, L, N, threads);                                                      \
  }

CALM_SCAN_API(float, f32)
CALM_SCAN_API(double, f64)

}  // extern "C"
