// CpuWeight packing, run-time kernel choice and the split of a matmul across the thread pool.
// The kernels themselves are in cpu_matmul_kernels.h (one instantiation per ISA file).
#include "backend/cpu/cpu_matmul.h"

#include <algorithm>
#include <cstring>

#include "backend/cpu/cpu_matmul_internal.h"
#include "util/status.h"

namespace deltaserve {

namespace {

using cpu::kPanelRows;
using cpu::packed_view;

using BlockFn = void (*)(const cpu::PackedWeight&, const cpu::MatmulArgs&, int64_t, int64_t,
                         int64_t, int64_t);

BlockFn block_fn(CpuIsa isa) {
  DS_CHECK(cpu_isa_supported(isa), "kernel family ", cpu_isa_name(isa), " not supported here");
  switch (isa) {
#if defined(DELTASERVE_X86_KERNELS)
    case CpuIsa::Avx512: return cpu::matmul_block_avx512;
    case CpuIsa::Avx2: return cpu::matmul_block_avx2;
#endif
    default: return cpu::matmul_block_portable;
  }
}

// Below this many multiply-adds a product runs on the calling thread: a fork/join costs about
// as much as ~30k bf16 MACs streamed from L2/L3.
constexpr int64_t kMinParallelMacs = 32 * 1024;
// From this many rows (prefill) the rows are split between threads; below, the panels (columns).
constexpr int64_t kRowSplitMinM = 64;
// Row splits are multiples of every ISA's MR (6 and 8); panel splits multiples of every NP.
constexpr int64_t kRowAlign = 24;
constexpr int64_t kPanelAlign = 4;

struct MultiJob {
  BlockFn fn;
  const float* x;
  int64_t m, ldx;
  const CpuMatmulOut* outs;
  int64_t n_outs;
  cpu::PackedWeight packed[16];
  int64_t total_cost;  // sum over outs of n_panels * kp (panel split)
  bool split_rows;
  int n_threads;  // threads that take a share (<= pool size)
};

// Thread t of n_threads: its rows (split_rows) or its share of the concatenated panels of all
// outputs, cut at equal cost (panel bytes) and rounded to kPanelAlign within an output.
void run_share(const MultiJob& job, int t, int n_threads) {
  if (job.split_rows) {
    const int64_t align = job.m >= 4 * kRowAlign ? kRowAlign : 1;
    auto cut = [&](int i) {
      int64_t r = job.m * i / n_threads;
      return i == n_threads ? job.m : std::min(job.m, (r + align / 2) / align * align);
    };
    int64_t m0 = cut(t), m1 = cut(t + 1);
    if (m0 >= m1) return;
    for (int64_t o = 0; o < job.n_outs; ++o) {
      const CpuMatmulOut& out = job.outs[o];
      cpu::MatmulArgs a{job.x, job.ldx, out.out, out.ldo, out.accumulate};
      job.fn(job.packed[o], a, m0, m1, 0, job.packed[o].n_panels);
    }
    return;
  }
  const int64_t c0 = job.total_cost * t / n_threads, c1 = job.total_cost * (t + 1) / n_threads;
  int64_t base = 0;
  for (int64_t o = 0; o < job.n_outs; ++o) {
    const cpu::PackedWeight& pw = job.packed[o];
    const int64_t cost = pw.n_panels * pw.kp;
    // This output's panels [p0, p1) that fall in [c0, c1), rounded to kPanelAlign panels.
    auto to_panel = [&](int64_t c) {
      if (c <= base) return int64_t{0};
      if (c >= base + cost) return pw.n_panels;
      int64_t p = (c - base) / pw.kp;
      p = (p + kPanelAlign / 2) / kPanelAlign * kPanelAlign;
      return std::min(p, pw.n_panels);
    };
    const int64_t p0 = to_panel(c0), p1 = to_panel(c1);
    if (p0 < p1) {
      const CpuMatmulOut& out = job.outs[o];
      cpu::MatmulArgs a{job.x, job.ldx, out.out, out.ldo, out.accumulate};
      job.fn(pw, a, 0, job.m, p0, p1);
    }
    base += cost;
  }
}

void matmul_multi(ThreadPool& pool, const float* x, int64_t m, int64_t ldx, const CpuMatmulOut* outs,
                  int64_t n_outs, CpuIsa isa) {
  if (m <= 0 || n_outs == 0) return;
  MultiJob job;
  DS_CHECK(n_outs <= 16, "cpu_matmul_multi: at most 16 outputs, got ", n_outs);
  job.fn = block_fn(isa);
  job.x = x;
  job.m = m;
  job.ldx = ldx;
  job.outs = outs;
  job.n_outs = n_outs;
  job.total_cost = 0;
  int64_t macs = 0;
  for (int64_t o = 0; o < n_outs; ++o) {
    DS_CHECK(outs[o].w != nullptr && !outs[o].w->empty(), "cpu_matmul: empty weight");
    DS_CHECK(outs[o].w->k() == outs[0].w->k(), "cpu_matmul_multi: k differs");
    DS_CHECK(ldx >= outs[o].w->k() || m == 1, "cpu_matmul: ldx < k");
    DS_CHECK(outs[o].ldo >= outs[o].w->n() || m == 1, "cpu_matmul: ldo < n");
    job.packed[o] = packed_view(*outs[o].w);
    job.total_cost += job.packed[o].n_panels * job.packed[o].kp;
    macs += m * outs[o].w->n() * outs[o].w->k();
  }
  int n_threads = pool.n_threads();
  if (macs < kMinParallelMacs) n_threads = 1;
  job.split_rows = m >= kRowSplitMinM || job.total_cost / std::max<int64_t>(1, job.packed[0].kp) <
                                             2 * kPanelAlign;
  if (job.split_rows) n_threads = static_cast<int>(std::min<int64_t>(n_threads, (m + 7) / 8));
  if (n_threads <= 1) {
    run_share(job, 0, 1);
    return;
  }
  job.n_threads = n_threads;
  const MultiJob* jp = &job;  // one pointer: fits std::function's inline storage, no allocation
  pool.run_on_all([jp](int t, int) {
    if (t < jp->n_threads) run_share(*jp, t, jp->n_threads);
  });
}

}  // namespace

CpuWeight CpuWeight::from(const void* data, DType dtype, int64_t n, int64_t k) {
  DS_CHECK(n > 0 && k > 0, "CpuWeight: bad shape ", n, "x", k);
  CpuWeight w;
  w.n_ = n;
  w.k_ = k;
  const int64_t n_panels = (n + kPanelRows - 1) / kPanelRows, kp = (k + 1) / 2;
  if (dtype == DType::BF16) {
    // lane r of pair block q = w[r][2q] | w[r][2q+1] << 16 (see cpu_matmul_internal.h)
    w.dtype_ = DType::BF16;
    w.storage_.assign(static_cast<std::size_t>(n_panels * kp * 64), 0);
    auto* dst = reinterpret_cast<uint16_t*>(w.storage_.data());
    auto* src = static_cast<const uint16_t*>(data);
    for (int64_t r = 0; r < n; ++r) {
      uint16_t* panel = dst + (r / kPanelRows) * kp * 32 + (r % kPanelRows) * 2;
      const uint16_t* row = src + r * k;
      for (int64_t t = 0; t < k; ++t) panel[(t >> 1) * 32 + (t & 1)] = row[t];
    }
  } else if (dtype == DType::F32 || dtype == DType::F16) {
    // pair block q = 16 floats w[r][2q], then 16 floats w[r][2q+1]
    w.dtype_ = DType::F32;
    w.storage_.assign(static_cast<std::size_t>(n_panels * kp * 128), 0);
    auto* dst = reinterpret_cast<float*>(w.storage_.data());
    for (int64_t r = 0; r < n; ++r) {
      float* panel = dst + (r / kPanelRows) * kp * 32 + (r % kPanelRows);
      for (int64_t t = 0; t < k; ++t) {
        float v;
        if (dtype == DType::F32) v = static_cast<const float*>(data)[r * k + t];
        else v = f16_to_f32(static_cast<const uint16_t*>(data)[r * k + t]);
        panel[(t >> 1) * 32 + (t & 1) * kPanelRows] = v;
      }
    }
  } else {
    DS_CHECK(false, "unsupported weight dtype ", dtype_name(dtype));
  }
  return w;
}

cpu::PackedWeight cpu::packed_view(const CpuWeight& w) {
  cpu::PackedWeight p;
  p.data = w.raw();
  p.n = w.n();
  p.k = w.k();
  p.n_panels = (w.n() + kPanelRows - 1) / kPanelRows;
  p.kp = (w.k() + 1) / 2;
  p.bf16 = w.dtype() == DType::BF16;
  p.panel_bytes = p.kp * (p.bf16 ? 64 : 128);
  return p;
}

bool cpu_isa_supported(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::Portable: return true;
#if defined(DELTASERVE_X86_KERNELS)
    // __builtin_cpu_supports also checks that the OS saves the ymm/zmm state (XCR0).
    case CpuIsa::Avx2: return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case CpuIsa::Avx512: return __builtin_cpu_supports("avx512f");
#endif
    default: return false;
  }
}

