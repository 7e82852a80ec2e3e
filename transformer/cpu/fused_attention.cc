// Fused exact attention for x86 CPUs with AVX-512 or AVX2, float32, as two XLA FFI custom
// calls.
//
// XLA:CPU cannot fuse a product with the softmax that follows it, so its blockwise attention
// writes every block of scores to memory and reads it back several times. Here one tile
// (one batch row, one head, 64 queries, keys 512 at a time with a running max) keeps its
// scores in cache from the q.k product to the p.v product, and the backward pass recomputes
// them from the saved log-sum-exp (FlashAttention-2's scheme) instead of storing the
// probabilities. The tile is key-major
// ([keys, 64 queries]) so the softmax runs down the columns: every step is a full-width
// vector operation over 64 queries, and the products read k and v in place.
//
// The mask is transformer.attention.Layout's: a query sees a key of its own nonzero segment,
// and, if causal, only keys whose index is not after its own. `offset` (the Layout's
// index_offset, when known) lets a causal tile skip the keys after its last query.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

#include "xla/ffi/api/ffi.h"
#include "parallel.h"
#include "vector16.h"

namespace ffi = xla::ffi;

namespace {

constexpr int QB = 64;       // queries per tile
constexpr int NQ = QB / 16;  // vectors per key row of a tile
constexpr long KC = 512;     // keys per chunk: a [KC x QB] float buffer is 128 KiB, in L2

// C[M x 16*NV] (= or +=) A[M x Kd] . B[Kd x 16*NV], A(m, k) = A[m*am + k*ak], B's rows ldb
// apart. B's vectors stay in registers and A's scalars are broadcast into the FMAs.
template <int MR, int NV>
inline void micro(int Kd, const float* A, long am, long ak, const float* B, long ldb, float* C,
                  long ldc, bool acc) {
  vf c[MR][NV];
  for (int m = 0; m < MR; ++m)
    for (int v = 0; v < NV; ++v)
      c[m][v] = acc ? load(C + m * ldc + 16 * v) : zero();
  for (int k = 0; k < Kd; ++k) {
    vf b[NV];
    for (int v = 0; v < NV; ++v) b[v] = load(B + k * ldb + 16 * v);
    for (int m = 0; m < MR; ++m) {
      vf a = set1(A[m * am + k * ak]);
      for (int v = 0; v < NV; ++v) c[m][v] = fmadd(a, b[v], c[m][v]);
    }
  }
  for (int m = 0; m < MR; ++m)
    for (int v = 0; v < NV; ++v) store(C + m * ldc + 16 * v, c[m][v]);
}

// Rows in blocks of BIG and one fewer. AVX-512 (32 registers): 6 rows 4 vectors wide or 8
// narrower, 16-24 accumulators, run at the FMA peak on Zen 5 (~230 GFLOP/s on one core), 4
// rows of 4 vectors at half of it and 24 rows of one vector at 60% (measured). AVX2 (16
// registers, two per vector): panels one vector wide, 6 rows, 12 accumulators. Any M from 20
// up, and 16, a causal tile's row groups, is a sum of such blocks; a ragged rest takes 2s
// and 1s.
template <int NV>
inline void panel(int M, int Kd, const float* A, long am, long ak, const float* B, long ldb,
                  float* C, long ldc, bool acc) {
  constexpr int BIG = !kAvx512 ? 6 : NV == 4 ? 6 : 8, SMALL = BIG - 1;
  int small = (BIG - M % BIG) % BIG, m = 0;
  if (small * SMALL > M) small = 0;
  for (int i = 0; i < small; ++i, m += SMALL)
    micro<SMALL, NV>(Kd, A + m * am, am, ak, B, ldb, C + m * ldc, ldc, acc);
  for (; m + BIG <= M; m += BIG)
    micro<BIG, NV>(Kd, A + m * am, am, ak, B, ldb, C + m * ldc, ldc, acc);
  for (; m + 2 <= M; m += 2) micro<2, NV>(Kd, A + m * am, am, ak, B, ldb, C + m * ldc, ldc, acc);
  for (; m < M; ++m) micro<1, NV>(Kd, A + m * am, am, ak, B, ldb, C + m * ldc, ldc, acc);
}

// N must be a multiple of 16 (the head size and the tile width are).
void gemm(long M, long N, long Kd, const float* A, long am, long ak, const float* B, long ldb,
          float* C, long ldc, bool acc) {
  long n = 0;
  if (!kAvx512) {
    for (; n < N; n += 16) panel<1>(M, Kd, A, am, ak, B + n, ldb, C + n, ldc, acc);
    return;
  }
  for (; n + 64 <= N; n += 64) panel<4>(M, Kd, A, am, ak, B + n, ldb, C + n, ldc, acc);
  switch (N - n) {
    case 48: panel<3>(M, Kd, A, am, ak, B + n, ldb, C + n, ldc, acc); break;
    case 32: panel<2>(M, Kd, A, am, ak, B + n, ldb, C + n, ldc, acc); break;
    case 16: panel<1>(M, Kd, A, am, ak, B + n, ldb, C + n, ldc, acc); break;
  }
}

struct Dims {
  long B, L, S, N, K, H;
  float scale;
  bool causal;
  bool offset_known;
  long offset;
};

// One tile: batch row b, query head n (key/value head kh), queries [q0, q0 + rows), keys
// [0, nk). Arrays are [B, L, N, H] (queries) and [B, S, K, H] (keys, values).
struct Tile {
  const Dims& d;
  long b, n, kh, q0, rows, nk;
  Tile(const Dims& d, long b, long n, long q0) : d(d), b(b), n(n), kh(n / (d.N / d.K)), q0(q0) {
    rows = std::min<long>(QB, d.L - q0);
    nk = d.S;
    if (d.causal && d.offset_known) nk = std::min(d.S, std::max(0L, q0 + rows + d.offset));
  }
  template <class T> T* q_rows(T* x) const { return x + ((b * d.L + q0) * d.N + n) * d.H; }
  template <class T> T* kv_rows(T* x) const { return x + (b * d.S * d.K + kh) * d.H; }
  long ldq() const { return d.N * d.H; }
  long ldk() const { return d.K * d.H; }
};

#if defined(__AVX512F__)
// In-register transpose of 16 rows of 16 floats (row c of the result is column c).
inline void transpose16(vf r[16]) {
  vf t[16];
  for (int i = 0; i < 8; ++i) {  // pairs of rows interleaved
    t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i) {  // then pairs of pairs, as 64-bit elements
    __m512d a = _mm512_castps_pd(t[4 * i]), b = _mm512_castps_pd(t[4 * i + 2]);
    __m512d c = _mm512_castps_pd(t[4 * i + 1]), d = _mm512_castps_pd(t[4 * i + 3]);
    r[4 * i] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, b));
    r[4 * i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, b));
    r[4 * i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(c, d));
    r[4 * i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(c, d));
  }
  for (int i = 0; i < 2; ++i)  // then 128-bit lanes, twice
    for (int j = 0; j < 4; ++j) {
      t[8 * i + j] = _mm512_shuffle_f32x4(r[8 * i + j], r[8 * i + 4 + j], 0x88);
      t[8 * i + 4 + j] = _mm512_shuffle_f32x4(r[8 * i + j], r[8 * i + 4 + j], 0xdd);
    }
  for (int j = 0; j < 8; ++j) {
    r[j] = _mm512_shuffle_f32x4(t[j], t[8 + j], 0x88);
    r[8 + j] = _mm512_shuffle_f32x4(t[j], t[8 + j], 0xdd);
  }
}

