// Gated attention on the CPU over the paged KV cache (reference for the CUDA kernels).
// Matches HF Qwen3_5Attention / Qwen3Attention: per-head q/k RMSNorm, RoPE on the first
// rotary_dim dims in rotate-half layout (inv_freq computed in f32 as transformers does), causal
// softmax with scale head_dim^-0.5, GQA, and o *= sigmoid(gate) when the output gate is on.
//
// KV cache dtypes (kernels.h, KvLayerView): f32, bf16, fp8 e4m3 / e5m2. k and v are computed in
// f32, stored as convert(x * (1/scale)) and read back as stored * scale; the scales are folded
// out of the inner loops (into the softmax scale and the output weights). The attention itself is
// blocked (Phase B below): a key block is widened to f32 once for a tile of query rows.
#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <vector>

#include "backend/cpu/cpu_attention_kernels.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/vec.h"
#include "core/dtype.h"

namespace deltaserve {

namespace {

void norm_head(float* x, const float* w, int d, float eps) {
  float inv = 1.0f / std::sqrt(vec::sum_squares(x, d) / float(d) + eps);
  for (int i = 0; i < d; ++i) x[i] = x[i] * inv * w[i];
}

void rope_head(float* x, int rotary_dim, const float* inv_freq, int32_t pos) {
  const int half = rotary_dim / 2;
  for (int i = 0; i < half; ++i) {
    float angle = float(pos) * inv_freq[i];
    float c = std::cos(angle), s = std::sin(angle);
    float x1 = x[i], x2 = x[i + half];
    x[i] = x1 * c - x2 * s;
    x[i + half] = x2 * c + x1 * s;
  }
}

// dst[i] = convert(x[i] * inv_scale) in the cache dtype.
void store_row(DType dt, void* dst, const float* x, int n, float inv_scale) {
  switch (dt) {
    case DType::F32: {
      float* d = static_cast<float*>(dst);
      for (int i = 0; i < n; ++i) d[i] = x[i] * inv_scale;
      return;
    }
    case DType::BF16: {
      uint16_t* d = static_cast<uint16_t*>(dst);
      for (int i = 0; i < n; ++i) d[i] = f32_to_bf16(x[i] * inv_scale);
      return;
    }
    case DType::F8E4M3: {
      uint8_t* d = static_cast<uint8_t*>(dst);
      for (int i = 0; i < n; ++i) d[i] = f32_to_f8e4m3(x[i] * inv_scale);
      return;
    }
    case DType::F8E5M2: {
      uint8_t* d = static_cast<uint8_t*>(dst);
      for (int i = 0; i < n; ++i) d[i] = f32_to_f8e5m2(x[i] * inv_scale);
      return;
    }
    default: DS_CHECK(false, "KV cache dtype ", dtype_name(dt));
  }
}

// A stored row (unscaled values) as f32: f32 rows as they are, bf16 and fp8 rows widened into
// `dst` (n floats).
template <DType DT>
const float* widen_row(float* dst, const void* row, int n) {
  if constexpr (DT == DType::F32) {
    (void)dst;
    (void)n;
    return static_cast<const float*>(row);
  } else if constexpr (DT == DType::BF16) {
    const uint16_t* r = static_cast<const uint16_t*>(row);
    for (int i = 0; i < n; ++i) dst[i] = std::bit_cast<float>(static_cast<uint32_t>(r[i]) << 16);
    return dst;
  } else {
    const auto& table = DT == DType::F8E4M3 ? kF8E4M3ToF32 : kF8E5M2ToF32;
    const uint8_t* r = static_cast<const uint8_t*>(row);
    for (int i = 0; i < n; ++i) dst[i] = table[r[i]];
    return dst;
  }
}

// vec::scores_strided, by the AVX-512 kernel where the CPU runs vec.cpp's x86-64-v4 clones and hd
// is a multiple of 16, else by the AVX2 one on x86-64-v3 (or v4) CPUs and hd a multiple of 8: each
// matches those clones' scores_block bit for bit (the same FMA per element, dims in order).
void scores_in_place(const float* q, int rows, const float* k, int64_t ldk, int n, int hd, float scale, float* s) {
#if defined(DELTASERVE_X86_KERNELS)
  static const bool v4 = __builtin_cpu_supports("x86-64-v4"), v3 = __builtin_cpu_supports("x86-64-v3");
  if (v4 && hd % 16 == 0) {
    cpu::scores_in_place_avx512(q, rows, k, ldk, n, hd, scale, s, vec::kKeyBlock);
    return;
  }
  if (v3 && hd % 8 == 0) {
    cpu::scores_in_place_avx2(q, rows, k, ldk, n, hd, scale, s, vec::kKeyBlock);
    return;
  }
#endif
  vec::scores_strided(q, rows, k, ldk, n, hd, scale, s);
}

}  // namespace

void CpuKernels::attention(const AttentionParams& p, const Tensor& qkv, const KvLayerView& kv,
                           const BatchMeta& meta, Tensor out) {
  switch (kv.k.dtype) {
    case DType::F32: attention_impl<DType::F32>(p, qkv, kv, meta, out); return;
    case DType::BF16: attention_impl<DType::BF16>(p, qkv, kv, meta, out); return;
    case DType::F8E4M3: attention_impl<DType::F8E4M3>(p, qkv, kv, meta, out); return;
    case DType::F8E5M2: attention_impl<DType::F8E5M2>(p, qkv, kv, meta, out); return;
    default: DS_CHECK(false, "attention: unsupported KV cache dtype ", dtype_name(kv.k.dtype));
  }
}

template <DType DT>
void CpuKernels::attention_impl(const AttentionParams& p, const Tensor& qkv, const KvLayerView& kv,
                                const BatchMeta& meta, Tensor out) {
  const int nh = p.n_heads, nkv = p.n_kv_heads, hd = p.head_dim;
  const int q_width = p.output_gate ? 2 * hd : hd;  // per head in the projection
  const int64_t q_cols = int64_t(nh) * q_width, kv_cols = int64_t(nkv) * hd;
  const int64_t row = q_cols + 2 * kv_cols;
  DS_CHECK(qkv.cols() == row && qkv.rows() == meta.n_tokens, "attention qkv ", qkv.shape_string());
  DS_CHECK(out.cols() == int64_t(nh) * hd, "attention out ", out.shape_string());
  DS_CHECK(p.rotary_dim <= 512 && p.rotary_dim % 2 == 0, "rotary_dim");
  DS_CHECK(kv.v.dtype == DT, "attention: K and V caches differ in dtype");
  DS_CHECK(kv.k_scale > 0.f && kv.v_scale > 0.f, "attention: KV scales must be positive");

  std::array<float, 256> inv_freq{};
  for (int i = 0; i < p.rotary_dim / 2; ++i)
    inv_freq[i] = 1.0f / std::pow(p.rope_theta, float(2 * i) / float(p.rotary_dim));

  const int T = meta.n_tokens, bs = meta.block_size;
  // Token -> sequence index.
  std::vector<int32_t>& tok_seq = scratch_i32(0, T);
  for (int s = 0; s < meta.n_seqs; ++s)
    for (int t = meta.seq_start[s]; t < meta.seq_start[s + 1]; ++t) tok_seq[t] = s;

  constexpr std::size_t esize = dtype_size(DT);
  auto cache_row = [&](const Tensor& cache, int s, int32_t pos, int kvh) {
    int32_t block = meta.block_table[int64_t(s) * meta.max_blocks + pos / bs];
    DS_CHECK(block >= 0, "no KV block for position ", pos);
    return static_cast<char*>(cache.data) + ((int64_t(block) * bs + pos % bs) * nkv + kvh) * hd * esize;
  };
  const float k_inv = 1.0f / kv.k_scale, v_inv = 1.0f / kv.v_scale;

  // Phase A: normalise + rotate q into scratch and k into a per-thread row stored into the cache;
  // store v into the cache.
  const int n_threads = pool_.n_threads();
  float* q_all = scratch_f32(0, int64_t(T) * nh * hd + int64_t(n_threads) * hd);
  float* k_tmp_all = q_all + int64_t(T) * nh * hd;
  pool_.parallel_for(T, 1, [&](int tid, int64_t t0, int64_t t1) {
    float* k = k_tmp_all + int64_t(tid) * hd;
    for (int64_t t = t0; t < t1; ++t) {
      const float* r = qkv.f32() + t * row;
      const int s = tok_seq[t];
      const int32_t pos = meta.positions[t];
      for (int h = 0; h < nh; ++h) {
        float* q = q_all + (t * nh + h) * hd;
        std::copy_n(r + int64_t(h) * q_width, hd, q);
        norm_head(q, p.q_norm.f32(), hd, p.eps);
        rope_head(q, p.rotary_dim, inv_freq.data(), pos);
      }
      for (int h = 0; h < nkv; ++h) {
        std::copy_n(r + q_cols + int64_t(h) * hd, hd, k);
        norm_head(k, p.k_norm.f32(), hd, p.eps);
        rope_head(k, p.rotary_dim, inv_freq.data(), pos);
        store_row(DT, cache_row(kv.k, s, pos, h), k, hd, k_inv);
        store_row(DT, cache_row(kv.v, s, pos, h), r + q_cols + kv_cols + int64_t(h) * hd, hd, v_inv);
      }
    }
  });

  // Phase B: causal attention, blocked. A work item is a tile of up to kTileTokens tokens of one
  // sequence and one KV head: its rows are the tile's tokens x the `group` query heads that share
  // the KV head. Keys go in blocks of vec::kKeyBlock: the block is widened once (transposed for
  // the scores, row-major for the values; an f32 cache's values and, for a tile of few rows, its
  // keys are read in place) and serves every row of the tile; each row keeps an online softmax
  // (running max, sum and output). The keys are split in parts of vec::kKeyPart positions: each
  // part is its own online softmax and the parts are merged in order, so a tile of few rows
  // (decode) whose sequence is long can spread its parts over threads when the tiles are fewer
  // than the threads, with the same bits. A row's result depends only on its query and its keys
  // (each score summed in one order on either path, the parts at fixed positions), so it is the
  // same whatever the batch, the chunking or the threads around it. Scores use the stored keys
  // (times k_scale, folded into the softmax scale); the output sums stored values (times v_scale,
  // folded into the final scale).
  constexpr int kTileTokens = vec::kQueryTile;
  constexpr int NK = vec::kKeyBlock;
  constexpr int32_t kPart = vec::kKeyPart;
  // A tile of at most this many rows (decode, short verifications) reads its keys in place
  // (vec::scores_strided: the same sums): transposing a key block costs more than few rows' scores.
  constexpr int kInPlaceRows = vec::kInPlaceRows;
  const int group = nh / nkv;
  const int R = kTileTokens * group;  // rows of a tile at most
  const int64_t per_thread = vec::attention_tile_floats(group, hd);
  float* tile_all = scratch_f32(1, int64_t(n_threads) * per_thread);
  const float score_scale = p.scale * kv.k_scale;
  // Tiles: (sequence, first token); work items: tile x KV head.
  std::vector<int32_t>& tiles = scratch_i32(1, 0);
  tiles.clear();
  for (int s = 0; s < meta.n_seqs; ++s)
    for (int t = meta.seq_start[s]; t < meta.seq_start[s + 1]; t += kTileTokens) tiles.push_back(t);
  const int64_t n_items = int64_t(tiles.size()) * nkv;

  struct Bufs {
    float *qb, *ob, *kt, *vb, *sb, *mx, *sum, *krow, *tob, *tmx, *tsum;
  };
  auto bufs_of = [&](int tid) {
    Bufs b;
    b.qb = tile_all + int64_t(tid) * per_thread;  // [R, hd] the tile's queries
    b.ob = b.qb + int64_t(R) * hd;                 // [R, hd] a part's outputs (unnormalised)
    b.kt = b.ob + int64_t(R) * hd;                 // [hd, NK] a key block, transposed
    b.vb = b.kt + int64_t(hd) * NK;                // [NK, hd] its values
    b.sb = b.vb + int64_t(NK) * hd;                // [R, NK] scores, then weights
    b.mx = b.sb + int64_t(R) * NK;                 // [R] running max
    b.sum = b.mx + R;                              // [R] running sum
    b.krow = b.sum + R;                            // [hd] a key widened
    b.tob = b.krow + hd;                           // [R, hd] the parts merged so far
    b.tmx = b.tob + int64_t(R) * hd;               // [R] their max
    b.tsum = b.tmx + R;                            // [R] their sum
    return b;
  };
  struct TileRef {
    int t0, t1, s, kvh, rows;
    int32_t n_ctx;  // keys the tile's last token sees (the most)
    int n_parts;
  };
  auto tile_of = [&](int64_t i) {
    TileRef tl;
    tl.t0 = tiles[static_cast<std::size_t>(i / nkv)];
    tl.kvh = static_cast<int>(i % nkv);
    tl.s = tok_seq[tl.t0];
    tl.t1 = std::min(tl.t0 + kTileTokens, meta.seq_start[tl.s + 1]);
    tl.rows = (tl.t1 - tl.t0) * group;
    tl.n_ctx = meta.positions[tl.t1 - 1] + 1;
    tl.n_parts = (tl.n_ctx + kPart - 1) / kPart;
    return tl;
  };
  auto load_queries = [&](const TileRef& tl, const Bufs& b) {
    for (int t = tl.t0; t < tl.t1; ++t)
      for (int g = 0; g < group; ++g)
        std::copy_n(q_all + (int64_t(t) * nh + tl.kvh * group + g) * hd, hd, b.qb + int64_t((t - tl.t0) * group + g) * hd);
  };
  // Keys [k_begin, k_end) into a fresh online softmax of the tile's rows (b.mx, b.sum, b.ob).
  auto attend_part = [&](const TileRef& tl, const Bufs& b, int32_t k_begin, int32_t k_end) {
    const int rows = tl.rows, s = tl.s, kvh = tl.kvh;
    std::fill_n(b.ob, int64_t(rows) * hd, 0.f);
    std::fill_n(b.mx, rows, -INFINITY);
    std::fill_n(b.sum, rows, 0.f);
    const bool in_place = rows <= kInPlaceRows;
    for (int32_t k0 = k_begin; k0 < k_end; k0 += NK) {
      const int nk = std::min<int32_t>(NK, k_end - k0);
      const float* vrows[NK];  // the block's values: the cache rows (f32), else widened into vb
      for (int j = 0; j < nk; ++j) vrows[j] = widen_row<DT>(b.vb + int64_t(j) * hd, cache_row(kv.v, s, k0 + j, kvh), hd);
      if (in_place && DT == DType::F32) {
        // Keys read where they are: runs of positions within a cache block are evenly spaced.
        for (int j = 0; j < nk;) {
          const int run = std::min(nk - j, bs - (k0 + j) % bs);
          const float* k = static_cast<const float*>(static_cast<const void*>(cache_row(kv.k, s, k0 + j, kvh)));
          scores_in_place(b.qb, rows, k, int64_t(nkv) * hd, run, hd, score_scale, b.sb + j);
          j += run;
        }
      } else if (in_place) {
        for (int j = 0; j < nk; ++j) widen_row<DT>(b.kt + int64_t(j) * hd, cache_row(kv.k, s, k0 + j, kvh), hd);
        scores_in_place(b.qb, rows, b.kt, hd, nk, hd, score_scale, b.sb);
      } else {
        for (int j = 0; j < nk; ++j) {
          const float* kr = widen_row<DT>(b.krow, cache_row(kv.k, s, k0 + j, kvh), hd);
          for (int d = 0; d < hd; ++d) b.kt[int64_t(d) * NK + j] = kr[d];
        }
        for (int j = nk; j < NK; ++j)
          for (int d = 0; d < hd; ++d) b.kt[int64_t(d) * NK + j] = 0.f;
        vec::scores_block(b.qb, rows, b.kt, hd, score_scale, b.sb);
      }
      for (int r = 0; r < rows; ++r) {
        // Keys this row sees in the block (causal): up to its own position.
        const int valid = std::min(nk, meta.positions[tl.t0 + r / group] + 1 - k0);
        if (valid <= 0) continue;
        float* sr = b.sb + int64_t(r) * NK;
        float m = b.mx[r];
        for (int j = 0; j < valid; ++j) m = std::max(m, sr[j]);
        if (m > b.mx[r]) {
          const float alpha = std::exp(b.mx[r] - m);  // 0 on the first block (-inf)
          b.sum[r] *= alpha;
          for (int d = 0; d < hd; ++d) b.ob[int64_t(r) * hd + d] *= alpha;
          b.mx[r] = m;
        }
        vec::exp_block(sr, m);  // (the lanes past `valid` are computed and not used)
        float add = 0.f;
        for (int j = 0; j < valid; ++j) add += sr[j];
        b.sum[r] += add;
        vec::weighted_rows(b.ob + int64_t(r) * hd, sr, vrows, valid, hd);
      }
    }
  };
  // A part's softmax (pm, ps, po) into the parts before it (tm, ts, to); the first is copied. A row
  // that saw no key of the part (-inf, 0, 0) leaves the total as it was.
  auto merge = [&](int rows, float* tm, float* ts, float* to, const float* pm, const float* ps, const float* po,
                   bool first) {
    if (first) {
      std::copy_n(pm, rows, tm);
      std::copy_n(ps, rows, ts);
      std::copy_n(po, int64_t(rows) * hd, to);
      return;
    }
    for (int r = 0; r < rows; ++r) {
      const float m = std::max(tm[r], pm[r]);
      const float a = std::exp(tm[r] - m), c = std::exp(pm[r] - m);
      ts[r] = ts[r] * a + ps[r] * c;
      float* o = to + int64_t(r) * hd;
      const float* q = po + int64_t(r) * hd;
      for (int d = 0; d < hd; ++d) o[d] = o[d] * a + q[d] * c;
      tm[r] = m;
    }
  };
  auto write_out = [&](const TileRef& tl, const float* ob, const float* sum) {
    for (int t = tl.t0; t < tl.t1; ++t)
      for (int g = 0; g < group; ++g) {
        const int r = (t - tl.t0) * group + g, h = tl.kvh * group + g;
        float* o = out.f32() + int64_t(t) * (int64_t(nh) * hd) + int64_t(h) * hd;
        const float inv = kv.v_scale / sum[r];
        const float* src = ob + int64_t(r) * hd;
        if (p.output_gate) {
          const float* gate = qkv.f32() + int64_t(t) * row + int64_t(h) * q_width + hd;
          for (int d = 0; d < hd; ++d) o[d] = src[d] * inv * vec::sigmoid(gate[d]);
        } else {
          for (int d = 0; d < hd; ++d) o[d] = src[d] * inv;
        }
      }
  };

  // Fewer items than threads, every tile few rows and some sequence long: one work item per
  // (item, part), then the parts merged per item.
  bool split = n_items < n_threads;
  int64_t n_units = 0;
  for (int64_t i = 0; split && i < n_items; ++i) {
    const TileRef tl = tile_of(i);
    split = tl.rows <= kInPlaceRows;
    n_units += tl.n_parts;
  }
  split = split && n_units > n_items;
  if (!split) {
    pool_.parallel_for(n_items, 1, [&](int tid, int64_t i0, int64_t i1) {
      const Bufs b = bufs_of(tid);
      for (int64_t i = i0; i < i1; ++i) {
        const TileRef tl = tile_of(i);
        load_queries(tl, b);
        for (int part = 0; part < tl.n_parts; ++part) {
          attend_part(tl, b, part * kPart, std::min(tl.n_ctx, (part + 1) * kPart));
          if (tl.n_parts > 1) merge(tl.rows, b.tmx, b.tsum, b.tob, b.mx, b.sum, b.ob, part == 0);
        }
        if (tl.n_parts > 1) write_out(tl, b.tob, b.tsum);
        else write_out(tl, b.ob, b.sum);
      }
    });
    return;
  }
  // units: (item, part), item-major; first: each item's first unit. A unit's softmax goes to
  // part_all [unit][kInPlaceRows][hd + 2] (max, sum, output).
  std::vector<int32_t>& units = scratch_i32(2, 2 * n_units + n_items + 1);
  int32_t* first = units.data() + 2 * n_units;
  for (int64_t i = 0, u = 0; i < n_items; ++i) {
    first[i] = static_cast<int32_t>(u);
    for (int part = 0; part < tile_of(i).n_parts; ++part, ++u) {
      units[2 * u] = static_cast<int32_t>(i);
      units[2 * u + 1] = part;
    }
  }
  first[n_items] = static_cast<int32_t>(n_units);
  const int64_t unit_floats = int64_t(kInPlaceRows) * (hd + 2);
  float* part_all = scratch_f32(2, n_units * unit_floats);
  pool_.parallel_for(n_units, 1, [&](int tid, int64_t u0, int64_t u1) {
    const Bufs b = bufs_of(tid);
    for (int64_t u = u0; u < u1; ++u) {
      const TileRef tl = tile_of(units[2 * u]);
      const int part = units[2 * u + 1];
      load_queries(tl, b);
      attend_part(tl, b, part * kPart, std::min(tl.n_ctx, (part + 1) * kPart));
      float* dst = part_all + u * unit_floats;
      std::copy_n(b.mx, tl.rows, dst);
      std::copy_n(b.sum, tl.rows, dst + kInPlaceRows);
      std::copy_n(b.ob, int64_t(tl.rows) * hd, dst + 2 * kInPlaceRows);
    }
  });
  pool_.parallel_for(n_items, 1, [&](int tid, int64_t i0, int64_t i1) {
    const Bufs b = bufs_of(tid);
    for (int64_t i = i0; i < i1; ++i) {
      const TileRef tl = tile_of(i);
      for (int32_t u = first[i]; u < first[i + 1]; ++u) {
        const float* src = part_all + u * unit_floats;
        merge(tl.rows, b.tmx, b.tsum, b.tob, src, src + kInPlaceRows, src + 2 * kInPlaceRows, u == first[i]);
      }
      write_out(tl, b.tob, b.tsum);
    }
  });
}

}  // namespace deltaserve
