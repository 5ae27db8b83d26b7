#include "model/safetensors.h"

#include <algorithm>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <tuple>
#include <vector>

namespace deltaserve {

using nlohmann::json;

namespace {

Result<DType> parse_dtype(const std::string& s, const std::string& where) {
  if (s == "F32") return DType::F32;
  if (s == "F16") return DType::F16;
  if (s == "BF16") return DType::BF16;
  if (s == "I32") return DType::I32;
  if (s == "I64") return DType::I64;
  if (s == "U8") return DType::U8;
  return error(where, ": unsupported dtype ", s);
}

}  // namespace

Status Checkpoint::add_file(const std::filesystem::path& path) {
  DS_ASSIGN_OR_RETURN(MmapFile file, MmapFile::open(path));
  const std::string where = path.string();
  if (file.size() < 8) return error(where, ": truncated safetensors file (no header)");
  uint64_t header_len = 0;
  std::memcpy(&header_len, file.data(), 8);
  if (header_len > file.size() - 8 || header_len > (100u << 20))
    return error(where, ": truncated or corrupt safetensors header (length ", header_len, ")");
  json header;
  // A key given twice would be silently collapsed by the parser (the last wins), while the
  // reference library refuses the file: note the first repeated top-level key and refuse it.
  std::set<std::string> keys;
  std::string duplicate;
  auto note_keys = [&](int depth, json::parse_event_t event, json& parsed) {
    if (event == json::parse_event_t::key && depth == 1 && parsed.is_string() &&
        !keys.insert(parsed.get<std::string>()).second && duplicate.empty())
      duplicate = parsed.get<std::string>();
    return true;
  };
  try {
    header = json::parse(std::string_view(reinterpret_cast<const char*>(file.data()) + 8, header_len),
                         note_keys);
  } catch (const std::exception& e) {
    return error(where, ": corrupt safetensors header: ", e.what());
  }
  if (!duplicate.empty())
    return error(where, ": corrupt safetensors header: tensor '", duplicate, "' appears twice");
  if (!header.is_object()) return error(where, ": safetensors header is not an object");
  const std::size_t data_start = 8 + header_len;
  const std::size_t data_size = file.size() - data_start;
  const int file_idx = static_cast<int>(files_.size());
  struct Span {
    uint64_t begin, end;
    std::string name;
  };
  std::vector<Span> spans;
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") continue;
    const std::string tensor_where = where + ": tensor '" + it.key() + "'";
    const json& v = it.value();
    if (!v.is_object() || !v.contains("dtype") || !v.contains("shape") || !v.contains("data_offsets"))
      return error(tensor_where, ": malformed header entry");
    TensorEntry e;
    e.name = it.key();
    try {
      DS_ASSIGN_OR_RETURN(e.dtype, parse_dtype(v["dtype"].get<std::string>(), tensor_where));
      e.shape = v["shape"].get<std::vector<int64_t>>();
      auto off = v["data_offsets"].get<std::vector<uint64_t>>();
      if (off.size() != 2 || off[0] > off[1]) return error(tensor_where, ": bad data_offsets");
      if (off[1] > data_size)
        return error(tensor_where, ": data runs past the end of the file (truncated file?)");
      spans.push_back({off[0], off[1], it.key()});
      e.nbytes = off[1] - off[0];
      e.data = file.data() + data_start + off[0];
    } catch (const std::exception& ex) {
      return error(tensor_where, ": malformed header entry: ", ex.what());
    }
    // The byte count by checked products: a shape such as [2^62] must not wrap around to the
    // bytes the entry holds (0), or loading reads past the mapped file.
    uint64_t want = dtype_size(e.dtype);
    for (auto d : e.shape) {
      if (d < 0) return error(tensor_where, ": negative dimension");
      if (__builtin_mul_overflow(want, static_cast<uint64_t>(d), &want))
        return error(tensor_where, ": shape overflows a 64-bit byte count");
    }
    if (want != e.nbytes) return error(tensor_where, ": byte size does not match shape and dtype");
    e.file_idx = file_idx;
    if (tensors_.count(e.name)) return error(tensor_where, ": tensor appears twice in the checkpoint");
    tensors_.emplace(e.name, std::move(e));
  }
  // The reference library's check (InvalidOffset): sorted by offset, the entries tile the data
  // exactly, from 0 to its end. Overlapping entries would share bytes (one tensor's weights read
  // as another's), a gap or a tail is bytes no tensor owns: both are a corrupt header.
  std::sort(spans.begin(), spans.end(),
            [](const Span& a, const Span& b) { return std::tie(a.begin, a.end) < std::tie(b.begin, b.end); });
  uint64_t next = 0;
  for (const Span& s : spans) {
    if (s.begin != next)
      return error(where, ": corrupt safetensors header: tensor '", s.name, "' data_offsets [", s.begin, ", ",
                   s.end, "] should start at byte ", next,
                   s.begin < next ? " (they overlap another tensor's)" : " (a gap that no tensor owns)");
    next = s.end;
  }
  if (next != data_size)
    return error(where, ": corrupt safetensors header: the tensors' data ends at byte ", next, " of ", data_size,
                 spans.empty() ? "" : str_cat(" (last tensor '", spans.back().name, "')"));
  files_.push_back(std::move(file));
  return Status::ok();
}