// xT[H x QB] = mult * the tile's rows of x, zeros past them, 16 x 16 blocks at a time.
void pack_transposed(const Tile& t, const float* x, float mult, float* xT) {
  const float* src = t.q_rows(x);
  const vf m = set1(mult);
  vf r[16];
  for (long i0 = 0; i0 < QB; i0 += 16)
    for (long h0 = 0; h0 < t.d.H; h0 += 16) {
      for (long i = 0; i < 16; ++i)
        r[i] = i0 + i < t.rows ? mul(load(src + (i0 + i) * t.ldq() + h0), m)
                               : zero();
      transpose16(r);
      for (long c = 0; c < 16; ++c) store(xT + (h0 + c) * QB + i0, r[c]);
    }
}
#else
// xT[H x QB] = mult * the tile's rows of x, zeros past them. Without AVX-512's lane shuffles
// a plain loop: H x 64 values per tile, against the tile's 4 x 64 x keys x H multiply-adds.
void pack_transposed(const Tile& t, const float* x, float mult, float* xT) {
  const float* src = t.q_rows(x);
  for (long i = 0; i < QB; ++i)
    for (long h = 0; h < t.d.H; ++h)
      xT[h * QB + i] = i < t.rows ? mult * src[i * t.ldq() + h] : 0.f;
}
#endif

