// Safetensors checkpoints via mmap: a single `model.safetensors`, or shards listed in
// `model.safetensors.index.json`. Tensors stay in the mapped files; lookups return views.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "util/mmap_file.h"
#include "util/status.h"

namespace deltaserve {

struct TensorEntry {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  const void* data = nullptr;  // inside the mapped file
  std::size_t nbytes = 0;
  int file_idx = 0;
  int64_t numel() const {
    int64_t n = 1;
    for (auto d : shape) n *= d;
    return n;
  }
};

class SafetensorsFile;

class Checkpoint {
 public:
  // Opens <dir>/model.safetensors.index.json if present, else every <dir>/*.safetensors except
  // reference.safetensors (fixtures keep their expected outputs beside the model).
  static Result<Checkpoint> open(const std::filesystem::path& dir);
  // One safetensors file (also used by tests to read reference outputs).
  static Result<Checkpoint> open_file(const std::filesystem::path& file);

  const TensorEntry* find(const std::string& name) const;
  const std::map<std::string, TensorEntry>& tensors() const { return tensors_; }
  const std::filesystem::path& file_of(const TensorEntry& e) const { return files_[e.file_idx].path(); }

 private:
  Status add_file(const std::filesystem::path& path);
  std::vector<MmapFile> files_;
  std::map<std::string, TensorEntry> tensors_;
};

// Writes f32 tensors as a safetensors file (the `logits` command's output).
struct NamedF32 {
  std::string name;
  std::vector<int64_t> shape;
  const float* data;
};
Status write_safetensors_f32(const std::filesystem::path& path, const std::vector<NamedF32>& tensors);

}  // namespace deltaserve
