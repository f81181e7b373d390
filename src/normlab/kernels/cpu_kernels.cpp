// normlab CPU kernels: LayerNorm / RMSNorm / add+norm, forward and single-pass backward.
//
// Built at first use by normlab/kernels/cpu.py (g++ -O3 -fopenmp) and called through ctypes
// with raw pointers to contiguous N x D rows. No torch headers: the build takes about a second.
//
// Numerics (docs/numerics.md): storage type T (float, double, bfloat16, float16); statistics, weights
// and weight gradients in the accumulation type A (double for double, else float); two passes over the
// row (mean, then the mean of squared deviations), the row staying in L1 between them; biased variance; eps inside the square root; rstd = 0 for a constant row
// at eps = 0, so such a row gives bias. Row reductions use LANES independent accumulators in a
// fixed order (explicit in the source, so no compiler choice or pointer alignment changes them):
// a row's result is bitwise the same alone or inside any batch, on any number of threads.
//
// Backward: one program per fixed block of ROWS rows computes dx row by row (the row's two
// dot products, then dx, with x and dy still in L1) and accumulates that block's dweight/dbias
// partial row; a second, column-parallel loop sums the partial rows in block order. The block
// partition depends only on N, so weight gradients are bitwise repeatable whatever the thread
// count. Threads take rows (forward) and blocks (backward) dynamically: which thread computes a
// row or a block never changes its bits, and a thread slowed by other work on a shared machine
// does not hold the others up.
#include <cmath>
#include <cstdint>
#include <cstring>

typedef int64_t i64;

static const i64 ROWS = 32;           // rows per weight-gradient partial (fixed: defines the sum order)
static const i64 SERIAL_WORK = 32768; // below this many elements, run on one thread

// ------------------------------------------------------------------ storage types

struct bf16 { uint16_t bits; };  // bfloat16: the top half of a float32

// IEEE half where the compiler has _Float16 in C++ (GCC >= 12, clang on x86-64 and aarch64): the compiler
// defines __FLT16_MAX__ exactly then. Elsewhere (GCC 11, or -DNORMLAB_NO_FLOAT16) the float16 entry points
// are left out and the rest of the file builds; normlab_has_f16() tells the caller which.
#if defined(__FLT16_MAX__) && !defined(NORMLAB_NO_FLOAT16) && (defined(__clang__) || !defined(__GNUC__) || __GNUC__ >= 12)
#define NORMLAB_HAS_F16 1
typedef _Float16 f16;
#else
#define NORMLAB_HAS_F16 0
#endif

template <class T> struct Acc { typedef T type; };
template <> struct Acc<bf16> { typedef float type; };
#if NORMLAB_HAS_F16
template <> struct Acc<f16> { typedef float type; };
#endif

