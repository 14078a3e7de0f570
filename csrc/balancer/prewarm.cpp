// Note [Prewarm]: what the balancer commits ahead of a prompt, and the thread
// that runs its steps.
#include "csrc/balancer/prewarm.h"

#include <algorithm>
#include <system_error>

#include "csrc/balancer/budget.h"
#include "csrc/base/check.h"
#include "csrc/base/nvtx.h"
#include "csrc/base/saturate.h"
#include "csrc/system/process.h"

namespace pins {

// ------------------------------------------------------------------ Balancer

uint64_t Balancer::prewarm_want_locked() const {
  uint64_t want = 0;
  for (const auto& [id, m] : table_.models()) {
    if (!m->in_prompt && !m->active) continue;
    const uint64_t expected =
        m->last_prompt_peak >= 0 ? static_cast<uint64_t>(m->last_prompt_peak) : m->options.size;
    const uint64_t held = static_cast<uint64_t>(held_bytes(*m));
    if (expected > held) want = add_sat(want, expected - held);
  }
  return want;
}

uint64_t Balancer::prewarm_want() const {
  MutexLock g(mu_);
  return prewarm_want_locked();
}

size_t Balancer::prewarm_step(size_t max_bytes) {
  PINS_RANGE("pins::prewarm_step");
  Config c;
  uint64_t want = 0;
  {
    MutexLock g(mu_);
    c = config_;
    if (!c.prewarm) return 0;
    want = prewarm_want_locked();
  }
  // Idle memory serves a new pin as prewarmed memory does, and a pin being made
  // (its bytes reserved, Note [Budget reservation]) has its memory already: a
  // cast that commits its own pages beside a round ends the round.
  const uint64_t reserved = gate_.reserved_bytes();
  const uint64_t covered = add_sat(pool_.idle_bytes(), reserved);
  if (want <= covered) return 0;
  const MemoryInfo mi = gate_.memory();
  const uint64_t room = prewarm_room(mi.available, reserved, c);
  const uint64_t page = pool_.backend().page_size();
  uint64_t bytes = std::min<uint64_t>({want - covered, room, max_bytes});
  bytes -= bytes % page;
  // A step smaller than an extent_min extent would serve only pins of that size.
  if (bytes == 0 || bytes < std::min<uint64_t>(want - covered, pool_.options().extent_min)) return 0;
  // Note [Warm idle memory]: the retain limit, on this reading, holds what the
  // step commits (it keeps available RAM at or above the headroom).
  gate_.keep_warm(mi, c.headroom);
  return pool_.prewarm(static_cast<size_t>(bytes));
}

// ------------------------------------------------------------------ Prewarmer

Prewarmer::Prewarmer(Balancer& balancer, size_t step)
    : balancer_(balancer),
      step_(step),
      pid_(process_id()),
      fork_generation_(fork_generation()),
      state_(std::make_unique<State>()) {
  PINS_CHECK_VALUE(step_ > 0, "Prewarmer step must be positive");
  try {
    thread_ = std::thread([this] { run(); });
  } catch (const std::system_error& e) {
    throw ResourceError(detail::cat("Prewarmer: cannot start its thread: ", e.what()));
  }
}

Prewarmer::~Prewarmer() { stop(); }

bool Prewarmer::inherited() const { return fork_generation() != fork_generation_ || process_id() != pid_; }

void Prewarmer::wake() {
  if (inherited()) return;
  {
    MutexLock g(state_->mu);
    if (state_->stopping) return;
    state_->pending = true;
  }
  state_->cv.notify_one();
}

bool Prewarmer::busy() const {
  if (inherited()) return false;
  MutexLock g(state_->mu);
  return state_->pending || state_->running;
}

// In a fork child only the thread that forked exists: the parent's thread may
// have held state_->mu or waited on state_->cv at the fork, so neither is
// touched here, nor destroyed (leaked with the thread handle).
void Prewarmer::stop() PINS_NO_THREAD_SAFETY_ANALYSIS {
  stop_.store(true);
  if (inherited()) {
    if (abandoned_.exchange(true)) return;
    new std::thread(std::move(thread_));  // NOLINT: leaked on purpose, as the monitor's
    (void)state_.release();               // NOLINT: likewise
    return;
  }
  {
    MutexLock g(state_->mu);
    state_->stopping = true;
  }
  state_->cv.notify_all();
  MutexLock j(join_mu_);
  if (thread_.joinable()) thread_.join();
}

void Prewarmer::run() {
  State& s = *state_;
  for (;;) {
    {
      MutexLock g(s.mu);
      while (!s.pending && !s.stopping) s.cv.wait(g);
      if (s.stopping) return;
      s.pending = false;
      s.running = true;
    }
    rounds_.fetch_add(1, std::memory_order_relaxed);
    while (!stop_.load()) {
      size_t got = 0;
      try {
        got = balancer_.prewarm_step(step_);
      } catch (...) {
        // A throw here would end the process (std::terminate on a thread); the
        // prewarm is advisory: the round ends, the next wake-up tries again.
        errors_.fetch_add(1, std::memory_order_relaxed);
      }
      if (got == 0) break;
      committed_.fetch_add(got, std::memory_order_relaxed);
    }
    MutexLock g(s.mu);
    s.running = false;
  }
}

}  // namespace pins
