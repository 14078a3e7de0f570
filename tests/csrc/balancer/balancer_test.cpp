#include "csrc/balancer/balancer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <optional>
#include <chrono>
#include <cstring>
#include <functional>
#include <random>
#include <thread>

#include "csrc/base/check.h"
#include "tests/csrc/pool/pool_fixture.h"

namespace pins {
namespace {

using testing::FakeFence;
using testing::pool_opts;

// RAM as the balancer sees it: a fixed amount free before pins, minus what the
// pool has committed.
class FakeProbe : public MemoryProbe {
 public:
  FakeProbe(HostPool& pool, uint64_t total, uint64_t free_before_pins) : free_(free_before_pins), pool_(pool), total_(total) {}
  MemoryInfo read() override {
    MemoryInfo m;
    m.total = total_;
    const uint64_t used = static_cast<uint64_t>(pool_.stats().committed_bytes.current);
    m.available = free_.load() > used ? free_.load() - used : 0;
    return m;
  }
  std::atomic<uint64_t> free_;

 private:
  HostPool& pool_;
  uint64_t total_;
};

class FlagGuard : public SourceGuard {
 public:
  explicit FlagGuard(std::shared_ptr<std::atomic<bool>> alive) : alive_(std::move(alive)) {}
  bool alive() const override { return alive_->load(); }

 private:
  std::shared_ptr<std::atomic<bool>> alive_;
};

constexpr uint64_t U = 64 * MiB;  // one pin in these scenarios

Config base_config() {
  Config c;
  c.policy = PolicyKind::Mru;  // the order these scenarios spell out (trace, the default, follows it without a record)
  c.headroom = 4 * GiB;  // a new pin needs 2 GiB + its size available
  c.pin_slack = 0;
  c.relieve_slack = 0;
  c.ceiling_min = 0;
  c.ceiling_max = 1;
  c.ceiling_reserve = 0;
  c.ceiling_swap_reserve = 0;
  return c;
}

Config policy_config(PolicyKind policy) {
  Config c = base_config();
  c.policy = policy;
  return c;
}

struct Fixture {
  explicit Fixture(uint64_t room_pins, Config c = base_config())
      : pool(make_null_backend(), pool_opts()), probe(pool, 64 * GiB, 2 * GiB + room_pins * U), bal(c, pool, probe) {}
  HostPool pool;
  FakeProbe probe;
  Balancer bal;

