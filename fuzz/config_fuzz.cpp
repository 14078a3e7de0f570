// libFuzzer target: parse_config (csrc/config/config.h) on any text.
// Properties beyond "no crash":
//  - the only exception is pins::ValueError;
//  - an accepted configuration lies within Note [Configuration bounds];
//  - format_config() reads back as the same configuration, and applying the
//    text again on top of its own result changes nothing;
//  - the pool built from it (null backend) takes a 4 KiB block without
//    committing past a nonzero cap, and keeps Note [Host pool invariants].
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "csrc/base/check.h"
#include "csrc/pool/backend.h"
#include "csrc/pool/pool.h"
#include "csrc/config/config.h"
#include "fuzz/fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace pins;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  Config c;
  try {
    c = parse_config(text);
  } catch (const ValueError&) {
    return 0;
  }
  const std::string shown = format_config(c);
  PINS_FUZZ_CHECK(c.segment_size >= kMinSegmentSize && c.segment_size <= kMaxSegmentSize, shown);
  PINS_FUZZ_CHECK(c.extent_min >= kMinExtentMin && c.extent_min <= kMaxExtentMin, shown);
  PINS_FUZZ_CHECK(c.extent_min <= c.segment_size, shown);
  PINS_FUZZ_CHECK(c.alignment >= 1 && c.alignment <= kMaxAlignment && (c.alignment & (c.alignment - 1)) == 0, shown);
  for (uint64_t v : {c.cap, c.retain_free, c.headroom, c.pin_reserve, c.pin_slack, c.relieve_slack,
                     c.ceiling_reserve, c.ceiling_swap_reserve, c.lock_hysteresis})
    PINS_FUZZ_CHECK(v <= kMaxConfigBytes, shown);
  PINS_FUZZ_CHECK(c.ceiling_min >= 0 && c.ceiling_min <= c.ceiling_max && c.ceiling_max <= 1, shown);
  PINS_FUZZ_CHECK(c.monitor_interval_ms >= 1 && c.monitor_interval_ms <= kMaxMonitorIntervalMs, shown);
  PINS_FUZZ_CHECK(!c.system_root.empty(), shown);

  Config again;
  try {
    again = parse_config(shown);
  } catch (const ValueError& e) {
    PINS_FUZZ_CHECK(false, shown + ": " + e.what());
  }
  PINS_FUZZ_CHECK(again == c, shown + " read back as " + format_config(again));
  PINS_FUZZ_CHECK(parse_config(text, c) == c, shown);

  HostPool pool(make_null_backend(), pool_options(c));
  if (void* p = pool.try_allocate(4096)) {
    const PoolStats s = pool.stats();
    PINS_FUZZ_CHECK(c.cap == 0 || static_cast<uint64_t>(s.committed_bytes.current) <= c.cap, shown);
    PINS_FUZZ_CHECK(c.cap != 0 || static_cast<uint64_t>(s.committed_bytes.current) <= std::max<uint64_t>(c.extent_min + 4095, 8192), shown);
    pool.check_invariants();
    pool.free(p);
  } else {
    PINS_FUZZ_CHECK(c.cap != 0 && c.cap < 4096, shown + ": a 4 KiB block was refused");
  }
  pool.check_invariants();
  return 0;
}
