#include "csrc/balancer/registry.h"

namespace pins {

const char* to_string(Subset s) {
  switch (s) {
    case Subset::Weights: return "weights";
    case Subset::Patches: return "patches";
    case Subset::WeightsLoaded: return "weights-loaded";
    case Subset::PatchesLoaded: return "patches-loaded";
  }
  return "?";
}

const char* to_string(Bypass b) {
  switch (b) {
    case Bypass::Empty: return "empty";
    case Bypass::Refused: return "refused";
    case Bypass::Pool: return "pool";
    case Bypass::Busy: return "busy";
    case Bypass::Raced: return "raced";
    case Bypass::Forgotten: return "forgotten";
    case Bypass::Unlocking: return "unlocking";
  }
  return "?";
}

}  // namespace pins
