#include "csrc/safetensors/header.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>

#include "csrc/base/check.h"

namespace pins::safetensors {
namespace {

struct DtypeName {
  const char* name;
  Dtype dtype;
  int bits;
};
constexpr DtypeName kDtypes[] = {
    {"BOOL", Dtype::Bool, 8},       {"U8", Dtype::U8, 8},          {"I8", Dtype::I8, 8},
    {"F8_E4M3", Dtype::F8_E4M3, 8}, {"F8_E5M2", Dtype::F8_E5M2, 8}, {"F8_E8M0", Dtype::F8_E8M0, 8},
    {"I16", Dtype::I16, 16},        {"U16", Dtype::U16, 16},       {"F16", Dtype::F16, 16},
    {"BF16", Dtype::BF16, 16},      {"I32", Dtype::I32, 32},       {"U32", Dtype::U32, 32},
    {"F32", Dtype::F32, 32},        {"I64", Dtype::I64, 64},       {"U64", Dtype::U64, 64},
    {"F64", Dtype::F64, 64},        {"C64", Dtype::C64, 64},       {"F4", Dtype::F4, 4},
    {"F6_E2M3", Dtype::F6_E2M3, 6}, {"F6_E3M2", Dtype::F6_E3M2, 6},
};

const DtypeName& entry(Dtype d) {
  for (const DtypeName& e : kDtypes)
    if (e.dtype == d) return e;
  throw std::logic_error("safetensors: a Dtype without a name");
}

// "model.safetensors: tensor \"w\": " and the like.
std::string where(const std::string& file, const std::string& tensor) {
  return tensor.empty() ? file + ": " : detail::cat(file, ": tensor \"", tensor, "\": ");
}

// A JSON value as its text, cut short: an error quotes what it got without
// echoing a megabyte of header.
std::string shown(const nlohmann::json& v) {
  std::string s = v.dump();
  if (s.size() > 80) s = s.substr(0, 77) + "...";
  return s;
}

uint64_t to_u64(const nlohmann::json& v, const std::string& at, const char* field) {
  PINS_CHECK_VALUE(v.is_number_unsigned() || (v.is_number_integer() && v.get<int64_t>() >= 0), at, field,
                   ": expected a non-negative integer, got ", shown(v));
  return v.get<uint64_t>();
}

TensorInfo parse_tensor(const std::string& name, const nlohmann::json& v, uint64_t data_bytes,
                        const std::string& file) {
  const std::string at = where(file, name);
  PINS_CHECK_VALUE(v.is_object(), at, "expected an object with dtype, shape and data_offsets, got ", shown(v));
  for (const auto& [key, _] : v.items())
    PINS_CHECK_VALUE(key == "dtype" || key == "shape" || key == "data_offsets", at, "unknown field \"", key, "\"");
  PINS_CHECK_VALUE(v.contains("dtype") && v.contains("shape") && v.contains("data_offsets"), at,
                   "expected the fields dtype, shape and data_offsets, got ", shown(v));
  TensorInfo t;
  t.name = name;

  const nlohmann::json& dt = v["dtype"];
  PINS_CHECK_VALUE(dt.is_string(), at, "dtype: expected a string, got ", shown(dt));
  const std::string dname = dt.get<std::string>();
  const auto it = std::find_if(std::begin(kDtypes), std::end(kDtypes), [&](const DtypeName& e) { return dname == e.name; });
  PINS_CHECK_VALUE(it != std::end(kDtypes), at, "dtype: unknown dtype \"", dname, "\"");
  t.dtype = it->dtype;

  const nlohmann::json& sh = v["shape"];
  PINS_CHECK_VALUE(sh.is_array(), at, "shape: expected an array of integers, got ", shown(sh));
  PINS_CHECK_VALUE(sh.size() <= 64, at, "shape: ", sh.size(), " dimensions, at most 64 allowed");
  // Element count times element bits, kept below 2^64 at every step.
  uint64_t count = 1;
  bool zero = false;
  for (const nlohmann::json& d : sh) {
    const uint64_t n = to_u64(d, at, "shape");
    t.shape.push_back(n);
    if (n == 0) zero = true;
    if (!zero) {
      PINS_CHECK_VALUE(count <= UINT64_MAX / n, at, "shape ", shown(sh), ": the element count overflows 64 bits");
      count *= n;
    }
  }
  if (zero) count = 0;
  const uint64_t b = static_cast<uint64_t>(it->bits);
  PINS_CHECK_VALUE(count <= UINT64_MAX / b, at, "shape ", shown(sh), ": the size in bits overflows 64 bits");
  PINS_CHECK_VALUE((count * b) % 8 == 0, at, "shape ", shown(sh), ": ", count, " elements of ", dname,
                   " do not fill whole bytes");
  const uint64_t want = count * b / 8;

  const nlohmann::json& off = v["data_offsets"];
  PINS_CHECK_VALUE(off.is_array() && off.size() == 2, at, "data_offsets: expected [begin, end], got ", shown(off));
  t.begin = to_u64(off[0], at, "data_offsets");
  t.end = to_u64(off[1], at, "data_offsets");
  PINS_CHECK_VALUE(t.begin <= t.end, at, "data_offsets [", t.begin, ", ", t.end, "]: end before begin");
  PINS_CHECK_VALUE(t.end <= data_bytes, at, "data_offsets [", t.begin, ", ", t.end,
                   "]: past the end of the data section (", data_bytes, " bytes)");
  PINS_CHECK_VALUE(t.end - t.begin == want, at, "data_offsets [", t.begin, ", ", t.end, "] hold ", t.end - t.begin,
                   " bytes, but shape ", shown(sh), " of ", dname, " needs ", want);
  return t;
}

// The header's length: the file's first 8 bytes, little-endian.
uint64_t le64(std::string_view b) {
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(b[static_cast<size_t>(i)]);
  return n;
}

}  // namespace

const char* to_string(Dtype d) { return entry(d).name; }
int bits(Dtype d) { return entry(d).bits; }

Header parse_header(std::string_view bytes, uint64_t file_size, const std::string& file) {
  const std::string at = where(file, "");
  PINS_CHECK_VALUE(file_size >= 8 && bytes.size() >= 8, at, "truncated: ", file_size,
                   " bytes, shorter than the 8-byte header length");
  const uint64_t n = le64(bytes);
  PINS_CHECK_VALUE(n <= kMaxHeaderBytes, at, "header length ", n, " exceeds the format's limit of ", kMaxHeaderBytes,
                   " bytes");
  PINS_CHECK_VALUE(n <= file_size - 8, at, "header length ", n, " runs past the end of the file (", file_size,
                   " bytes)");
  PINS_CHECK_VALUE(bytes.size() - 8 >= n, at, "truncated: the header's ", n, " bytes were not all read (got ",
                   bytes.size() - 8, ")");
  Header h;
  h.data_start = 8 + n;
  h.file_size = file_size;
  const uint64_t data_bytes = file_size - h.data_start;

  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(bytes.substr(8, n));
  } catch (const nlohmann::json::exception& e) {
    throw ValueError(detail::cat(at, "header: not valid JSON (", e.what(), ")"));
  }
  PINS_CHECK_VALUE(doc.is_object(), at, "header: expected a JSON object, got ", shown(doc));
  for (const auto& [name, v] : doc.items()) {
    if (name == "__metadata__") {
      PINS_CHECK_VALUE(v.is_object(), at, "__metadata__: expected an object of strings, got ", shown(v));
      for (const auto& [k, s] : v.items()) {
        PINS_CHECK_VALUE(s.is_string(), at, "__metadata__ \"", k, "\": expected a string, got ", shown(s));
        h.metadata[k] = s.get<std::string>();
      }
      continue;
    }
    h.tensors.push_back(parse_tensor(name, v, data_bytes, file));
  }
  // No two tensors share a byte (empty tensors occupy none).
  std::sort(h.tensors.begin(), h.tensors.end(), [](const TensorInfo& a, const TensorInfo& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  const TensorInfo* last = nullptr;
  for (const TensorInfo& t : h.tensors) {
    if (t.nbytes() == 0) continue;
    PINS_CHECK_VALUE(last == nullptr || last->end <= t.begin, where(file, t.name), "data_offsets [", t.begin, ", ",
                     t.end, "] overlap tensor \"", last ? last->name : "", "\" [", last ? last->begin : 0, ", ",
                     last ? last->end : 0, "]");
    last = &t;
  }
  return h;
}

Header read_header(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw ResourceError(detail::cat(path, ": cannot open (", std::strerror(errno), ")"));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) throw ResourceError(detail::cat(path, ": cannot stat (", std::strerror(errno), ")"));
  PINS_CHECK_VALUE(S_ISREG(st.st_mode), path, ": not a regular file");
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  // The length first, checked, then exactly the header: a hostile length
  // never sizes an allocation beyond the format's cap or the file.
  std::string bytes(std::min<uint64_t>(size, 8), '\0');
  const auto read_at = [&](char* dst, size_t n, uint64_t off) {
    size_t done = 0;
    while (done < n) {
      const ssize_t r = ::pread(fd, dst + done, n - done, static_cast<off_t>(off + done));
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) throw ResourceError(detail::cat(path, ": read failed (", std::strerror(errno), ")"));
      if (r == 0) break;
      done += static_cast<size_t>(r);
    }
    return done;
  };
  bytes.resize(read_at(bytes.data(), bytes.size(), 0));
  if (bytes.size() == 8) {
    const uint64_t n = le64(bytes);
    if (n <= kMaxHeaderBytes && n <= size - 8) {
      bytes.resize(8 + n);
      bytes.resize(8 + read_at(bytes.data() + 8, n, 8));
    }
  }
  return parse_header(bytes, size, path);
}

}  // namespace pins::safetensors
