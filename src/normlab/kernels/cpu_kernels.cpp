// normlab CPU kernels: LayerNorm / RMSNorm / add+norm, forward and single-pass backward.
//
// Built at first use by normlab/kernels/build.py (g++ -O3 -march=native -fopenmp) and called through
// ctypes with raw pointers to contiguous N x D rows. No torch headers: the build takes seconds.
//
// Numerics (docs/numerics.md): storage type T (float, double, bfloat16, float16); statistics, weights
// and weight gradients in the accumulation type A (double for double, else float); two passes over the
// row (mean, then the deviations from it: their mean corrects the mean, the mean of their squares less its
// square is the variance), the row staying in L1 between them; biased variance;
// eps inside the square root; rstd = 0 for a constant row at eps = 0, so such a row gives bias.
//
// Vectorized explicitly with the compiler's vector extensions (a vector is 16 or 32 bytes of A, chosen
// per target below). A row reduction keeps LANES independent accumulators (one cache line of A: 16
// floats or 8 doubles), element j always added to accumulator j % LANES (a row's last elements as if it
// went on with zeros; a long row in chunks of 8 blocks whose sums are added in order, in groups of 64 chunks
// whose sums are added pairwise, row_reduce), and folds them
// by a fixed pairwise tree: the order is written in the source, so no
// compiler choice, vector width, thread count or pointer alignment changes it, and a row's result is bitwise
// the same alone or inside any batch. A row's last elements are loaded and stored by part vectors (masked on
// AVX-512), never one by one. Built with -ffp-contract=off: no fused multiply-add, so every lane computes
// the same expressions whatever part of a row its vector covers.
//
// Backward: one program per fixed block of ROWS rows computes dx row by row (the row's two dot
// products, then dx, with x and dy still in L1) and accumulates that block's dweight/dbias partial
// row; a second, column-parallel loop sums the partial rows in block order, a vector of columns at a
// time. The block partition depends only on N, so weight gradients are bitwise repeatable whatever the
// thread count. Threads take rows (forward) and blocks (backward) dynamically, in chunks of about 1 MB
// (CHUNK_BYTES): which thread computes a row or a block never changes its bits, and a thread slowed by
// other work on a shared machine does not hold the others up.
//
// Streaming stores: with stream = 1 (the caller sets it when an output is larger than the last-level
// cache, so it could not stay there anyway) the outputs y, dx and full-precision s are written with
// non-temporal stores where the target has them (x86 SSE2/AVX): the lines go to memory without being read
// first, a third less memory traffic. The values are the same bits either way; each thread fences its own stores.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <utility>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

typedef int64_t i64;

static const i64 ROWS = 32;           // rows per weight-gradient partial (fixed: defines the sum order)
static const i64 SERIAL_WORK = 32768; // below this many elements, run on one thread

// Threads take rows in chunks of about CHUNK_BYTES of one input, so each reads long runs of memory: with chunks of
// 16 rows (5 KB at D = 80) the threads' reads interleave finely and a short-row kernel ran at half the speed.
// Measured on AMD EPYC (Zen 4, 2 threads), kernels alone from memory, float32 (benchmarks/row_chunks.py), time
// with 1 MB chunks over 16-row chunks (one 32-row block in the backward): 0.45-0.74 at 65536x80, 0.52-0.79 at
// 16384x256, 0.54-0.82 at 4096x80 (capped at 4 chunks per thread: 160 KB), 0.82-0.97 at 8192x768, 0.82-1.00 at
// 32768x768. Against 1 MB, 256 KB chunks read 0.92-1.16 and 4 MB 0.88-1.12 (no size better throughout). A call has at
// least 4 chunks per thread (the dynamic schedule's balance on a shared machine). Which thread runs a row never
// changes its bits.
#ifndef NORMLAB_CHUNK_BYTES
#define NORMLAB_CHUNK_BYTES 1048576
#endif
static const i64 CHUNK_BYTES = NORMLAB_CHUNK_BYTES;

// units (rows, or blocks of rows) per chunk: about CHUNK_BYTES, at most a quarter of a thread's share, at least 1;
// -DNORMLAB_CHUNK_BYTES=0 builds the rule before (`least` units: 16 rows, one block), for benchmarks/row_chunks.py
static inline i64 chunk_units(i64 units, i64 unit_bytes, int nthreads, i64 least) {
  if (CHUNK_BYTES == 0) return least;
  i64 c = CHUNK_BYTES / (unit_bytes > 0 ? unit_bytes : 1);
  const i64 share = units / (4 * (i64)(nthreads > 0 ? nthreads : 1));
  if (c > share) c = share;
  return c > 1 ? c : 1;
}

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

// ------------------------------------------------------------------ vectors of A

// VB bytes per vector: 64 where the target has AVX-512F, 32 where it has AVX, else 16 (SSE, NEON). Measured on
// AMD Zen 1, which splits 256-bit operations: float16 is 15-40% faster at 32 than at 16 (F16C converts 8 values
// at once), bfloat16 10-25% (in-lane unpacks and packs, no cross-lane shuffle), float32 the same. On an Intel
// Xeon with AVX-512, 64 against 32, kernels alone from memory: forward+backward 2-23% faster (bfloat16 8-23%),
// forwards within -10%..+11%. -DNORMLAB_VECTOR_BYTES=16 or 32 overrides; the bits are the same at every width.
#if !defined(NORMLAB_VECTOR_BYTES) && defined(__AVX512F__)
#define NORMLAB_VECTOR_BYTES 64
#elif !defined(NORMLAB_VECTOR_BYTES) && defined(__AVX__)
#define NORMLAB_VECTOR_BYTES 32
#elif !defined(NORMLAB_VECTOR_BYTES)
#define NORMLAB_VECTOR_BYTES 16
#endif
#if NORMLAB_VECTOR_BYTES == 64 && !defined(__AVX512F__)
#error "NORMLAB_VECTOR_BYTES=64 needs AVX-512F"
#endif
static const int VB = NORMLAB_VECTOR_BYTES;

typedef float vf __attribute__((vector_size(VB)));
typedef double vd __attribute__((vector_size(VB)));
typedef uint32_t vu __attribute__((vector_size(VB)));
typedef int32_t vi __attribute__((vector_size(VB)));
typedef uint16_t vh __attribute__((vector_size(VB / 2)));
#if NORMLAB_HAS_F16
typedef _Float16 vhf __attribute__((vector_size(VB / 2)));
#endif

