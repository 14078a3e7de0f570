// libFuzzer target: the safetensors header parser (csrc/safetensors/header.h)
// on any bytes, taken as a whole file. Properties beyond "no crash":
//  - the only exception is pins::ValueError;
//  - an accepted header's tensors lie within the data section, in the order of
//    their bytes, without overlap, each exactly as long as its shape and dtype
//    say (Note [Safetensors layout]).
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "csrc/base/check.h"
#include "csrc/safetensors/header.h"
#include "fuzz/fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace pins::safetensors;
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  Header h;
  try {
    h = parse_header(bytes, size, "fuzz.safetensors");
  } catch (const pins::ValueError&) {
    return 0;
  }
  PINS_FUZZ_CHECK(h.data_start >= 8 && h.data_start <= size, std::to_string(h.data_start));
  const uint64_t data_bytes = size - h.data_start;
  uint64_t last_end = 0;
  for (const TensorInfo& t : h.tensors) {
    PINS_FUZZ_CHECK(t.begin <= t.end && t.end <= data_bytes, t.name);
    if (t.nbytes() != 0) {
      PINS_FUZZ_CHECK(t.begin >= last_end, t.name);
      last_end = t.end;
    }
    // The size from the shape, recomputed in 128 bits.
    unsigned __int128 count = 1;
    for (uint64_t d : t.shape) count *= d;
    PINS_FUZZ_CHECK(count * static_cast<unsigned>(bits(t.dtype)) == static_cast<unsigned __int128>(t.nbytes()) * 8,
                    t.name);
  }
  return 0;
}
