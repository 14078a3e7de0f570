// A file of pseudo-random bytes in the system's temp directory, removed with
// the object: for the tests of code that reads files.
#pragma once

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>

namespace pins::testing {

struct TempFile {
  std::string path;
  std::string bytes;
  // `n` bytes drawn from `seed`, in a file whose name starts with `name`.
  TempFile(uint64_t n, uint32_t seed, const std::string& name = "pins_files_test") {
    path = (std::filesystem::temp_directory_path() / (name + std::to_string(std::random_device{}()))).string();
    std::mt19937 rng(seed);
    bytes.resize(n);
    for (char& c : bytes) c = static_cast<char>(rng());
    write(bytes);
  }
  ~TempFile() { std::remove(path.c_str()); }
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;

  // Replaces the file's bytes (the object's `bytes` stay as they were).
  void write(const std::string& content) const {
    std::ofstream(path, std::ios::binary | std::ios::trunc)
        .write(content.data(), static_cast<std::streamsize>(content.size()));
  }
};

}  // namespace pins::testing