  Request req(ModelId m, uint64_t id, Kind kind = Kind::Weights, bool resident = false, uint64_t bytes = U) {
    Request r;
    r.model = m;
    r.key = PinKey{id, 0, bytes};
    r.bytes = bytes;
    r.kind = kind;
    r.resident = resident;
    return r;
  }
  // A cast: true when served from a pin (hit or new), false when refused.
  bool cast(const Request& r) {
    Lease l = bal.acquire(r);
    if (!l) return false;
    if (l.needs_fill()) l.filled();
    return true;
  }
  bool has(ModelId m, uint64_t id, Subset s) {
    for (const auto& p : bal.pins())
      if (p.model == m && p.key.storage == id && p.subset == s) return true;
    return false;
  }
  // One prompt of model m casting `keys` (weights) in order; every cast must get a pin.
  void prompt(ModelId m, const std::vector<uint64_t>& keys) {
    bal.mark_prompt({m});
    for (uint64_t k : keys) EXPECT_TRUE(cast(req(m, k))) << "refused: key " << k;
    bal.end_prompt();
  }
  // One prompt of model m loading layer `id`, which stays on the device:
  // whether it got a pin.
  bool load(ModelId m, uint64_t id) {
    bal.mark_prompt({m});
    const bool pinned = cast(req(m, id, Kind::Weights, true));
    bal.end_prompt();
    return pinned;
  }
  // One prompt of model m loading `keys`, which stay on the device: each must get a pin.
  void load_all(ModelId m, const std::vector<uint64_t>& keys) {
    bal.mark_prompt({m});
    for (uint64_t k : keys) EXPECT_TRUE(cast(req(m, k, Kind::Weights, true))) << "refused: key " << k;
    bal.end_prompt();
  }
  int count(ModelId m, Subset s) {
    int n = 0;
    for (const auto& p : bal.pins()) n += p.model == m && p.subset == s;
    return n;
  }
};

TEST(BalancerTiers, OutOfPromptStreamingGoesBeforeInPromptCache) {
  Fixture f(8);
  const ModelId a = f.bal.register_model("a", "cuda:0");
  const ModelId b = f.bal.register_model("b", "cuda:0");
  for (uint64_t i = 0; i < 4; ++i) ASSERT_TRUE(f.cast(f.req(a, 100 + i)));                     // a: weights
  for (uint64_t i = 0; i < 4; ++i) ASSERT_TRUE(f.cast(f.req(b, 200 + i, Kind::Weights, true)));  // b: weights-loaded
  f.bal.mark_prompt({b});
  ASSERT_TRUE(f.cast(f.req(b, 300, Kind::Weights, true)));  // no room: one pin must go
  EXPECT_EQ(f.count(a, Subset::Weights), 3);
  EXPECT_FALSE(f.has(a, 103, Subset::Weights)) << "mru: the newest pin of the model goes first";
  EXPECT_EQ(f.count(b, Subset::WeightsLoaded), 5);
  EXPECT_EQ(f.bal.subset_stats(a, Subset::Weights).evictions[0], 1);
}

TEST(BalancerTiers, OutOfPromptCacheGoesBeforeInPromptCache) {
  Fixture f(8);
  const ModelId a = f.bal.register_model("a", "cuda:0");
  const ModelId b = f.bal.register_model("b", "cuda:0");
  for (uint64_t i = 0; i < 4; ++i) ASSERT_TRUE(f.cast(f.req(b, 200 + i, Kind::Weights, true)));
  for (uint64_t i = 0; i < 4; ++i) ASSERT_TRUE(f.cast(f.req(a, 100 + i, Kind::Weights, true)));
  f.bal.mark_prompt({b});
  ASSERT_TRUE(f.cast(f.req(b, 300, Kind::Weights, true)));
  ASSERT_TRUE(f.cast(f.req(b, 301, Kind::Weights, true)));
  EXPECT_EQ(f.count(a, Subset::WeightsLoaded), 2);
  EXPECT_EQ(f.count(b, Subset::WeightsLoaded), 6);
  EXPECT_EQ(f.bal.subset_stats(a, Subset::WeightsLoaded).evictions[1], 2);  // tier 2
}

TEST(BalancerTiers, InPromptCacheGoesBeforeInactiveStreamingAndOnlyStreamingRequestsReachTier4) {
  Fixture f(4);
  const ModelId b = f.bal.register_model("b", "cuda:0");
  const ModelId c = f.bal.register_model("c", "cuda:0");
  f.bal.mark_prompt({b, c});
  ASSERT_TRUE(f.cast(f.req(b, 1, Kind::Weights, true)));  // b: weights-loaded (tier 3)
  ASSERT_TRUE(f.cast(f.req(c, 2)));                       // c: weights, in prompt, inactive (tier 4)
  ASSERT_TRUE(f.cast(f.req(c, 3)));
  ASSERT_TRUE(f.cast(f.req(c, 4)));
  // A streaming request: the cache pin (tier 3) goes first.
  ASSERT_TRUE(f.cast(f.req(c, 5)));
  EXPECT_EQ(f.count(b, Subset::WeightsLoaded), 0);
  EXPECT_EQ(f.count(c, Subset::Weights), 4);
  // A cache request may not take streaming pins of the prompt: refused.
  EXPECT_FALSE(f.cast(f.req(b, 6, Kind::Weights, true)));
  EXPECT_EQ(f.count(c, Subset::Weights), 4);
  // A streaming request may (tier 4).
  ASSERT_TRUE(f.cast(f.req(b, 7)));
  EXPECT_EQ(f.count(c, Subset::Weights), 3);
  EXPECT_EQ(f.bal.subset_stats(c, Subset::Weights).evictions[3], 1);
}

TEST(BalancerTiers, ActiveStreamingPinsOnlyWhenAllowed) {
  Fixture f(3);
  const ModelId m = f.bal.register_model("m", "cuda:0");
  f.bal.mark_prompt({m});
  f.bal.set_active(m, true);
  for (uint64_t i = 0; i < 3; ++i) ASSERT_TRUE(f.cast(f.req(m, i)));
  EXPECT_FALSE(f.cast(f.req(m, 10))) << "only the model's own active streaming pins are left: refuse";
  EXPECT_EQ(f.bal.free(U, false), 0u);
  EXPECT_EQ(f.count(m, Subset::Weights), 3);
  EXPECT_EQ(f.bal.free(U, true), U);
  EXPECT_EQ(f.count(m, Subset::Weights), 2);
  EXPECT_EQ(f.bal.subset_stats(m, Subset::Weights).evictions[4], 1);
}

// Note [Miss cost]: a patch pin saves a RAM copy, a weight pin a disk read. A
// new weight pin takes an active model's patch pin (tier 5) before a weight pin
// of a model out of the prompt (tier 1); a new patch pin takes no weight pin.
TEST(BalancerMissCost, PatchPinsGoFirstAndNeverTakeAWeightPin) {
  Fixture f(3);
  const ModelId out = f.bal.register_model("out", "cuda:0");
  const ModelId m = f.bal.register_model("m", "cuda:0");
  ASSERT_TRUE(f.cast(f.req(out, 1)));
  f.bal.mark_prompt({m});
  f.bal.set_active(m, true);
  ASSERT_TRUE(f.cast(f.req(m, 2, Kind::Patches)));
  ASSERT_TRUE(f.cast(f.req(m, 3)));
  ASSERT_TRUE(f.cast(f.req(m, 4))) << "room made by the patch pin";
  EXPECT_EQ(f.count(m, Subset::Patches), 0);
  EXPECT_EQ(f.count(out, Subset::Weights), 1) << "the weight pin out of the prompt stays";
  EXPECT_EQ(f.bal.subset_stats(m, Subset::Patches).evictions[4], 1);
  EXPECT_FALSE(f.cast(f.req(m, 5, Kind::Patches))) << "a patch pin is refused rather than take a weight pin";
  EXPECT_EQ(f.count(out, Subset::Weights), 1);
  EXPECT_EQ(f.count(m, Subset::Weights), 2);
  // A free takes patch pins within its reach before weight pins of any tier.
  ASSERT_TRUE(f.bal.free(3 * U, true) >= 3 * U);
  f.bal.end_prompt();
}

TEST(BalancerMissCost, AFreeTakesPatchPinsBeforeWeightPinsOfALowerTier) {
  Fixture f(4);
  const ModelId out = f.bal.register_model("out", "cuda:0");
  const ModelId m = f.bal.register_model("m", "cuda:0");
  ASSERT_TRUE(f.cast(f.req(out, 1)));  // tier 1 once m's prompt starts
  f.bal.mark_prompt({m});
  ASSERT_TRUE(f.cast(f.req(m, 2, Kind::Patches, true)));  // patches-loaded needs a signature: streaming below
  ASSERT_TRUE(f.cast(f.req(m, 3, Kind::Patches)));
  ASSERT_EQ(f.count(m, Subset::Patches), 2);
  EXPECT_EQ(f.bal.free(2 * U), 2 * U);
  EXPECT_EQ(f.count(m, Subset::Patches), 0) << "tier 4 patch pins before the tier 1 weight pin";
  EXPECT_EQ(f.count(out, Subset::Weights), 1);
  f.bal.end_prompt();
}

// Note [Idle cache pins]: a model's cache pins unused through a whole prompt
// it ran in go first, before any tier (here before a model out of the prompt).
TEST(BalancerIdleCachePins, CachePinsUnusedThroughAPromptGoFirst) {
  Fixture f(4);
  const ModelId x = f.bal.register_model("x", "cuda:0");
  const ModelId y = f.bal.register_model("y", "cuda:0");
  const ModelId z = f.bal.register_model("z", "cuda:0");
  f.bal.mark_prompt({x});
  ASSERT_TRUE(f.cast(f.req(x, 1, Kind::Weights, true)));  // loaded, then stays on the device
  ASSERT_TRUE(f.cast(f.req(x, 2, Kind::Weights, true)));
  f.bal.end_prompt();
  f.bal.mark_prompt({x});
  ASSERT_TRUE(f.cast(f.req(x, 2, Kind::Weights, true)));  // 2 is cast again (a hit), 1 stayed resident
  ASSERT_TRUE(f.cast(f.req(z, 3)));
  f.bal.end_prompt();
  f.bal.mark_prompt({y});
  ASSERT_TRUE(f.cast(f.req(y, 4)));
  ASSERT_TRUE(f.cast(f.req(y, 5))) << "room made by the idle pin";
  EXPECT_FALSE(f.has(x, 1, Subset::WeightsLoaded)) << "unused through x's last prompt: first to go";
  EXPECT_TRUE(f.has(x, 2, Subset::WeightsLoaded));
  EXPECT_TRUE(f.has(z, 3, Subset::Weights)) << "tier 1 goes only after the idle pins";
  f.bal.end_prompt();
}

// Note [Idle cache pins]: a model being loaded does not evict its own layers
// for others of its own; the new cache pin is refused.
TEST(BalancerIdleCachePins, AModelBeingLoadedKeepsItsOwnCachePins) {
  Fixture f(2);
  const ModelId m = f.bal.register_model("m", "cuda:0");
  f.bal.mark_prompt({m});
  f.bal.set_active(m, true);
  ASSERT_TRUE(f.cast(f.req(m, 1, Kind::Weights, true)));
  ASSERT_TRUE(f.cast(f.req(m, 2, Kind::Weights, true)));
  EXPECT_FALSE(f.cast(f.req(m, 3, Kind::Weights, true)));
  EXPECT_TRUE(f.has(m, 1, Subset::WeightsLoaded) && f.has(m, 2, Subset::WeightsLoaded));
  EXPECT_EQ(f.bal.subset_stats(m, Subset::WeightsLoaded).evictions_all(), 0);
  // Another model's cache pin may still take them (tier 3), as a streaming pin of m may.
  const ModelId other = f.bal.register_model("other", "cuda:0");
  f.bal.mark_prompt({other});
  f.bal.set_active(m, false);
  ASSERT_TRUE(f.cast(f.req(other, 4, Kind::Weights, true)));
  EXPECT_EQ(f.count(m, Subset::WeightsLoaded), 1);
  f.bal.end_prompt();
}

// Note [Idle cache pins] under the trace policy: a layer that stayed on the
// device (1, loaded once, never cast again) is predicted used only where an
// older record used it, later than a layer the model loads each prompt (4), so
// the load may take its pin (Note [Trace bypass]); mru keeps its own pins and
// refuses 4 every prompt. The load's other layers (2, 3) stay pinned in both.
TEST(BalancerIdleCachePins, UnderTheTraceALoadTakesItsOwnLayerThatStayedOnTheDevice) {
  for (PolicyKind policy : {PolicyKind::Trace, PolicyKind::Mru}) {
    SCOPED_TRACE(to_string(policy));
    Fixture f(3, policy_config(policy));
    const ModelId m = f.bal.register_model("m", "cuda:0");
    const auto load = [&](std::initializer_list<uint64_t> layers) {
      f.bal.mark_prompt({m});
      int pinned = 0;
      for (uint64_t k : layers) pinned += f.cast(f.req(m, k, Kind::Weights, true));
      f.bal.end_prompt();
      return pinned;
    };
    ASSERT_EQ(load({1, 2, 3}), 3);
    EXPECT_EQ(load({2, 3, 4}), 2) << "no record uses 4 yet: refused";
    const int third = load({2, 3, 4});
    const int fourth = load({2, 3, 4});
    EXPECT_TRUE(f.has(m, 2, Subset::WeightsLoaded) && f.has(m, 3, Subset::WeightsLoaded));
    if (policy == PolicyKind::Trace) {
      EXPECT_EQ(third, 3) << "4 took the pin of 1, which stayed on the device";
      EXPECT_EQ(fourth, 3);
      EXPECT_FALSE(f.has(m, 1, Subset::WeightsLoaded));
      EXPECT_TRUE(f.has(m, 4, Subset::WeightsLoaded));
    } else {
      EXPECT_EQ(third, 2);
      EXPECT_EQ(fourth, 2);
      EXPECT_TRUE(f.has(m, 1, Subset::WeightsLoaded));
    }
  }
}

// Note [First-seen models]: under the trace, a layer that stays on the device
// of a model no record knows (a one-off workflow) takes no weight pin: the
// pins of the workflow the records know stay. Its streamed layers may take
// them, and once a record knows the model its loaded layers are pinned like any.
// mru evicts for it at once.
TEST(BalancerPolicy, TraceGivesAFirstSeenModelsLoadedLayersNoWeightPin) {
  for (PolicyKind policy : {PolicyKind::Trace, PolicyKind::Mru}) {
    SCOPED_TRACE(to_string(policy));
    Fixture f(3, policy_config(policy));
    const ModelId a = f.bal.register_model("a", "cuda:0");
    const ModelId b = f.bal.register_model("b", "cuda:0");
    f.prompt(a, {1, 2, 3});
    f.bal.mark_prompt({b});
    const bool loaded = f.cast(f.req(b, 10, Kind::Weights, true));
    EXPECT_EQ(loaded, policy == PolicyKind::Mru);
    EXPECT_EQ(f.count(a, Subset::Weights), policy == PolicyKind::Trace ? 3 : 2);
    EXPECT_TRUE(f.cast(f.req(b, 11))) << "a streamed layer of b takes a pin of a";
    f.bal.end_prompt();
    f.bal.mark_prompt({b});
    EXPECT_TRUE(f.cast(f.req(b, 10, Kind::Weights, true))) << "b is known now";
    EXPECT_TRUE(f.has(b, 10, Subset::WeightsLoaded));
    f.bal.end_prompt();
  }
}

// Note [First-seen models]: the rule spares only the last prompt's workflow.
// a ran, then b twice; a new model c's loaded layer takes a
// pin of a, which has not run since, under the trace (mru takes b's, the most
// recently loaded).
TEST(BalancerPolicy, TraceLetsAFirstSeenModelTakeThePinsOfAWorkflowThatHasNotRunSince) {
  for (PolicyKind policy : {PolicyKind::Trace, PolicyKind::Mru}) {
    SCOPED_TRACE(to_string(policy));
    Fixture f(4, policy_config(policy));
    const ModelId a = f.bal.register_model("a", "cuda:0");
    const ModelId b = f.bal.register_model("b", "cuda:0");
    const ModelId c = f.bal.register_model("c", "cuda:0");
    f.prompt(a, {1, 2, 3});
    f.prompt(b, {4});
    f.prompt(b, {4});
    f.bal.mark_prompt({c});
    EXPECT_TRUE(f.cast(f.req(c, 10, Kind::Weights, true)));
    EXPECT_EQ(f.count(a, Subset::Weights), policy == PolicyKind::Trace ? 2 : 3);
    EXPECT_EQ(f.count(b, Subset::Weights), policy == PolicyKind::Trace ? 1 : 0);
    f.bal.end_prompt();
  }
}

// Note [Spared layers on the device]: a loaded three layers (cache pins, 3U)
// of its 4U of weights; b, first seen, is refused a's pins unless the
// application said how much of a is on its device: then b takes as many bytes
// of them as are certainly of layers there (3U less what is off the device).
TEST(BalancerPolicy, TraceLetsAFirstSeenModelTakeSparedPinsOfLayersOnTheDevice) {
  for (const std::optional<uint64_t> on_device : {std::optional<uint64_t>(), std::optional<uint64_t>(0),
                                                  std::optional<uint64_t>(2 * U), std::optional<uint64_t>(4 * U)}) {
    SCOPED_TRACE(on_device ? std::to_string(*on_device / U) + "U on the device" : "never said");
    Fixture f(3, policy_config(PolicyKind::Trace));
    const ModelId a = f.bal.register_model("a", "cuda:0");
    const ModelId b = f.bal.register_model("b", "cuda:0");
    f.load_all(a, {1, 2, 3});
    if (on_device) f.bal.set_device_bytes(a, *on_device, 4 * U);
    const int room = !on_device ? 0 : static_cast<int>((*on_device > U ? *on_device - U : 0) / U);
    f.bal.mark_prompt({b});
    for (uint64_t k : {10, 11}) EXPECT_EQ(f.cast(f.req(b, k, Kind::Weights, true)), room >= static_cast<int>(k - 9));
    EXPECT_EQ(f.count(a, Subset::WeightsLoaded), 3 - std::min(room, 2));
    f.bal.end_prompt();
  }
}

// Balancer::set_device_bytes: more than the total counts as the total; a model
// not registered is a ValueError naming the call.
TEST(BalancerPolicy, DeviceBytesAreCappedAtTheTotalAndNeedARegisteredModel) {
  Fixture f(3, policy_config(PolicyKind::Trace));
  const ModelId a = f.bal.register_model("a", "cuda:0");
  const ModelId b = f.bal.register_model("b", "cuda:0");
  f.load_all(a, {1, 2, 3});
  f.bal.set_device_bytes(a, 9 * U, 3 * U);  // all of it
  f.bal.mark_prompt({b});
  EXPECT_TRUE(f.cast(f.req(b, 10, Kind::Weights, true)));
  f.bal.end_prompt();
  try {
    f.bal.set_device_bytes(99, U, U);
    ADD_FAILURE() << "no error for model 99";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("set_device_bytes"), std::string::npos) << e.what();
  }
}

// Note [Idle cache pins] under the trace: a's layer 1 stays on the device
// through a seed change, so its pin goes unused, and the next prompt that
// changes the text loads it again first, as the full prompt's record says.
// While the trace is followed its prediction ranks the idle pin like any other:
// a free of one pin takes b's, predicted used last, and 1 stays. mru takes the
// idle pin first.
TEST(BalancerIdleCachePins, UnderTheTraceAnIdlePinIsRankedByItsNextUse) {
  for (PolicyKind policy : {PolicyKind::Trace, PolicyKind::Mru}) {
    SCOPED_TRACE(to_string(policy));
    Fixture f(3, policy_config(policy));
    const ModelId a = f.bal.register_model("a", "cuda:0");
    const ModelId b = f.bal.register_model("b", "cuda:0");
    f.bal.mark_prompt({a, b});  // the full prompt: 1 loaded, 3 streamed, b's 7 loaded
    ASSERT_TRUE(f.cast(f.req(a, 1, Kind::Weights, true)));
    ASSERT_TRUE(f.cast(f.req(a, 3)));
    ASSERT_TRUE(f.cast(f.req(b, 7, Kind::Weights, true)));
    f.bal.end_prompt();
    f.prompt(a, {3});  // a seed change: 1 stays on the device
    EXPECT_EQ(f.bal.free(U), U);
    EXPECT_EQ(f.has(a, 1, Subset::WeightsLoaded), policy == PolicyKind::Trace);
    EXPECT_EQ(f.has(b, 7, Subset::WeightsLoaded), policy == PolicyKind::Mru);
    EXPECT_TRUE(f.has(a, 3, Subset::Weights));
  }
}

// Note [Rule checks] for Note [First-seen models]: after x and a took turns, b,
// new after a, is refused its loaded layer to spare a; then b runs again
// before a: the rule was wrong, and it stops. When a new model c comes after
// another loop d, its loaded layer is pinned.
TEST(BalancerPolicy, TraceStopsSparingAWorkflowForNewModelsThatRepeat) {
  Fixture f(3, policy_config(PolicyKind::Trace));
  const ModelId a = f.bal.register_model("a", "cuda:0");
  const ModelId b = f.bal.register_model("b", "cuda:0");
  const ModelId c = f.bal.register_model("c", "cuda:0");
  const ModelId d = f.bal.register_model("d", "cuda:0");
  const ModelId x = f.bal.register_model("x", "cuda:0");
  for (int i = 0; i < 2; ++i) {
    f.load(x, 40);
    f.prompt(a, {1, 2, 3});
  }
  EXPECT_FALSE(f.load(b, 10)) << "first seen after workflows that took turns: a is spared";
  EXPECT_EQ(f.bal.stats().rule_first_seen_wrong, 0);
  f.load(b, 10);  // b again, before a
  EXPECT_EQ(f.bal.stats().rule_first_seen_wrong, 1);
  // A loop d then holds every pin; c, new after it, is not refused: the rule stopped.
  f.prompt(d, {31, 32, 33});
  f.prompt(d, {31, 32, 33});
  EXPECT_TRUE(f.load(c, 20)) << "the rule stopped: c's loaded layer takes a pin of d";
  EXPECT_EQ(f.count(d, Subset::Weights), 2);
}

// Note [First-seen models] before any verdict: the records say whether the
// user's workflows go on past their first prompt. a's prompt loads layer 1
// and streams 2 and 3. After a a, a new b is taken for the next loop: its
// loaded layer takes the pin of a's, and a's streamed layers, which a reads
// every step when it comes back, stay. After x a x a, where each workflow's
// first prompt was followed by another, b is taken for a one-off and a is
// spared whole.
TEST(BalancerPolicy, TraceSparesAWorkflowForANewModelOnlyWhereWorkflowsTookTurns) {
  for (const bool turns : {false, true}) {
    SCOPED_TRACE(turns ? "x a x a b" : "a a b");
    Fixture f(3, policy_config(PolicyKind::Trace));
    const ModelId a = f.bal.register_model("a", "cuda:0");
    const ModelId b = f.bal.register_model("b", "cuda:0");
    const ModelId x = f.bal.register_model("x", "cuda:0");
    for (int i = 0; i < 2; ++i) {
      if (turns) f.load(x, 40);
      f.bal.mark_prompt({a});
      ASSERT_TRUE(f.cast(f.req(a, 1, Kind::Weights, true)));
      ASSERT_TRUE(f.cast(f.req(a, 2)));
      ASSERT_TRUE(f.cast(f.req(a, 3)));
      f.bal.end_prompt();
    }
    ASSERT_EQ(f.count(a, Subset::WeightsLoaded), 1);
    ASSERT_EQ(f.count(a, Subset::Weights), 2);
    EXPECT_EQ(f.load(b, 10), !turns);
    EXPECT_EQ(f.count(a, Subset::WeightsLoaded), turns ? 1 : 0);
    EXPECT_EQ(f.count(a, Subset::Weights), 2) << "a's streamed layers stay either way";
  }
}

// Note [Trace policy]: a one-off leaves the cycle where streaks go on. a's
// full prompt loads layer 1 and streams 2 and 3; its seed change streams 2
// and 3 only (layer 1 stayed on the device). A new b then takes a's loaded
// pin (a went on: b may be the next loop). When a's full prompt comes back,
// the cycle from a's full record (a seed change, then b, then a) would put
// layer 1 after b's pin and refuse it; b ran once, as a detour, so its pin is
// predicted never to be used, and layer 1 takes it.
TEST(BalancerPolicy, TraceGivesTheWorkflowABackToItsLoopThePinOfAOneOff) {
  Fixture f(3, policy_config(PolicyKind::Trace));
  const ModelId a = f.bal.register_model("a", "cuda:0");
  const ModelId b = f.bal.register_model("b", "cuda:0");
  const auto full = [&] {
    f.bal.mark_prompt({a});
    const bool pinned = f.cast(f.req(a, 1, Kind::Weights, true));
    EXPECT_TRUE(f.cast(f.req(a, 2)));
    EXPECT_TRUE(f.cast(f.req(a, 3)));
    f.bal.end_prompt();
    return pinned;
  };
  ASSERT_TRUE(full());
  f.prompt(a, {2, 3});
  ASSERT_TRUE(f.load(b, 10)) << "a went on: b takes a's loaded pin";
  ASSERT_FALSE(f.has(a, 1, Subset::WeightsLoaded));
  EXPECT_TRUE(full()) << "b's pin, a one-off's, goes to a's loaded layer";
  EXPECT_TRUE(f.has(a, 1, Subset::WeightsLoaded));
  EXPECT_FALSE(f.has(b, 10, Subset::WeightsLoaded));
}

// Note [Cached conditioning]: an encoder e (one layer), a sampler s (one
// streamed layer, `passes` steps) and a VAE v (two layers that stay on the
// device), room for three pins. In the rerun, once the sampler looped, the
// trace predicts that the next prompt (a seed change) takes e's output from the
// application's cache: v's second layer takes e's pin, and the seed change
// finds all it casts pinned. Two passes are no loop: e keeps its pin and v's
// second layer is refused, as it was in the first prompt.
TEST(BalancerPolicy, TraceGivesARerunsConditioningPinToTheLayersAfterTheLoop) {
  for (int passes : {3, 2}) {
    SCOPED_TRACE(passes);
    Fixture f(3, policy_config(PolicyKind::Trace));
    const ModelId e = f.bal.register_model("e", "cuda:0");
    const ModelId s = f.bal.register_model("s", "cuda:0");
    const ModelId v = f.bal.register_model("v", "cuda:0");
    const auto run = [&](bool encode) {  // whether each cast was served from a pin
      std::vector<bool> served;
      const auto node = [&](ModelId m, std::initializer_list<uint64_t> keys, bool resident, int times) {
        f.bal.set_active(m, true);
        for (int i = 0; i < times; ++i)
          for (uint64_t k : keys) served.push_back(f.cast(f.req(m, k, Kind::Weights, resident)));
        f.bal.set_active(m, false);
      };
      f.bal.mark_prompt(encode ? std::vector<ModelId>{e, s, v} : std::vector<ModelId>{s, v});
      if (encode) node(e, {1}, true, 1);
      node(s, {10}, false, passes);
      node(v, {20, 21}, true, 1);
      f.bal.end_prompt();
      return served;
    };
    const std::vector<bool> first = run(true);
    EXPECT_FALSE(first.back()) << "no record yet: v's second layer is refused";
    const std::vector<bool> rerun = run(true);
    EXPECT_EQ(rerun.back(), passes == 3);
    EXPECT_EQ(f.has(e, 1, Subset::WeightsLoaded), passes == 2);
    EXPECT_EQ(f.has(v, 21, Subset::WeightsLoaded), passes == 3);
    if (passes == 3) {
      EXPECT_TRUE(f.has(v, 20, Subset::WeightsLoaded) && f.has(s, 10, Subset::Weights))
          << "the seed change's every layer is pinned before it starts";
      const std::vector<bool> seed = run(false);
      EXPECT_EQ(std::count(seed.begin(), seed.end(), true), static_cast<long>(seed.size()));
    }
  }
}

// Note [Trace marks]: workflows a (sampler sa) and b (sampler sb) share an
// encoder e of two layers that stay on the device; room for three pins. After
// a b b, b's samplers hold two pins and e's second layer none (b's rerun
// refused it for the sampler's pins, used sooner). Then a runs: its encoder
// follows every record, and the most recent, b's, predicts sb's pins in this
// prompt. Marked as the prompt starts (pins.prompt()), a's sampler departs b's
// records: e's second layer comes before them and takes a pin. Marked as each
// model loads (ComfyUI), the encoder's mark names no sampler and it is refused,
// as without marks.
TEST(BalancerPolicy, TraceFollowsTheWorkflowWhoseSamplerThePromptMarked) {
  for (const bool upfront : {true, false}) {
    SCOPED_TRACE(upfront ? "marked at the start" : "marked on load");
    Fixture f(3, policy_config(PolicyKind::Trace));
    const ModelId e = f.bal.register_model("e", "cuda:0");
    const ModelId sa = f.bal.register_model("sa", "cuda:0");
    const ModelId sb = f.bal.register_model("sb", "cuda:0");
    std::vector<bool> encoded;  // whether each cast of e's layers was served from a pin
    const auto run = [&](ModelId sampler, std::initializer_list<uint64_t> keys, bool mark_all) {
      encoded.clear();
      f.bal.mark_prompt(mark_all ? std::vector<ModelId>{e, sampler} : std::vector<ModelId>{e});
      for (uint64_t k : {1, 2}) encoded.push_back(f.cast(f.req(e, k, Kind::Weights, true)));
      f.bal.mark_prompt({sampler});
      for (int i = 0; i < 3; ++i)
        for (uint64_t k : keys) f.cast(f.req(sampler, k));
      f.bal.end_prompt();
    };
    run(sa, {10}, true);
    run(sb, {20, 21}, true);
    run(sb, {20, 21}, true);
    ASSERT_FALSE(encoded[1]) << "b's rerun refuses e's second layer";
    ASSERT_TRUE(f.has(sb, 20, Subset::Weights) && f.has(sb, 21, Subset::Weights));
    run(sa, {10}, upfront);
    EXPECT_EQ(encoded[1], upfront);
    EXPECT_EQ(f.has(e, 2, Subset::WeightsLoaded), upfront);
  }
}

// free(loaded): ComfyUI's free_pins(loaded=True), room for a cache pin: tiers
// 1-3 only, so the prompt's streaming pins stay even when evict_active says more.
TEST(BalancerTiers, LoadedFreeSparesThePromptsStreamingPins) {
  Fixture f(4);
  const ModelId m = f.bal.register_model("m", "cuda:0");
  const ModelId out = f.bal.register_model("out", "cuda:0");
  ASSERT_TRUE(f.cast(f.req(out, 1)));
  f.bal.mark_prompt({m});
  ASSERT_TRUE(f.cast(f.req(m, 2)));
  ASSERT_TRUE(f.cast(f.req(m, 3, Kind::Weights, true)));
  EXPECT_EQ(f.bal.free(3 * U, true, true), 2 * U) << "tier 1 (out's) and tier 3 (m's cache pin), not tier 4";
  EXPECT_EQ(f.count(out, Subset::Weights), 0);
  EXPECT_EQ(f.count(m, Subset::WeightsLoaded), 0);
  EXPECT_EQ(f.count(m, Subset::Weights), 1);
  EXPECT_EQ(f.bal.free(U, false, false), U) << "without `loaded`, tier 4 goes";
}

// Three models out of the prompt, loaded x, y, z: mru frees z first, lru x first.
TEST(BalancerPolicy, MruAgainstLruOrder) {
  for (PolicyKind policy : {PolicyKind::Mru, PolicyKind::Lru}) {
    Fixture f(6, policy_config(policy));
    const ModelId x = f.bal.register_model("x", "cuda:0");
    const ModelId y = f.bal.register_model("y", "cuda:0");
    const ModelId z = f.bal.register_model("z", "cuda:0");
    for (ModelId m : {x, y, z})
      for (uint64_t i = 0; i < 2; ++i) ASSERT_TRUE(f.cast(f.req(m, 10 * m + i)));
    ASSERT_EQ(f.bal.free(2 * U), 2 * U);
    SCOPED_TRACE(to_string(policy));
    if (policy == PolicyKind::Mru) {
      EXPECT_EQ(f.count(z, Subset::Weights), 0);
      EXPECT_EQ(f.count(x, Subset::Weights), 2);
    } else {
      EXPECT_EQ(f.count(x, Subset::Weights), 0);
      EXPECT_EQ(f.count(z, Subset::Weights), 2);
    }
    EXPECT_EQ(f.count(y, Subset::Weights), 2);
    // Loading x again moves it to the front of the load order.
    f.bal.set_active(x, true);
    f.bal.set_active(x, false);
    for (uint64_t i = 0; i < 2; ++i) ASSERT_TRUE(f.cast(f.req(z, 10 * z + i)));
    ASSERT_EQ(f.bal.free(2 * U), 2 * U);
    if (policy == PolicyKind::Mru) EXPECT_EQ(f.count(x, Subset::Weights), 0) << "x was loaded last";
    else EXPECT_EQ(f.count(y, Subset::Weights), 0) << "y is now the oldest";
  }
}

TEST(BalancerPolicy, LruKeepsNoLoadedCache) {
  Fixture f(8, policy_config(PolicyKind::Lru));
  const ModelId m = f.bal.register_model("m", "cuda:0");
  ASSERT_TRUE(f.cast(f.req(m, 1, Kind::Weights, true)));
  EXPECT_TRUE(f.has(m, 1, Subset::Weights));
  EXPECT_EQ(f.count(m, Subset::WeightsLoaded), 0);
}

TEST(BalancerCastPath, FastDiskCreatesNoLoadedPinsButReusesThem) {
  Fixture f(8);
  const ModelId m = f.bal.register_model("m", "cuda:0");
  ASSERT_TRUE(f.cast(f.req(m, 1, Kind::Weights, true)));  // fast-disk off: weights-loaded
  EXPECT_TRUE(f.has(m, 1, Subset::WeightsLoaded));
  Config c = base_config();
  c.fast_disk = true;
  f.bal.configure(c);
  ASSERT_TRUE(f.cast(f.req(m, 2, Kind::Weights, true)));
  EXPECT_TRUE(f.has(m, 2, Subset::Weights)) << "fast-disk: a resident weight goes to the streaming subset";
  EXPECT_EQ(f.count(m, Subset::WeightsLoaded), 1);
  Lease l = f.bal.acquire(f.req(m, 1, Kind::Weights, true));
  ASSERT_TRUE(l);
  EXPECT_TRUE(l.hit()) << "fast-disk still reuses an existing -loaded pin";
  EXPECT_EQ(l.subset(), Subset::WeightsLoaded);
}

TEST(BalancerCastPath, StreamingSubsetIsLookedUpBeforeLoaded) {
  Fixture f(8);
  const ModelId m = f.bal.register_model("m", "cuda:0");
  ASSERT_TRUE(f.cast(f.req(m, 1)));  // weights
  Lease l = f.bal.acquire(f.req(m, 1, Kind::Weights, true));  // now resident: still the same pin
  ASSERT_TRUE(l && l.hit());
  EXPECT_EQ(l.subset(), Subset::Weights);
  EXPECT_EQ(f.count(m, Subset::WeightsLoaded), 0);
}

TEST(BalancerCastPath, PatchSignatureChangeRefills) {
  Fixture f(8);
  const ModelId m = f.bal.register_model("m", "cuda:0");
  Request r = f.req(m, 1, Kind::Patches, true, 1 * MiB);
  r.signature = 11;
  ASSERT_TRUE(f.cast(r));
  EXPECT_TRUE(f.has(m, 1, Subset::PatchesLoaded));
  {
    Lease l = f.bal.acquire(r);
    EXPECT_TRUE(l.hit());
  }
  r.signature = 12;
  {
    Lease l = f.bal.acquire(r);
    ASSERT_TRUE(l);
    EXPECT_FALSE(l.hit()) << "a patches-loaded pin serves only its own signature";
    EXPECT_TRUE(l.needs_fill());
    l.filled();
  }
  const SubsetStats s = f.bal.subset_stats(m, Subset::PatchesLoaded);
  EXPECT_EQ(s.dropped, 1);
  EXPECT_EQ(s.pins, 1);
  EXPECT_TRUE(f.bal.acquire(r).hit());
  // Without a signature a resident patch is not cached in patches-loaded.
  Request plain = f.req(m, 2, Kind::Patches, true, 1 * MiB);
  ASSERT_TRUE(f.cast(plain));
  EXPECT_TRUE(f.has(m, 2, Subset::Patches));
}

TEST(BalancerPrompt, BoundaryDropsPatchesKeepsPatchesLoaded) {
  Fixture f(8);
  const ModelId m = f.bal.register_model("m", "cuda:0");
  f.bal.mark_prompt({m});
  ASSERT_TRUE(f.cast(f.req(m, 1, Kind::Patches, false, 1 * MiB)));
  Request loaded = f.req(m, 2, Kind::Patches, true, 1 * MiB);
  loaded.signature = 5;
  ASSERT_TRUE(f.cast(loaded));
  ASSERT_TRUE(f.cast(f.req(m, 3)));
  EXPECT_TRUE(f.bal.prompt_running());
  f.bal.end_prompt();
  EXPECT_FALSE(f.bal.prompt_running());
  EXPECT_FALSE(f.has(m, 1, Subset::Patches));
  EXPECT_TRUE(f.has(m, 2, Subset::PatchesLoaded));
  EXPECT_TRUE(f.has(m, 3, Subset::Weights));
  EXPECT_EQ(f.bal.subset_stats(m, Subset::Patches).dropped, 1);
}

TEST(BalancerCastPath, StaleVersionOrDeadSourceNeverServes) {
  Fixture f(8);
  const ModelId m = f.bal.register_model("m", "cuda:0");
  Request r = f.req(m, 1);
  auto alive = std::make_shared<std::atomic<bool>>(true);
  auto guard = [&](bool) { return std::make_unique<FlagGuard>(alive); };
  {
    Lease l = f.bal.acquire(r, guard);
    l.filled();
  }
  EXPECT_TRUE(f.bal.acquire(r, guard).hit());
  r.version = 1;  // the source was written in place
  {
    Lease l = f.bal.acquire(r, guard);
    EXPECT_FALSE(l.hit());
    EXPECT_TRUE(l.needs_fill());
    l.filled();
  }
  EXPECT_TRUE(f.bal.acquire(r, guard).hit());
  *alive = false;  // the storage died
  EXPECT_EQ(f.bal.sweep(), U);
  EXPECT_EQ(f.count(m, Subset::Weights), 0);
  EXPECT_EQ(f.bal.subset_stats(m, Subset::Weights).dropped, 2);
}

TEST(BalancerEviction, DeadSourcesGoBeforeAnyTier) {
  Fixture f(2);
  const ModelId m = f.bal.register_model("m", "cuda:0");
  auto alive = std::make_shared<std::atomic<bool>>(true);
  {
    Lease l = f.bal.acquire(f.req(m, 1), [&](bool) { return std::make_unique<FlagGuard>(alive); });
    l.filled();
  }
  ASSERT_TRUE(f.cast(f.req(m, 2)));
  *alive = false;  // pin 1's storage died; pin 2 is newer, so mru would take it first
  ASSERT_TRUE(f.cast(f.req(m, 3)));
  EXPECT_TRUE(f.has(m, 2, Subset::Weights));
  EXPECT_FALSE(f.has(m, 1, Subset::Weights));
  EXPECT_EQ(f.bal.subset_stats(m, Subset::Weights).evictions[0], 0);
}

TEST(BalancerCastPath, UnfilledPinIsDroppedAndNeverServed) {
  Fixture f(8);
  const ModelId m = f.bal.register_model("m", "cuda:0");
  {
    Lease l = f.bal.acquire(f.req(m, 1));
    ASSERT_TRUE(l.needs_fill());
    // Another cast of the same source while it fills: served from the source.
    Lease other = f.bal.acquire(f.req(m, 1));
    EXPECT_FALSE(other);
  }  // dropped without filled(): the fill failed
  EXPECT_EQ(f.count(m, Subset::Weights), 0);
  EXPECT_EQ(f.pool.stats().blocks.current, 0);
}

TEST(BalancerEviction, InFlightAndLeasedPinsAreSkipped) {
  Fixture f(4);
  const ModelId m = f.bal.register_model("m", "cuda:0");
  for (uint64_t i = 0; i < 3; ++i) ASSERT_TRUE(f.cast(f.req(m, i)));
  std::atomic<bool> done{false};
  void* newest = nullptr;
  {
    Lease l = f.bal.acquire(f.req(m, 2));
    newest = l.data();
    f.pool.record_fence(newest, std::make_shared<FakeFence>(&done));
  }
  Lease held = f.bal.acquire(f.req(m, 1));  // a lease out on pin 1
  EXPECT_EQ(f.bal.free(U), U);
  EXPECT_TRUE(f.has(m, 2, Subset::Weights)) << "a pin with a copy in flight was evicted";
  EXPECT_TRUE(f.has(m, 1, Subset::Weights)) << "a leased pin was evicted";
  EXPECT_FALSE(f.has(m, 0, Subset::Weights));
  EXPECT_EQ(f.bal.subset_stats(m, Subset::Weights).inflight_skips, 2);
  done = true;
  EXPECT_EQ(f.bal.free(U), U);
  EXPECT_FALSE(f.has(m, 2, Subset::Weights));
}

TEST(BalancerEviction, ForgetFreesEverythingEvenWithALeaseOut) {
  Fixture f(8);
  const ModelId m = f.bal.register_model("m", "cuda:0");
  for (uint64_t i = 0; i < 3; ++i) ASSERT_TRUE(f.cast(f.req(m, i)));
  {
    Lease l = f.bal.acquire(f.req(m, 0));
    f.bal.forget_model(m);
    EXPECT_FALSE(f.bal.has_model(m));
    EXPECT_EQ(f.pool.stats().blocks.current, 1) << "the leased block lives until the lease ends";
  }
  EXPECT_EQ(f.pool.stats().blocks.current, 0);
  EXPECT_THROW(f.bal.acquire(f.req(m, 0)), ValueError);
  EXPECT_THROW(f.bal.set_active(m, true), ValueError);
  EXPECT_THROW(f.bal.mark_prompt({m}), ValueError);
}

TEST(BalancerBudget, RefusesWhenNothingCanGoAndCounts) {
  Fixture f(1);
  const ModelId m = f.bal.register_model("m", "cuda:0");
  f.bal.set_active(m, true);
  f.bal.mark_prompt({m});
  ASSERT_TRUE(f.cast(f.req(m, 1)));
  EXPECT_FALSE(f.cast(f.req(m, 2)));
  const BalancerStats stats = f.bal.stats();
  EXPECT_EQ(stats.refusals, 1);
  EXPECT_EQ(stats.total.pins, 1);
  EXPECT_EQ(stats.total.bytes, static_cast<int64_t>(U));
  EXPECT_EQ(stats.subsets[static_cast<int>(Subset::Weights)].bytes, static_cast<int64_t>(U));
  EXPECT_EQ(stats.total.misses, 2);
  ASSERT_EQ(stats.models.size(), 1u);
  EXPECT_EQ(stats.models[0].id, m);
  EXPECT_EQ(stats.models[0].name, "m");
  EXPECT_EQ(stats.models[0].refusals, 1);
  EXPECT_TRUE(stats.models[0].active);
  EXPECT_TRUE(stats.models[0].in_prompt);
  EXPECT_TRUE(stats.prompt);
}

// The totals of BalancerStats are the sums of the per-model, per-subset counters.
TEST(BalancerStats, TotalsSumModelsAndSubsets) {
  Fixture f(3);
  const ModelId a = f.bal.register_model("a", "cuda:0");
  const ModelId b = f.bal.register_model("b", "cuda:0");
  f.bal.mark_prompt({b});
  ASSERT_TRUE(f.cast(f.req(a, 1)));                      // a: weights
  ASSERT_TRUE(f.cast(f.req(a, 2, Kind::Weights, true)));  // a: weights-loaded
  ASSERT_TRUE(f.cast(f.req(a, 1)));                      // a: a hit
  ASSERT_TRUE(f.cast(f.req(b, 3)));                      // b: weights
  ASSERT_TRUE(f.cast(f.req(b, 4)));                      // b: evicts a's weights pin (tier 1)
  const BalancerStats st = f.bal.stats();
  ASSERT_EQ(st.models.size(), 2u);
  const ModelStats& ma = st.models[0];
  const ModelStats& mb = st.models[1];
  EXPECT_EQ(ma.id, a);
  EXPECT_EQ(ma.name, "a");
  EXPECT_EQ(mb.name, "b");
  EXPECT_FALSE(ma.in_prompt);
  EXPECT_TRUE(mb.in_prompt);
  const int w = static_cast<int>(Subset::Weights), wl = static_cast<int>(Subset::WeightsLoaded);
  EXPECT_EQ(ma.subsets[w].hits, 1);
  EXPECT_EQ(ma.subsets[w].evictions[0], 1);
  EXPECT_EQ(ma.subsets[w].evicted_bytes, static_cast<int64_t>(U));
  EXPECT_EQ(ma.subsets[wl].pins, 1);
  EXPECT_EQ(ma.total.pins, 1);
  EXPECT_EQ(ma.total.misses, 2);
  EXPECT_EQ(mb.total.pins, 2);
  EXPECT_EQ(st.subsets[w].pins, 2);
  EXPECT_EQ(st.subsets[w].created, 3);
  EXPECT_EQ(st.subsets[wl].pins, 1);
  EXPECT_EQ(st.total.pins, 3);
  EXPECT_EQ(st.total.bytes, static_cast<int64_t>(3 * U));
  EXPECT_EQ(st.total.hits, 1);
  EXPECT_EQ(st.total.misses, 4);
  EXPECT_EQ(st.total.hit_bytes, static_cast<int64_t>(U));
  EXPECT_EQ(st.total.miss_bytes, static_cast<int64_t>(4 * U));
  EXPECT_EQ(st.total.evictions_all(), 1);
  EXPECT_EQ(st.total.evicted_bytes, static_cast<int64_t>(U));
  EXPECT_EQ(st.refusals, 0);
  EXPECT_EQ(st.total.bytes, f.pool.stats().requested_bytes.current);
}

TEST(BalancerBudget, RelieveFreesHeadroomShortfall) {
  Fixture f(8);
  const ModelId m = f.bal.register_model("m", "cuda:0");
  for (uint64_t i = 0; i < 6; ++i) ASSERT_TRUE(f.cast(f.req(m, i)));
  // available = 2 GiB + 2 U now; headroom is 4 GiB: nothing frees 2 GiB of shortfall...
  EXPECT_EQ(f.bal.relieve(), 6 * U) << "everything evictable goes when the shortfall exceeds it";
  f.probe.free_ = 8 * GiB;
  for (uint64_t i = 0; i < 6; ++i) ASSERT_TRUE(f.cast(f.req(m, i)));
  EXPECT_EQ(f.bal.relieve(), 0u) << "available above headroom: nothing to do";
  f.probe.free_ = 4 * GiB + 6 * U - U;  // one unit short
  EXPECT_EQ(f.bal.relieve(), U);
}

TEST(BalancerCeiling, DropsPageLocksAlongTheTiersKeepingMemory) {
  Config c = base_config();
  c.ceiling_max = 0.5;  // R = 1 GiB: ceiling 512 MiB = 8 pins
  c.lock_hysteresis = 2 * U;
  HostPool pool(make_null_backend(), pool_opts());
  FakeProbe probe(pool, 1 * GiB, 64 * GiB);
  Balancer bal(c, pool, probe);
  const ModelId old_model = bal.register_model("old", "cuda:0");
  const ModelId m = bal.register_model("m", "cuda:0");
  auto cast = [&](ModelId id, uint64_t key) {
    Request r;
    r.model = id;
    r.key = PinKey{key, 0, U};
    r.bytes = U;
    Lease l = bal.acquire(r);
    ASSERT_TRUE(l);
    l.filled();
  };
  for (uint64_t i = 0; i < 4; ++i) cast(old_model, i);
  bal.mark_prompt({m});
  for (uint64_t i = 10; i < 14; ++i) cast(m, i);
  EXPECT_EQ(pool.stats().locked_bytes.current, static_cast<int64_t>(8 * U));
  cast(m, 20);  // 9 pins > ceiling: drop to 8 - 2 - 1 = 5 locked before locking it
  EXPECT_EQ(pool.stats().locked_bytes.current, static_cast<int64_t>(6 * U));
  EXPECT_EQ(pool.stats().committed_bytes.current, static_cast<int64_t>(9 * U)) << "memory is kept";
  int unlocked_old = 0, unlocked_m = 0;
  for (const auto& p : bal.pins()) {
    if (!p.locked) (p.model == old_model ? unlocked_old : unlocked_m)++;
  }
  EXPECT_EQ(unlocked_old, 3) << "the out-of-prompt model loses its locks first";
  EXPECT_EQ(unlocked_m, 0);
  EXPECT_EQ(bal.subset_stats(old_model, Subset::Weights).lock_drops, 3);
}

// Note [Trace policy] on a small trace, against the hand-computed
// farthest-next-use answer.
TEST(BalancerPolicy, TraceEvictsFarthestNextUse) {
  for (PolicyKind policy : {PolicyKind::Trace, PolicyKind::Mru}) {
    SCOPED_TRACE(to_string(policy));
    Fixture f(3, policy_config(policy));  // room for three pins
    const ModelId m = f.bal.register_model("m", "cuda:0");
    f.prompt(m, {1, 2, 3, 4, 5});  // no record yet, so mru: 3 goes for 4, 4 for 5
    EXPECT_TRUE(f.has(m, 5, Subset::Weights));
    f.bal.mark_prompt({m});
    // Follows the record [1 2 3 4 5] from 3 on, skipping 1 and 2 (a seed change):
    // 5 comes again in this prompt, 3 first in the next one like it, 1 and 2 in
    // the one after that, 2 last.
    ASSERT_TRUE(f.cast(f.req(m, 3)));
    if (policy == PolicyKind::Trace) {
      EXPECT_FALSE(f.has(m, 2, Subset::Weights)) << "the farthest next use goes";
      EXPECT_TRUE(f.has(m, 5, Subset::Weights));
    } else {
      EXPECT_FALSE(f.has(m, 5, Subset::Weights)) << "mru: the newest pin goes";
    }
    ASSERT_TRUE(f.cast(f.req(m, 4)));  // trace: 1 goes, 5 stays
    const SubsetStats before = f.bal.subset_stats(m, Subset::Weights);
    ASSERT_TRUE(f.cast(f.req(m, 5)));
    const SubsetStats after = f.bal.subset_stats(m, Subset::Weights);
    EXPECT_EQ(after.hits - before.hits, policy == PolicyKind::Trace ? 1 : 0);
    f.bal.end_prompt();
  }
}

// Note [Trace bypass]: a streamed loop one pin larger than the room. Following
// the record, the pin a new one would take is always used before it: the new
// pin is refused and the loop keeps hitting the two it has. Without the bypass
// the farthest-first order evicts and hits 3 of 6, mru 2 of 6.
TEST(BalancerPolicy, TraceBypassesAPinUsedLaterThanEveryVictim) {
  for (PolicyKind policy : {PolicyKind::Trace, PolicyKind::Mru}) {
    SCOPED_TRACE(to_string(policy));
    Fixture f(2, policy_config(policy));  // room for two pins
    const ModelId m = f.bal.register_model("m", "cuda:0");
    const std::vector<uint64_t> loop = {1, 2, 3, 1, 2, 3};
    f.prompt(m, loop);  // no record yet: mru
    const SubsetStats before = f.bal.subset_stats(m, Subset::Weights);
    const int64_t refusals_before = f.bal.stats().refusals;
    f.bal.mark_prompt({m});
    int refused = 0;
    for (uint64_t k : loop) refused += !f.cast(f.req(m, k));
    f.bal.end_prompt();
    const SubsetStats after = f.bal.subset_stats(m, Subset::Weights);
    if (policy == PolicyKind::Trace) {
      EXPECT_EQ(after.hits - before.hits, 4) << "1 and 3 stay pinned; 2 is copied from its source";
      EXPECT_EQ(refused, 2);
      EXPECT_EQ(f.bal.stats().refusals - refusals_before, 2);
      EXPECT_EQ(after.evictions_all() - before.evictions_all(), 0) << "nothing used sooner was evicted";
    } else {
      EXPECT_EQ(after.hits - before.hits, 2);
      EXPECT_EQ(refused, 0);
    }
  }
}

TEST(BalancerPolicy, TraceFallsBackToMruWhenThePromptDeparts) {
  Fixture f(3, policy_config(PolicyKind::Trace));
  const ModelId m = f.bal.register_model("m", "cuda:0");
  for (uint64_t k : {1, 2, 3}) ASSERT_TRUE(f.cast(f.req(m, k)));
  f.bal.end_prompt();
  for (uint64_t k : {7, 8}) ASSERT_TRUE(f.cast(f.req(m, k)));  // departs from [1 2 3]
  // mru: the newest pins go first, 7 for 8.
  EXPECT_FALSE(f.has(m, 7, Subset::Weights));
  EXPECT_TRUE(f.has(m, 1, Subset::Weights));
  EXPECT_EQ(f.bal.stats().trace_departures, 1);
}

// Note [Trace index]: the balancer keeps its by_trace indexes at the recorder's
// ranks through hits, misses, evictions, patch drops at boundaries, departures
// and changes of policy: random workflows of three models (reruns, alternation,
// changed steps, skipped layers, LoRA patches) with room for a third of their pins.
TEST(BalancerPolicy, TraceIndexFollowsTheRecorder) {
  const uint64_t seed = std::random_device{}();
  std::printf("BalancerPolicy.TraceIndexFollowsTheRecorder seed %llu\n", static_cast<unsigned long long>(seed));
  std::mt19937_64 rng(seed);
  Fixture f(12, policy_config(PolicyKind::Trace));
  const ModelId models[] = {f.bal.register_model("a", "cuda:0"), f.bal.register_model("b", "cuda:0"),
                            f.bal.register_model("c", "cuda:0")};
  int checked = 0;
  for (int prompt = 0; prompt < 80; ++prompt) {
    if (prompt == 40) {
      f.bal.configure(policy_config(PolicyKind::Mru));  // a change of policy and back: the indexes go and come again
    } else if (prompt == 44) {
      f.bal.configure(policy_config(PolicyKind::Trace));
    }
    const ModelId m = models[prompt % 2 == 0 ? 0 : (rng() % 3 == 0 ? 2 : 1)];
    f.bal.mark_prompt({m});
    const uint64_t steps = 2 + rng() % 3, layers = 8 + rng() % 6, lora = rng() % 3;
    for (uint64_t s = 0; s < steps; ++s)
      for (uint64_t l = 0; l < layers; ++l) {
        if (rng() % 8 == 0) continue;  // a layer this step skips: the cursor passes it
        f.cast(f.req(m, l));
        if (lora != 0 && l % 3 == 0) f.cast(f.req(m, 1000 * lora + l, Kind::Patches));
        const std::optional<size_t> faults = f.bal.trace_index_faults();
        if (!faults) continue;
        ASSERT_EQ(*faults, 0u) << "seed " << seed << " prompt " << prompt << " step " << s << " layer " << l;
        ++checked;
      }
    f.bal.end_prompt();
  }
  EXPECT_GT(checked, 500) << "the indexes must be kept for most of the casts";
  int64_t evictions = 0;
  for (ModelId m : models) evictions += f.bal.subset_stats(m, Subset::Weights).evictions_all();
  EXPECT_GT(evictions, 100) << "the walk must have been used";
}

// Note [Trace policy]: a pin that the last prompt did not use goes before one it
// did, even when the older record used it first (a seed change after a full run).
TEST(BalancerPolicy, TracePredictsTheNextPromptFromTheLastOne) {
  Fixture f(3, policy_config(PolicyKind::Trace));
  const ModelId m = f.bal.register_model("m", "cuda:0");
  auto run = [&](std::vector<uint64_t> keys) { f.prompt(m, keys); };
  run({1, 2, 3, 4});  // 1: the text encoder; no record yet: mru drops 3 for 4
  run({2, 3, 4});     // a new seed: the encoder's output is cached
  EXPECT_FALSE(f.has(m, 1, Subset::Weights)) << "the encoder, absent from the last prompt, goes first";
  EXPECT_TRUE(f.has(m, 2, Subset::Weights));
  const SubsetStats before = f.bal.subset_stats(m, Subset::Weights);
  run({2, 3, 4});
  EXPECT_EQ(f.bal.subset_stats(m, Subset::Weights).hits - before.hits, 3);
}

// Note [Trace policy]: with two workflows alternating, the record of the
// workflow now running predicts its accesses, and the other one, which followed
// it last time, predicts what comes after.
TEST(BalancerPolicy, TraceFollowsAlternatingWorkflows) {
  Fixture f(2, policy_config(PolicyKind::Trace));
  const ModelId m = f.bal.register_model("m", "cuda:0");
  auto run = [&](std::vector<uint64_t> keys) { f.prompt(m, keys); };
  run({1, 2});  // workflow A
  run({3, 4});  // workflow B: departs from A's record, mru: pins 1 and 4
  // A again: follows A's record; B came after it last time, then A.
  f.bal.mark_prompt({m});
  EXPECT_TRUE(f.cast(f.req(m, 1)));
  // 2 is next used after 4 (B) and after 1 (A comes round first): Note [Trace
  // bypass] refuses it rather than evict either.
  EXPECT_FALSE(f.cast(f.req(m, 2)));
  f.bal.end_prompt();
  EXPECT_TRUE(f.has(m, 4, Subset::Weights)) << "B's pin is kept for the next prompt";
  EXPECT_TRUE(f.has(m, 1, Subset::Weights));
  const SubsetStats before = f.bal.subset_stats(m, Subset::Weights);
  f.bal.mark_prompt({m});
  EXPECT_FALSE(f.cast(f.req(m, 3))) << "next used after A's 1: refused again";
  EXPECT_TRUE(f.cast(f.req(m, 4)));
  f.bal.end_prompt();
  EXPECT_EQ(f.bal.subset_stats(m, Subset::Weights).hits - before.hits, 1);
}

// A LoRA swap changes the patch tensors, not the order of the weights: the
// prompt keeps following the record.
TEST(BalancerPolicy, TraceSkipsPatchesOfAnotherSignature) {
  Fixture f(8, policy_config(PolicyKind::Trace));
  const ModelId m = f.bal.register_model("m", "cuda:0");
  for (int64_t sig : {11, 12}) {
    f.bal.mark_prompt({m});
    ASSERT_TRUE(f.cast(f.req(m, 1)));
    Request p = f.req(m, 100 + sig, Kind::Patches, false, 1 * MiB);
    p.signature = sig;
    ASSERT_TRUE(f.cast(p));
    ASSERT_TRUE(f.cast(f.req(m, 2)));
    f.bal.end_prompt();
  }
  EXPECT_EQ(f.bal.stats().trace_departures, 0);
}

// Records stay bounded: other policies keep none, and a prompt past the limit
// (or a process that never ends one) keeps none either.
TEST(BalancerPolicy, TraceRecordsAreBounded) {
  Fixture mru(8);
  const ModelId a = mru.bal.register_model("a", "cuda:0");
  mru.prompt(a, {1, 2, 3});
  EXPECT_EQ(mru.bal.stats().trace_records, 0) << "mru needs no record";
  EXPECT_EQ(mru.bal.stats().trace_bytes, 0);

  Fixture f(8, policy_config(PolicyKind::Trace));
  const ModelId m = f.bal.register_model("m", "cuda:0");
  f.prompt(m, {1, 2, 3});
  EXPECT_EQ(f.bal.stats().trace_records, 1);
  const int64_t one = f.bal.stats().trace_bytes;
  EXPECT_GT(one, 0) << "Note [Trace memory]: the record's bytes";
  f.bal.mark_prompt({m});
  for (size_t i = 0; i < (size_t{1} << 20) + 10; ++i) ASSERT_TRUE(f.cast(f.req(m, 1 + i % 3)));
  EXPECT_LT(f.bal.stats().trace_bytes, one + 4096) << "past the limit the prompt holds none of its accesses";
  f.bal.end_prompt();
  EXPECT_EQ(f.bal.stats().trace_records, 1) << "a prompt past the limit left a record";
  EXPECT_LE(f.bal.stats().trace_bytes, one) << "nor kept the accesses it recorded";
  f.prompt(m, {1, 2, 3});
  EXPECT_EQ(f.bal.stats().trace_records, 2) << "recording resumes after the boundary";
}

// Note [Reuse policy]: the indexes follow the pins: built when the policy is
// switched on with pins there, moved at every hit, dropped with every eviction
// (the sanitizer runs would see a dangling entry), cleared when it is switched
// off; the history counts sources, recorded under reuse only.
TEST(BalancerPolicy, ReuseKeepsItsIndexesThroughUsesEvictionsAndPolicyChanges) {
  Fixture f(4);
  const ModelId a = f.bal.register_model("a", "cuda:0");
  const ModelId b = f.bal.register_model("b", "cuda:0");
  f.prompt(a, {1, 2, 3, 4});
  EXPECT_EQ(f.bal.stats().reuse_keys, 0) << "mru keeps no history";
  Config c = base_config();
  c.policy = PolicyKind::Reuse;
  f.bal.configure(c);  // indexes built from the four pins there
  f.prompt(b, {11, 12});
  f.prompt(a, {1, 2, 3, 4});
  f.prompt(b, {11, 12});
  EXPECT_EQ(f.bal.pins().size(), 4u) << "RAM for four";
  EXPECT_EQ(f.bal.stats().reuse_keys, 6);
  f.bal.configure(base_config());
  f.bal.configure(c);
  EXPECT_EQ(f.bal.free(64 * U), 4 * U);
  EXPECT_TRUE(f.bal.pins().empty());
  f.prompt(a, {1, 2});
  EXPECT_EQ(f.bal.pins().size(), 2u);
}

// ------------------------------------------------------------------ staleness the caller reports
// Note [Pin validity], Note [Source index].

TEST(BalancerValidity, ASourceWithoutAVersionCounterIsPinnedAndHits) {
  Fixture f(8);
  const ModelId m = f.bal.register_model("m", "cuda:0");
  Request r = f.req(m, 1);
  r.version = std::nullopt;  // an inference tensor
  ASSERT_TRUE(f.cast(r));
  Lease l = f.bal.acquire(r);
  EXPECT_TRUE(l.hit());
  r.version = 0;  // a source with a counter is another source
  l = f.bal.acquire(r);
  EXPECT_TRUE(l.needs_fill());
}

TEST(BalancerValidity, AWeightsSignatureChangeRefills) {
  Fixture f(8);
  const ModelId m = f.bal.register_model("m", "cuda:0");
  for (bool resident : {false, true}) {
    Request r = f.req(m, resident ? 2 : 1, Kind::Weights, resident);
    r.signature = 7;
    ASSERT_TRUE(f.cast(r));
    EXPECT_TRUE(f.bal.acquire(r).hit()) << "the same content signature";
    r.signature = 8;  // the caller rewrote the source
    {
      Lease l = f.bal.acquire(r);
      EXPECT_FALSE(l.hit());
      EXPECT_TRUE(l.needs_fill());
      l.filled();
    }
    r.signature = std::nullopt;  // no signature is not a wildcard
    Lease l = f.bal.acquire(r);
    EXPECT_FALSE(l.hit());
    EXPECT_TRUE(l.needs_fill());
    l.filled();
  }
  EXPECT_EQ(f.bal.subset_stats(m, Subset::Weights).dropped, 2);
  EXPECT_EQ(f.bal.subset_stats(m, Subset::WeightsLoaded).dropped, 2);
}

TEST(BalancerInvalidate, DropsOverlappingPinsOfEveryModelAndSubsetOnly) {
  Fixture f(16);
  const ModelId a = f.bal.register_model("a", "cuda:0");
  const ModelId b = f.bal.register_model("b", "cuda:0");
  const auto at = [&](ModelId m, uint64_t offset, Kind kind = Kind::Weights, bool resident = false) {
    Request r = f.req(m, 7, kind, resident, 1 * MiB);
    r.key.offset = offset;
    return r;
  };
  // Storage 7: [0, 1M) in a's weights, [1M, 2M) in a's weights-loaded and b's
  // patches, [4M, 5M) in b's weights; storage 8 at the same offsets.
  ASSERT_TRUE(f.cast(at(a, 0)));
  ASSERT_TRUE(f.cast(at(a, 1 * MiB, Kind::Weights, true)));
  ASSERT_TRUE(f.cast(at(b, 1 * MiB, Kind::Patches)));
  ASSERT_TRUE(f.cast(at(b, 4 * MiB)));
  Request other = f.req(a, 8, Kind::Weights, false, 1 * MiB);
  ASSERT_TRUE(f.cast(other));
  EXPECT_EQ(f.bal.invalidate(7, 1 * MiB - 1, 2), 3 * MiB) << "one byte either side of 1M";
  EXPECT_TRUE(f.has(b, 7, Subset::Weights));
  EXPECT_TRUE(f.has(a, 8, Subset::Weights));
  EXPECT_EQ(f.count(a, Subset::Weights), 1);
  EXPECT_EQ(f.count(a, Subset::WeightsLoaded), 0);
  EXPECT_EQ(f.count(b, Subset::Patches), 0);
  EXPECT_EQ(f.bal.invalidate(7, 2 * MiB, 2 * MiB), 0u) << "the gap";
  EXPECT_EQ(f.bal.invalidate(9, 0, 1 * GiB), 0u) << "no pin of that storage";
  const BalancerStats st = f.bal.stats();
  EXPECT_EQ(st.total.invalidated, 3);
  EXPECT_EQ(st.total.dropped, 3);
  EXPECT_EQ(st.models[0].subsets[static_cast<int>(Subset::WeightsLoaded)].invalidated, 1);
  EXPECT_EQ(st.total.bytes, f.pool.stats().requested_bytes.current);
  // The next cast of an invalidated source makes its pin again.
  Lease l = f.bal.acquire(at(a, 0));
  EXPECT_TRUE(l.needs_fill());
}

TEST(BalancerInvalidate, ALeasedOrFillingPinIsDetachedNeverServedAgain) {
  Fixture f(8);
  const ModelId m = f.bal.register_model("m", "cuda:0");
  Lease filling = f.bal.acquire(f.req(m, 1));
  ASSERT_TRUE(filling.needs_fill());
  ASSERT_TRUE(f.cast(f.req(m, 2)));
  Lease reading = f.bal.acquire(f.req(m, 2));
  ASSERT_TRUE(reading.hit());
  EXPECT_EQ(f.bal.invalidate(1, 0, U), U);
  EXPECT_EQ(f.bal.invalidate(2, 0, U), U);
  EXPECT_EQ(f.count(m, Subset::Weights), 0);
  EXPECT_EQ(f.pool.stats().blocks.current, 2) << "the holders' blocks live on";
  filling.filled();  // the filler finishes with the bytes it read
  {
    Lease again = f.bal.acquire(f.req(m, 1));
    EXPECT_TRUE(again.needs_fill()) << "a detached pin is never served";
    again.filled();
  }
  filling = Lease();
  reading = Lease();
  EXPECT_EQ(f.pool.stats().blocks.current, 1) << "detached blocks go back when released";
  EXPECT_EQ(f.bal.stats().total.bytes, f.pool.stats().requested_bytes.current);
}

TEST(BalancerInvalidate, APinBeingEvictedIsDroppedToo) {
  Fixture f(8);
  const ModelId m = f.bal.register_model("m", "cuda:0");
  ASSERT_TRUE(f.cast(f.req(m, 1)));
  std::atomic<bool> done{false};
  {
    Lease l = f.bal.acquire(f.req(m, 1));
    f.pool.record_fence(l.data(), std::make_shared<FakeFence>(&done));
  }
  // A copy in flight: eviction skips it, invalidation detaches it.
  EXPECT_EQ(f.bal.free(U), 0u);
  EXPECT_EQ(f.bal.invalidate(1, 0, 1), U);
  EXPECT_TRUE(f.bal.acquire(f.req(m, 1)).needs_fill());
  done = true;
}

TEST(BalancerInvalidate, AnyPartOfAGatheredPinDropsTheGroup) {
  Fixture f(8);
  const ModelId m = f.bal.register_model("m", "cuda:0");
  Request g = f.req(m, 1, Kind::Weights, false, 2 * MiB);
  g.key.layout = 2;  // a group's key
  g.parts = {SourcePart{PinKey{1, 0, 1 * MiB, 0}, 1 * MiB, 3}, SourcePart{PinKey{5, 4096, 1 * MiB, 0}, 1 * MiB, 0}};
  ASSERT_TRUE(f.cast(g));
  EXPECT_TRUE(f.bal.acquire(g).hit());
  g.parts[1].version = 1;  // the second part was written in place
  EXPECT_FALSE(f.bal.acquire(g).hit()) << "one stale part makes the group stale";
  ASSERT_TRUE(f.cast(g));
  Request collide = g;  // another group whose key collides with g's
  collide.parts[1].key.offset = 8192;
  EXPECT_TRUE(f.bal.acquire(collide).needs_fill()) << "parts are compared, not only the key";
  ASSERT_TRUE(f.cast(g));
  EXPECT_EQ(f.bal.invalidate(5, 4096 + 1 * MiB - 1, 1), 2 * MiB) << "the last byte of the second part";
  EXPECT_EQ(f.count(m, Subset::Weights), 0);
}

TEST(BalancerInvalidate, InvalidateModelDropsThatModelsPinsOnly) {
  Fixture f(16);
  const ModelId a = f.bal.register_model("a", "cuda:0");
  const ModelId b = f.bal.register_model("b", "cuda:0");
  ASSERT_TRUE(f.cast(f.req(a, 1)));
  ASSERT_TRUE(f.cast(f.req(a, 2, Kind::Weights, true)));
  ASSERT_TRUE(f.cast(f.req(a, 3, Kind::Patches)));
  ASSERT_TRUE(f.cast(f.req(b, 1)));
  EXPECT_EQ(f.bal.invalidate_model(a), 3 * U);
  EXPECT_TRUE(f.bal.has_model(a)) << "the model stays registered";
  EXPECT_EQ(f.bal.stats().models[0].total.pins, 0);
  EXPECT_EQ(f.bal.stats().models[0].total.invalidated, 3);
  EXPECT_TRUE(f.has(b, 1, Subset::Weights));
  EXPECT_EQ(f.bal.invalidate(1, 0, U), U) << "the index forgot a's pins";
  EXPECT_EQ(f.bal.invalidate_model(a), 0u);
  EXPECT_THROW(f.bal.invalidate_model(424242), ValueError);
}

// ------------------------------------------------------------------ node boundaries, model options

TEST(BalancerNode, EndNodeDropsPatchesAndClearsActiveButKeepsThePrompt) {
  Fixture f(16);
  const ModelId a = f.bal.register_model("a", "cuda:0");
  const ModelId b = f.bal.register_model("b", "cuda:0");
  f.bal.mark_prompt({a, b});
  f.bal.set_active(a, true);
  f.bal.set_active(b, true);
  ASSERT_TRUE(f.cast(f.req(a, 1, Kind::Patches)));
  Request loaded = f.req(a, 2, Kind::Patches, true);
  loaded.signature = 4;
  ASSERT_TRUE(f.cast(loaded));
  ASSERT_TRUE(f.cast(f.req(b, 3)));
  f.bal.end_node();
  const BalancerStats st = f.bal.stats();
  EXPECT_TRUE(st.prompt);
  for (const ModelStats& ms : st.models) {
    EXPECT_FALSE(ms.active) << ms.name;
    EXPECT_TRUE(ms.in_prompt) << ms.name;
  }
  EXPECT_EQ(f.count(a, Subset::Patches), 0);
  EXPECT_EQ(f.count(a, Subset::PatchesLoaded), 1);
  EXPECT_TRUE(f.has(b, 3, Subset::Weights));
  EXPECT_EQ(st.models[0].subsets[static_cast<int>(Subset::Patches)].dropped, 1);
}

TEST(BalancerCastPath, AFastDiskModelGetsNoLoadedPins) {
  Fixture f(8);
  const ModelId fast = f.bal.register_model("fast", "cuda:0", ModelOptions{.fast_disk = true});
  const ModelId slow = f.bal.register_model("slow", "cuda:0");
  ASSERT_TRUE(f.cast(f.req(fast, 1, Kind::Weights, true)));
  ASSERT_TRUE(f.cast(f.req(slow, 2, Kind::Weights, true)));
  Request patch = f.req(fast, 3, Kind::Patches, true);
  patch.signature = 1;
  ASSERT_TRUE(f.cast(patch));
  EXPECT_TRUE(f.has(fast, 1, Subset::Weights));
  EXPECT_TRUE(f.has(fast, 3, Subset::Patches));
  EXPECT_TRUE(f.has(slow, 2, Subset::WeightsLoaded));
  const BalancerStats st = f.bal.stats();
  EXPECT_TRUE(st.models[0].options.fast_disk);
  EXPECT_FALSE(st.models[1].options.fast_disk);
  EXPECT_EQ(st.models[0].load_device, "cuda:0");
}

// ------------------------------------------------------------------ casts served from the source

TEST(BalancerBypass, EveryReasonIsCountedPerModelAndGlobally) {
  Fixture f(2);
  const ModelId m = f.bal.register_model("m", "cuda:0");
  f.bal.mark_prompt({m});
  f.bal.set_active(m, true);
  const auto bypassed = [&](Bypass b) { return f.bal.stats().models.at(0).bypassed[static_cast<int>(b)]; };
  // empty: no bytes, no pin, no miss.
  EXPECT_FALSE(f.bal.acquire(f.req(m, 1, Kind::Weights, false, 0)));
  EXPECT_EQ(bypassed(Bypass::Empty), 1);
  EXPECT_EQ(f.bal.stats().total.misses, 0);
  // busy: the pin is still being filled by another cast.
  {
    Lease filling = f.bal.acquire(f.req(m, 2));
    EXPECT_FALSE(f.bal.acquire(f.req(m, 2)));
    EXPECT_EQ(bypassed(Bypass::Busy), 1);
    filling.filled();
  }
  // refused: the active model's streaming pins may not go, and there is no room.
  ASSERT_TRUE(f.cast(f.req(m, 3)));
  EXPECT_FALSE(f.cast(f.req(m, 4)));
  EXPECT_EQ(bypassed(Bypass::Refused), 1);
  // raced: another cast pins the same source while this one made room.
  ASSERT_EQ(f.bal.free(2 * U, true), 2 * U);
  {
    Lease outer = f.bal.acquire(f.req(m, 5), [&](bool) -> std::unique_ptr<SourceGuard> {
      EXPECT_TRUE(f.cast(f.req(m, 5)));  // the other thread's cast, inside this one's window
      return nullptr;
    });
    EXPECT_FALSE(outer);
  }
  EXPECT_EQ(bypassed(Bypass::Raced), 1);
  EXPECT_TRUE(f.has(m, 5, Subset::Weights));
  // forgotten: the model went while its pin was being made (global only).
  const int64_t refusals = f.bal.stats().refusals;
  Lease orphan = f.bal.acquire(f.req(m, 6), [&](bool) -> std::unique_ptr<SourceGuard> {
    f.bal.forget_model(m);
    return nullptr;
  });
  EXPECT_FALSE(orphan);
  const BalancerStats st = f.bal.stats();
  EXPECT_EQ(st.bypassed[static_cast<int>(Bypass::Forgotten)], 1);
  EXPECT_EQ(st.bypassed[static_cast<int>(Bypass::Empty)], 1);
  EXPECT_EQ(st.bypassed[static_cast<int>(Bypass::Busy)], 1);
  EXPECT_EQ(st.bypassed[static_cast<int>(Bypass::Refused)], 1);
  EXPECT_EQ(st.bypassed[static_cast<int>(Bypass::Raced)], 1);
  EXPECT_EQ(st.bypassed_all(), 5);
  EXPECT_EQ(st.refusals, refusals) << "only the budget and the pool refuse";
  EXPECT_EQ(f.pool.stats().blocks.current, 0);
}

TEST(BalancerBypass, APoolRefusalIsItsOwnReason) {
  PoolOptions o = pool_opts();
  o.cap = 2 * MiB;
  HostPool pool(make_null_backend(), o);
  FakeProbe probe(pool, 64 * GiB, 32 * GiB);
  Balancer bal(base_config(), pool, probe);
  const ModelId m = bal.register_model("m", "cuda:0");
  Request r;
  r.model = m;
  r.key = PinKey{1, 0, 4 * MiB};
  r.bytes = 4 * MiB;  // past the pool's cap; the budget has room
  EXPECT_FALSE(bal.acquire(r));
  const BalancerStats st = bal.stats();
  EXPECT_EQ(st.bypassed[static_cast<int>(Bypass::Pool)], 1);
  EXPECT_EQ(st.models[0].bypassed[static_cast<int>(Bypass::Pool)], 1);
  EXPECT_EQ(st.refusals, 1);
  bal.count_plain_copy();
  bal.count_plain_copy();
  EXPECT_EQ(bal.stats().plain_copies, 2);
  EXPECT_STREQ(to_string(Bypass::Pool), "pool");
  EXPECT_STREQ(to_string(Bypass::Empty), "empty");
}

// ------------------------------------------------------------------ reliability (docs/RELIABILITY.md)

// A backend whose unlock() can wait at a gate: the extent stays "being
// unlocked" (Note [Copies from a block]) as long as the test wants.
class GatedBackend : public HostBackend {
 public:
  GatedBackend() : inner_(make_null_backend()) {}
  const char* name() const override { return "gated"; }
  size_t page_size() const override { return inner_->page_size(); }
  bool can_lock() const override { return true; }
  int reserve(size_t size, void** addr) override { return inner_->reserve(size, addr); }
  int release(void* addr, size_t size) override { return inner_->release(addr, size); }
  int commit(void* addr, size_t size) override { return inner_->commit(addr, size); }
  int decommit(void* addr, size_t size) override { return inner_->decommit(addr, size); }
  int lock(void* addr, size_t size) override { return inner_->lock(addr, size); }
  int unlock(void* addr, size_t size) override {
    if (gated) {
      entered = true;
      while (!open) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return inner_->unlock(addr, size);
  }
  std::atomic<bool> gated{false}, entered{false}, open{false};

 private:
  std::unique_ptr<HostBackend> inner_;
};

PoolOptions shared_extent_opts() {  // pins of 1 MiB share 8 MiB extents
  PoolOptions o = pool_opts();
  o.extent_min = 8 * MiB;
  return o;
}

Request small_req(ModelId m, uint64_t id, uint64_t bytes = 1 * MiB) {
  Request r;
  r.model = m;
  r.key = PinKey{id, 0, bytes};
  r.bytes = bytes;
  return r;
}

bool fill(Balancer& bal, const Request& r, const Balancer::MakeGuard& guard = {}) {
  Lease l = bal.acquire(r, guard);
  if (!l) return false;
  if (l.needs_fill()) l.filled();
  return true;
}

int copies_on(const HostPool& pool, const void* block) {
  for (const auto& b : pool.snapshot().blocks)
    if (b.addr == reinterpret_cast<uintptr_t>(block)) return b.copies;
  return -1;
}

bool pin_locked(const Balancer& bal, ModelId m, uint64_t id) {
  for (const auto& p : bal.pins())
    if (p.model == m && p.key.storage == id) return p.locked;
  ADD_FAILURE() << "no pin " << id << " of model " << m;
  return false;
}

// Note [Copies from a block]: every lease (a hit or a fill) is a copy begun on
// its block, ended when the lease goes (after the op recorded its fence).
TEST(BalancerCopies, ALeaseIsACopyBegunUntilItIsReleased) {
  Fixture f(8);
  const ModelId m = f.bal.register_model("m", "cuda:0");
  void* block = nullptr;
  {
    Lease l = f.bal.acquire(f.req(m, 1));
    block = l.data();
    EXPECT_EQ(copies_on(f.pool, block), 1) << "a fill lease announces its copy";
    l.filled();
  }
  EXPECT_EQ(copies_on(f.pool, block), 0);
  EXPECT_FALSE(f.pool.in_flight(block));
  {
    Lease hit = f.bal.acquire(f.req(m, 1));
    ASSERT_TRUE(hit.hit());
    Lease hit2 = f.bal.acquire(f.req(m, 1));
    EXPECT_EQ(copies_on(f.pool, block), 2) << "each lease is one copy";
    EXPECT_TRUE(f.pool.in_flight(block)) << "a copy issued and not fenced yet is in flight";
  }
  EXPECT_EQ(copies_on(f.pool, block), 0);
  EXPECT_EQ(f.pool.stats().copies.current, 0);
}

// The window between a copy's issue and its fence's recording
// (Note [Copies from a block]): two pins in one extent, a lease out on one.
// Dropping page-locks over the ceiling picks the other pin, and unlocking it
// would drop the whole extent's lock under the copy.
TEST(BalancerCopies, LockDropsSpareAnExtentWithACopyBegunAndNoFence) {
  Config c = base_config();
  c.lock_hysteresis = 0;
  HostPool pool(make_null_backend(), shared_extent_opts());
  FakeProbe probe(pool, 64 * GiB, 64 * GiB);
  Balancer bal(c, pool, probe);
  const ModelId old_model = bal.register_model("old", "cuda:0");
  const ModelId m = bal.register_model("m", "cuda:0");
  ASSERT_TRUE(fill(bal, small_req(old_model, 1)));
  ASSERT_TRUE(fill(bal, small_req(old_model, 2)));
  ASSERT_EQ(pool.stats().locked_bytes.current, static_cast<int64_t>(8 * MiB)) << "one shared extent";
  Lease copying = bal.acquire(small_req(old_model, 1));  // pin 1: copy issued, no fence yet
  ASSERT_TRUE(copying.hit());
  c.ceiling_max = static_cast<double>(8 * MiB) / static_cast<double>(64 * GiB);  // ceiling: 8 MiB, locked now
  bal.configure(c);
  bal.mark_prompt({m});
  ASSERT_TRUE(fill(bal, small_req(m, 3)));  // over the ceiling: pin 2's lock is the one to drop
  EXPECT_TRUE(pin_locked(bal, old_model, 1)) << "the extent lost its page-lock under a copy in flight";
  EXPECT_TRUE(pin_locked(bal, old_model, 2));
  EXPECT_EQ(bal.subset_stats(old_model, Subset::Weights).lock_drops, 0);
  EXPECT_GE(pool.stats().busy_unlocks, 1);
  EXPECT_FALSE(pin_locked(bal, m, 3)) << "the new pin is made pageable instead";
  copying = Lease();  // the copy ended (its fence, if any, recorded before)
  ASSERT_TRUE(fill(bal, small_req(m, 4)));
  EXPECT_FALSE(pin_locked(bal, old_model, 1)) << "with no copy left, the lock drops";
  EXPECT_EQ(bal.subset_stats(old_model, Subset::Weights).lock_drops, 1);
  pool.check_invariants();
}

// While an unlock is dropping an extent's lock, no copy begins on it: a hit on
// a pin of that extent is served from the source, counted as `unlocking`.
TEST(BalancerCopies, APinWhoseExtentIsBeingUnlockedIsServedFromTheSource) {
  auto backend = std::make_unique<GatedBackend>();
  GatedBackend* gate = backend.get();
  HostPool pool(std::move(backend), shared_extent_opts());
  FakeProbe probe(pool, 64 * GiB, 64 * GiB);
  Balancer bal(base_config(), pool, probe);
  const ModelId m = bal.register_model("m", "cuda:0");
  ASSERT_TRUE(fill(bal, small_req(m, 1)));
  ASSERT_TRUE(fill(bal, small_req(m, 2)));
  void* other = nullptr;
  {
    Lease l = bal.acquire(small_req(m, 2));
    other = l.data();
  }
  gate->gated = true;
  std::thread unlocker([&] { EXPECT_EQ(pool.unlock(other), 8 * MiB); });
  while (!gate->entered) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  {
    Lease l = bal.acquire(small_req(m, 1));
    EXPECT_FALSE(l) << "a copy began on an extent whose page-lock is being dropped";
  }
  gate->open = true;
  unlocker.join();
  const BalancerStats st = bal.stats();
  EXPECT_EQ(st.bypassed[static_cast<int>(Bypass::Unlocking)], 1);
  EXPECT_EQ(st.models[0].bypassed[static_cast<int>(Bypass::Unlocking)], 1);
  EXPECT_EQ(st.total.hits, 1) << "the refused hit is a miss";
  EXPECT_STREQ(to_string(Bypass::Unlocking), "unlocking");
  EXPECT_TRUE(bal.acquire(small_req(m, 1)).hit()) << "served again once the unlock is over";
}

// A leased block is never reused while its copy can be in flight: not while
// the copy is begun (the lease), nor after, while its fence is pending, even
// when its pin was dropped meanwhile.
TEST(BalancerCopies, ALeasedBlockIsNeverReusedBeforeItsCopyIsDone) {
  Fixture f(8);
  const ModelId m = f.bal.register_model("m", "cuda:0");
  ASSERT_TRUE(f.cast(f.req(m, 1)));
  std::atomic<bool> done{false};
  void* block = nullptr;
  {
    Lease l = f.bal.acquire(f.req(m, 1));
    block = l.data();
    EXPECT_EQ(f.bal.invalidate(1, 0, U), U);  // detached: never served again
    EXPECT_TRUE(f.pool.in_flight(block));
    for (uint64_t k = 10; k < 13; ++k) {
      Lease n = f.bal.acquire(f.req(m, k));
      ASSERT_TRUE(n);
      EXPECT_NE(n.data(), block) << "reused while a copy from it was begun";
      n.filled();
    }
    f.pool.record_fence(block, std::make_shared<FakeFence>(&done));  // the op fences, then lets go
  }
  EXPECT_EQ(f.bal.free(3 * U), 3 * U);
  for (uint64_t k = 20; k < 23; ++k) {
    Lease n = f.bal.acquire(f.req(m, k));
    ASSERT_TRUE(n);
    EXPECT_NE(n.data(), block) << "reused while its fence was pending";
    n.filled();
  }
  EXPECT_EQ(f.pool.stats().copies.current, 0);
  done = true;
  f.pool.check_invariants();
}

// Note [Dead source reclaim]: with no boundary, free or pressure, the pins of
// dead sources go within a bounded number of later casts, each checking a
// bounded number of guards.
class CountingGuard : public SourceGuard {
 public:
  CountingGuard(std::shared_ptr<std::atomic<bool>> alive, std::atomic<int>* calls)
      : alive_(std::move(alive)), calls_(calls) {}
  bool alive() const override {
    calls_->fetch_add(1);
    return alive_->load();
  }