CpuIsa cpu_best_isa() {
  static const CpuIsa best = [] {
    if (cpu_isa_supported(CpuIsa::Avx512)) return CpuIsa::Avx512;
    if (cpu_isa_supported(CpuIsa::Avx2)) return CpuIsa::Avx2;
    return CpuIsa::Portable;
  }();
  return best;
}

const char* cpu_isa_name(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::Portable: return "portable";
    case CpuIsa::Avx2: return "avx2";
    case CpuIsa::Avx512: return "avx512";
  }
  return "?";
}

std::string cpu_matmul_isa() { return cpu_isa_name(cpu_best_isa()); }

void cpu_matmul(ThreadPool& pool, const float* x, int64_t m, int64_t ldx, const CpuWeight& w,
                float* out, int64_t ldo, bool accumulate, CpuIsa isa) {
  CpuMatmulOut o{&w, out, ldo, accumulate};
  matmul_multi(pool, x, m, ldx, &o, 1, isa);
}

void cpu_matmul(ThreadPool& pool, const float* x, int64_t m, int64_t ldx, const CpuWeight& w,
                float* out, int64_t ldo, bool accumulate) {
  cpu_matmul(pool, x, m, ldx, w, out, ldo, accumulate, cpu_best_isa());
}

void cpu_matmul_multi(ThreadPool& pool, const float* x, int64_t m, int64_t ldx,
                      std::span<const CpuMatmulOut> outs, CpuIsa isa) {
  matmul_multi(pool, x, m, ldx, outs.data(), static_cast<int64_t>(outs.size()), isa);
}

void cpu_matmul_multi(ThreadPool& pool, const float* x, int64_t m, int64_t ldx,
                      std::span<const CpuMatmulOut> outs) {
  cpu_matmul_multi(pool, x, m, ldx, outs, cpu_best_isa());
}

}  // namespace deltaserve
