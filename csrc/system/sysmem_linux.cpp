// System memory on Linux: /proc/meminfo bounded by the cgroup's limits (the
// Windows reading is sysmem_win.cpp).
#include "csrc/system/sysmem.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <string_view>
#include <vector>

#include "csrc/base/check.h"
#include "csrc/base/saturate.h"
#include "csrc/base/text.h"

namespace pins {
namespace {

namespace fs = std::filesystem;

constexpr uint64_t kNoLimit = std::numeric_limits<uint64_t>::max();
// cgroup v1 reports "no limit" as LONG_MAX rounded down to a page
// (9223372036854771712); anything this large is no limit.
constexpr uint64_t kV1Unlimited = 1ull << 62;


// Reads a small file (procfs, cgroupfs) whole with one open and as few reads as
// it takes. Returns the errno on failure, 0 on success.
int read_small_file(const std::string& path, std::string& out) {
  out.clear();
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return errno;
  char buf[4096];
  int err = 0;
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n > 0) {
      out.append(buf, static_cast<size_t>(n));
    } else if (n == 0) {
      break;
    } else if (errno != EINTR) {
      err = errno;
      break;
    }
  }
  ::close(fd);
  return err;
}

std::optional<uint64_t> to_u64(std::string_view s) {
  uint64_t v = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size() || s.empty()) return std::nullopt;
  return v;
}

[[noreturn]] void malformed(const std::string& path, std::string_view content) {
  throw ResourceError(detail::cat("malformed number in ", path, ": '", content, "'"));
}

// A cgroup file holding one number, or "max" where `max_ok`. nullopt: the file is
// missing or unreadable, or says "max" (no limit either way).
std::optional<uint64_t> read_cgroup_number(const std::string& path, bool max_ok) {
  std::string text;
  if (read_small_file(path, text) != 0) return std::nullopt;
  const std::string_view v = trim(text);
  if (max_ok && v == "max") return std::nullopt;
  const auto n = to_u64(v);
  if (!n) malformed(path, v);
  return n;
}

// Calls f(line) for each line of `text`, without its newline.
template <typename F>
void for_each_line(std::string_view text, F&& f) {
  size_t pos = 0;
  while (pos < text.size()) {
    size_t eol = text.find('\n', pos);
    if (eol == std::string_view::npos) eol = text.size();
    f(text.substr(pos, eol - pos));
    pos = eol + 1;
  }
}

// The value of `key` in a memory.stat file ("key 123" lines); 0 when the file
// or the key is missing.
uint64_t stat_value(const std::string& path, std::string_view key) {
  std::string text;
  if (read_small_file(path, text) != 0) return 0;
  uint64_t value = 0;
  for_each_line(text, [&](std::string_view line) {
    if (line.size() > key.size() && line.substr(0, key.size()) == key && line[key.size()] == ' ') {
      const auto n = to_u64(trim(line.substr(key.size() + 1)));
      if (!n) malformed(path, line);
      value = *n;
    }
  });
  return value;
}

// One "Key:   123 kB" line of meminfo, in bytes.
uint64_t meminfo_value(const std::string& path, std::string_view line, std::string_view rest) {
  rest = trim(rest);
  uint64_t scale = 1;
  if (rest.size() >= 2 && rest.substr(rest.size() - 2) == "kB") {
    scale = KiB;
    rest = trim(rest.substr(0, rest.size() - 2));
  }
  const auto n = to_u64(rest);
  if (!n || *n > kNoLimit / scale) malformed(path, trim(line));
  return *n * scale;
}

// The cgroup directories from `leaf` (relative to `base`) up to `base`, leaf
// first. When the leaf does not exist (a container that mounts its own cgroup
// at `base` but sees the host's path in /proc/self/cgroup) or the path escapes
// `base` (a cgroup namespace shows ".." for cgroups outside it), only `base`.
std::vector<fs::path> cgroup_path(const fs::path& base, std::string_view leaf) {
  const fs::path rel = fs::path(std::string(leaf)).relative_path();
  bool escapes = false;
  for (const auto& part : rel) escapes |= part == "..";
  std::error_code ec;
  if (rel.empty() || escapes || !fs::is_directory(base / rel, ec)) return {base};
  std::vector<fs::path> dirs;
  for (fs::path p = rel; !p.empty(); p = p.parent_path()) dirs.push_back(base / p);
  dirs.push_back(base);
  return dirs;
}

}  // namespace

// The files a SystemMemoryProbe reads, found on its first reading.
class SystemMemoryProbe::Source {
 public:
  explicit Source(std::string root)
      : root_(std::move(root)), meminfo_path_((fs::path(root_) / "proc/meminfo").string()) {}
  MemoryInfo read();

 private:
  // The files of one cgroup directory on the path from this process's cgroup to
  // the hierarchy root.
  struct CgroupDir {
    std::string limit;       // v2 memory.max, v1 memory.limit_in_bytes
    std::string usage;       // v2 memory.current, v1 memory.usage_in_bytes
    std::string swap_limit;  // v2 memory.swap.max; empty for v1
    std::string swap_usage;  // v2 memory.swap.current; empty for v1
    std::string stat;        // memory.stat: its inactive file cache is reclaimable
  };
  void resolve_cgroup();

