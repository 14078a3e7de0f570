// The prewarm: pool memory committed ahead of a prompt's new pins, on a thread
// of its own. The balancer decides how much and within what budget
// (Balancer::prewarm_want, Balancer::prewarm_step); the pool commits it
// (HostPool::prewarm); the Prewarmer here is the thread that runs the steps.
//
// Note [Prewarm]
// A new pin whose block needs fresh pages waits for the kernel to zero them, at
// a fifth of a warm copy's speed or less (docs/PERFORMANCE.md "fill"): the first
// pins of a prompt, and every pin after RAM pressure gave the pool's memory
// back. The prewarm commits and touches that memory ahead of need, off the cast
// path, so the pins find their pages backed (prewarmed extents, Note [Host pool
// layout] in csrc/pool/pool.h).
//
// How much: what the models of the prompt are expected to pin beyond what they
// hold now, less the pool's idle bytes (which serve a new pin as well) and the
// bytes of pins being made (Note [Budget reservation]: they have their memory,
// so a cast that commits its own pages beside a round ends it). A model
// counts while marked in the prompt or active; it is expected to pin what its
// pins held at most during the last prompt it was marked in (Model::
// last_prompt_peak), and before its first prompt the size given when it was
// registered (ModelOptions::size; torch_pins.comfy gives ComfyUI's
// ModelPatcher.model_size(); 0: unknown, nothing is prewarmed for it). So a
// model ComfyUI keeps wholly on the device, which pins nothing, is prewarmed
// for at most once.
//
// Within the budget: a step commits at most what keeps available RAM, less the
// bytes of pins being made (Note [Budget reservation]), at or above
// max(headroom, pin_reserve_line) (prewarm_room, budget.h). That is above the
// line of Note [Warm idle memory], so what the prewarm commits is idle memory
// the budget lets stay committed (the step sets the pool's retain limit first),
// and a new pin sees the same room as without it (available RAM falls by what
// the pool's idle bytes gain). It goes back as idle memory does: relieve()
// gives idle memory back before any pin, the steps stop once available RAM is
// below the line (a step in flight adds at most kStep after that), the pool's
// retain limit and a `cap` bound it. Prewarmed memory a prompt did not use
// stays, as an evicted pin's memory does, while available RAM is above the
// headroom.
//
// Off the hot path: the Prewarmer's thread commits in steps of kStep (8 MiB),
// each through HostPool::prewarm (the range taken out of the free lists under
// the pool's lock, its pages populated with no lock of pins held). A cast never
// waits for it: a request that prewarmed memory cannot serve yet (its step is
// still in flight, or no prewarmed extent is large enough) commits its own
// pages, as without a prewarm. Small steps keep short the kernel's hold on the
// process's address space while a step populates (MADV_POPULATE_WRITE holds
// mmap_lock for reading: an mmap of the cast path waits that long at most).
//
// When: Runtime::wake_prewarm(), which the ops call after mark_prompt with
// models and after set_active(model, true). ComfyUI, through
// torch_pins/comfy.py, calls both at the top of load_models_gpu, before ComfyUI
// loads the models' weights to the device and runs them: the prewarm overlaps
// that load. register_model comes earlier but says nothing about a run
// (torch_pins.comfy registers every ModelPatcher, clones too), and a trigger
// there would commit memory for models a prompt may never run. Each wake-up
// is a round of steps until a step commits nothing; a wake-up during a round
// runs another after it, against the state of then.
//
// Across fork() (Note [Fork safety] in csrc/runtime/runtime.h) a child's copy
// of the Prewarmer has no thread and never touches the lock and condition
// variable it shares with the parent's thread (a parent's waiter would keep a
// condition variable's destruction waiting forever): wake() does nothing,
// stop() leaks the thread handle and that state, and the child runs without a
// prewarm until its next configure() starts its own, as with the monitor.
//
// On by default (the `prewarm` key): it commits nothing but RAM the budget
// would give pins anyway, only for models a prompt is about to run, and only
// once their size or their last prompt says they will pin it.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <thread>

#include "csrc/balancer/balancer.h"
#include "csrc/base/size.h"
#include "csrc/base/thread_safety.h"

namespace pins {

class Prewarmer {
 public:
  // What one step commits at most (Note [Prewarm]).
  static constexpr size_t kStep = 8 * MiB;

  // Starts the thread, which waits for wake(). `balancer` must outlive the
  // Prewarmer; `step` is what each Balancer::prewarm_step may commit. Throws
  // pins::ResourceError when the thread cannot be started.
  explicit Prewarmer(Balancer& balancer, size_t step = kStep);
  // stop(). Must not run with a lock held that prewarm_step takes.
  ~Prewarmer();
  Prewarmer(const Prewarmer&) = delete;
  Prewarmer& operator=(const Prewarmer&) = delete;

  // A round of steps on the thread, after the one running if any; returns at
  // once. Does nothing once stopping, and in a fork child.
  void wake();
  // Ends the round at the step in flight and joins the thread; idempotent.
  void stop();
  // Note [Prewarm]: built in another process, of which this one is a fork() child.
  bool inherited() const;
  // A round asked for or running (false in a fork child).
  bool busy() const;

  uint64_t rounds() const { return rounds_.load(std::memory_order_relaxed); }  // COUNT rounds run
  uint64_t committed() const { return committed_.load(std::memory_order_relaxed); }  // SUM bytes the steps committed
  // COUNT steps that threw (the exception is dropped and the round ends).
  uint64_t errors() const { return errors_.load(std::memory_order_relaxed); }

 private:
  void run();

  // What the thread waits on, on the heap: a fork child leaks it rather than
  // destroy what a parent's thread may be waiting on (Note [Prewarm]). A leaf
  // lock outside the levels of Note [Lock order]: nothing else is taken while
  // it is held, and the thread releases it before every step.
  struct State {
    Mutex mu;
    std::condition_variable_any cv;
    bool pending PINS_GUARDED_BY(mu) = false;   // a wake() the thread has not started on
    bool running PINS_GUARDED_BY(mu) = false;   // a round in progress
    bool stopping PINS_GUARDED_BY(mu) = false;
  };

  Balancer& balancer_;
  const size_t step_;
  // Where it was built: the process and its fork generation (csrc/system/process.h).
  const int pid_;
  const uint64_t fork_generation_;
  std::atomic<bool> stop_{false};       // read by the thread between steps
  std::atomic<bool> abandoned_{false};  // an inherited Prewarmer's stop() ran
  std::atomic<uint64_t> rounds_{0}, committed_{0}, errors_{0};
  std::unique_ptr<State> state_;
  // Serializes stop()'s join; a leaf, never taken by the thread.
  Mutex join_mu_;
  std::thread thread_ PINS_GUARDED_BY(join_mu_);
};

}  // namespace pins