Result<Checkpoint> Checkpoint::open_file(const std::filesystem::path& file) {
  Checkpoint ck;
  DS_RETURN_IF_ERROR(ck.add_file(file));
  return ck;
}

Result<Checkpoint> Checkpoint::open(const std::filesystem::path& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return error(dir.string(), ": not a model directory");
  Checkpoint ck;
  const fs::path index = dir / "model.safetensors.index.json";
  if (fs::exists(index, ec)) {
    DS_ASSIGN_OR_RETURN(std::string text, read_text_file(index));
    json j;
    try {
      j = json::parse(text);
    } catch (const std::exception& e) {
      return error(index.string(), ": invalid JSON: ", e.what());
    }
    if (!j.contains("weight_map") || !j["weight_map"].is_object())
      return error(index.string(), ": missing 'weight_map'");
    std::set<std::string> shards;
    for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
      if (!it.value().is_string()) return error(index.string(), ": bad entry for ", it.key());
      shards.insert(it.value().get<std::string>());
    }
    for (const auto& s : shards) {
      if (s.find('/') != std::string::npos || s.find("..") != std::string::npos)
        return error(index.string(), ": shard name '", s, "' must be a plain file name");
      DS_RETURN_IF_ERROR(ck.add_file(dir / s));
    }
    for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it)
      if (!ck.tensors_.count(it.key()))
        return error((dir / it.value().get<std::string>()).string(), ": tensor '", it.key(),
                     "' listed in the index is missing from the shard");
    return ck;
  }
  std::vector<fs::path> files;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const auto& p = entry.path();
    if (p.extension() == ".safetensors" && p.filename() != "reference.safetensors") files.push_back(p);
  }
  if (files.empty())
    return error(dir.string(), ": no model.safetensors (or model.safetensors.index.json) found");
  std::sort(files.begin(), files.end());
  for (const auto& f : files) DS_RETURN_IF_ERROR(ck.add_file(f));
  return ck;
}

const TensorEntry* Checkpoint::find(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

Status write_safetensors_f32(const std::filesystem::path& path, const std::vector<NamedF32>& tensors) {
  json header = json::object();
  uint64_t offset = 0;
  for (const auto& t : tensors) {
    uint64_t n = 1;
    for (auto d : t.shape) n *= static_cast<uint64_t>(d);
    header[t.name] = {{"dtype", "F32"}, {"shape", t.shape}, {"data_offsets", {offset, offset + n * 4}}};
    offset += n * 4;
  }
  std::string h = header.dump();
  while ((h.size() + 8) % 8) h += ' ';
  std::ofstream out(path, std::ios::binary);
  if (!out) return error(path.string(), ": cannot open for writing");
  uint64_t len = h.size();
  out.write(reinterpret_cast<const char*>(&len), 8);
  out.write(h.data(), static_cast<std::streamsize>(h.size()));
  for (const auto& t : tensors) {
    uint64_t n = 1;
    for (auto d : t.shape) n *= static_cast<uint64_t>(d);
    out.write(reinterpret_cast<const char*>(t.data), static_cast<std::streamsize>(n * 4));
  }
  if (!out) return error(path.string(), ": write failed");
  return Status::ok();
}

}  // namespace deltaserve
