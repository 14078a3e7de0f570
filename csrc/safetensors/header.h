// The safetensors file format's header, parsed and validated (torch-free).
//
// Note [Safetensors layout]
// A file is: 8 bytes, the header's length N as a little-endian u64; N bytes
// of JSON, an object mapping each tensor's name to {"dtype", "shape",
// "data_offsets": [begin, end]} plus an optional "__metadata__" object of
// strings; then the data section, to the end of the file. Offsets are
// relative to the data section's start (8 + N). Everything a file says is
// checked before any of it is used, with arithmetic that cannot wrap:
// - N is at most kMaxHeaderBytes (the format's own 100 MB cap) and within the
//   file; the JSON is an object; every entry has exactly the three keys;
// - the dtype is one the format defines (element size in bits, so sub-byte
//   types size correctly); every dimension and the element count fit in
//   uint64 without overflow;
// - the header is UTF-8, as the format requires (an error quoting a name from
//   it is text any caller can print);
// - begin <= end <= the data section's length, and end - begin equals the
//   element count times the element size;
// - in the order of their offsets the tensors tile the data section: the
//   first begins at 0, each where the previous one ended (an empty tensor
//   too), the last ends at the end of the file. safetensors' own reader
//   refuses gaps and trailing bytes as well, so a file pins loads is one any
//   reader of the format loads.
// "__metadata__" may be null (no metadata), as safetensors' reader allows.
// The JSON may nest as deep as it likes: nothing here recurses on it but the
// quoting of a value in an error, which stops at 80 characters.
// An error is a pins::ValueError naming the file and the field: `<file>:
// tensor "<name>": data_offsets [10, 4]: end before begin`.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace pins::safetensors {

// The format's limit on the JSON header (Note [Safetensors layout]).
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

enum class Dtype {
  Bool, U8, I8, F8_E4M3, F8_E5M2, F8_E8M0, I16, U16, F16, BF16, I32, U32, F32, I64, U64, F64, C64, F4, F6_E2M3, F6_E3M2
};
// The format's name of `d` ("F16"), and its element size in bits.
const char* to_string(Dtype d);
int bits(Dtype d);

struct TensorInfo {
  std::string name;
  Dtype dtype = Dtype::U8;
  std::vector<uint64_t> shape;
  uint64_t begin = 0;  // within the data section
  uint64_t end = 0;
  uint64_t nbytes() const { return end - begin; }
};

struct Header {
  uint64_t data_start = 0;  // 8 + N: where the data section begins in the file
  uint64_t file_size = 0;
  std::vector<TensorInfo> tensors;  // in the order of their data
  std::map<std::string, std::string> metadata;
};

// Parses `bytes`, the first bytes of a file of `file_size` bytes (at least the
// 8-byte length and the whole header; more is ignored). `file` names the file
// in errors. Throws pins::ValueError (Note [Safetensors layout]).
Header parse_header(std::string_view bytes, uint64_t file_size, const std::string& file);

// Opens `path` and parses its header: pins::ValueError for a malformed file,
// pins::ResourceError naming the path when it cannot be opened or read.
Header read_header(const std::string& path);

}  // namespace pins::safetensors
