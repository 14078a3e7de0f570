// libFuzzer target: the safetensors header parser (csrc/safetensors/header.h).
// An input is one of two forms, told apart by its first byte:
//  - raw (first byte below 0x80): the bytes, whole, taken as a file;
//  - nested (0x80 and above): [mode][depth: 2 bytes][fragment...], a file
//    whose JSON header places the fragment inside `depth` (mod 8,192) levels
//    of arrays or objects, at the field the mode picks (a tensor's entry, its
//    dtype, shape or data_offsets, __metadata__ or one of its values, the
//    whole header). libFuzzer's inputs stay small (a few hundred bytes), so the raw
//    form never reaches deep nesting; this one does from 3 bytes.
// The parser runs on a thread with a small stack (kStack): code that recurses
// once per level of nesting overflows it within a few thousand levels (a
// header of kilobytes, parsed in microseconds), where the 8 MiB of a main
// thread would need hundreds of thousands (a header of megabytes, parsed at
// a dozen inputs a second under ASan).
// Properties beyond "no crash":
//  - the only exception is pins::ValueError;
//  - an accepted header's tensors tile the data section (in the order of
//    their bytes, each beginning where the previous ended, the last ending at
//    the end of the file), each exactly as long as its shape and dtype say
//    (Note [Safetensors layout]).
#include <pthread.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "csrc/base/check.h"
#include "csrc/safetensors/header.h"
#include "fuzz/fuzz_check.h"

namespace {

constexpr size_t kStack = 512 << 10;

struct Parse {
  std::string_view bytes;
  pins::safetensors::Header header;
  bool accepted = false;
};

// Any exception but pins::ValueError escapes the thread and terminates: a crash.
void* parse(void* arg) {
  Parse& p = *static_cast<Parse*>(arg);
  try {
    p.header = pins::safetensors::parse_header(p.bytes, p.bytes.size(), "fuzz.safetensors");
    p.accepted = true;
  } catch (const pins::ValueError&) {
  }
  return nullptr;
}

// The nested form's file: the header with `fragment` `levels` deep at the
// place `mode` names, a valid 8-byte length, and 16 bytes of data.
std::string nested_file(uint8_t mode, size_t levels, std::string_view fragment) {
  const bool objects = mode & 0x40;  // {"k": ...} levels rather than [...] ones
  std::string value;
  value.reserve(levels * 7 + fragment.size());
  for (size_t i = 0; i < levels; ++i) value += objects ? "{\"k\":" : "[";
  value += fragment;
  for (size_t i = 0; i < levels; ++i) value += objects ? "}" : "]";
  const std::string ok = R"("dtype":"F32","shape":[4],"data_offsets":[0,16])";
  std::string json;
  switch (mode & 0x7) {
    case 0: json = R"({"w":)" + value + "}"; break;
    case 1: json = R"({"w":{"dtype":)" + value + R"(,"shape":[4],"data_offsets":[0,16]}})"; break;
    case 2: json = R"({"w":{"dtype":"F32","shape":)" + value + R"(,"data_offsets":[0,16]}})"; break;
    case 3: json = R"({"w":{"dtype":"F32","shape":[4],"data_offsets":)" + value + "}}"; break;
    case 4: json = R"({"__metadata__":)" + value + R"(,"w":{)" + ok + "}}"; break;
    case 5: json = R"({"__metadata__":{"m":)" + value + R"(},"w":{)" + ok + "}}"; break;
    case 6: json = R"({"w":{)" + ok + R"(,"x":)" + value + "}}"; break;
    default: json = value; break;
  }
  std::string file(8, '\0');
  for (int i = 0; i < 8; ++i) file[static_cast<size_t>(i)] = static_cast<char>((json.size() >> (8 * i)) & 0xff);
  return file + json + std::string(16, '\0');
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace pins::safetensors;
  std::string built;
  std::string_view bytes(reinterpret_cast<const char*>(data), size);
  if (size >= 3 && data[0] >= 0x80) {
    // Up to 8,191: a parser recursing per level overflowed kStack at 4,096.
    const size_t levels = (static_cast<size_t>(data[1]) << 8 | data[2]) & 0x1fff;
    built = nested_file(data[0], levels, bytes.substr(3));
    bytes = built;
  }
  Parse p;
  p.bytes = bytes;
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, kStack);
  pthread_t thread;
  if (pthread_create(&thread, &attr, parse, &p) != 0) {
    std::perror("pthread_create");
    std::abort();
  }
  pthread_join(thread, nullptr);
  pthread_attr_destroy(&attr);
  if (!p.accepted) return 0;
  const Header& h = p.header;
  PINS_FUZZ_CHECK(h.data_start >= 8 && h.data_start <= bytes.size(), std::to_string(h.data_start));
  const uint64_t data_bytes = bytes.size() - h.data_start;
  uint64_t covered = 0;
  for (const TensorInfo& t : h.tensors) {
    PINS_FUZZ_CHECK(t.begin == covered && t.begin <= t.end && t.end <= data_bytes, t.name);
    covered = t.end;
    // The size from the shape, recomputed in 128 bits.
    unsigned __int128 count = 1;
    for (uint64_t d : t.shape) count *= d;
    PINS_FUZZ_CHECK(count * static_cast<unsigned>(bits(t.dtype)) == static_cast<unsigned __int128>(t.nbytes()) * 8,
                    t.name);
  }
  PINS_FUZZ_CHECK(covered == data_bytes, std::to_string(covered));
  return 0;
}
