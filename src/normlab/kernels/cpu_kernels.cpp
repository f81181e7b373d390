// normlab CPU kernels: LayerNorm / RMSNorm / add+norm, forward and single-pass backward.
//
// Built at first use by normlab/kernels/cpu.py (g++ -O3 -fopenmp) and called through ctypes
// with raw pointers to contiguous N x D rows. No torch headers: the build takes about a second.
//
// Numerics (DESIGN.md): statistics in the accumulation type A (float for float, double for
// double); two passes over the row (mean, then the mean of squared deviations), the row staying
// in L1 between them; biased variance; eps inside the square root; rstd = 0 for a constant row
// at eps = 0, so such a row gives bias. Row reductions use LANES independent accumulators in a
// fixed order (explicit in the source, so no compiler choice or pointer alignment changes them):
// a row's result is bitwise the same alone or inside any batch, on any number of threads.
//
// Backward: one program per fixed block of ROWS rows computes dx row by row (the row's two
// dot products, then dx, with x and dy still in L1) and accumulates that block's dweight/dbias
// partial row; a second, column-parallel loop sums the partial rows in block order. The block
// partition depends only on N, so weight gradients are bitwise repeatable whatever the thread
// count.
#include <cmath>
#include <cstdint>
#include <cstring>

typedef int64_t i64;

static const i64 ROWS = 32;           // rows per weight-gradient partial (fixed: defines the sum order)
static const i64 SERIAL_WORK = 32768; // below this many elements, run on one thread

template <class A> struct Lanes { static const int n = 64 / sizeof(A); };  // one cache line of A

// sum_j f(j) over a row with LANES fixed accumulators, then a fixed pairwise tree, then the tail
template <class A, class F> static inline A row_reduce(i64 d, F f) {
  const int L = Lanes<A>::n;
  A acc[L];
  for (int k = 0; k < L; ++k) acc[k] = 0;
  i64 j = 0;
  for (; j + L <= d; j += L) {
#pragma omp simd
    for (int k = 0; k < L; ++k) acc[k] += f(j + k);
  }
  A tail = 0;
  for (; j < d; ++j) tail += f(j);
  for (int w = L / 2; w >= 1; w /= 2)
    for (int k = 0; k < w; ++k) acc[k] += acc[k + w];
  return acc[0] + tail;
}

template <class A> static inline A rstd_of(A m, A eps) {
  // 1/sqrt(m + eps); 0 where m + eps == 0 (a constant row at eps = 0)
  if (eps == 0 && !(m > 0)) return A(0);
  return A(1) / std::sqrt(m + eps);
}

// ------------------------------------------------------------------ forward

// One row: y = (s - mean) * rstd * w + b with s = x (+ r, written to so). RMS: mean = 0.
template <class A, bool RMS, bool HW, bool HB, bool HR>
static inline void fwd_row(const A* xi, const A* ri, A* so, const A* w, const A* b, A* yi, A* mean, A* rstd,
                           i64 d, A inv_d, A eps) {
  const A* si = xi;
  if (HR) {
#pragma omp simd
    for (i64 j = 0; j < d; ++j) so[j] = xi[j] + ri[j];
    si = so;
  }
  A m = 0, rs;
  if (RMS) {
    rs = rstd_of<A>(row_reduce<A>(d, [=](i64 j) { return si[j] * si[j]; }) * inv_d, eps);
  } else {
    m = row_reduce<A>(d, [=](i64 j) { return si[j]; }) * inv_d;
    rs = rstd_of<A>(row_reduce<A>(d, [=](i64 j) { A c = si[j] - m; return c * c; }) * inv_d, eps);
    *mean = m;
  }
  *rstd = rs;
#pragma omp simd
  for (i64 j = 0; j < d; ++j) {
    A v = (si[j] - m) * rs;
    if (HW) v = v * w[j];
    if (HB) v = v + b[j];
    yi[j] = v;
  }
}

template <class A, bool RMS, bool HW, bool HB, bool HR>
static void fwd(const A* x, const A* r, A* s, const A* w, const A* b, A* y, A* mean, A* rstd, i64 n, i64 d,
                A eps, int nthreads) {
  const A inv_d = A(1) / A(d);
#pragma omp parallel for schedule(static) num_threads(nthreads) if (n * d > SERIAL_WORK && nthreads > 1)
  for (i64 i = 0; i < n; ++i)
    fwd_row<A, RMS, HW, HB, HR>(x + i * d, HR ? r + i * d : nullptr, HR ? s + i * d : nullptr, w, b, y + i * d,
                                RMS ? nullptr : mean + i, rstd + i, d, inv_d, eps);
}

// ------------------------------------------------------------------ backward