// Causal tiles skip the products' masked corner in steps of 16 (exact: those probabilities
// and their gradients are zero). A group of 16 keys from j0 needs query columns from
// first_col(j0); a group of 16 queries from i0 needs keys below key_end(i0).
long first_col(const Tile& t, long j0) {
  if (!t.d.causal || !t.d.offset_known) return 0;
  long c = j0 - t.q0 - t.d.offset;
  return c <= 0 ? 0 : std::min<long>(c / 16 * 16, QB - 16);
}

long key_end(const Tile& t, long i0) {
  if (!t.d.causal || !t.d.offset_known) return t.nk;
  return std::min(t.nk, std::max(0L, t.q0 + i0 + 16 + t.d.offset));
}

// Keys below full_keys need every query column.
long full_keys(const Tile& t) {
  if (!t.d.causal || !t.d.offset_known) return t.nk;
  return std::min(t.nk, std::max(0L, t.q0 + t.d.offset + 16));
}

// The products over one chunk of keys [lo, hi): a tile's [keys x QB] buffers hold the
// chunk's rows only, so they stay in L2 at any length.

// outT[hi - lo x QB] = rows lo..hi of x (keys) . xT[H x QB] (queries).
void key_major(const Tile& t, const float* x, const float* xT, float* outT, long lo, long hi) {
  long jf = std::clamp(full_keys(t), lo, hi), H = t.d.H;
  gemm(jf - lo, QB, H, t.kv_rows(x) + lo * t.ldk(), t.ldk(), 1, xT, QB, outT, QB, false);
  for (long j0 = jf; j0 < hi; j0 += 16) {
    long c = first_col(t, j0);
    gemm(std::min(16L, hi - j0), QB - c, H, t.kv_rows(x) + j0 * t.ldk(), t.ldk(), 1, xT + c,
         QB, outT + (j0 - lo) * QB + c, QB, false);
  }
}

// out rows (queries) += pT[hi - lo x QB]^T . rows lo..hi of y (keys).
void query_major(const Tile& t, const float* pT, const float* y, float* out, long lo, long hi) {
  const float* y_lo = t.kv_rows(y) + lo * t.ldk();
  if (full_keys(t) >= hi) {
    gemm(t.rows, t.d.H, hi - lo, pT, 1, QB, y_lo, t.ldk(), out, t.ldq(), true);
    return;
  }
  for (long i0 = 0; i0 < t.rows; i0 += 16) {
    long end = std::min(hi, key_end(t, i0));
    if (end > lo)
      gemm(std::min(16L, t.rows - i0), t.d.H, end - lo, pT + i0, 1, QB, y_lo, t.ldk(),
           out + i0 * t.ldq(), t.ldq(), true);
  }
}

// rows lo..hi of acc (keys) += pT[hi - lo x QB] . rows of x (queries).
void key_accumulate(const Tile& t, const float* pT, const float* x, float* acc, long lo,
                    long hi) {
  long jf = std::clamp(full_keys(t), lo, hi);
  gemm(jf - lo, t.d.H, t.rows, pT, QB, 1, t.q_rows(x), t.ldq(), t.kv_rows(acc) + lo * t.ldk(),
       t.ldk(), true);
  for (long j0 = jf; j0 < hi; j0 += 16) {
    long c = first_col(t, j0);
    if (c < t.rows)
      gemm(std::min(16L, hi - j0), t.d.H, t.rows - c, pT + (j0 - lo) * QB + c, QB, 1,
           t.q_rows(x) + c * t.ldq(), t.ldq(), t.kv_rows(acc) + j0 * t.ldk(), t.ldk(), true);
  }
}

// Which of a tile's queries may see key j: the same nonzero segment and, if causal, a key
// index not after the query's. Queries past the tile's rows get segment 0: they see nothing.
struct Mask {
  vi qs[NQ], qi[NQ];
  const int32_t* kseg;
  const int32_t* kidx;
  bool causal;
  Mask(const Tile& t, const int32_t* qseg, const int32_t* kseg_, const int32_t* qidx,
       const int32_t* kidx_)
      : kseg(kseg_ + t.b * t.d.S), kidx(kidx_ + t.b * t.d.S), causal(t.d.causal) {
    for (int v = 0; v < NQ; ++v) {
      alignas(64) int32_t s[16], i[16];
      for (int u = 0; u < 16; ++u) {
        long r = 16 * v + u;
        s[u] = r < t.rows ? qseg[t.b * t.d.L + t.q0 + r] : 0;
        i[u] = r < t.rows ? qidx[t.b * t.d.L + t.q0 + r] : 0;
      }
      qs[v] = load_int(s);
      qi[v] = load_int(i);
    }
  }
  void row(long j, lanes* ok) const {
    vi ks = set1_int(kseg[j]), ki = set1_int(kidx[j]);
    for (int v = 0; v < NQ; ++v) {
      ok[v] = kseg[j] == 0 ? 0 : eq_int(qs[v], ks);
      if (causal) ok[v] &= ge_int(qi[v], ki);
    }
  }
};

