// Attention of a decoding step's queries over the filled slots of a KV cache held in blocks,
// for x86 CPUs with AVX-512 or AVX2, as an XLA FFI custom call. Queries, arithmetic and output
// are float32; the cache is float32 or bfloat16 (model.cache_dtype; passed as its bits,
// uint16, as XLA:CPU holds it), widened as it is read.
//
// A decoding step has a handful of queries per key/value head and reads every filled slot
// of the cache once: it is bound by reading keys and values, not by arithmetic. XLA's path
// (transformer/model/attention/cached.py) reads a static prefix of the cache that covers the
// filled slots (up to ~1.4x of them) and runs each batch row's and head's small products one
// after another on one thread. Here the number of filled slots is a runtime value, so a step
// reads exactly those slots, and the work is split over the device's cores in chunks of
// slots (split-K, as FlashDecoding does on GPUs): each chunk keeps a running max, sum and
// output for its queries, and a second pass merges the chunks of each query.
//
// The mask is transformer.attention.Layout's: a query sees a key of its own nonzero segment,
// if causal only keys whose index is not after its own, and within `window` indices when a
// window is set. A query that sees no key gets zeros, as `masked_softmax` gives.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "parallel.h"
#include "vector16.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

constexpr long CHUNK = 256;   // slots per work item: its scores stay in L1
constexpr long PREFETCH = 8;  // rows ahead that a chunk's loops ask the cache for

struct Step {
  long B, K, X, H, L, S;  // queries [B, K, X, H] with X = G * L (x = g * L + l); S slots
  float scale;
  bool causal;
  long window;
  std::vector<const void*> k, v;   // the blocks [B, K, b_j, H], float or bf16
  std::vector<long> start, size;   // block j holds slots [start[j], start[j] + size[j])
};

// Asks for a row's cache lines (16 elements per vector, 64-byte lines).
template <class T>
inline void prefetch(const T* p, int nv) {
  const char* c = reinterpret_cast<const char*>(p);
  for (long at = 0; at < long(16 * sizeof(T)) * nv; at += 64) _mm_prefetch(c + at, _MM_HINT_T0);
}

// Calls row(j, r) for each slot j in [lo, hi), r its row of key/value head kh of batch row b
// in `blocks` (the keys' or the values'), asking for the row PREFETCH slots ahead.
template <class T, class Row>
inline void for_rows(const Step& d, const std::vector<const void*>& blocks, long b, long kh,
                     long lo, long hi, int nv, Row row) {
  for (size_t blk = 0; blk < d.start.size(); ++blk) {
    long a = std::max(lo, d.start[blk]), e = std::min(hi, d.start[blk] + d.size[blk]);
    const T* base = static_cast<const T*>(blocks[blk]) +
                    ((b * d.K + kh) * d.size[blk] - d.start[blk]) * d.H;
    for (long j = a; j < e; ++j) {
      if (j + PREFETCH < e) prefetch(base + (j + PREFETCH) * d.H, nv);
      row(j, base + j * d.H);
    }
  }
}