template <class A> struct Vec;
template <> struct Vec<float> { typedef vf type; static const int W = VB / 4; };
template <> struct Vec<double> { typedef vd type; static const int W = VB / 8; };

// W elements of storage T at p, as a vector of A (unaligned loads and stores)
static inline vf vld(const float* p) { vf v; std::memcpy(&v, p, VB); return v; }
static inline vd vld(const double* p) { vd v; std::memcpy(&v, p, VB); return v; }
// half-precision conversions: x86 intrinsics where the target has them (one widening move and a shift for
// bfloat16, F16C for float16), the portable vector code elsewhere; the same values either way
static inline vf vld(const bf16* p) {
#if defined(__AVX512F__) && NORMLAB_VECTOR_BYTES == 64
  // one widening load to 32-bit lanes and a shift (the generic code below compiles to two half-width widenings
  // and an insert on some targets)
  return (vf)_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)p)), 16);
#elif defined(__AVX2__) && NORMLAB_VECTOR_BYTES == 32
  // each 16-bit value becomes the top half of a 32-bit lane: two in-lane unpacks with zero and one insert
  const __m128i h = _mm_loadu_si128((const __m128i*)p), z = _mm_setzero_si128();
  return (vf)_mm256_insertf128_si256(_mm256_castsi128_si256(_mm_unpacklo_epi16(z, h)), _mm_unpackhi_epi16(z, h), 1);
#elif defined(__SSE4_1__) && NORMLAB_VECTOR_BYTES == 16
  return (vf)_mm_slli_epi32(_mm_cvtepu16_epi32(_mm_loadl_epi64((const __m128i*)p)), 16);
#else
  vh h;
  std::memcpy(&h, p, VB / 2);
  vu u = __builtin_convertvector(h, vu) << 16;
  vf f;
  std::memcpy(&f, &u, VB);
  return f;
#endif
}
#if NORMLAB_HAS_F16
static inline vf vld(const f16* p) {
#if NORMLAB_VECTOR_BYTES == 64
  return (vf)_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)p));
#elif defined(__F16C__) && NORMLAB_VECTOR_BYTES == 32
  return (vf)_mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)p));
#elif defined(__F16C__) && NORMLAB_VECTOR_BYTES == 16
  return (vf)_mm_cvtph_ps(_mm_loadl_epi64((const __m128i*)p));
#else
  vhf h;
  std::memcpy(&h, p, VB / 2);
  return __builtin_convertvector(h, vf);
#endif
}
#endif
static inline void vst(float* p, vf v) { std::memcpy(p, &v, VB); }
static inline void vst(double* p, vd v) { std::memcpy(p, &v, VB); }
static inline void vst(bf16* p, vf v) {  // round to nearest even, NaN to 0x7fc0 (as torch), lane by lane
#if defined(__AVX512BF16__) && defined(__AVX512DQ__) && NORMLAB_VECTOR_BYTES == 64
  // one instruction (VCVTNEPS2BF16: round to nearest even) where no lane is NaN or subnormal: it reads
  // subnormal inputs as zero and keeps NaN payloads, so a vector holding either (rare) takes the rounding below
  if (!_mm512_fpclass_ps_mask((__m512)v, 0x01 | 0x20 | 0x80)) {  // quiet NaN, subnormal, signalling NaN
    _mm256_storeu_si256((__m256i*)p, (__m256i)_mm512_cvtneps_pbh((__m512)v));
    return;
  }
#endif
#if defined(__AVX2__) && NORMLAB_VECTOR_BYTES == 32
  // round to nearest even in 32-bit lanes, NaN -> 0x7fc0, then the two 128-bit halves packed to 16 bits (the
  // lanes hold 0..0xffff, so the saturating pack is exact): no cross-lane permute
  const __m256i u = (__m256i)v;
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  __m256i h = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff))), 16);
  h = _mm256_blendv_epi8(h, _mm256_set1_epi32(0x7fc0), (__m256i)_mm256_cmp_ps((__m256)v, (__m256)v, _CMP_UNORD_Q));
  _mm_storeu_si128((__m128i*)p, _mm_packus_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1)));
#else
  vi u;
  std::memcpy(&u, &v, VB);
  const vi nan = (u & 0x7fffffff) > 0x7f800000;  // all ones where NaN (the masked value is >= 0)
  const vi rne = (vi)(((vu)u + 0x7fffu + (((vu)u >> 16) & 1u)) >> 16);
  const vh h = __builtin_convertvector((rne & ~nan) | (nan & 0x7fc0), vh);
  std::memcpy(p, &h, VB / 2);
