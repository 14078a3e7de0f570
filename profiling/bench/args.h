// Command-line options of the pins-bench benchmarks. A bad option is a
// std::invalid_argument whose message names it and what it got; main.cpp
// prints it with the benchmark's name and exits 2.
#pragma once

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "csrc/base/size.h"

namespace pins::bench {

// Walks `args` as `--flag VALUE` pairs: `while (a.next()) { if (a.is("--reps")) reps = a.positive(); ... else
// a.unknown(); }`.
class Args {
 public:
  explicit Args(const std::vector<std::string>& args) : args_(args) {}

  bool next() {
    if (i_ >= args_.size()) return false;
    flag_ = args_[i_++];
    return true;
  }
  bool is(const char* flag) const { return flag_ == flag; }
  [[noreturn]] void unknown() const { throw std::invalid_argument("unknown option \"" + flag_ + "\""); }

  const std::string& value() {
    if (i_ >= args_.size()) throw std::invalid_argument(flag_ + " needs a value");
    return args_[i_++];
  }
  // A whole number >= 1.
  int positive() {
    const std::string v = value();
    return parse_positive(v, v);
  }
  // Bytes in Note [Size syntax] (csrc/base/size.h), at least 1.
  uint64_t size() {
    const std::string v = value();
    const std::optional<uint64_t> n = parse_size(v);
    if (!n || *n == 0) fail("a size such as 512M or 1.5GiB", v);
    return *n;
  }
  // Comma-separated whole numbers >= 1, in the order given.
  std::vector<int> positive_list() {
    const std::string v = value();
    std::vector<int> out;
    for (const std::string& item : split(v)) out.push_back(parse_positive(item, v, "a comma-separated list of positive integers"));
    return out;
  }
  // Comma-separated names, each one of `allowed`.
  std::vector<std::string> choice_list(const std::vector<std::string>& allowed) {
    const std::string v = value();
    std::string choices;
    for (const std::string& a : allowed) choices += (choices.empty() ? "" : ", ") + a;
    std::vector<std::string> out;
    for (const std::string& item : split(v)) {
      bool ok = false;
      for (const std::string& a : allowed) ok |= item == a;
      if (!ok) fail("a comma-separated list of " + choices, v);
      out.push_back(item);
    }
    return out;
  }

 private:
  [[noreturn]] void fail(const std::string& expected, const std::string& got) const {
    throw std::invalid_argument(flag_ + ": expected " + expected + ", got \"" + got + "\"");
  }
  int parse_positive(const std::string& item, const std::string& whole,
                     const std::string& expected = "a positive integer") const {
    size_t used = 0;
    long n = 0;
    try {
      n = std::stol(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (item.empty() || used != item.size() || n < 1 || n > 1'000'000'000 || item[0] == '+' || item[0] == ' ')
      fail(expected, whole);
    return static_cast<int>(n);
  }
  std::vector<std::string> split(const std::string& v) const {
    std::vector<std::string> out;
    size_t start = 0;
    while (true) {
      const size_t comma = v.find(',', start);
      out.push_back(v.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
      if (comma == std::string::npos) break;
      start = comma + 1;
    }
    return out;
  }

  const std::vector<std::string>& args_;
  size_t i_ = 0;
  std::string flag_;
};

}  // namespace pins::bench
