// Warnings pins prints itself: one line on stderr, "pins: warning: ...", for
// a condition a user or operator should know of but that changes no result
// (pins works on, in a slower or less shared way). Each kind is printed once
// per process, however many times it happens; its counter in stats() says how
// often. Callable from any thread; pins calls it with none of its locks held
// (a write to stderr can block).
#pragma once

#include <atomic>
#include <string>

namespace pins {

// Prints `text` the first time `once` is passed: true when it printed.
bool warn_once(std::atomic<bool>& once, const std::string& text);

}  // namespace pins
