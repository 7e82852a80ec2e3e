// 16 floats (or int32s; or bfloat16s, loaded as floats) as one vector for the CPU kernels
// (fused_attention.cc, cached_attention.cc): one AVX-512 register, or two AVX2 halves on CPUs
// without AVX-512.
// Masks are 16-bit lane masks in both cases. The kernels use only these operations, so both
// instruction sets run the same code.
#ifndef TRANSFORMER_CPU_VECTOR16_H_
#define TRANSFORMER_CPU_VECTOR16_H_

#include <immintrin.h>

#include <cstdint>

namespace {
// A bfloat16's bits (a KV cache passes them as uint16): load() widens 16 of them to floats.
struct bf16 {
  uint16_t bits;
};

#if defined(__AVX512F__)
constexpr bool kAvx512 = true;
using vf = __m512;
using vi = __m512i;
using lanes = __mmask16;
inline vf load(const float* p) { return _mm512_loadu_ps(p); }
inline vf load(const bf16* p) {  // a bfloat16 is a float's upper 16 bits
  return _mm512_castsi512_ps(_mm512_slli_epi32(
      _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))), 16));
}
inline void store(float* p, vf x) { _mm512_storeu_ps(p, x); }
inline vf set1(float x) { return _mm512_set1_ps(x); }
inline vf zero() { return _mm512_setzero_ps(); }
inline vf add(vf a, vf b) { return _mm512_add_ps(a, b); }
inline vf sub(vf a, vf b) { return _mm512_sub_ps(a, b); }
inline vf mul(vf a, vf b) { return _mm512_mul_ps(a, b); }
inline vf max(vf a, vf b) { return _mm512_max_ps(a, b); }
inline vf min(vf a, vf b) { return _mm512_min_ps(a, b); }
inline vf fmadd(vf a, vf b, vf c) { return _mm512_fmadd_ps(a, b, c); }    // a * b + c
inline vf fnmadd(vf a, vf b, vf c) { return _mm512_fnmadd_ps(a, b, c); }  // c - a * b
inline lanes ge(vf a, vf b) { return _mm512_cmp_ps_mask(a, b, _CMP_GE_OQ); }
inline lanes ne(vf a, vf b) { return _mm512_cmp_ps_mask(a, b, _CMP_NEQ_OQ); }
inline vf select(lanes m, vf a, vf b) { return _mm512_mask_blend_ps(m, b, a); }  // m ? a : b
inline vf keep(lanes m, vf a) { return _mm512_maskz_mov_ps(m, a); }              // m ? a : 0
inline float reduce_sum(vf x) { return _mm512_reduce_add_ps(x); }
inline vf round_nearest(vf x) {
  return _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}