// Chunk [lo, hi) of batch row b, key/value head kh: for each query x its max score m, the sum
// of exp(score - m) and the sum of exp(score - m) v, into part[x] = {m, sum, out[H]}. NV is
// H / 16 when it is a compile-time case (0: read from d), so a query's vectors and its output
// stay in registers. T is the cache's element type (float or bf16).
template <class T, int NV>
void chunk(const Step& d, long b, long kh, long lo, long hi, const float* q,
           const int32_t* qseg, const int32_t* kseg, const int32_t* qidx, const int32_t* kidx,
           float* s, float* part) {
  const int nv = NV ? NV : int(d.H / 16);
  const long X = d.X, H = d.H, W = d.H + 2;
  const float* qb = q + (b * d.K + kh) * X * H;
  const float neg = -std::numeric_limits<float>::infinity();
  const int32_t* ks = kseg + b * d.S;
  const int32_t* ki = kidx + b * d.S;
  for (long x = 0; x < X; ++x) {
    const long l = x % d.L;
    const int32_t sq = qseg[b * d.L + l], iq = qidx[b * d.L + l];
    vf qv[NV ? NV : 16];
    for (int v = 0; v < nv; ++v) qv[v] = mul(load(qb + x * H + 16 * v), set1(d.scale));
    float* sx = s + x * CHUNK - lo;
    float mx = neg;
    // Scores: sx[j] for j in [lo, hi), -inf where masked.
    for_rows<T>(d, d.k, b, kh, lo, hi, nv, [&](long j, const T* kr) {
      bool ok = ks[j] != 0 && ks[j] == sq && (!d.causal || iq >= ki[j]) &&
                (!d.window || std::abs(long(iq) - long(ki[j])) < d.window);
      vf acc = mul(qv[0], load(kr));
      for (int v = 1; v < nv; ++v) acc = fmadd(qv[v], load(kr + 16 * v), acc);
      float score = ok ? reduce_sum(acc) : neg;
      mx = std::max(mx, score);
      sx[j] = score;
    });
    float* px = part + x * W;
    px[0] = mx;
    px[1] = 0.f;
    for (int v = 0; v < nv; ++v) store(px + 2 + 16 * v, zero());
    if (mx == neg) continue;  // no visible key in this chunk
    // Probabilities in place, and their sum.
    vf mxv = set1(mx), sum = zero();
    long j = lo;
    for (; j + 16 <= hi; j += 16) {
      vf p = exp_nonpositive(sub(load(sx + j), mxv));
      store(sx + j, p);
      sum = add(sum, p);
    }
    float tail = 0.f;
    for (; j < hi; ++j) tail += sx[j] = std::exp(sx[j] - mx);  // exp(-inf) = 0
    px[1] = reduce_sum(sum) + tail;
    // out = sum_j p_j v_j, the accumulators in registers.
    vf out[NV ? NV : 16];
    for (int v = 0; v < nv; ++v) out[v] = zero();
    for_rows<T>(d, d.v, b, kh, lo, hi, nv, [&](long j, const T* vr) {
      vf pj = set1(sx[j]);
      for (int v = 0; v < nv; ++v) out[v] = fmadd(pj, load(vr + 16 * v), out[v]);
    });
    for (int v = 0; v < nv; ++v) store(px + 2 + 16 * v, out[v]);
  }
}

// chunk for the cache's element type, with a head size of 64 or 128 unrolled.
template <class T>
auto pick(long H) { return H == 64 ? chunk<T, 4> : H == 128 ? chunk<T, 8> : chunk<T, 0>; }