 private:
  std::shared_ptr<std::atomic<bool>> alive_;
  std::atomic<int>* calls_;
};

TEST(BalancerReclaim, DeadSourcesGoWithinBoundedCallsWithoutABoundary) {
  Fixture f(64);
  const ModelId m = f.bal.register_model("m", "cuda:0");
  constexpr int kPins = 48;
  std::atomic<int> calls{0};
  std::vector<std::shared_ptr<std::atomic<bool>>> alive;
  for (int i = 0; i < kPins; ++i) {
    alive.push_back(std::make_shared<std::atomic<bool>>(true));
    ASSERT_TRUE(fill(f.bal, small_req(m, 100 + i), [&, i](bool) { return std::make_unique<CountingGuard>(alive[i], &calls); }));
  }
  ASSERT_TRUE(fill(f.bal, small_req(m, 1)));  // a live source without a guard, cast over and over
  std::mt19937 rng(12);
  for (int i = 0; i < kPins; ++i)
    if (rng() % 3 != 0) *alive[i] = false;
  const auto dead_left = [&] {
    int n = 0;
    for (const auto& p : f.bal.pins()) n += p.key.storage >= 100 && !*alive[p.key.storage - 100];
    return n;
  };
  std::vector<bool> invalidated(kPins, false);
  const int bound = (kPins + 1) / (Balancer::kReclaimPerCall - 1) + 1;
  int n = 0;
  for (; n < bound && dead_left() > 0; ++n) {
    calls = 0;
    const int64_t before = f.bal.subset_stats(m, Subset::Weights).dropped;
    ASSERT_TRUE(f.bal.acquire(small_req(m, 1)).hit());
    EXPECT_LE(calls.load(), Balancer::kReclaimPerCall) << "unbounded work in one cast";
    EXPECT_LE(f.bal.subset_stats(m, Subset::Weights).dropped - before, Balancer::kReclaimPerCall);
    if (n % 2 == 1) {  // removals mid-round must not hide a pin from the cursor
      const int k = static_cast<int>(rng() % kPins);
      f.bal.invalidate(100 + k, 0, 1 * MiB);
      invalidated[k] = true;
    }
  }
  EXPECT_EQ(dead_left(), 0) << "pins of dead sources left after " << n << " casts, with no boundary";
  for (int i = 0; i < kPins; ++i)
    if (*alive[i] && !invalidated[i]) EXPECT_TRUE(f.has(m, 100 + i, Subset::Weights)) << "a live pin was dropped: " << i;
  EXPECT_FALSE(f.bal.prompt_running());
}

// The ring under random makes, deaths and drops anywhere relative to the cursor:
// no pin of a dead source outlives the bound, counted in casts since it died.
TEST(BalancerReclaim, NoDeadSourceOutlivesTheBoundUnderRandomDrops) {
  Fixture f(1024);
  const ModelId m = f.bal.register_model("m", "cuda:0");
  const unsigned seed = std::random_device{}();
  std::printf("BalancerReclaim.NoDeadSourceOutlivesTheBoundUnderRandomDrops seed=%u\n", seed);
  std::mt19937 rng(seed);
  constexpr int kKeys = 64;
  std::vector<std::shared_ptr<std::atomic<bool>>> alive(kKeys);
  std::vector<int> dead_since(kKeys, -1);  // casts since its source died; -1: alive or not pinned
  for (int step = 0; step < 3000; ++step) {
    const int k = static_cast<int>(rng() % kKeys);
    const int op = static_cast<int>(rng() % 10);
    if (op < 5) {  // a cast (makes a pin for a key without one)
      if (!alive[k] || !*alive[k] || !f.has(m, 100 + k, Subset::Weights)) {  // a new source
        alive[k] = std::make_shared<std::atomic<bool>>(true);
        dead_since[k] = -1;
      }
      auto flag = alive[k];
      ASSERT_TRUE(fill(f.bal, small_req(m, 100 + k), [flag](bool) { return std::make_unique<FlagGuard>(flag); }));
      for (int& d : dead_since)
        if (d >= 0) ++d;
    } else if (op < 8) {  // its source dies
      if (alive[k] && *alive[k] && f.has(m, 100 + k, Subset::Weights)) {
        *alive[k] = false;
        dead_since[k] = 0;
      }
    } else {  // dropped another way, wherever its slot is
      f.bal.invalidate(100 + k, 0, 1 * MiB);
      dead_since[k] = -1;
    }
    const int bound = (kKeys + 1) / (Balancer::kReclaimPerCall - 1) + 2;
    for (int i = 0; i < kKeys; ++i) {
      if (dead_since[i] < 0) continue;
      if (!f.has(m, 100 + i, Subset::Weights)) {
        dead_since[i] = -1;  // reclaimed
      } else {
        ASSERT_LE(dead_since[i], bound) << "pin " << i << " of a dead source at step " << step;
      }
    }
  }
}

// relieve() (the monitor's poll, and node and prompt boundaries) takes a step too.
TEST(BalancerReclaim, RelieveReclaimsWithoutAnyCast) {
  Fixture f(64);
  const ModelId m = f.bal.register_model("m", "cuda:0");
  auto alive = std::make_shared<std::atomic<bool>>(true);
  for (uint64_t i = 0; i < 20; ++i)
    ASSERT_TRUE(fill(f.bal, small_req(m, i), [&](bool) { return std::make_unique<FlagGuard>(alive); }));
  *alive = false;
  for (int i = 0; i < 20 / Balancer::kReclaimPerCall + 1; ++i) f.bal.relieve();
  EXPECT_EQ(f.count(m, Subset::Weights), 0);
  EXPECT_EQ(f.pool.stats().blocks.current, 0);
}

// COUNT and SUM totals never decrease: forgetting a model keeps its hits,
// misses, evictions... in BalancerStats::total and the subsets; levels drop.
TEST(BalancerStats, LifetimeTotalsNeverDecrease) {
  Fixture f(3);
  const ModelId a = f.bal.register_model("a", "cuda:0");
  const ModelId b = f.bal.register_model("b", "cuda:0");
  f.bal.mark_prompt({b});
  ASSERT_TRUE(f.cast(f.req(a, 1)));
  ASSERT_TRUE(f.cast(f.req(a, 1)));                      // a hit
  ASSERT_TRUE(f.cast(f.req(a, 2, Kind::Weights, true)));  // weights-loaded
  ASSERT_TRUE(f.cast(f.req(b, 3)));
  ASSERT_TRUE(f.cast(f.req(b, 4)));  // evicts a's weights pin
  f.bal.invalidate(2, 0, U);
  const BalancerStats before = f.bal.stats();
  f.bal.forget_model(a);
  f.bal.forget_model(b);
  const BalancerStats after = f.bal.stats();
  const auto check = [&](const SubsetStats& s0, const SubsetStats& s1, const std::string& what) {
    EXPECT_EQ(s1.hits, s0.hits) << what;
    EXPECT_EQ(s1.misses, s0.misses) << what;
    EXPECT_EQ(s1.hit_bytes, s0.hit_bytes) << what;
    EXPECT_EQ(s1.miss_bytes, s0.miss_bytes) << what;
    EXPECT_EQ(s1.created, s0.created) << what;
    for (int t = 0; t < kTiers; ++t) EXPECT_EQ(s1.evictions[t], s0.evictions[t]) << what << " tier " << t + 1;
    EXPECT_EQ(s1.evicted_bytes, s0.evicted_bytes) << what;
    EXPECT_EQ(s1.dropped, s0.dropped + s0.pins) << what << ": forgetting drops its pins";
    EXPECT_EQ(s1.invalidated, s0.invalidated) << what;
    EXPECT_EQ(s1.lock_drops, s0.lock_drops) << what;
    EXPECT_EQ(s1.inflight_skips, s0.inflight_skips) << what;
    EXPECT_EQ(s1.pins, 0) << what;
    EXPECT_EQ(s1.bytes, 0) << what;
  };
  check(before.total, after.total, "total");
  for (int s = 0; s < kSubsets; ++s) check(before.subsets[s], after.subsets[s], to_string(static_cast<Subset>(s)));
  EXPECT_GT(before.total.hits, 0);
  EXPECT_GT(before.total.evictions_all(), 0);
  EXPECT_GT(before.total.invalidated, 0);
  EXPECT_TRUE(after.models.empty());
}

// A reading of memory that does not show what other casts reserve meanwhile.
class StaleProbe : public MemoryProbe {
 public:
  explicit StaleProbe(uint64_t available) : available_(available) {}
  MemoryInfo read() override {
    if (on_read) {
      auto hook = std::move(on_read);
      on_read = nullptr;
      hook();
    }
    if (arrive > 0) {  // the first `arrive` reads wait for each other: one reading for all
      const int n = ++arrived_;
      while (arrived_ < arrive && n <= arrive) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    MemoryInfo m;
    m.total = 64 * GiB;
    m.available = available_;
    return m;
  }
  std::function<void()> on_read;
  int arrive = 0;

 private:
  const uint64_t available_;
  std::atomic<int> arrived_{0};
};

// Note [Budget reservation]: room for one pin; two casts take the same reading.
TEST(BalancerBudget, TwoCastsOnOneReadingCannotBothSpendIt) {
  HostPool pool(make_null_backend(), pool_opts());
  StaleProbe probe(2 * GiB + U + U / 2);  // headroom/2 + one pin and a half
  probe.arrive = 2;
  Balancer bal(base_config(), pool, probe);
  const ModelId m = bal.register_model("m", "cuda:0");
  bal.mark_prompt({m});
  bal.set_active(m, true);  // nothing to evict: the second pin can only be refused
  Lease leases[2];
  std::vector<std::thread> threads;
  for (int t = 0; t < 2; ++t) threads.emplace_back([&, t] { leases[t] = bal.acquire(small_req(m, 1 + t, U)); });
  for (auto& th : threads) th.join();
  EXPECT_NE(static_cast<bool>(leases[0]), static_cast<bool>(leases[1])) << "exactly one pin fits";
  EXPECT_EQ(bal.stats().bypassed[static_cast<int>(Bypass::Refused)], 1);
  EXPECT_EQ(bal.reserved_bytes(), 0u) << "a reservation ends once the block is allocated";
  for (Lease& l : leases)
    if (l) l.filled();
}

// The same on one thread, deterministically: another cast makes its pin after
// this one's reading was taken; the reading does not show it.
TEST(BalancerBudget, APinMadeAfterTheReadingStillCounts) {
  HostPool pool(make_null_backend(), pool_opts());
  StaleProbe probe(2 * GiB + U + U / 2);
  Balancer bal(base_config(), pool, probe);
  const ModelId m = bal.register_model("m", "cuda:0");
  bal.mark_prompt({m});
  bal.set_active(m, true);  // the other pin may not be evicted to make room
  bool other = false;
  probe.on_read = [&] { other = fill(bal, small_req(m, 2, U)); };  // inside this cast's reading
  EXPECT_FALSE(bal.acquire(small_req(m, 1, U))) << "both pins were admitted on one reading";
  EXPECT_TRUE(other);
  EXPECT_EQ(bal.reserved_bytes(), 0u);
  EXPECT_EQ(bal.stats().total.pins, 1);
  EXPECT_EQ(pool.stats().blocks.current, 1);
}

// An explicit free with nothing to evict gives idle committed memory back.
TEST(BalancerBudget, FreeWithNothingToEvictTrimsIdleMemory) {
  PoolOptions o = pool_opts();
  o.retain_free = 1 * GiB;  // idle extents stay committed for reuse
  HostPool pool(make_null_backend(), o);
  FakeProbe probe(pool, 64 * GiB, 32 * GiB);
  Balancer bal(base_config(), pool, probe);
  const ModelId m = bal.register_model("m", "cuda:0");
  ASSERT_TRUE(fill(bal, small_req(m, 1, U)));
  ASSERT_EQ(bal.invalidate(1, 0, U), U);
  ASSERT_EQ(pool.stats().committed_bytes.current, static_cast<int64_t>(U)) << "idle, kept for reuse";
  EXPECT_EQ(bal.free(U), 0u) << "no pin to evict";
  EXPECT_EQ(pool.stats().committed_bytes.current, 0) << "idle committed memory kept after free_pins";
  pool.check_invariants();
}

// Eight threads cast, evict, invalidate and cross node and prompt boundaries over three models with
// room for a fraction of their pins; every hit must read its own source's bytes.
TEST(BalancerConcurrency, StressKeepsContentsAndAccounts) {
  HostPool pool(make_cpu_backend(false), pool_opts());
  Config c = base_config();
  c.headroom = 2 * MiB;
  c.pin_reserve = 1 * MiB;
  FakeProbe probe(pool, 64 * GiB, 1 * MiB + 24 * MiB);  // room for ~24 pins of 1 MiB
  Balancer bal(c, pool, probe);
  std::vector<ModelId> models;
  for (int i = 0; i < 3; ++i) models.push_back(bal.register_model("m" + std::to_string(i), "cuda:0"));
  const unsigned seed = std::random_device{}();
  std::printf("BalancerConcurrency.StressKeepsContentsAndAccounts seed=%u\n", seed);
  std::atomic<int> bad{0}, hits{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(seed + t);
      for (int i = 0; i < 1500; ++i) {
        const ModelId m = models[rng() % models.size()];
        const uint64_t key = rng() % 20;
        const uint64_t bytes = 256 * KiB + (key % 4) * 256 * KiB;
        const unsigned char pattern = static_cast<unsigned char>(m * 41 + key * 7 + 1);
        const int op = static_cast<int>(rng() % 100);
        if (op < 85) {
          Request r;
          r.model = m;
          r.key = PinKey{key, 0, bytes};
          r.bytes = bytes;
          r.resident = rng() % 2;
          Lease l = bal.acquire(r);
          if (!l) continue;
          auto* p = static_cast<unsigned char*>(l.data());
          if (l.needs_fill()) {
            std::memset(p, pattern, bytes);
            l.filled();
          } else {
            hits++;
            if (p[0] != pattern || p[bytes / 2] != pattern || p[bytes - 1] != pattern) bad++;
          }
        } else if (op < 92) {
          bal.free(1 * MiB, rng() % 2);
        } else if (op < 96) {
          bal.mark_prompt({m});
          bal.set_active(m, rng() % 2);
        } else if (op < 98) {
          bal.invalidate(rng() % 20, 0, 1 * MiB);  // pins being filled or leased elsewhere are detached
        } else if (op < 99) {
          bal.end_node();
        } else {
          bal.end_prompt();
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(bad.load(), 0);
  EXPECT_GT(hits.load(), 0);
  EXPECT_EQ(bal.stats().total.bytes, pool.stats().requested_bytes.current) << "every pool block is a pin and vice versa";
}

}  // namespace
}  // namespace pins

namespace pins {
namespace {

// A guard whose source changed under its pin (Note [Changed files]): alive,
// but no longer current once `changed` is set; counts the looks.
class ChangingGuard : public SourceGuard {
 public:
  ChangingGuard(std::shared_ptr<std::atomic<bool>> changed, std::shared_ptr<std::atomic<int>> looks)
      : changed_(std::move(changed)), looks_(std::move(looks)) {}
  bool alive() const override { return true; }
  SourceChange current(bool) override {
    looks_->fetch_add(1);
    return changed_->load() ? SourceChange::File : SourceChange::None;
  }

 private:
  std::shared_ptr<std::atomic<bool>> changed_;
  std::shared_ptr<std::atomic<int>> looks_;
};

TEST(BalancerChangedSource, AHitOnAPinThatIsNotCurrentIsAMissThatPinsAgain) {
  Fixture f(8);
  const ModelId m = f.bal.register_model("m", "cpu");
  auto changed = std::make_shared<std::atomic<bool>>(false);
  auto looks = std::make_shared<std::atomic<int>>(0);
  const auto guard = [&](bool) -> std::unique_ptr<SourceGuard> {
    return std::make_unique<ChangingGuard>(changed, looks);
  };
  ASSERT_TRUE(fill(f.bal, f.req(m, 1), guard));  // made: no look
  EXPECT_EQ(looks->load(), 0);
  {
    Lease hit = f.bal.acquire(f.req(m, 1), guard);
    ASSERT_TRUE(hit && hit.hit() && !hit.needs_fill());
  }
  EXPECT_EQ(looks->load(), 1) << "a hit looks at its source";
  changed->store(true);
  {
    Lease again = f.bal.acquire(f.req(m, 1), guard);
    ASSERT_TRUE(again) << "a changed source is pinned again";
    EXPECT_FALSE(again.hit());
    EXPECT_TRUE(again.needs_fill()) << "the new pin is filled from the source as it is now";
    again.filled();
  }
  const SubsetStats st = f.bal.subset_stats(m, Subset::Weights);
  EXPECT_EQ(st.hits, 1) << "the hit on the changed pin was taken back";
  EXPECT_EQ(st.misses, 2);
  EXPECT_EQ(st.created, 2);
  EXPECT_EQ(st.dropped, 1);
  EXPECT_EQ(st.pins, 1);
  EXPECT_EQ(f.bal.pins().size(), 1u);
  EXPECT_EQ(f.pool.stats().blocks.current, 1) << "the changed pin's block went back to the pool";
  f.pool.check_invariants();
}

// Note [Content check]: a guard whose source's sampled bytes differ once
// `written` is set; it records whether it was made to sample and whether a
// hit asked it to compare.
class SampledGuard : public SourceGuard {
 public:
  struct Seen {
    std::atomic<bool> written{false};
    std::atomic<int> made_sampling{0}, made_plain{0}, compared{0}, looked{0};
  };
  SampledGuard(bool sampled, std::shared_ptr<Seen> seen) : sampled_(sampled), seen_(std::move(seen)) {
    (sampled ? seen_->made_sampling : seen_->made_plain).fetch_add(1);
  }
  bool alive() const override { return true; }
  SourceChange current(bool content) override {
    seen_->looked.fetch_add(1);
    if (!content || !sampled_) return SourceChange::None;
    seen_->compared.fetch_add(1);
    return seen_->written.load() ? SourceChange::Content : SourceChange::None;
  }

 private:
  bool sampled_;
  std::shared_ptr<Seen> seen_;
};

TEST(BalancerContentCheck, AHitOnAPinWhoseSourceWasWrittenIsAMissThatPinsAgainCounted) {
  Config c = base_config();
  c.content_check = true;
  Fixture f(8, c);
  const ModelId m = f.bal.register_model("m", "cpu");
  auto seen = std::make_shared<SampledGuard::Seen>();
  const auto guard = [&](bool content) -> std::unique_ptr<SourceGuard> {
    return std::make_unique<SampledGuard>(content, seen);
  };
  ASSERT_TRUE(fill(f.bal, f.req(m, 1, Kind::Weights, /*resident=*/true), guard));
  EXPECT_EQ(seen->made_sampling.load(), 1) << "content_check is on: the guard samples";
  ASSERT_TRUE(f.bal.acquire(f.req(m, 1, Kind::Weights, true), guard).hit());
  EXPECT_EQ(seen->compared.load(), 1) << "a hit compares";
  seen->written = true;  // an inference tensor written in place: no version counter moved
  {
    Lease again = f.bal.acquire(f.req(m, 1, Kind::Weights, true), guard);
    ASSERT_TRUE(again);
    EXPECT_FALSE(again.hit());
    EXPECT_TRUE(again.needs_fill()) << "the new pin is filled from the source as it is now";
    again.filled();
  }
  seen->written = false;  // the new pin's sample is of the bytes as written
  EXPECT_TRUE(f.bal.acquire(f.req(m, 1, Kind::Weights, true), guard).hit());
  const SubsetStats st = f.bal.subset_stats(m, Subset::WeightsLoaded);
  EXPECT_EQ(st.content_mismatches, 1);
  EXPECT_EQ(st.dropped, 1);
  EXPECT_EQ(st.hits, 2) << "the hit on the written pin was taken back";
  EXPECT_EQ(st.misses, 2);
  EXPECT_EQ(st.created, 2);
  EXPECT_EQ(st.pins, 1);
  const BalancerStats all = f.bal.stats();
  EXPECT_EQ(all.total.content_mismatches, 1);
  EXPECT_EQ(all.models.at(0).total.content_mismatches, 1);
  EXPECT_EQ(all.subsets[static_cast<int>(Subset::Weights)].content_mismatches, 0);
  EXPECT_EQ(f.pool.stats().blocks.current, 1) << "the written pin's block went back to the pool";
}

TEST(BalancerContentCheck, TheKeyOffNeitherSamplesNorCompares) {
  Config c = base_config();
  ASSERT_FALSE(c.content_check) << "off by default";
  Fixture f(8, c);
  const ModelId m = f.bal.register_model("m", "cpu");
  auto seen = std::make_shared<SampledGuard::Seen>();
  const auto guard = [&](bool content) -> std::unique_ptr<SourceGuard> {
    return std::make_unique<SampledGuard>(content, seen);
  };
  ASSERT_TRUE(fill(f.bal, f.req(m, 1), guard));
  EXPECT_EQ(seen->made_plain.load(), 1);
  EXPECT_EQ(seen->made_sampling.load(), 0);
  seen->written = true;
  EXPECT_TRUE(f.bal.acquire(f.req(m, 1), guard).hit()) << "not compared: served as before the check";
  EXPECT_EQ(seen->looked.load(), 1) << "the guard is still asked (Note [Changed files])";
  EXPECT_EQ(seen->compared.load(), 0);
  // Turned on: a pin made while it was off has no sample; a new one is compared.
  c.content_check = true;
  f.bal.configure(c);
  EXPECT_TRUE(f.bal.acquire(f.req(m, 1), guard).hit());
  ASSERT_TRUE(fill(f.bal, f.req(m, 2), guard));
  EXPECT_EQ(seen->made_sampling.load(), 1);
  EXPECT_FALSE(f.bal.acquire(f.req(m, 2), guard).hit());
  EXPECT_EQ(f.bal.subset_stats(m, Subset::Weights).content_mismatches, 1);
}

TEST(BalancerContentCheck, AFileChangeIsNotCountedAsAContentMismatch) {
  Fixture f(8);
  const ModelId m = f.bal.register_model("m", "cpu");
  auto changed = std::make_shared<std::atomic<bool>>(false);
  auto looks = std::make_shared<std::atomic<int>>(0);
  const auto guard = [&](bool) -> std::unique_ptr<SourceGuard> {
    return std::make_unique<ChangingGuard>(changed, looks);
  };
  ASSERT_TRUE(fill(f.bal, f.req(m, 1), guard));
  changed->store(true);
  {
    Lease again = f.bal.acquire(f.req(m, 1), guard);
    ASSERT_TRUE(again && again.needs_fill());
    again.filled();
  }
  const SubsetStats st = f.bal.subset_stats(m, Subset::Weights);
  EXPECT_EQ(st.dropped, 1);
  EXPECT_EQ(st.content_mismatches, 0);
}

}  // namespace
}  // namespace pins