inline vf times_exp2(vf p, vf n) { return _mm512_scalef_ps(p, n); }  // p * 2^n, n integral
inline vi load_int(const int32_t* p) { return _mm512_loadu_si512(p); }
inline vi set1_int(int32_t x) { return _mm512_set1_epi32(x); }
inline lanes eq_int(vi a, vi b) { return _mm512_cmpeq_epi32_mask(a, b); }
inline lanes ge_int(vi a, vi b) { return _mm512_cmpge_epi32_mask(a, b); }
#elif defined(__AVX2__) && defined(__FMA__)
constexpr bool kAvx512 = false;
struct vf { __m256 lo, hi; };
struct vi { __m256i lo, hi; };
using lanes = uint16_t;
inline vf load(const float* p) { return {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
inline __m256 widen(const bf16* p) {  // 8 bfloat16s: each a float's upper 16 bits
  return _mm256_castsi256_ps(_mm256_slli_epi32(
      _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))), 16));
}
inline vf load(const bf16* p) { return {widen(p), widen(p + 8)}; }
inline void store(float* p, vf x) { _mm256_storeu_ps(p, x.lo), _mm256_storeu_ps(p + 8, x.hi); }
inline vf set1(float x) { return {_mm256_set1_ps(x), _mm256_set1_ps(x)}; }
inline vf zero() { return {_mm256_setzero_ps(), _mm256_setzero_ps()}; }
inline vf add(vf a, vf b) { return {_mm256_add_ps(a.lo, b.lo), _mm256_add_ps(a.hi, b.hi)}; }
inline vf sub(vf a, vf b) { return {_mm256_sub_ps(a.lo, b.lo), _mm256_sub_ps(a.hi, b.hi)}; }
inline vf mul(vf a, vf b) { return {_mm256_mul_ps(a.lo, b.lo), _mm256_mul_ps(a.hi, b.hi)}; }
inline vf max(vf a, vf b) { return {_mm256_max_ps(a.lo, b.lo), _mm256_max_ps(a.hi, b.hi)}; }
inline vf min(vf a, vf b) { return {_mm256_min_ps(a.lo, b.lo), _mm256_min_ps(a.hi, b.hi)}; }
inline vf fmadd(vf a, vf b, vf c) {
  return {_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi)};
}
inline vf fnmadd(vf a, vf b, vf c) {
  return {_mm256_fnmadd_ps(a.lo, b.lo, c.lo), _mm256_fnmadd_ps(a.hi, b.hi, c.hi)};
}
inline lanes bits(__m256 lo, __m256 hi) {  // lane i's sign bit -> bit i
  return static_cast<lanes>(_mm256_movemask_ps(lo) | _mm256_movemask_ps(hi) << 8);
}
inline __m256 lane_mask(unsigned m) {  // bit i of m (8 bits) -> lane i all ones
  const __m256i bit = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
  return _mm256_castsi256_ps(
      _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_set1_epi32(m), bit), bit));
}
inline lanes ge(vf a, vf b) {
  return bits(_mm256_cmp_ps(a.lo, b.lo, _CMP_GE_OQ), _mm256_cmp_ps(a.hi, b.hi, _CMP_GE_OQ));
}
inline lanes ne(vf a, vf b) {
  return bits(_mm256_cmp_ps(a.lo, b.lo, _CMP_NEQ_OQ), _mm256_cmp_ps(a.hi, b.hi, _CMP_NEQ_OQ));
}
inline vf select(lanes m, vf a, vf b) {  // m ? a : b
  return {_mm256_blendv_ps(b.lo, a.lo, lane_mask(m & 0xff)),
          _mm256_blendv_ps(b.hi, a.hi, lane_mask(m >> 8))};
}
inline vf keep(lanes m, vf a) {  // m ? a : 0
  return {_mm256_and_ps(lane_mask(m & 0xff), a.lo), _mm256_and_ps(lane_mask(m >> 8), a.hi)};
}
inline float reduce_sum(vf x) {
  __m256 s = _mm256_add_ps(x.lo, x.hi);
  __m128 h = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
  h = _mm_add_ps(h, _mm_movehl_ps(h, h));
  return _mm_cvtss_f32(_mm_add_ss(h, _mm_movehdup_ps(h)));
}
inline vf round_nearest(vf x) {
  constexpr int mode = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
  return {_mm256_round_ps(x.lo, mode), _mm256_round_ps(x.hi, mode)};
}
inline __m256 exp2_int(__m256 n) {  // 2^n for integral n in [-126, 127]: the exponent field
  return _mm256_castsi256_ps(_mm256_slli_epi32(
      _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23));
}
inline vf times_exp2(vf p, vf n) {  // p * 2^n, n integral in [-126, 127] (here [-126, 0])
  return {_mm256_mul_ps(p.lo, exp2_int(n.lo)), _mm256_mul_ps(p.hi, exp2_int(n.hi))};
}
inline vi load_int(const int32_t* p) {
  return {_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)),
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 8))};
}
inline vi set1_int(int32_t x) { return {_mm256_set1_epi32(x), _mm256_set1_epi32(x)}; }
inline lanes eq_int(vi a, vi b) {
  return bits(_mm256_castsi256_ps(_mm256_cmpeq_epi32(a.lo, b.lo)),
              _mm256_castsi256_ps(_mm256_cmpeq_epi32(a.hi, b.hi)));
}
inline lanes ge_int(vi a, vi b) {  // a >= b: not b > a
  return static_cast<lanes>(~bits(_mm256_castsi256_ps(_mm256_cmpgt_epi32(b.lo, a.lo)),
                                  _mm256_castsi256_ps(_mm256_cmpgt_epi32(b.hi, a.hi))));
}
#else
#error "the CPU kernels need AVX-512 or AVX2 with FMA (compile with -march=native)"
#endif

// exp(x) for x <= 0 (a score minus its row's max or log-sum-exp); 0 for x < -87 and -inf.
// Cody-Waite reduction and Cephes' expf polynomial: within 2 ulp of expf.
inline vf exp_nonpositive(vf x) {
  const vf lo = set1(-87.f);
  lanes in_range = ge(x, lo);
  x = min(max(x, lo), zero());
  vf n = round_nearest(mul(x, set1(1.44269504088896341f)));
  vf r = fnmadd(n, set1(0.693359375f), x);
  r = fnmadd(n, set1(-2.12194440e-4f), r);
  vf p = set1(1.9875691500e-4f);
  p = fmadd(p, r, set1(1.3981999507e-3f));
  p = fmadd(p, r, set1(8.3334519073e-3f));
  p = fmadd(p, r, set1(4.1665795894e-2f));
  p = fmadd(p, r, set1(1.6666665459e-1f));
  p = fmadd(p, r, set1(5.0000001201e-1f));
  p = fmadd(mul(p, r), r, add(r, set1(1.f)));
  return keep(in_range, times_exp2(p, n));
}

}  // namespace

#endif  // TRANSFORMER_CPU_VECTOR16_H_
