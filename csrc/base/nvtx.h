// NVTX ranges in the `pins` domain. PINS_RANGE("name") opens a range that closes
// at the end of the enclosing scope; without PINS_NVTX it compiles to nothing.
#pragma once

#if defined(PINS_NVTX)
#include <nvtx3/nvToolsExt.h>

namespace pins::nvtx {
struct Domain {
  static nvtxDomainHandle_t get() {
    static nvtxDomainHandle_t h = nvtxDomainCreateA("pins");
    return h;
  }
};

class Range {
 public:
  explicit Range(const char* name) {
    nvtxEventAttributes_t a{};
    a.version = NVTX_VERSION;
    a.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
    a.messageType = NVTX_MESSAGE_TYPE_ASCII;
    a.message.ascii = name;
    nvtxDomainRangePushEx(Domain::get(), &a);
  }
  ~Range() { nvtxDomainRangePop(Domain::get()); }
  Range(const Range&) = delete;
  Range& operator=(const Range&) = delete;
};
}  // namespace pins::nvtx

#define PINS_NVTX_CONCAT2(a, b) a##b
#define PINS_NVTX_CONCAT(a, b) PINS_NVTX_CONCAT2(a, b)
#define PINS_RANGE(name) ::pins::nvtx::Range PINS_NVTX_CONCAT(pins_nvtx_range_, __LINE__)(name)
#else
#define PINS_RANGE(name) ((void)0)
#endif
