// Helpers for device probe tests: fixture roots and scratch fake roots.
#pragma once

#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <string>

namespace spw::device::testing {

inline std::string fixture(const std::string& name) { return std::string(SPW_DEVICE_TESTDATA) + "/" + name; }

// A temporary fake root removed on destruction; write() creates parents.
class ScratchRoot {
 public:
  ScratchRoot() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "spw_device_XXXXXX").string();
    char* dir = mkdtemp(tmpl.data());
    path_ = dir != nullptr ? dir : "";
  }
  ~ScratchRoot() {
    std::error_code ec;
    if (!path_.empty()) std::filesystem::remove_all(path_, ec);
  }
  ScratchRoot(const ScratchRoot&) = delete;
  ScratchRoot& operator=(const ScratchRoot&) = delete;

  const std::string& path() const { return path_; }
  void write(const std::string& rel, const std::string& content) const {
    std::filesystem::path p = std::filesystem::path(path_) / rel;
    std::filesystem::create_directories(p.parent_path());
    std::ofstream(p, std::ios::binary) << content;
  }

 private:
  std::string path_;
};

}  // namespace spw::device::testing