  std::string root_;
  std::string meminfo_path_;
  // Resolved from <root>/proc/self/cgroup on the first read() and kept: the
  // files are re-read every time, the directory list is not.
  std::once_flag resolved_;
  bool cgroup_v1_ = false;          // written once under resolved_
  std::vector<CgroupDir> cgroup_;   // leaf first; written once under resolved_
};

SystemMemoryProbe::SystemMemoryProbe(std::string root, int64_t max_age_ns)
    : source_(std::make_unique<Source>(std::move(root))), max_age_ns_(max_age_ns) {}

SystemMemoryProbe::~SystemMemoryProbe() = default;

MemoryInfo SystemMemoryProbe::read() { return source_->read(); }

void SystemMemoryProbe::Source::resolve_cgroup() {
  std::string text;
  if (read_small_file((fs::path(root_) / "proc/self/cgroup").string(), text) != 0) return;
  // "hierarchy-ID:controller-list:path". The memory controller lives in exactly
  // one hierarchy: a v1 line naming it wins over the v2 line "0::path" (hybrid
  // systems have both, and their v2 hierarchy holds no memory controller).
  std::optional<std::string> v1, v2;
  for_each_line(text, [&](std::string_view line) {
    const size_t c1 = line.find(':');
    const size_t c2 = c1 == std::string_view::npos ? c1 : line.find(':', c1 + 1);
    if (c2 == std::string_view::npos) return;
    const std::string_view id = line.substr(0, c1);
    const std::string_view controllers = line.substr(c1 + 1, c2 - c1 - 1);
    const std::string path(line.substr(c2 + 1));
    if (id == "0" && controllers.empty()) {
      v2 = path;
      return;
    }
    for (size_t b = 0; b <= controllers.size();) {
      size_t e = controllers.find(',', b);
      if (e == std::string_view::npos) e = controllers.size();
      if (controllers.substr(b, e - b) == "memory") v1 = path;
      b = e + 1;
    }
  });
  const fs::path base = fs::path(root_) / "sys/fs/cgroup";
  if (v1) {
    cgroup_v1_ = true;
    for (const auto& d : cgroup_path(base / "memory", *v1))
      cgroup_.push_back({(d / "memory.limit_in_bytes").string(), (d / "memory.usage_in_bytes").string(), {}, {},
                         (d / "memory.stat").string()});
  } else if (v2) {
    for (const auto& d : cgroup_path(base, *v2))
      cgroup_.push_back({(d / "memory.max").string(), (d / "memory.current").string(),
                         (d / "memory.swap.max").string(), (d / "memory.swap.current").string(),
                         (d / "memory.stat").string()});
  }
}

MemoryInfo SystemMemoryProbe::Source::read() {
  std::string text;
  if (const int err = read_small_file(meminfo_path_, text); err != 0)
    throw ResourceError(detail::cat("cannot read ", meminfo_path_, ": ", std::strerror(err)));

  MemoryInfo m;
  bool have_total = false, have_available = false;
  for_each_line(text, [&](std::string_view line) {
    const size_t colon = line.find(':');
    if (colon == std::string_view::npos) return;
    const std::string_view key = line.substr(0, colon), rest = line.substr(colon + 1);
    if (key == "MemTotal") {
      m.total = meminfo_value(meminfo_path_, line, rest);
      have_total = true;
    } else if (key == "MemAvailable") {
      m.available = meminfo_value(meminfo_path_, line, rest);
      have_available = true;
    } else if (key == "SwapTotal") {
      m.swap_total = meminfo_value(meminfo_path_, line, rest);
    } else if (key == "SwapFree") {
      m.swap_free = meminfo_value(meminfo_path_, line, rest);
    }
  });
  if (!have_total || !have_available)
    throw ResourceError(detail::cat(meminfo_path_, " has no ", have_total ? "MemAvailable" : "MemTotal", " line"));

  std::call_once(resolved_, [this] { resolve_cgroup(); });
  // Each level bounds both the size (its limit) and what is left (its limit
  // minus its usage, which counts every descendant).
  uint64_t limit = kNoLimit, room = kNoLimit, swap_limit = kNoLimit, swap_room = kNoLimit;
  for (const CgroupDir& d : cgroup_) {
    std::optional<uint64_t> lim = read_cgroup_number(d.limit, !cgroup_v1_);
    if (lim && cgroup_v1_ && *lim >= kV1Unlimited) lim.reset();
    if (lim) {
      limit = std::min(limit, *lim);
      const uint64_t usage = read_cgroup_number(d.usage, false).value_or(0);
      const uint64_t reclaimable = stat_value(d.stat, cgroup_v1_ ? "total_inactive_file" : "inactive_file");
      room = std::min(room, sub_sat(*lim, sub_sat(usage, reclaimable)));
    }
    if (d.swap_limit.empty()) continue;
    if (const auto slim = read_cgroup_number(d.swap_limit, true)) {
      swap_limit = std::min(swap_limit, *slim);
      swap_room = std::min(swap_room, sub_sat(*slim, read_cgroup_number(d.swap_usage, false).value_or(0)));
    }
  }
  m.cgroup_limited = limit < m.total;
  m.total = std::min(m.total, limit);
  m.available = std::min({m.available, room, m.total});
  m.swap_total = std::min(m.swap_total, swap_limit);
  m.swap_free = std::min({m.swap_free, swap_room, m.swap_total});
  return m;
}

}  // namespace pins