#endif
}
#if NORMLAB_HAS_F16
static inline void vst(f16* p, vf v) {
#if NORMLAB_VECTOR_BYTES == 64
  _mm256_storeu_si256((__m256i*)p, _mm512_cvtps_ph((__m512)v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
#elif defined(__F16C__) && NORMLAB_VECTOR_BYTES == 32
  _mm_storeu_si128((__m128i*)p, _mm256_cvtps_ph((__m256)v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
#elif defined(__F16C__) && NORMLAB_VECTOR_BYTES == 16
  _mm_storel_epi64((__m128i*)p, _mm_cvtps_ph((__m128)v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
#else
  vhf h = __builtin_convertvector(v, vhf);
  std::memcpy(p, &h, VB / 2);
#endif
}
#endif
template <class V, class S> static inline V splat(S a) { return V{} + a; }

// Non-temporal vst: the same bits as vst, to memory without a read for ownership. Needs p aligned to the
// store's width (SALIGN<T> bytes); row_loop writes the elements before it by a part vector. Where the target
// has no streaming store for T, it is vst.
#if defined(__SSE2__)
#define NORMLAB_HAS_STREAM 1
static inline void vst_nt(float* p, vf v) {
#if NORMLAB_VECTOR_BYTES == 64
  _mm512_stream_ps(p, (__m512)v);
#elif NORMLAB_VECTOR_BYTES == 32
  _mm256_stream_ps(p, (__m256)v);
#else
  _mm_stream_ps(p, (__m128)v);
#endif
}
static inline void vst_nt(double* p, vd v) {
#if NORMLAB_VECTOR_BYTES == 64
  _mm512_stream_pd(p, (__m512d)v);
#elif NORMLAB_VECTOR_BYTES == 32
  _mm256_stream_pd(p, (__m256d)v);
#else
  _mm_stream_pd(p, (__m128d)v);
#endif
}
template <class T> static inline void vst_nt(T* p, vf v) {  // bfloat16, float16: VB / 2 bytes
#if NORMLAB_VECTOR_BYTES == 64
  alignas(32) T h[VB / 4];
  vst(h, v);
  _mm256_stream_si256((__m256i*)p, _mm256_load_si256((const __m256i*)h));
#elif NORMLAB_VECTOR_BYTES == 32
  alignas(16) T h[VB / 4];
  vst(h, v);
  _mm_stream_si128((__m128i*)p, _mm_load_si128((const __m128i*)h));
#else
  alignas(8) T h[VB / 4];
  vst(h, v);
  _mm_stream_si64((long long*)p, *(const long long*)h);
#endif
}
static inline void stream_fence() { _mm_sfence(); }
#else
#define NORMLAB_HAS_STREAM 0
template <class T, class V> static inline void vst_nt(T* p, V v) { vst(p, v); }
static inline void stream_fence() {}
#endif

// ------------------------------------------------------------------ part vectors: a row's last elements

// vld_n / vst_n: the first n of a vector's W elements (0 < n < W), at the end of a row. The lanes from n on load
// as zero and are never stored: nothing beyond the row is written, or used. AVX-512 has masked loads and stores
// (with AVX512BW for 16-bit elements), AVX masked loads of 32- and 64-bit elements; elsewhere see vld_n_page and
// vst_n_buf below.

#if defined(__GNUC__)
#define NORMLAB_INLINE __attribute__((always_inline))
#else
#define NORMLAB_INLINE
#endif

// The lanes below n of a vector V: its lane mask (integers of the lanes' width), all ones there
template <class V> static inline auto lanes_under(int n) {
  typedef decltype(V{} < V{}) M;
  M lane = {};
  for (int l = 0; l < int(sizeof(V) / sizeof(V{}[0])); ++l) lane[l] = l;
  return lane < n;
}
#if NORMLAB_VECTOR_BYTES == 64 && defined(__AVX512F__)
static inline vf vld_n(const float* p, int n) { return (vf)_mm512_maskz_loadu_ps((__mmask16)((1u << n) - 1), p); }
static inline vd vld_n(const double* p, int n) { return (vd)_mm512_maskz_loadu_pd((__mmask8)((1u << n) - 1), p); }
static inline void vst_n(float* p, vf v, int n) { _mm512_mask_storeu_ps(p, (__mmask16)((1u << n) - 1), (__m512)v); }
static inline void vst_n(double* p, vd v, int n) { _mm512_mask_storeu_pd(p, (__mmask8)((1u << n) - 1), (__m512d)v); }
#endif
#if NORMLAB_VECTOR_BYTES == 32 && defined(__AVX2__)
// AVX's masked loads of 32- and 64-bit lanes (the masked-off lanes are not read). Its masked stores are microcoded
// on some AMD cores: stores go through a buffer (vst_n_buf, below)
static inline vf vld_n(const float* p, int n) { return (vf)_mm256_maskload_ps(p, (__m256i)lanes_under<vf>(n)); }
static inline vd vld_n(const double* p, int n) { return (vd)_mm256_maskload_pd(p, (__m256i)lanes_under<vd>(n)); }
#endif
#if NORMLAB_VECTOR_BYTES == 64 && defined(__AVX512BW__) && defined(__AVX512VL__)
// 16-bit storage: the n values masked in, then widened as vld does (zero bits widen to 0.0)
template <class T> static inline vf vld_n(const T* p, int n) {
  alignas(32) T h[16];
  _mm256_store_si256((__m256i*)h, _mm256_maskz_loadu_epi16((__mmask16)((1u << n) - 1), p));
  return vld(static_cast<const T*>(h));
}
template <class T> static inline void vst_n(T* p, vf v, int n) {
  alignas(32) T h[16];
  vst(h, v);
  _mm256_mask_storeu_epi16(p, (__mmask16)((1u << n) - 1), _mm256_load_si256((const __m256i*)h));
}
#define NORMLAB_MASKED_16 1
#endif
// Without masked loads: one whole-vector load where its bytes stay inside the 4 KB page that holds the row's last
// element (the bytes beyond the row are read but never used: the lanes from n on are zeroed; a load cannot fault
// there), through a buffer on the stack where the vector would cross into the next page (a buffer filled by
// narrow stores and read by a wide load waits for them: 1.3-3x the old scalar tail's time, measured on AVX2).
// Stores: the vector to a buffer, then its first n elements (a wide store read back narrow does not wait).
template <class V> static inline V lanes_below(V v, int n) { return lanes_under<V>(n) ? v : V{}; }
template <class T> static inline auto vld_n_page(const T* p, int n) -> decltype(vld(p)) {
  typedef decltype(vld(p)) V;
  const int W = sizeof(V) / sizeof(V{}[0]);
  if ((reinterpret_cast<uintptr_t>(p) & 4095) + W * sizeof(T) <= 4096) return lanes_below(vld(p), n);  // vld's bytes
  alignas(64) T t[W] = {};
  for (int l = 0; l < W; ++l)
    if (l < n) t[l] = p[l];
  return vld(static_cast<const T*>(t));
}
template <class T, class V> static inline void vst_n_buf(T* p, V v, int n) {
  const int W = sizeof(V) / sizeof(v[0]);
  alignas(64) T t[W];
  vst(t, v);
  for (int l = 0; l < W; ++l)  // unrolled; a loop to n would become a call to memmove
    if (l < n) p[l] = t[l];
}
// Every part access the target's masked forms above do not cover (the float and double overloads above, where
// they exist, are preferred to these templates): 16-bit rows without AVX512BW, AVX2's stores, all of SSE and NEON
#if !defined(NORMLAB_MASKED_16)
template <class T> static inline auto vld_n(const T* p, int n) -> decltype(vld(p)) { return vld_n_page(p, n); }
template <class T, class V> static inline void vst_n(T* p, V v, int n) { vst_n_buf(p, v, n); }
#endif

// How a vector step reads and writes: Full (W elements) or Part (a row's last n < W, read as if the row went on
// with zeros). Each element's arithmetic is the same in both (the same expressions, lane by lane), so where a
// row's last part begins never changes a bit. add(acc, v): acc + v in the lanes of the row's elements, the other
// lanes of acc left as they are (not even 0 added: -0 stays -0), so the sums do not depend on the vector width.
struct Full {
  template <class T> static inline auto ld(const T* p) { return vld(p); }
  template <class T, class V> static inline void st(T* p, V v) { vst(p, v); }
  template <class V> static inline V add(V acc, V v) { return acc + v; }
};
struct Part {
  int n;
  template <class T> inline auto ld(const T* p) const { return vld_n(p, n); }
  template <class T, class V> inline void st(T* p, V v) const { vst_n(p, v, n); }
  template <class V> inline V add(V acc, V v) const { return lanes_under<V>(n) ? acc + v : acc; }
};

template <class T> struct SAlign { static const int B = VB; };  // bytes of one vector of T in memory
template <> struct SAlign<bf16> { static const int B = VB / 2; };
#if NORMLAB_HAS_F16
template <> struct SAlign<f16> { static const int B = VB / 2; };
#endif

// The element loop of every output row: vec(j, P, store) computes the W elements at j, read through P (Full, or
// Part for fewer), and writes its result vector through store(p, v). With `stream` (where the target has
// streaming stores), whole vectors from the first element aligned for them are streamed, the elements before it
// written by an ordinary part store; the row's last part is always. No fused multiply-add, and each lane's
// arithmetic is the same in every step: where the steps fall never changes a bit.
template <class T, class FV> static inline void row_loop(T* out, i64 d, bool stream, FV vec) {
  typedef typename Acc<T>::type A;
  typedef typename Vec<A>::type V;
  const int W = Vec<A>::W;
  const auto part = [&](i64 at, i64 n) NORMLAB_INLINE {
    const Part p{int(n)};
    vec(at, p, [p](T* q, V v) { p.st(q, v); });
  };
  i64 j = 0;
  const uintptr_t mis = reinterpret_cast<uintptr_t>(out) % SAlign<T>::B;
  if (stream && NORMLAB_HAS_STREAM && mis % sizeof(T) == 0) {
    const i64 lead = i64((SAlign<T>::B - mis) % SAlign<T>::B / sizeof(T));  // fewer than W
    j = lead < d ? lead : d;
    if (j > 0) part(0, j);
    for (; j + W <= d; j += W) vec(j, Full{}, [](T* q, V v) { vst_nt(q, v); });
  } else {
    for (; j + W <= d; j += W) vec(j, Full{}, [](T* q, V v) { vst(q, v); });
  }
  if (j < d) part(j, d - j);
}

// out[j] = fv(j, P) (the values at j, a vector of A), rounded to T.
template <class T, class FV> static inline void row_store(T* out, i64 d, bool stream, FV fv) {
  row_loop(out, d, stream, [&](i64 j, auto P, auto store) { store(out + j, fv(j, P)); });
}

// LANES = 64 / sizeof(A) accumulators (one cache line) as NV vectors; lane l of vector k is accumulator
// k * W + l. The fold is the fixed pairwise tree over the LANES accumulators (acc[i] += acc[i + h] for
// h = LANES/2, ..., 1), whatever W is: the bits do not depend on the vector width.
template <class A> struct Lanes {
  static const int W = Vec<A>::W, NV = 64 / sizeof(A) / W;
};
#if defined(__has_builtin)
#if __has_builtin(__builtin_shufflevector)
#define NORMLAB_HAS_SHUFFLE 1
#endif
#endif
#ifndef NORMLAB_HAS_SHUFFLE
#define NORMLAB_HAS_SHUFFLE 0
#endif

#if NORMLAB_HAS_SHUFFLE
// The lanes of one vector summed by the same tree in registers: lanes [h, 2h) added to [0, h) for h = N/2, ..., 1
// (the halves of a vector taken by shuffles, which compile to extracts; the array loop below went through the
// stack, where each narrower reload of a wider store waits for it: most of a short row's time)
template <class A, int N> struct VecN { typedef A type __attribute__((vector_size(N * sizeof(A)))); };
template <class A, int N, class V, std::size_t... I> static inline typename VecN<A, N / 2>::type
halves_sum(V v, std::index_sequence<I...>) {
  return __builtin_shufflevector(v, v, I...) + __builtin_shufflevector(v, v, (I + N / 2)...);
}
template <class A, int N, class V> static inline A lane_tree(V v) {
  if constexpr (N == 2) {
    return v[0] + v[1];
  } else {
    return lane_tree<A, N / 2>(halves_sum<A, N>(v, std::make_index_sequence<N / 2>{}));
  }
}
#endif

template <class A, class V> static inline A fold(V* acc) {
  const int W = Lanes<A>::W;
  for (int h = Lanes<A>::NV / 2; h >= 1; h /= 2)
    for (int k = 0; k < h; ++k) acc[k] += acc[k + h];
#if NORMLAB_HAS_SHUFFLE
  return lane_tree<A, W>(acc[0]);
#else
  A l[W];
  std::memcpy(l, &acc[0], sizeof(V));
  for (int h = W / 2; h >= 1; h /= 2)
    for (int k = 0; k < h; ++k) l[k] += l[k + h];
  return l[0];
#endif
}

// sum_j f(j) over a row: LANES accumulators over blocks of LANES elements, the last block as if the row went on
// with zeros (element j is always added to accumulator j % LANES), folded. fv(j, P): the W values at j, read
// through P (Full, or Part for the row's last elements).
//
// In chunks: each SUM_CHUNK blocks (128 float or 64 double elements) are summed into fresh accumulators, and the
// chunks' sums are added in order into the row's, so an element passes through at most SUM_CHUNK + D / (SUM_CHUNK *
// LANES) + 5 additions instead of D / LANES + 4 (45 instead of 260 at D = 4096 in float32). Added 256 times in a
// row, a float32 row of 4096 with a few large entries (1000 among N(0, 1), or Cauchy draws) normalized with 2-5
// times torch's relative error (its sums are cascaded); in chunks, within it. A pairwise cascade of every chunk sum
// made rows of 256 15% slower (and of 768 10%: its levels live in memory), so the sums in order run in groups of
// GROUP_CHUNKS chunks (rows up to 8192 float or 4096 double elements: one group, as before), and only the groups'
// sums are added pairwise (Cascade): in order, rows of 300,000 Cauchy draws read 20x torch's error (the rule held
// to rows of about 65,536); an element now meets at most SUM_CHUNK + GROUP_CHUNKS + log2(groups) + 5 additions.
// The order depends only on D.
static const i64 SUM_CHUNK = 8, GROUP_CHUNKS = 64;

// Group sums added pairwise: level i holds the sum of 2^i chunks while bit i of the count is set (a level is
// written before it is read, so the array starts uninitialised). S: the vectors of one group's sums.
template <class V, int S> struct Cascade {
  V level[40][S];
  i64 n = 0;
  inline void add(V* part) {
    int i = 0;
    for (i64 c = n++; c & 1; c >>= 1, ++i)
      for (int k = 0; k < S; ++k) part[k] = level[i][k] + part[k];
    for (int k = 0; k < S; ++k) level[i][k] = part[k];
  }
  // out[k] = (every group's sum)[k], the levels added from the lowest up (n > 0)
  inline void total(V* out) {
    int i = __builtin_ctzll(static_cast<unsigned long long>(n));
    for (int k = 0; k < S; ++k) out[k] = level[i][k];
    for (++i; (n >> i) != 0; ++i)
      if ((n >> i) & 1)
        for (int k = 0; k < S; ++k) out[k] = level[i][k] + out[k];
  }
};

// A row of more than GROUP_CHUNKS chunks: its whole chunks summed into sums[0, S) (zeros on entry), each by
// chunk(j, part), in groups of GROUP_CHUNKS whose chunks' sums are added in order and whose sums are added pairwise;
// returns the whole chunks' end. Not inlined: the cascade's levels (kilobytes) in the stack frame of every row's
// reduction made rows of 256 20% slower
template <class V, int S, class CHUNK>
static __attribute__((noinline)) i64 grouped_sums(i64 d, i64 c, V* sums, CHUNK& chunk) {
  Cascade<V, S> groups;
  i64 j = 0;
  while (j + c <= d) {
    for (i64 n = 0; n < GROUP_CHUNKS && j + c <= d; ++n, j += c) {
      V part[S] = {};
      chunk(j, part);
      for (int k = 0; k < S; ++k) sums[k] += part[k];
    }
    groups.add(sums);
    for (int k = 0; k < S; ++k) sums[k] = V{};
  }
  groups.total(sums);
  return j;
}

// Vector accumulators set to zero one store each: `V a[N] = {}` compiled to `rep stos` (GCC, x86-64), whose start
// cost (tens of cycles, twice per reduction) was a quarter of a 80-element row's normalization
template <class V, int N> static inline void zero(V (&a)[N]) {
  for (int k = 0; k < N; ++k) a[k] = V{};
}

template <class A, class FV> static inline A row_reduce(i64 d, FV fv) {
  typedef typename Vec<A>::type V;
  const int W = Lanes<A>::W, NV = Lanes<A>::NV;
  const i64 B = NV * W;
  V acc[NV], chunks[NV];
  zero(acc);
  zero(chunks);
  auto chunk = [&](i64 c, V* part) NORMLAB_INLINE {
    for (i64 o = c; o < c + SUM_CHUNK * B; o += B)
      for (int k = 0; k < NV; ++k) part[k] += fv(o + k * W, Full{});
  };
  i64 j = 0;
  if (d > GROUP_CHUNKS * SUM_CHUNK * B) {
    j = grouped_sums<V, NV>(d, SUM_CHUNK * B, chunks, chunk);
  } else {
    for (; j + SUM_CHUNK * B <= d; j += SUM_CHUNK * B) {
      V part[NV] = {};
      chunk(j, part);
      for (int k = 0; k < NV; ++k) chunks[k] += part[k];
    }
  }
  for (; j + B <= d; j += B)
    for (int k = 0; k < NV; ++k) acc[k] += fv(j + k * W, Full{});
  for (int k = 0; j + k * W < d; ++k) {  // the last block: whole vectors, then a part
    const i64 o = j + k * W;
    if (d - o >= W) {
      acc[k] += fv(o, Full{});
    } else {
      const Part p{int(d - o)};
      acc[k] = p.add(acc[k], fv(o, p));
    }
  }
  for (int k = 0; k < NV; ++k) acc[k] = chunks[k] + acc[k];
  return fold<A>(acc);
}

// Two sums over a row in one pass, each in row_reduce's order: fv(j, P) returns the pair of vectors at j.
template <class A, class FV> static inline std::pair<A, A> row_reduce2(i64 d, FV fv) {
  typedef typename Vec<A>::type V;
  const int W = Lanes<A>::W, NV = Lanes<A>::NV;
  const i64 B = NV * W;
  V acc[2 * NV], chunks[2 * NV];  // the first sum's accumulators, then the second's
  zero(acc);
  zero(chunks);
  V *acc1 = acc, *acc2 = acc + NV;
  const auto step = [&](V* a1, V* a2, i64 o, auto P, int k) NORMLAB_INLINE {
    const auto v = fv(o, P);
    a1[k] = P.add(a1[k], v.first);
    a2[k] = P.add(a2[k], v.second);
  };
  auto chunk = [&](i64 c, V* part) NORMLAB_INLINE {
    for (i64 o = c; o < c + SUM_CHUNK * B; o += B)
      for (int k = 0; k < NV; ++k) step(part, part + NV, o + k * W, Full{}, k);
  };
  i64 j = 0;
  if (d > GROUP_CHUNKS * SUM_CHUNK * B) {
    j = grouped_sums<V, 2 * NV>(d, SUM_CHUNK * B, chunks, chunk);
  } else {
    for (; j + SUM_CHUNK * B <= d; j += SUM_CHUNK * B) {
      V part[2 * NV] = {};
      chunk(j, part);
      for (int k = 0; k < 2 * NV; ++k) chunks[k] += part[k];
    }
  }
  for (; j + B <= d; j += B)
    for (int k = 0; k < NV; ++k) step(acc1, acc2, j + k * W, Full{}, k);
  for (int k = 0; j + k * W < d; ++k) {  // the last block: whole vectors, then a part
    const i64 o = j + k * W;
    if (d - o >= W) step(acc1, acc2, o, Full{}, k);
    else step(acc1, acc2, o, Part{int(d - o)}, k);
  }
  for (int k = 0; k < 2 * NV; ++k) acc[k] = chunks[k] + acc[k];
  return {fold<A>(acc1), fold<A>(acc2)};
}

template <class A> static inline A rstd_of(A m, A eps) {
  // 1/sqrt(m + eps); 0 where m + eps == 0 (a constant row at eps = 0). A NaN m (a NaN input to RMSNorm) stays NaN
  if (eps == 0 && m == 0) return A(0);
  return A(1) / std::sqrt(m + eps);
}

// ------------------------------------------------------------------ forward

// The row's first reduction: sum of s (LayerNorm) or of s^2 (RMSNorm), s's values given by sv(j, P) (the values
// at j, a vector of A). With `buf`, s is also written there as A, in the same pass: the later passes read the
// buffer. The sum's order is row_reduce's.
template <bool RMS, class A, class SV> static inline A first_sum(SV sv, A* buf, i64 d) {
  return row_reduce<A>(d, [=](i64 j, auto P) {
    const auto v = sv(j, P);
    if (buf) P.st(buf + j, v);
    return RMS ? v * v : v;
  });
}

// first_sum of a stored row si (the storage type T, widened as it is read)
template <bool RMS, class S, class A> static inline A first_sum(const S* si, A* buf, i64 d) {
  return first_sum<RMS, A>([=](i64 j, auto P) { return P.ld(si + j); }, buf, d);
}

// A row's statistics and output from s (si: the storage type T, or the row already widened to A) and its
// first_sum.
template <class T, bool RMS, bool HW, bool HB, class S, class A = typename Acc<T>::type>
static inline void norm_row(const S* si, A first, const A* w, const A* b, T* yi, A* mean, A* rstd, i64 d, A inv_d,
                            A eps, bool stream) {
  typedef typename Vec<A>::type V;
  A m = 0, c = 0, rs;  // LayerNorm: the mean is m + c (below)
  if (RMS) {
    rs = rstd_of<A>(first * inv_d, eps);
  } else {
    // The first pass's mean m is rounded (a sum of D values, then times 1/D): a row with mean 1e4 and std 1e-2
    // is 5% of its std away from it. The second pass sums the deviations from m (exact where they are small)
    // with their squares; their mean c corrects m, and the variance is taken about m + c.
    m = first * inv_d;
    const V mv = splat<V>(m);
    const auto sums = row_reduce2<A>(d, [=](i64 j, auto P) {
      const V e = P.ld(si + j) - mv;
      return std::pair<V, V>{e, e * e};
    });
    // divided, not times 1/D: a constant row's deviations e sum exactly to D*e (e is a few ulps of the row's
    // values), and only the division gives e back; times the rounded 1/D, c was an ulp off e, the variance
    // (clamped at 0) left eps alone, and y was (e - c) / sqrt(eps) where the bias is exact (0.015 at eps 1e-12)
    c = sums.first / A(d);
    const A var = sums.second * inv_d - c * c;  // inf - inf where the squares overflow: then the variance is inf
    rs = var != var ? A(0) : rstd_of<A>(var > 0 ? var : A(0), eps);  // rstd 0: the bias (NaN input stays NaN via m)
    if (mean) *mean = m + c;
  }
  if (rstd) *rstd = rs;
  const V mv = splat<V>(m), cv = splat<V>(c), rv = splat<V>(rs);
  row_store(yi, d, stream, [=](i64 j, auto P) {
    V v = RMS ? P.ld(si + j) * rv : ((P.ld(si + j) - mv) - cv) * rv;
    if (HW) v = v * P.ld(w + j);
    if (HB) v = v + P.ld(b + j);
    return v;
  });
}

// Widens a row of half-precision T to A (exact), W elements at a time, then the last part: written whole (its
// lanes past the row are zero), so `out` has room for d rounded up to a vector (WIDEN_PAD).
template <class T, class A> static inline void widen(const T* p, A* out, i64 d) {
  const int W = Vec<A>::W;
  i64 j = 0;
  for (; j + W <= d; j += W) vst(out + j, vld(p + j));
  if (j < d) vst(out + j, Part{int(d - j)}.ld(p + j));
}

// Half-precision rows up to this many elements are widened to A once, into a buffer on the stack (in L1), in the
// pass that sums them, and the later passes read the buffer: one conversion per element instead of three.
// Widening is exact, so the bits are those of the passes over T.
static const i64 WIDEN_MAX = 4096;
static const i64 WIDEN_PAD = 16;  // room past a widened row for widen's last whole vector

// One row: y = (s - mean) * rstd * w + b with s = x (+ r, rounded to T and written to so). RMS: mean = 0.
template <class T, bool RMS, bool HW, bool HB, bool HR, class A = typename Acc<T>::type>
static inline void fwd_row(const T* xi, const T* ri, T* so, const A* w, const A* b, T* yi, A* mean, A* rstd,
                           i64 d, A inv_d, A eps, bool stream) {
  if (HR && sizeof(T) == sizeof(A) && stream && d <= WIDEN_MAX) {
    // A streamed call (outputs larger than the last-level cache) in full precision: s = x + r (nothing to round)
    // is formed in a buffer in L1 with its first sum, written out with streaming stores like y (no read for
    // ownership of its lines: one tensor less of traffic) and normalized from the buffer. The same values as
    // the path below, which reads back the s it stored.
    alignas(64) A buf[WIDEN_MAX];
    const A first = first_sum<RMS, A>([=](i64 j, auto P) { return P.ld(xi + j) + P.ld(ri + j); }, buf, d);
    row_store(so, d, true, [&](i64 j, auto P) { return P.ld(buf + j); });
    norm_row<T, RMS, HW, HB>(static_cast<const A*>(buf), first, w, b, yi, mean, rstd, d, inv_d, eps, stream);
    return;
  }
  const T* si = xi;
  if (HR) {
    // s is read back below: ordinary stores keep it in cache
    row_store(so, d, false, [=](i64 j, auto P) { return P.ld(xi + j) + P.ld(ri + j); });
    si = so;  // the statistics see s as stored, as eager's x + r does
  }
  if (sizeof(T) < sizeof(A) && d <= WIDEN_MAX) {
    alignas(64) A buf[WIDEN_MAX];
    const A first = first_sum<RMS>(si, buf, d);
    norm_row<T, RMS, HW, HB>(static_cast<const A*>(buf), first, w, b, yi, mean, rstd, d, inv_d, eps, stream);
  } else {
    norm_row<T, RMS, HW, HB>(si, first_sum<RMS>(si, static_cast<A*>(nullptr), d), w, b, yi, mean, rstd, d, inv_d,
                             eps, stream);
  }
}

// mean and rstd may be null (an inference call keeps no statistics): then they are not written.
template <class T, bool RMS, bool HW, bool HB, bool HR, class A = typename Acc<T>::type>
static void fwd(const T* x, const T* r, T* s, const A* w, const A* b, T* y, A* mean, A* rstd, i64 n, i64 d,
                A eps, bool stream, int nthreads) {
  const A inv_d = A(1) / A(d);
  const i64 chunk = chunk_units(n, d * (i64)sizeof(T), nthreads, 16);
#pragma omp parallel num_threads(nthreads) if (n * d > SERIAL_WORK && nthreads > 1)
  {
#pragma omp for schedule(dynamic, chunk) nowait
    for (i64 i = 0; i < n; ++i)
      fwd_row<T, RMS, HW, HB, HR>(x + i * d, HR ? r + i * d : nullptr, HR ? s + i * d : nullptr, w, b,
                                  y + i * d, RMS || !mean ? nullptr : mean + i, rstd ? rstd + i : nullptr, d, inv_d,
                                  eps, stream);
    if (stream) stream_fence();  // this thread's streamed stores are visible before the region ends
  }
}

// ------------------------------------------------------------------ backward

// x_hat = (x - mean) * rstd (mean = 0 for RMS), g = dy * w:
//   LayerNorm: dx = rstd * (g - mean(g) - x_hat * mean(g x_hat))
//   RMSNorm:   dx = rstd * (g - x_hat * mean(g x_hat))
// dx += ds (the add variants). Partial sums of the block: pw += dy x_hat, pb += dy (LayerNorm).
// gi, xi: the rows of dy and x in the storage type T, or already widened to A (S). dx2i (the add variants, or
// null): a second output with the same values, written in the same pass (the gradients of x and of the residual
// are equal, and each input's .grad must be a tensor of its own); streamed like dx where `al2` (aligned as dx).
template <class T, bool RMS, bool HW, bool HDS, class S, class A = typename Acc<T>::type>
static inline void bwd_row_of(const S* gi, const S* xi, A m, A rs, const A* w, const T* dsi, T* dxi, T* dx2i,
                              bool al2, A* pw, A* pb, i64 d, A inv_d, bool stream) {
  typedef typename Vec<A>::type V;
  const V mv = splat<V>(m), rv = splat<V>(rs);
  const auto sums = row_reduce2<A>(d, [=](i64 o, auto P) {  // sum g and sum g x_hat, in one pass
    const V xh = (P.ld(xi + o) - mv) * rv;
    const V g = HW ? P.ld(gi + o) * P.ld(w + o) : P.ld(gi + o);
    return std::pair<V, V>{g, g * xh};
  });
  const A c1 = RMS ? A(0) : sums.first * inv_d;
  const A c2 = sums.second * inv_d;
  const V c1v = splat<V>(c1), c2v = splat<V>(c2);
  // dx, and the block's partial rows (each element its own sum: where a step begins changes no bit); inlined
  // into every step (GCC for AVX2 called the part step's copy: vectors through memory, +10% on rows of 75)
  row_loop(dxi, d, stream, [&](i64 k, auto P, auto store) NORMLAB_INLINE {
    const V dy = P.ld(gi + k);
    const V xh = (P.ld(xi + k) - mv) * rv;
    const V g = HW ? dy * P.ld(w + k) : dy;
    V v = rv * (g - c1v - xh * c2v);
    if (HDS) v += P.ld(dsi + k);
    store(dxi + k, v);
    if (dx2i) {
      if (al2) store(dx2i + k, v);
      else P.st(dx2i + k, v);
    }
    if (HW) P.st(pw + k, P.ld(pw + k) + dy * xh);
    if (!RMS) P.st(pb + k, P.ld(pb + k) + dy);
  });
}

// Which storage types the backward widens once (BwdWiden<T>::on): bfloat16, whose conversions are integer
// shuffles. Measured on AMD Zen 1, 2 threads, from memory: bfloat16's backward 20-27% faster widened; float16's
// 7-11% slower (F16C converts in one instruction; the buffer's stores and loads cost more than it saves).
// With AVX-512, where a bfloat16 vector loads with one widening move and a shift (vld), bfloat16 is read
// directly too: on an AMD EPYC with AVX-512, 2 threads, from memory, its backward took 0.71-0.97x the time.
template <class T> struct BwdWiden { static const bool on = false; };
#if NORMLAB_VECTOR_BYTES != 64
template <> struct BwdWiden<bf16> { static const bool on = true; };
#endif

// One row of the backward. Rows of a BwdWiden type up to WIDEN_MAX elements read dy and x once each, widened
// into buffers on the stack (two conversions per element instead of four; the same bits).
template <class T, bool RMS, bool HW, bool HDS, class A = typename Acc<T>::type>
static inline void bwd_row(const T* gi, const T* xi, A m, A rs, const A* w, const T* dsi, T* dxi, T* dx2i,
                           bool al2, A* pw, A* pb, i64 d, A inv_d, bool stream) {
  if (BwdWiden<T>::on && d <= WIDEN_MAX) {
    alignas(64) A gb[WIDEN_MAX + WIDEN_PAD];
    alignas(64) A xb[WIDEN_MAX + WIDEN_PAD];
    widen(gi, gb, d);
    widen(xi, xb, d);
    bwd_row_of<T, RMS, HW, HDS>(static_cast<const A*>(gb), static_cast<const A*>(xb), m, rs, w, dsi, dxi, dx2i,
                                al2, pw, pb, d, inv_d, stream);
  } else {
    bwd_row_of<T, RMS, HW, HDS>(gi, xi, m, rs, w, dsi, dxi, dx2i, al2, pw, pb, d, inv_d, stream);
  }
}

// partial: (ceil(n / ROWS), 2, d) scratch; dw written when HW, db when LayerNorm; dx2 (or null) a copy of dx.
template <class T, bool RMS, bool HW, bool HDS, class A = typename Acc<T>::type>
static void bwd(const T* dy, const T* x, const A* mean, const A* rstd, const A* w, const T* ds, T* dx, T* dx2,
                A* dw, A* db, A* partial, i64 n, i64 d, bool stream, int nthreads) {
  typedef typename Vec<A>::type V;
  const int W = Vec<A>::W;
  const bool al2 = dx2 && (reinterpret_cast<uintptr_t>(dx2) - reinterpret_cast<uintptr_t>(dx)) % SAlign<T>::B == 0;
  const A inv_d = A(1) / A(d);
  const i64 nb = (n + ROWS - 1) / ROWS;
  const i64 nchunks = (d + W - 1) / W;
  const i64 chunk = chunk_units(nb, ROWS * d * (i64)sizeof(T), nthreads, 1);
#pragma omp parallel num_threads(nthreads) if (n * d > SERIAL_WORK && nthreads > 1)
  {
#pragma omp for schedule(dynamic, chunk)
    for (i64 blk = 0; blk < nb; ++blk) {
      A* pw = partial + blk * 2 * d;
      A* pb = pw + d;
      std::memset(pw, 0, 2 * d * sizeof(A));
      const i64 end = (blk + 1) * ROWS < n ? (blk + 1) * ROWS : n;
      for (i64 i = blk * ROWS; i < end; ++i)
        bwd_row<T, RMS, HW, HDS>(dy + i * d, x + i * d, RMS ? A(0) : mean[i], rstd[i], w,
                                 HDS ? ds + i * d : nullptr, dx + i * d, dx2 ? dx2 + i * d : nullptr, al2, pw, pb,
                                 d, inv_d, stream);
    }
    if (stream) stream_fence();  // before the barrier that ends this loop
    // second reduction: column sums of the partial rows in block order, W columns at a time (taken
    // dynamically too: a thread descheduled by other work on a shared machine does not hold up its share)
#pragma omp for schedule(dynamic, 8)
    for (i64 c = 0; c < nchunks; ++c) {
      const i64 j = c * W;
      const auto columns = [&](auto P) {
        V sw = {}, sb = {};
        for (i64 blk = 0; blk < nb; ++blk) {
          if (HW) sw += P.ld(partial + blk * 2 * d + j);
          if (!RMS) sb += P.ld(partial + blk * 2 * d + d + j);
        }
        if (HW) P.st(dw + j, sw);
        if (!RMS) P.st(db + j, sb);
      };
      if (j + W <= d) columns(Full{});
      else columns(Part{int(d - j)});
    }
  }
}

// Streaming stores only where every row is whole cache lines: a row that ends inside a line leaves the line to
// ordinary stores of the next row's first elements, and a line written partly streamed, partly cached is flushed
// twice (bfloat16 rows of 75 and 250 elements took 2.2-3.7x as long streamed as not)
template <class T> static inline bool whole_lines(i64 d) { return (d * (i64)sizeof(T)) % 64 == 0; }

// runtime flags -> template instantiation
template <class T, class A = typename Acc<T>::type>
static void norm_fwd(const T* x, const T* r, T* s, const A* w, const A* b, T* y, A* mean, A* rstd, i64 n, i64 d,
                     A eps, int rms, int stream, int nthreads) {
  stream = stream && whole_lines<T>(d);
#define NL_FWD(R, W, B, RR) fwd<T, R, W, B, RR>(x, r, s, w, b, y, mean, rstd, n, d, eps, stream != 0, nthreads)
#define NL_FWD_R(R, W, B) (r ? NL_FWD(R, W, B, true) : NL_FWD(R, W, B, false))
#define NL_FWD_B(R, W) (b ? NL_FWD_R(R, W, true) : NL_FWD_R(R, W, false))
  if (rms) {
    w ? NL_FWD_R(true, true, false) : NL_FWD_R(true, false, false);
  } else {
    w ? NL_FWD_B(false, true) : NL_FWD_B(false, false);
  }
}

template <class T, class A = typename Acc<T>::type>
static void norm_bwd(const T* dy, const T* x, const A* mean, const A* rstd, const A* w, const T* ds, T* dx,
                     T* dx2, A* dw, A* db, A* partial, i64 n, i64 d, int rms, int stream, int nthreads) {
  stream = stream && whole_lines<T>(d);
#define NL_BWD(R, W, S) \
  bwd<T, R, W, S>(dy, x, mean, rstd, w, ds, dx, dx2, dw, db, partial, n, d, stream != 0, nthreads)
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
                                    i64 n, i64 d, double eps, int rms, int stream, int nthreads) {         \
    norm_fwd<T>(x, r, s_out, w, b, y, mean, rstd, n, d, Acc<T>::type(eps), rms, stream, nthreads);        \
  }                                                                                                         \
  extern "C" void normlab_bwd_##SUF(const T* dy, const T* x, const Acc<T>::type* mean,                     \
                                    const Acc<T>::type* rstd, const Acc<T>::type* w, const T* ds, T* dx,   \
                                    T* dx2, Acc<T>::type* dw, Acc<T>::type* db, Acc<T>::type* partial,     \
                                    i64 n, i64 d, int rms, int stream, int nthreads) {                     \
    norm_bwd<T>(dy, x, mean, rstd, w, ds, dx, dx2, dw, db, partial, n, d, rms, stream, nthreads);          \
  }

// NORMLAB_UNIT (build.py compiles the file once per storage type, in parallel, and links the objects): 1 float,
// 2 double, 3 bfloat16, 4 float16 and the common entry points; unset, all of them (one translation unit).
#if !defined(NORMLAB_UNIT) || NORMLAB_UNIT == 1
NORMLAB_ENTRIES(float, f32)
#endif
#if !defined(NORMLAB_UNIT) || NORMLAB_UNIT == 2
NORMLAB_ENTRIES(double, f64)
#endif
#if !defined(NORMLAB_UNIT) || NORMLAB_UNIT == 3
NORMLAB_ENTRIES(bf16, bf16)
#endif
#if !defined(NORMLAB_UNIT) || NORMLAB_UNIT == 4
#if NORMLAB_HAS_F16
NORMLAB_ENTRIES(f16, f16)
#endif
extern "C" i64 normlab_rows_per_partial(void) { return ROWS; }
extern "C" int normlab_has_f16(void) { return NORMLAB_HAS_F16; }
#endif
