// Read-only memory map of a whole file (safetensors shards, tokenizer.json). Move-only.
#pragma once

#include <cstddef>
#include <filesystem>
#include <span>
#include <string_view>

#include "util/status.h"

namespace deltaserve {

class MmapFile {
 public:
  static Result<MmapFile> open(const std::filesystem::path& path);
  MmapFile() = default;
  MmapFile(MmapFile&& other) noexcept;
  MmapFile& operator=(MmapFile&& other) noexcept;
  MmapFile(const MmapFile&) = delete;
  MmapFile& operator=(const MmapFile&) = delete;
  ~MmapFile();

  const std::byte* data() const { return data_; }
  std::size_t size() const { return size_; }
  std::string_view view() const { return {reinterpret_cast<const char*>(data_), size_}; }
  const std::filesystem::path& path() const { return path_; }

 private:
  const std::byte* data_ = nullptr;
  std::size_t size_ = 0;
  std::filesystem::path path_;
};

// Whole file into a string (small text files: config.json, templates).
Result<std::string> read_text_file(const std::filesystem::path& path);

}  // namespace deltaserve