ffi::Error Cached(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> q, ffi::Buffer<ffi::S32> qseg,
                  ffi::Buffer<ffi::S32> kseg, ffi::Buffer<ffi::S32> qidx,
                  ffi::Buffer<ffi::S32> kidx, ffi::Buffer<ffi::S32> filled,
                  ffi::RemainingArgs blocks, ffi::ResultBuffer<ffi::F32> out, float scale,
                  bool causal, int64_t window, int64_t threads) {
  auto qd = q.dimensions();
  Step d{qd[0], qd[1], qd[2], qd[3], qseg.dimensions()[1], kseg.dimensions()[1], scale, causal,
         window, {}, {}, {}, {}};
  if (d.H % 16 || d.H > 256)
    return ffi::Error::InvalidArgument("head size must divide by 16 and be at most 256");
  if (blocks.size() % 2) return ffi::Error::InvalidArgument("key and value blocks must pair");
  long nb = blocks.size() / 2, at = 0;
  ffi::DataType type = ffi::DataType::F32;
  for (long j = 0; j < 2 * nb; ++j) {
    auto buf = blocks.get<ffi::AnyBuffer>(j);
    if (!buf.has_value()) return buf.error();
    if (j == 0) type = buf->element_type();
    if (buf->element_type() != type || (type != ffi::DataType::F32 && type != ffi::DataType::U16))
      return ffi::Error::InvalidArgument(
          "the cache blocks must all be float32 or all bfloat16 bits (uint16)");
    long size = buf->dimensions()[2];
    (j < nb ? d.k : d.v).push_back(buf->untyped_data());
    if (j < nb) d.start.push_back(at), d.size.push_back(size), at += size;
  }
  if (at != d.S) return ffi::Error::InvalidArgument("the blocks must cover the layout's slots");
  // Filled slots per batch row, and the chunks that cover the longest.
  std::vector<long> n(d.B);
  long most = 0;
  for (long b = 0; b < d.B; ++b)
    most = std::max(most, n[b] = std::clamp<long>(filled.typed_data()[b], 0, d.S));
  long chunks = std::max(1L, (most + CHUNK - 1) / CHUNK), W = d.H + 2;
  std::vector<float> parts(d.B * d.K * chunks * d.X * W);
  // Under ~1 MiB of keys and values, waking a helper costs more than it saves.
  long bytes = type == ffi::DataType::U16 ? 4 : 8;  // a slot's key and value, per element
  bool small = d.B * d.K * most * d.H * bytes < (1L << 20);
  parallel_for(pool, small ? 1 : threads, d.B * d.K * chunks, [&](long i) {
    thread_local std::vector<float> s;
    s.resize(CHUNK * d.X);
    long b = i / (d.K * chunks), kh = (i / chunks) % d.K, c = i % chunks;
    auto run = type == ffi::DataType::U16 ? pick<bf16>(d.H) : pick<float>(d.H);
    run(d, b, kh, c * CHUNK, std::min(n[b], (c + 1) * CHUNK), q.typed_data(),
        qseg.typed_data(), kseg.typed_data(), qidx.typed_data(), kidx.typed_data(), s.data(),
        parts.data() + i * d.X * W);
  }, /*spin=*/true);
  // Merge each query's chunks: out = sum_c e^(m_c - M) out_c / sum_c e^(m_c - M) sum_c. A
  // few vector operations per chunk and query: on this thread.
  for (long i = 0; i < d.B * d.K; ++i) {
    for (long x = 0; x < d.X; ++x) {
      float* o = out->typed_data() + (i * d.X + x) * d.H;
      const float* p0 = parts.data() + i * chunks * d.X * W + x * W;
      float M = -std::numeric_limits<float>::infinity(), total = 0.f;
      for (long c = 0; c < chunks; ++c)
        if (p0[c * d.X * W + 1] > 0.f) M = std::max(M, p0[c * d.X * W]);
      for (long h = 0; h < d.H; h += 16) store(o + h, zero());
      if (M == -std::numeric_limits<float>::infinity()) continue;  // sees no key: zeros
      for (long c = 0; c < chunks; ++c) {
        const float* pc = p0 + c * d.X * W;
        if (pc[1] <= 0.f) continue;
        float w = std::exp(pc[0] - M);
        total += w * pc[1];
        for (long h = 0; h < d.H; h += 16)
          store(o + h, fmadd(set1(w), load(pc + 2 + h), load(o + h)));
      }
      vf inv = set1(1.f / total);
      for (long h = 0; h < d.H; h += 16) store(o + h, mul(load(o + h), inv));
    }
  }
  return ffi::Error::Success();
}

}  // namespace

// out [B, K, X, H] = f(q [B, K, X, H], segments and indices [B, L] / [B, S], filled [B],
// key blocks..., value blocks...), the blocks float32 or bfloat16 bits (uint16)
XLA_FFI_DEFINE_HANDLER_SYMBOL(TransformerCachedAttention, Cached,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .RemainingArgs()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<float>("scale")
                                  .Attr<bool>("causal")
                                  .Attr<int64_t>("window")
                                  .Attr<int64_t>("threads"));