// Masked lanes of sT and dT are never read as numbers (they may hold stale values where a
// causal tile skipped its corner): every pass below selects them away.

void zero_rows(float* x, long rows, long ld, long H) {
  for (long i = 0; i < rows; ++i)
    for (long h = 0; h < H; h += 16) store(x + i * ld + h, zero());
}

// out, lse for one tile. A query that sees no key gets zeros and lse = +inf. Keys come in
// chunks of KC with FlashAttention's running max: where a chunk raises a column's max, the
// sum and output so far are scaled down by exp(old - new).
void forward_tile(const Tile& t, const float* q, const float* k, const float* v,
                  const int32_t* qseg, const int32_t* kseg, const int32_t* qidx,
                  const int32_t* kidx, float* out, float* lse, float* qT, float* sT) {
  const Dims& d = t.d;
  float* o = t.q_rows(out);
  float* l = lse + (t.b * d.N + t.n) * d.L + t.q0;
  zero_rows(o, t.rows, t.ldq(), d.H);
  pack_transposed(t, q, d.scale, qT);
  Mask mask(t, qseg, kseg, qidx, kidx);
  lanes ok[NQ], seen[NQ] = {};
  vf mx[NQ], sum[NQ];
  for (int u = 0; u < NQ; ++u) mx[u] = zero(), sum[u] = zero();
  for (long lo = 0; lo < t.nk; lo += KC) {
    long hi = std::min(t.nk, lo + KC);
    key_major(t, k, qT, sT, lo, hi);  // sT = k . (scale q)^T
    vf cm[NQ];
    lanes cseen[NQ];
    for (int u = 0; u < NQ; ++u) cm[u] = mx[u], cseen[u] = seen[u];
    for (long j = lo; j < hi; ++j) {  // column maxima over the visible keys
      mask.row(j, ok);
      for (int u = 0; u < NQ; ++u) {
        vf x = load(sT + (j - lo) * QB + 16 * u);
        // The first visible key sets the max; a column that sees nothing keeps 0 (no NaN).
        cm[u] = select(ok[u] & ~cseen[u], x, cm[u]);
        cm[u] = select(ok[u], max(cm[u], x), cm[u]);
        cseen[u] |= ok[u];
      }
    }
    alignas(64) float alpha[QB];
    bool rescale = false;
    for (int u = 0; u < NQ; ++u) {
      vf a = select(seen[u], exp_nonpositive(sub(mx[u], cm[u])), set1(1.f));
      rescale |= ne(a, set1(1.f)) != 0;
      store(alpha + 16 * u, a);
      sum[u] = mul(sum[u], a);
      mx[u] = cm[u];
      seen[u] = cseen[u];
    }
    if (rescale)
      for (long i = 0; i < t.rows; ++i)
        for (long h = 0; h < d.H; h += 16) {
          float* x = o + i * t.ldq() + h;
          store(x, mul(load(x), set1(alpha[i])));
        }
    for (long j = lo; j < hi; ++j) {  // e = exp(s - max) where visible, 0 elsewhere
      mask.row(j, ok);
      float* row = sT + (j - lo) * QB;
      for (int u = 0; u < NQ; ++u) {
        vf e = exp_nonpositive(sub(load(row + 16 * u), mx[u]));
        e = keep(ok[u], e);
        store(row + 16 * u, e);
        sum[u] = add(sum[u], e);
      }
    }
    query_major(t, sT, v, o, lo, hi);  // out += e . v, unnormalized
  }
  alignas(64) float m_[QB], s_[QB];
  for (int u = 0; u < NQ; ++u) {
    store(m_ + 16 * u, mx[u]);
    store(s_ + 16 * u, sum[u]);
  }
  for (long i = 0; i < t.rows; ++i) {  // each row divided by its sum (64 x H divides)
    float inv = s_[i] > 0 ? 1.f / s_[i] : 0.f;
    l[i] = s_[i] > 0 ? m_[i] + std::log(s_[i]) : INFINITY;
    float* row = o + i * t.ldq();
    for (long h = 0; h < d.H; ++h) row[h] *= inv;
  }
}

