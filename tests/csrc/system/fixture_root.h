// A fake system root (proc/, sys/fs/cgroup/) in a fresh temp directory, removed
// with the object. For the tests of code that reads /proc and /sys.
#pragma once

#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>

namespace pins::testing {

class FixtureRoot {
 public:
  FixtureRoot() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "pins_fixture_XXXXXX").string();
    if (::mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("mkdtemp failed for " + tmpl);
    dir_ = tmpl;
  }
  ~FixtureRoot() {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  FixtureRoot(const FixtureRoot&) = delete;
  FixtureRoot& operator=(const FixtureRoot&) = delete;

  void write(const std::string& rel, const std::string& text) const {
    const std::filesystem::path p = dir_ / rel;
    std::filesystem::create_directories(p.parent_path());
    std::ofstream(p) << text;
  }
  std::string read(const std::string& rel) const {
    std::ifstream f(dir_ / rel);
    std::stringstream s;
    s << f.rdbuf();
    return s.str();
  }
  void mkdir(const std::string& rel) const { std::filesystem::create_directories(dir_ / rel); }
  std::string path() const { return dir_.string(); }
  std::string file(const std::string& rel) const { return (dir_ / rel).string(); }

 private:
  std::filesystem::path dir_;
};

}  // namespace pins::testing
