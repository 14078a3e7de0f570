// A fake system root (proc/, sys/fs/cgroup/) in a fresh temp directory, removed
// with the object. For the tests of code that reads /proc and /sys.
#pragma once

#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>

namespace pins::testing {

class FixtureRoot {
 public:
  // A directory no one else has, as mkdtemp makes (which Windows lacks):
  // create_directory says false for a name already taken.
  FixtureRoot() {
    const std::filesystem::path tmp = std::filesystem::temp_directory_path();
    std::random_device random;
    for (int i = 0; i < 100; ++i) {
      dir_ = tmp / ("pins_fixture_" + std::to_string(random()));
      if (std::filesystem::create_directory(dir_)) return;
    }
    throw std::runtime_error("no fresh fixture directory in " + tmp.string());
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