// dq for the tile's rows; dk, dv of keys [0, nk) accumulate (the caller owns head kh).
// With the log-sum-exp known, each chunk of keys is exact on its own.
void backward_tile(const Tile& t, const float* q, const float* k, const float* v,
                   const int32_t* qseg, const int32_t* kseg, const int32_t* qidx,
                   const int32_t* kidx, const float* out, const float* lse, const float* dout,
                   float* dq, float* dk, float* dv, float* qT, float* gT, float* sT, float* dT) {
  const Dims& d = t.d;
  zero_rows(t.q_rows(dq), t.rows, t.ldq(), d.H);
  if (t.nk == 0) return;
  const float* l = lse + (t.b * d.N + t.n) * d.L + t.q0;
  alignas(64) float l_[QB], delta[QB];
  for (long i = 0; i < QB; ++i) {  // delta = rowsum(dout * out)
    vf acc = zero();
    if (i < t.rows) {
      const float* o = t.q_rows(out) + i * t.ldq();
      const float* g = t.q_rows(dout) + i * t.ldq();
      for (long h = 0; h < d.H; h += 16)
        acc = fmadd(load(o + h), load(g + h), acc);
    }
    l_[i] = i < t.rows ? l[i] : INFINITY;
    delta[i] = reduce_sum(acc);
  }
  pack_transposed(t, q, d.scale, qT);
  pack_transposed(t, dout, 1.f, gT);
  Mask mask(t, qseg, kseg, qidx, kidx);
  lanes ok[NQ];
  vf lv[NQ], dl[NQ], sc = set1(d.scale);
  for (int u = 0; u < NQ; ++u) {
    lv[u] = load(l_ + 16 * u);
    dl[u] = load(delta + 16 * u);
  }
  for (long lo = 0; lo < t.nk; lo += KC) {
    long hi = std::min(t.nk, lo + KC);
    key_major(t, k, qT, sT, lo, hi);  // sT = k . (scale q)^T
    key_major(t, v, gT, dT, lo, hi);  // dp^T = v . dout^T
    for (long j = lo; j < hi; ++j) {  // p = exp(s - lse); ds = scale * p * (dp - delta)
      mask.row(j, ok);
      float* srow = sT + (j - lo) * QB;
      float* drow = dT + (j - lo) * QB;
      for (int u = 0; u < NQ; ++u) {
        vf p = exp_nonpositive(sub(load(srow + 16 * u), lv[u]));
        p = keep(ok[u], p);
        store(srow + 16 * u, p);
        vf dp = sub(load(drow + 16 * u), dl[u]);
        store(drow + 16 * u, keep(ok[u], mul(mul(p, dp), sc)));
      }
    }
    query_major(t, dT, k, t.q_rows(dq), lo, hi);  // dq += ds . k
    key_accumulate(t, dT, q, dk, lo, hi);         // dk += ds^T . q
    key_accumulate(t, sT, dout, dv, lo, hi);      // dv += p^T . dout
  }
}

Dims dims(const ffi::Buffer<ffi::F32>& q, const ffi::Buffer<ffi::F32>& k, float scale,
          bool causal, bool offset_known, int64_t offset) {
  auto qd = q.dimensions(), kd = k.dimensions();
  return Dims{qd[0], qd[1], kd[1], qd[2], kd[2], qd[3], scale, causal, offset_known, offset};
}

ffi::Error Forward(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> q, ffi::Buffer<ffi::F32> k,
                   ffi::Buffer<ffi::F32> v, ffi::Buffer<ffi::S32> qseg,
                   ffi::Buffer<ffi::S32> kseg, ffi::Buffer<ffi::S32> qidx,
                   ffi::Buffer<ffi::S32> kidx, ffi::ResultBuffer<ffi::F32> out,
                   ffi::ResultBuffer<ffi::F32> lse, float scale, bool causal, bool offset_known,
                   int64_t offset, int64_t threads) {
  Dims d = dims(q, k, scale, causal, offset_known, offset);
  if (d.H % 16 || d.N % d.K) return ffi::Error::InvalidArgument("head size must divide by 16");
  long blocks = (d.L + QB - 1) / QB;
  parallel_for(pool, threads, d.B * d.N * blocks, [&](long i) {
    thread_local std::vector<float> qT, sT;
    qT.resize(d.H * QB);
    sT.resize(KC * QB);
    Tile t(d, i / (d.N * blocks), (i / blocks) % d.N, (i % blocks) * QB);
    forward_tile(t, q.typed_data(), k.typed_data(), v.typed_data(), qseg.typed_data(),
                 kseg.typed_data(), qidx.typed_data(), kidx.typed_data(), out->typed_data(),
                 lse->typed_data(), qT.data(), sT.data());
  });
  return ffi::Error::Success();
}