static inline float ld(float v) { return v; }
static inline double ld(double v) { return v; }
#if NORMLAB_HAS_F16
static inline float ld(f16 v) { return (float)v; }
#endif
static inline float ld(bf16 v) {
  uint32_t u = uint32_t(v.bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

template <class T> static inline T st(typename Acc<T>::type v) { return T(v); }  // float, double, f16: RNE
template <> inline bf16 st<bf16>(float f) {  // round to nearest even, NaN stays NaN (as torch)
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16{0x7fc0};
  u += 0x7fffu + ((u >> 16) & 1u);
  return bf16{uint16_t(u >> 16)};
}

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

// One row: y = (s - mean) * rstd * w + b with s = x (+ r, rounded to T and written to so). RMS: mean = 0.
template <class T, bool RMS, bool HW, bool HB, bool HR, class A = typename Acc<T>::type>
static inline void fwd_row(const T* xi, const T* ri, T* so, const A* w, const A* b, T* yi, A* mean, A* rstd,
                           i64 d, A inv_d, A eps) {
  const T* si = xi;
  if (HR) {
#pragma omp simd
    for (i64 j = 0; j < d; ++j) so[j] = st<T>(ld(xi[j]) + ld(ri[j]));
    si = so;  // the statistics see s as stored, as eager's x + r does
  }
  A m = 0, rs;
  if (RMS) {
    rs = rstd_of<A>(row_reduce<A>(d, [=](i64 j) { A v = ld(si[j]); return v * v; }) * inv_d, eps);
  } else {
    m = row_reduce<A>(d, [=](i64 j) { return A(ld(si[j])); }) * inv_d;
    rs = rstd_of<A>(row_reduce<A>(d, [=](i64 j) { A c = ld(si[j]) - m; return c * c; }) * inv_d, eps);
    *mean = m;
  }
  *rstd = rs;
#pragma omp simd
  for (i64 j = 0; j < d; ++j) {
    A v = (ld(si[j]) - m) * rs;
    if (HW) v = v * w[j];
    if (HB) v = v + b[j];
    yi[j] = st<T>(v);
  }
}

template <class T, bool RMS, bool HW, bool HB, bool HR, class A = typename Acc<T>::type>
static void fwd(const T* x, const T* r, T* s, const A* w, const A* b, T* y, A* mean, A* rstd, i64 n, i64 d,
                A eps, int nthreads) {
  const A inv_d = A(1) / A(d);
#pragma omp parallel for schedule(dynamic, 16) num_threads(nthreads) if (n * d > SERIAL_WORK && nthreads > 1)
  for (i64 i = 0; i < n; ++i)
    fwd_row<T, RMS, HW, HB, HR>(x + i * d, HR ? r + i * d : nullptr, HR ? s + i * d : nullptr, w, b, y + i * d,
                                RMS ? nullptr : mean + i, rstd + i, d, inv_d, eps);
}

// ------------------------------------------------------------------ backward

// x_hat = (x - mean) * rstd (mean = 0 for RMS), g = dy * w:
//   LayerNorm: dx = rstd * (g - mean(g) - x_hat * mean(g x_hat))
//   RMSNorm:   dx = rstd * (g - x_hat * mean(g x_hat))
// dx += ds (the add variants). Partial sums of the block: pw += dy x_hat, pb += dy (LayerNorm).
template <class T, bool RMS, bool HW, bool HDS, class A = typename Acc<T>::type>
static inline void bwd_row(const T* gi, const T* xi, A m, A rs, const A* w, const T* dsi, T* dxi, A* pw, A* pb,
                           i64 d, A inv_d) {
  const int L = Lanes<A>::n;
  A a1[L], a2[L];
  for (int k = 0; k < L; ++k) a1[k] = a2[k] = 0;
  i64 j = 0;
  for (; j + L <= d; j += L) {
#pragma omp simd
    for (int k = 0; k < L; ++k) {
      const A xh = (ld(xi[j + k]) - m) * rs;
      const A g = HW ? ld(gi[j + k]) * w[j + k] : ld(gi[j + k]);
      a1[k] += g;
      a2[k] += g * xh;
    }
  }
  A t1 = 0, t2 = 0;
  for (; j < d; ++j) {
    const A xh = (ld(xi[j]) - m) * rs;
    const A g = HW ? ld(gi[j]) * w[j] : ld(gi[j]);
    t1 += g;
    t2 += g * xh;
  }
  for (int h = L / 2; h >= 1; h /= 2)
    for (int k = 0; k < h; ++k) a1[k] += a1[k + h], a2[k] += a2[k + h];
  const A c1 = RMS ? A(0) : (a1[0] + t1) * inv_d;
  const A c2 = (a2[0] + t2) * inv_d;
#pragma omp simd
  for (i64 j = 0; j < d; ++j) {
    const A dy = ld(gi[j]);
    const A xh = (ld(xi[j]) - m) * rs;
    const A g = HW ? dy * w[j] : dy;
    A v = rs * (g - c1 - xh * c2);
    if (HDS) v += ld(dsi[j]);
    dxi[j] = st<T>(v);
    if (HW) pw[j] += dy * xh;
    if (!RMS) pb[j] += dy;
  }
}

// partial: (ceil(n / ROWS), 2, d) scratch; dw written when HW, db when LayerNorm.
template <class T, bool RMS, bool HW, bool HDS, class A = typename Acc<T>::type>
static void bwd(const T* dy, const T* x, const A* mean, const A* rstd, const A* w, const T* ds, T* dx, A* dw,
                A* db, A* partial, i64 n, i64 d, int nthreads) {
  const A inv_d = A(1) / A(d);
  const i64 nb = (n + ROWS - 1) / ROWS;
#pragma omp parallel num_threads(nthreads) if (n * d > SERIAL_WORK && nthreads > 1)
  {
#pragma omp for schedule(dynamic, 1)
    for (i64 blk = 0; blk < nb; ++blk) {
      A* pw = partial + blk * 2 * d;
      A* pb = pw + d;
      std::memset(pw, 0, 2 * d * sizeof(A));
      const i64 end = (blk + 1) * ROWS < n ? (blk + 1) * ROWS : n;
      for (i64 i = blk * ROWS; i < end; ++i)
        bwd_row<T, RMS, HW, HDS>(dy + i * d, x + i * d, RMS ? A(0) : mean[i], rstd[i], w,
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
template <class T, class A = typename Acc<T>::type>
static void norm_fwd(const T* x, const T* r, T* s, const A* w, const A* b, T* y, A* mean, A* rstd, i64 n, i64 d,
                     A eps, int rms, int nthreads) {
#define NL_FWD(R, W, B, RR) fwd<T, R, W, B, RR>(x, r, s, w, b, y, mean, rstd, n, d, eps, nthreads)
#define NL_FWD_R(R, W, B) (r ? NL_FWD(R, W, B, true) : NL_FWD(R, W, B, false))
#define NL_FWD_B(R, W) (b ? NL_FWD_R(R, W, true) : NL_FWD_R(R, W, false))
  if (rms) {
    w ? NL_FWD_R(true, true, false) : NL_FWD_R(true, false, false);
  } else {
    w ? NL_FWD_B(false, true) : NL_FWD_B(false, false);
  }
}

template <class T, class A = typename Acc<T>::type>
static void norm_bwd(const T* dy, const T* x, const A* mean, const A* rstd, const A* w, const T* ds, T* dx, A* dw,
                     A* db, A* partial, i64 n, i64 d, int rms, int nthreads) {
#define NL_BWD(R, W, S) bwd<T, R, W, S>(dy, x, mean, rstd, w, ds, dx, dw, db, partial, n, d, nthreads)
#define NL_BWD_S(R, W) (ds ? NL_BWD(R, W, true) : NL_BWD(R, W, false))
  if (rms) {
    w ? NL_BWD_S(true, true) : NL_BWD_S(true, false);
  } else {
    w ? NL_BWD_S(false, true) : NL_BWD_S(false, false);
  }
}

// ------------------------------------------------------------------ C entry points

#define NORMLAB_ENTRIES(T, SUF)                                                                             \
  extern "C" void normlab_fwd_##SUF(const T* x, const T* r, T* s_out, const Acc<T>::type* w,              \
                                    const Acc<T>::type* b, T* y, Acc<T>::type* mean, Acc<T>::type* rstd,  \
                                    i64 n, i64 d, double eps, int rms, int nthreads) {                     \
    norm_fwd<T>(x, r, s_out, w, b, y, mean, rstd, n, d, Acc<T>::type(eps), rms, nthreads);                \
  }                                                                                                         \
  extern "C" void normlab_bwd_##SUF(const T* dy, const T* x, const Acc<T>::type* mean,                     \
                                    const Acc<T>::type* rstd, const Acc<T>::type* w, const T* ds, T* dx,   \
                                    Acc<T>::type* dw, Acc<T>::type* db, Acc<T>::type* partial, i64 n,      \
                                    i64 d, int rms, int nthreads) {                                        \
    norm_bwd<T>(dy, x, mean, rstd, w, ds, dx, dw, db, partial, n, d, rms, nthreads);                       \
  }

NORMLAB_ENTRIES(float, f32)
NORMLAB_ENTRIES(double, f64)
NORMLAB_ENTRIES(bf16, bf16)
#if NORMLAB_HAS_F16
NORMLAB_ENTRIES(f16, f16)
#endif

extern "C" i64 normlab_rows_per_partial(void) { return ROWS; }
extern "C" int normlab_has_f16(void) { return NORMLAB_HAS_F16; }
