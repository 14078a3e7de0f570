// pins::configure, pins::config, pins::config_sources (ops/configure.cpp).
#pragma once

#include <c10/util/string_view.h>

#include <string>

#include <pins/export.h>

namespace pins::ops {

// Applies `conf` (PINS_CONF syntax, "key:value,key:value") on top of the current
// settings. An unknown key, a bad value, or a change of a host-pool key after the
// pool exists is a c10::ValueError naming it, and nothing is applied. A monitor
// that cannot start is a c10::Error, after the rest was applied.
PINS_API void configure(c10::string_view conf);

// The settings in force, in PINS_CONF syntax: every key, in the order of the
// key list (csrc/config/config.h), sizes in bytes. configure(config()) changes
// nothing.
PINS_API std::string config();

// Where each setting in force came from, in the same syntax and order as
// config(): "key:source,..." with source one of "default", "derived from the
// machine: RAM 23.54 GiB" (or "cgroup limit ..."; headroom and pin_reserve
// only, csrc/config/config.h Note [Derived budget]), "PINS_CONF",
// "configure()". A source holds no ','; split each entry at its first ':'.
PINS_API std::string config_sources();

}  // namespace pins::ops