ffi::Error Backward(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> q, ffi::Buffer<ffi::F32> k,
                    ffi::Buffer<ffi::F32> v, ffi::Buffer<ffi::S32> qseg,
                    ffi::Buffer<ffi::S32> kseg, ffi::Buffer<ffi::S32> qidx,
                    ffi::Buffer<ffi::S32> kidx, ffi::Buffer<ffi::F32> out,
                    ffi::Buffer<ffi::F32> lse, ffi::Buffer<ffi::F32> dout,
                    ffi::ResultBuffer<ffi::F32> dq, ffi::ResultBuffer<ffi::F32> dk,
                    ffi::ResultBuffer<ffi::F32> dv, float scale, bool causal,
                    bool offset_known, int64_t offset, int64_t threads) {
  Dims d = dims(q, k, scale, causal, offset_known, offset);
  if (d.H % 16 || d.N % d.K) return ffi::Error::InvalidArgument("head size must divide by 16");
  long blocks = (d.L + QB - 1) / QB, G = d.N / d.K;
  // One work item per (batch row, key/value head): it owns those rows of dk and dv.
  parallel_for(pool, threads, d.B * d.K, [&](long i) {
    thread_local std::vector<float> qT, gT, sT, dT;
    qT.resize(d.H * QB);
    gT.resize(d.H * QB);
    sT.resize(KC * QB);
    dT.resize(KC * QB);
    long b = i / d.K, kh = i % d.K;
    for (long s = 0; s < d.S; ++s)  // rows of H floats, K * H apart: stores, not memset calls
      for (long h = 0; h < d.H; h += 16) {
        store(dk->typed_data() + ((b * d.S + s) * d.K + kh) * d.H + h, zero());
        store(dv->typed_data() + ((b * d.S + s) * d.K + kh) * d.H + h, zero());
      }
    for (long n = kh * G; n < (kh + 1) * G; ++n)
      for (long blk = 0; blk < blocks; ++blk)
        backward_tile(Tile(d, b, n, blk * QB), q.typed_data(), k.typed_data(), v.typed_data(),
                      qseg.typed_data(), kseg.typed_data(), qidx.typed_data(),
                      kidx.typed_data(), out.typed_data(), lse.typed_data(), dout.typed_data(),
                      dq->typed_data(), dk->typed_data(), dv->typed_data(), qT.data(),
                      gT.data(), sT.data(), dT.data());
  });
  return ffi::Error::Success();
}

}  // namespace

namespace {

// What both calls take: q, k, v and the layout's segment and index arrays ...
auto bind_inputs() {
  using F32 = ffi::Buffer<ffi::F32>;
  using S32 = ffi::Buffer<ffi::S32>;
  return ffi::Ffi::Bind().Ctx<ffi::ThreadPool>().Arg<F32>().Arg<F32>().Arg<F32>().Arg<S32>()
      .Arg<S32>().Arg<S32>().Arg<S32>();
}

// ... and their attributes, after the call's own operands and results.
template <class Binding>
auto bind_attributes(Binding binding) {
  return std::move(binding).template Attr<float>("scale").template Attr<bool>("causal")
      .template Attr<bool>("offset_known").template Attr<int64_t>("offset")
      .template Attr<int64_t>("threads");
}

using F32 = ffi::Buffer<ffi::F32>;

}  // namespace

// out, lse = f(q, k, v, segments and indices)
XLA_FFI_DEFINE_HANDLER_SYMBOL(TransformerAttentionForward, Forward,
                              bind_attributes(bind_inputs().Ret<F32>().Ret<F32>()));

// dq, dk, dv = f(q, k, v, segments and indices, out, lse, dout)
XLA_FFI_DEFINE_HANDLER_SYMBOL(TransformerAttentionBackward, Backward,
                              bind_attributes(bind_inputs().Arg<F32>().Arg<F32>().Arg<F32>()
                                                  .Ret<F32>().Ret<F32>().Ret<F32>()));
