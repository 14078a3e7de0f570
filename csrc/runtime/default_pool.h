// The process-wide host pool that backs every pin and the torch allocator.
#pragma once

#include "csrc/pool/pool.h"

namespace pins {

// Built on first use from PINS_CONF (see csrc/runtime/config.h). A bad PINS_CONF throws
// pins::ValueError here, and the next call tries again.
HostPool& default_pool();

}  // namespace pins
