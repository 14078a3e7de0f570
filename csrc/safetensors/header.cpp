#include "csrc/safetensors/header.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>

#include "csrc/base/check.h"
#include "csrc/files/read.h"

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

// What an error quotes of the header: at most this many characters, so a
// message never echoes a megabyte of header, and the quoting of a value
// recurses at most this deep however deep the JSON nests.
constexpr size_t kShown = 80;

// `text` as a JSON string, appended to `out` up to kShown characters in all.
// The header is UTF-8 (checked before it is parsed); control characters are
// escaped, so a message stays one line.
void quote(std::string_view text, std::string& out) {
  out += '"';
  for (const char c : text) {
    if (out.size() > kShown) return;
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char esc[8];
      std::snprintf(esc, sizeof esc, "\\u%04x", static_cast<unsigned>(c));
      out += esc;
    } else {
      out += c;
    }
  }
  out += '"';
}

// `v` as JSON text, appended to `out` until it holds more than kShown
// characters: each level of nesting appends a bracket before it recurses, so
// the recursion is at most kShown + 1 deep.
void show(const nlohmann::json& v, std::string& out) {
  if (out.size() > kShown) return;
  if (v.is_string()) return quote(v.get_ref<const std::string&>(), out);
  if (!v.is_structured()) {
    out += v.dump();  // a number, a boolean or null
    return;
  }
  const bool object = v.is_object();
  out += object ? '{' : '[';
  bool first = true;
  for (auto it = v.begin(); it != v.end() && out.size() <= kShown; ++it) {
    if (!first) out += ',';
    first = false;
    if (object) {
      quote(it.key(), out);
      out += ':';
    }
    show(it.value(), out);
  }
  out += object ? '}' : ']';
}

// A JSON value, or a name from the header, as an error quotes it: cut short.
std::string cut(std::string s) {
  if (s.size() > kShown) s = s.substr(0, kShown - 3) + "...";
  return s;
}
std::string shown(const nlohmann::json& v) {
  std::string s;
  show(v, s);
  return cut(std::move(s));
}
std::string in_quotes(std::string_view text) {
  std::string s;
  quote(text, s);
  return cut(std::move(s));
}

// "model.safetensors: tensor \"w\": " and the like.
std::string where(const std::string& file, const std::string& tensor) {
  return tensor.empty() ? file + ": " : detail::cat(file, ": tensor ", in_quotes(tensor), ": ");
}

// The offset of the first byte of `s` that does not begin a well-formed UTF-8
// sequence (RFC 3629: no overlong form, no surrogate, nothing past U+10FFFF),
// or npos.
size_t invalid_utf8(std::string_view s) {
  const auto* b = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  for (size_t i = 0; i < n;) {
    const unsigned char c = b[i];
    size_t len = 0;
    unsigned char lo = 0x80, hi = 0xBF;  // the second byte's range
    if (c < 0x80) {
      ++i;
      continue;
    } else if (c >= 0xC2 && c <= 0xDF) {
      len = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
      len = 3;
      if (c == 0xE0) lo = 0xA0;
      if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
      len = 4;
      if (c == 0xF0) lo = 0x90;
      if (c == 0xF4) hi = 0x8F;
    } else {
      return i;
    }
    if (n - i < len || b[i + 1] < lo || b[i + 1] > hi) return i;
    for (size_t k = 2; k < len; ++k)
      if (b[i + k] < 0x80 || b[i + k] > 0xBF) return i;
    i += len;
  }
  return std::string_view::npos;
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
  PINS_CHECK_VALUE(it != std::end(kDtypes), at, "dtype: unknown dtype ", in_quotes(dname));
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
  const std::string_view text = bytes.substr(8, n);
  if (const size_t bad = invalid_utf8(text); bad != std::string_view::npos) {
    char byte[8];
    std::snprintf(byte, sizeof byte, "0x%02x", static_cast<unsigned>(static_cast<unsigned char>(text[bad])));
    throw ValueError(detail::cat(at, "header: not UTF-8 at byte ", bad, " of the header (", byte,
                                 "; the format's header is UTF-8 JSON)"));
  }
  Header h;
  h.data_start = 8 + n;
  h.file_size = file_size;
  const uint64_t data_bytes = file_size - h.data_start;

  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw ValueError(detail::cat(at, "header: not valid JSON (", e.what(), ")"));
  }
  PINS_CHECK_VALUE(doc.is_object(), at, "header: expected a JSON object, got ", shown(doc));
  for (const auto& [name, v] : doc.items()) {
    if (name == "__metadata__") {
      if (v.is_null()) continue;  // no metadata, as safetensors' reader reads it
      PINS_CHECK_VALUE(v.is_object(), at, "__metadata__: expected an object of strings, got ", shown(v));
      for (const auto& [k, s] : v.items()) {
        PINS_CHECK_VALUE(s.is_string(), at, "__metadata__ ", in_quotes(k), ": expected a string, got ", shown(s));
        h.metadata[k] = s.get<std::string>();
      }
      continue;
    }
    h.tensors.push_back(parse_tensor(name, v, data_bytes, file));
  }
  // In the order of their offsets the tensors tile the data section.
  std::sort(h.tensors.begin(), h.tensors.end(), [](const TensorInfo& a, const TensorInfo& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  const TensorInfo* last = nullptr;
  uint64_t covered = 0;  // the data section's bytes [0, covered) belong to the tensors so far
  for (const TensorInfo& t : h.tensors) {
    const std::string here = detail::cat(where(file, t.name), "data_offsets [", t.begin, ", ", t.end, "] ");
    PINS_CHECK_VALUE(t.begin >= covered, here, "overlap tensor ", in_quotes(last->name), " [", last->begin, ", ",
                     last->end, "]");
    if (last == nullptr) {
      PINS_CHECK_VALUE(t.begin == 0, here, "leave the data section's first ", t.begin,
                       " bytes to no tensor (the format allows no gap)");
    } else {
      PINS_CHECK_VALUE(t.begin == covered, here, "leave a gap of ", t.begin - covered, " bytes after tensor ",
                       in_quotes(last->name), " [", last->begin, ", ", last->end, "] (the format allows no gap)");
    }
    covered = t.end;
    last = &t;
  }
  PINS_CHECK_VALUE(covered == data_bytes, at, "the data section holds ", data_bytes - covered,
                   " bytes past the last tensor's end (", covered, " of ", data_bytes,
                   "; the format allows no trailing bytes)");
  return h;
}

Header read_header(const std::string& path) {
  files::FileStamp stamp;
  const files::FileHandle file = files::open_regular(path, stamp);
  struct Closer {
    files::FileHandle file;
    ~Closer() { files::close_file(file); }
  } closer{file};
  const uint64_t size = stamp.size;
  // The length first, checked, then exactly the header: a hostile length
  // never sizes an allocation beyond the format's cap or the file.
  std::string bytes(std::min<uint64_t>(size, 8), '\0');
  bytes.resize(files::read_at(file, bytes.data(), bytes.size(), 0, path));
  if (bytes.size() == 8) {
    const uint64_t n = le64(bytes);
    if (n <= kMaxHeaderBytes && n <= size - 8) {
      bytes.resize(8 + n);
      bytes.resize(8 + files::read_at(file, bytes.data() + 8, n, 8, path));
    }
  }
  return parse_header(bytes, size, path);
}

}  // namespace pins::safetensors
