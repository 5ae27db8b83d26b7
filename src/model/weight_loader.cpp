#include "model/weight_loader.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace deltaserve {

namespace {
std::string shape_str(const std::vector<int64_t>& s) {
  std::string r = "[";
  for (std::size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}
int64_t numel(const std::vector<int64_t>& s) {
  int64_t n = 1;
  for (auto d : s) n *= d;
  return n;
}
}  // namespace

WeightLoader::WeightLoader(const Checkpoint* checkpoint, Backend& backend, std::string source,
                           WeightDType weight_dtype, uint64_t seed)
    : checkpoint_(checkpoint), backend_(backend), source_(std::move(source)), weight_dtype_(weight_dtype), rng_(seed) {}

bool WeightLoader::has(const std::string& name) const {
  return checkpoint_ == nullptr || checkpoint_->find(name) != nullptr;
}

Status WeightLoader::check(const std::string& name, const std::vector<int64_t>& shape,
                           const TensorEntry** out) {
  const TensorEntry* e = checkpoint_->find(name);
  if (!e) return error(source_, ": missing tensor '", name, "'");
  // Squeeze-equivalent shapes are fine (conv1d.weight [C, 1, K] read as [C, K]).
  if (e->numel() != numel(shape)) {
    return error(checkpoint_->file_of(*e).string(), ": tensor '", name, "' has shape ",
                 shape_str(e->shape), ", expected ", shape_str(shape));
  }
  std::vector<int64_t> a, b;
  for (auto d : e->shape) if (d != 1) a.push_back(d);
  for (auto d : shape) if (d != 1) b.push_back(d);
  if (a != b)
    return error(checkpoint_->file_of(*e).string(), ": tensor '", name, "' has shape ",
                 shape_str(e->shape), ", expected ", shape_str(shape));
  if (e->dtype != DType::BF16 && e->dtype != DType::F16 && e->dtype != DType::F32)
    return error(checkpoint_->file_of(*e).string(), ": tensor '", name, "' has unsupported dtype ",
                 dtype_name(e->dtype));
  used_.insert(name);
  *out = e;
  return Status::ok();
}

std::vector<uint16_t> WeightLoader::random_bf16(int64_t n, float scale) {
  std::vector<uint16_t> v(static_cast<std::size_t>(n));
  std::uniform_real_distribution<float> dist(-scale, scale);
  // Fill a block with fresh randoms and tile it: generating billions of values one by one would
  // dominate start-up for the 27B shape, and the numbers only need to be non-degenerate.
  const int64_t block = std::min<int64_t>(n, 1 << 20);
  for (int64_t i = 0; i < block; ++i) v[i] = f32_to_bf16(dist(rng_));
  for (int64_t i = block; i < n; i += block)
    std::memcpy(v.data() + i, v.data(), static_cast<std::size_t>(std::min(block, n - i)) * 2);
  return v;
}

namespace {

// Element i of a checkpoint tensor as f32.
float element_f32(const TensorEntry& e, int64_t i) {
  if (e.dtype == DType::F32) return static_cast<const float*>(e.data)[i];
  const uint16_t v = static_cast<const uint16_t*>(e.data)[i];
  return e.dtype == DType::BF16 ? bf16_to_f32(v) : f16_to_f32(v);
}

// The ranges to keep of n rows (all of them when take is empty), and their total.
std::vector<RowRange> ranges_or_all(const std::vector<RowRange>& take, int64_t n) {
  return take.empty() ? std::vector<RowRange>{RowRange{0, n}} : take;
}
int64_t total_rows(const std::vector<RowRange>& take, int64_t n) {
  if (take.empty()) return n;
  int64_t t = 0;
  for (const auto& r : take) t += r.size();
  return t;
}

}  // namespace

Result<std::vector<float>> WeightLoader::host_f32(const std::string& name, const std::vector<int64_t>& shape,
                                                  const std::vector<RowRange>& take) {
  const int64_t n0 = shape.empty() ? 1 : shape[0];
  const int64_t width = numel(shape) / std::max<int64_t>(n0, 1);
  for (const auto& r : take) DS_CHECK(r.begin >= 0 && r.begin <= r.end && r.end <= n0, name, ": row range");
  std::vector<float> out(static_cast<std::size_t>(total_rows(take, n0) * width));
  if (!checkpoint_) {
    std::uniform_real_distribution<float> dist(-0.1f, 0.1f);
    for (auto& x : out) x = bf16_to_f32(f32_to_bf16(dist(rng_)));
    return out;
  }
  const TensorEntry* e = nullptr;
  DS_RETURN_IF_ERROR(check(name, shape, &e));
  std::size_t o = 0;
  for (const RowRange& r : ranges_or_all(take, n0)) {
    if (e->dtype == DType::F32) {
      std::memcpy(out.data() + o, static_cast<const float*>(e->data) + r.begin * width,
                  static_cast<std::size_t>(r.size() * width) * 4);
      o += static_cast<std::size_t>(r.size() * width);
    } else {
      for (int64_t i = r.begin * width; i < r.end * width; ++i) out[o++] = element_f32(*e, i);
    }
  }
  return out;
}

Result<DeviceTensor> WeightLoader::f32(const std::string& name, const std::vector<int64_t>& shape,
                                       bool add_one, const std::vector<RowRange>& take) {
  DS_ASSIGN_OR_RETURN(std::vector<float> host, host_f32(name, shape, take));
  if (add_one)
    for (auto& x : host) x += 1.0f;
  DeviceTensor t;
  t.buffer = backend_.allocate(host.size() * 4);
  t.view = t.buffer.view(DType::F32, {static_cast<int64_t>(host.size())});
  backend_.copy_to_device(t.view, host.data());
  bytes_loaded_ += host.size() * 4;
  return t;
}

Result<std::optional<float>> WeightLoader::optional_scalar(const std::string& name) {
  if (!checkpoint_ || !checkpoint_->find(name)) return std::optional<float>();
  DS_ASSIGN_OR_RETURN(std::vector<float> v, host_f32(name, {1}));
  if (!(v[0] > 0.f) || !std::isfinite(v[0]))
    return error(checkpoint_->file_of(*checkpoint_->find(name)).string(), ": tensor '", name,
                 "' must be a positive finite scale, got ", v[0]);
  return std::optional<float>(v[0]);
}

Result<DeviceTensor> WeightLoader::neg_exp(const std::string& name, int64_t n, const std::vector<RowRange>& take) {
  DS_ASSIGN_OR_RETURN(std::vector<float> host, host_f32(name, {n}, take));
  for (auto& x : host) x = -std::exp(x);
  DeviceTensor t;
  t.buffer = backend_.allocate(host.size() * 4);
  t.view = t.buffer.view(DType::F32, {static_cast<int64_t>(host.size())});
  backend_.copy_to_device(t.view, host.data());
  return t;
}

Result<DeviceTensor> WeightLoader::embedding(const std::string& name, int64_t v, int64_t h, RowRange rows) {
  if (rows.size() == 0) rows = RowRange{0, v};
  DS_CHECK(rows.begin >= 0 && rows.end <= v, name, ": vocabulary rows");
  const int64_t n = rows.size();
  DeviceTensor t;
  if (!checkpoint_) {
    auto host = random_bf16(n * h, 0.05f);
    t.buffer = backend_.allocate(host.size() * 2);
    t.view = t.buffer.view(DType::BF16, {n, h});
    backend_.copy_to_device(t.view, host.data());
    bytes_loaded_ += host.size() * 2;
    return t;
  }
  const TensorEntry* e = nullptr;
  DS_RETURN_IF_ERROR(check(name, {v, h}, &e));
  if (e->dtype == DType::BF16 || e->dtype == DType::F32) {
    const std::size_t es = dtype_size(e->dtype);
    t.buffer = backend_.allocate(static_cast<std::size_t>(n * h) * es);
    t.view = t.buffer.view(e->dtype, {n, h});
    backend_.copy_to_device(t.view, static_cast<const char*>(e->data) + static_cast<std::size_t>(rows.begin * h) * es);
    bytes_loaded_ += t.view.nbytes();
    return t;
  }
  DS_ASSIGN_OR_RETURN(std::vector<float> host, host_f32(name, {v, h}, {rows}));
  t.buffer = backend_.allocate(host.size() * 4);
  t.view = t.buffer.view(DType::F32, {n, h});
  backend_.copy_to_device(t.view, host.data());
  bytes_loaded_ += host.size() * 4;
  return t;
}

Result<std::unique_ptr<LinearWeight>> WeightLoader::linear(const std::vector<std::string>& names,
                                                           const std::vector<int64_t>& rows,
                                                           int64_t k) {
  DS_CHECK(names.size() == rows.size() && !names.empty(), "linear: names/rows mismatch");
  std::vector<LinearPart> parts;
  for (std::size_t i = 0; i < names.size(); ++i) parts.push_back(LinearPart{names[i], rows[i], {}});
  return linear(parts, k);
}

Result<std::unique_ptr<LinearWeight>> WeightLoader::linear(const std::vector<LinearPart>& parts, int64_t k,
                                                           RowRange cols) {
  DS_CHECK(!parts.empty(), "linear: no parts");
  if (cols.size() == 0) cols = RowRange{0, k};
  DS_CHECK(cols.begin >= 0 && cols.end <= k, "linear: column range");
  const int64_t kc = cols.size();
  int64_t n = 0;
  bool whole = kc == k;
  for (const auto& p : parts) {
    n += total_rows(p.take, p.rows);
    whole = whole && p.take.empty();
  }
  if (!checkpoint_) {
    // GPU backends generate dummy weights on the device (host == nullptr, see Backend::make_linear):
    // no round trip of tens of GB through host memory for the large shapes.
    if (backend_.device() != Device::Cpu) {
      bytes_loaded_ += static_cast<std::size_t>(n * kc) * 2;
      return backend_.make_linear(nullptr, DType::BF16, n, kc);
    }
    auto host = random_bf16(n * kc, 1.0f / std::sqrt(float(k)));
    bytes_loaded_ += host.size() * 2;
    if (weight_dtype_ != WeightDType::F32) return backend_.make_linear(host.data(), DType::BF16, n, kc);
    std::vector<float> wide(host.size());
    for (std::size_t i = 0; i < host.size(); ++i) wide[i] = bf16_to_f32(host[i]);
    return backend_.make_linear(wide.data(), DType::F32, n, kc);
  }
  std::vector<const TensorEntry*> entries;
  for (const auto& p : parts) {
    const TensorEntry* e = nullptr;
    DS_RETURN_IF_ERROR(check(p.name, {p.rows, k}, &e));
    entries.push_back(e);
  }
  bool same_dtype = true;
  for (auto* e : entries) same_dtype &= e->dtype == entries[0]->dtype;
  // The dtype handed to the backend: --dtype's, or the checkpoint's (parts of mixed dtypes: f32).
  const DType dtype = weight_dtype_ == WeightDType::BF16 ? DType::BF16
                      : weight_dtype_ == WeightDType::F32 ? DType::F32
                      : same_dtype                        ? entries[0]->dtype
                                                          : DType::F32;
  const std::size_t es = dtype_size(dtype);
  bytes_loaded_ += static_cast<std::size_t>(n * kc) * es;
  // One whole source tensor in that dtype: hand it over directly (no extra host copy).
  if (entries.size() == 1 && whole && entries[0]->dtype == dtype) return backend_.make_linear(entries[0]->data, dtype, n, k);
  std::vector<uint8_t> host(static_cast<std::size_t>(n * kc) * es);
  uint8_t* o = host.data();
  for (std::size_t i = 0; i < parts.size(); ++i) {
    const TensorEntry& e = *entries[i];
    for (const RowRange& r : ranges_or_all(parts[i].take, parts[i].rows)) {
      DS_CHECK(r.begin >= 0 && r.begin <= r.end && r.end <= parts[i].rows, parts[i].name, ": row range");
      for (int64_t row = r.begin; row < r.end; ++row) {
        const int64_t first = row * k + cols.begin;
        if (e.dtype == dtype) {
          std::memcpy(o, static_cast<const uint8_t*>(e.data) + static_cast<std::size_t>(first) * es,
                      static_cast<std::size_t>(kc) * es);
        } else if (dtype == DType::BF16) {  // rounded to nearest even
          uint16_t* b = reinterpret_cast<uint16_t*>(o);
          for (int64_t j = 0; j < kc; ++j) b[j] = f32_to_bf16(element_f32(e, first + j));
        } else {
          float* f = reinterpret_cast<float*>(o);
          for (int64_t j = 0; j < kc; ++j) f[j] = element_f32(e, first + j);
        }
        o += static_cast<std::size_t>(kc) * es;
      }
    }
  }
  return backend_.make_linear(host.data(), dtype, n, kc);
}

std::vector<std::string> WeightLoader::unused(const std::vector<std::string>& ignore_prefixes) const {
  std::vector<std::string> out;
  if (!checkpoint_) return out;
  for (const auto& [name, e] : checkpoint_->tensors()) {
    if (used_.count(name)) continue;
    bool ignored = false;
    for (const auto& p : ignore_prefixes) ignored |= name.rfind(p, 0) == 0;
    if (name.find("rotary_emb.inv_freq") != std::string::npos) ignored = true;
    if (!ignored) out.push_back(name);
  }
  return out;
}

}  // namespace deltaserve