// x_hat = (x - mean) * rstd (mean = 0 for RMS), g = dy * w:
//   LayerNorm: dx = rstd * (g - mean(g) - x_hat * mean(g x_hat))
//   RMSNorm:   dx = rstd * (g - x_hat * mean(g x_hat))
// dx += ds (the add variants). Partial sums of the block: pw += dy x_hat, pb += dy (LayerNorm).
template <class A, bool RMS, bool HW, bool HDS>
static inline void bwd_row(const A* gi, const A* xi, A m, A rs, const A* w, const A* dsi, A* dxi, A* pw, A* pb,
                           i64 d, A inv_d) {
  const int L = Lanes<A>::n;
  A a1[L], a2[L];
  for (int k = 0; k < L; ++k) a1[k] = a2[k] = 0;
  i64 j = 0;
  for (; j + L <= d; j += L) {
#pragma omp simd
    for (int k = 0; k < L; ++k) {
      const A xh = (xi[j + k] - m) * rs;
      const A g = HW ? gi[j + k] * w[j + k] : gi[j + k];
      a1[k] += g;
      a2[k] += g * xh;
    }
  }
  A t1 = 0, t2 = 0;
  for (; j < d; ++j) {
    const A xh = (xi[j] - m) * rs;
    const A g = HW ? gi[j] * w[j] : gi[j];
    t1 += g;
    t2 += g * xh;
  }
  for (int h = L / 2; h >= 1; h /= 2)
    for (int k = 0; k < h; ++k) a1[k] += a1[k + h], a2[k] += a2[k + h];
  const A c1 = RMS ? A(0) : (a1[0] + t1) * inv_d;
  const A c2 = (a2[0] + t2) * inv_d;
#pragma omp simd
  for (i64 j = 0; j < d; ++j) {
    const A xh = (xi[j] - m) * rs;
    const A g = HW ? gi[j] * w[j] : gi[j];
    A v = rs * (g - c1 - xh * c2);
    if (HDS) v += dsi[j];
    dxi[j] = v;
    if (HW) pw[j] += gi[j] * xh;
    if (!RMS) pb[j] += gi[j];
  }
}

// partial: (ceil(n / ROWS), 2, d) scratch; dw written when HW, db when LayerNorm.
template <class A, bool RMS, bool HW, bool HDS>
static void bwd(const A* dy, const A* x, const A* mean, const A* rstd, const A* w, const A* ds, A* dx, A* dw,
                A* db, A* partial, i64 n, i64 d, int nthreads) {
  const A inv_d = A(1) / A(d);
  const i64 nb = (n + ROWS - 1) / ROWS;
#pragma omp parallel num_threads(nthreads) if (n * d > SERIAL_WORK && nthreads > 1)
  {
#pragma omp for schedule(static)
    for (i64 blk = 0; blk < nb; ++blk) {
      A* pw = partial + blk * 2 * d;
      A* pb = pw + d;
      std::memset(pw, 0, 2 * d * sizeof(A));
      const i64 end = (blk + 1) * ROWS < n ? (blk + 1) * ROWS : n;
      for (i64 i = blk * ROWS; i < end; ++i)
        bwd_row<A, RMS, HW, HDS>(dy + i * d, x + i * d, RMS ? A(0) : mean[i], rstd[i], w,
                                 HDS ? ds + i * d : nullptr, dx + i * d, pw, pb, d, inv_d);
    }
    // second reduction: column sums of the partial rows, in block order
#pragma omp for schedule(static)
    for (i64 j = 0; j < d; ++j) {
      A sw = 0, sb = 0;
      for (i64 blk = 0; blk < nb; ++blk) {
        sw += partial[blk * 2 * d + j];
        sb += partial[blk * 2 * d + d + j];
      }
      if (HW) dw[j] = sw;
      if (!RMS) db[j] = sb;
    }
  }
}

// runtime flags -> template instantiation
template <class A>
static void norm_fwd(const A* x, const A* r, A* s, const A* w, const A* b, A* y, A* mean, A* rstd, i64 n, i64 d,
                     A eps, int rms, int nthreads) {
#define NL_FWD(R, W, B, RR) fwd<A, R, W, B, RR>(x, r, s, w, b, y, mean, rstd, n, d, eps, nthreads)
#define NL_FWD_R(R, W, B) (r ? NL_FWD(R, W, B, true) : NL_FWD(R, W, B, false))
#define NL_FWD_B(R, W) (b ? NL_FWD_R(R, W, true) : NL_FWD_R(R, W, false))
  if (rms) {
    w ? NL_FWD_R(true, true, false) : NL_FWD_R(true, false, false);
  } else {
    w ? NL_FWD_B(false, true) : NL_FWD_B(false, false);
  }
}

template <class A>
static void norm_bwd(const A* dy, const A* x, const A* mean, const A* rstd, const A* w, const A* ds, A* dx, A* dw,
                     A* db, A* partial, i64 n, i64 d, int rms, int nthreads) {
#define NL_BWD(R, W, S) bwd<A, R, W, S>(dy, x, mean, rstd, w, ds, dx, dw, db, partial, n, d, nthreads)
#define NL_BWD_S(R, W) (ds ? NL_BWD(R, W, true) : NL_BWD(R, W, false))
  if (rms) {
    w ? NL_BWD_S(true, true) : NL_BWD_S(true, false);
  } else {
    w ? NL_BWD_S(false, true) : NL_BWD_S(false, false);
  }
}

// ------------------------------------------------------------------ C entry points

#define NORMLAB_ENTRIES(A, SUF)                                                                          \
  extern "C" void normlab_fwd_##SUF(const A* x, const A* r, A* s_out, const A* w, const A* b, A* y,     \
                                    A* mean, A* rstd, i64 n, i64 d, double eps, int rms, int nthreads) { \
    norm_fwd<A>(x, r, s_out, w, b, y, mean, rstd, n, d, A(eps), rms, nthreads);                         \
  }                                                                                                      \
  extern "C" void normlab_bwd_##SUF(const A* dy, const A* x, const A* mean, const A* rstd, const A* w,  \
                                    const A* ds, A* dx, A* dw, A* db, A* partial, i64 n, i64 d, int rms, \
                                    int nthreads) {                                                      \
    norm_bwd<A>(dy, x, mean, rstd, w, ds, dx, dw, db, partial, n, d, rms, nthreads);                    \
  }

NORMLAB_ENTRIES(float, f32)
NORMLAB_ENTRIES(double, f64)

extern "C" i64 normlab_rows_per_partial(void) { return ROWS; }
