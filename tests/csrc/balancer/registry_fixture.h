// A registry of models and their pins built by hand, with no balancer: for the
// tests of the eviction order and of its walk, which read nothing else. Each
// pin goes into its model's indexes as PinTable::link (csrc/balancer/
// pin_table.cpp) puts it there (by_trace excepted: its ranks depend on a
// trace, so a test fills it).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>

#include "csrc/balancer/registry.h"
#include "csrc/balancer/reuse.h"

namespace pins::testing {

struct Registry {
  Models models;
  uint64_t seq = 0;  // load_seq and created share it: every add() and pin() is newer than the last

  Model& add(ModelId id, bool in_prompt = false, bool active = false) {
    auto m = std::make_unique<Model>();
    m->id = id;
    m->load_seq = ++seq;
    m->in_prompt = in_prompt;
    m->active = active;
    Model& ref = *m;
    models.emplace(id, std::move(m));
    return ref;
  }

  Pin* pin(Model& m, uint64_t storage, Subset s, size_t bytes = 1, uint64_t last_use = 0, uint64_t reuse_gap = 0) {
    auto p = std::make_unique<Pin>();
    p->key = PinKey{storage, 0, bytes};
    p->subset = s;
    p->model = m.id;
    p->bytes = bytes;
    p->created = ++seq;
    p->last_use = last_use;
    p->reuse_gap = reuse_gap;
    p->state = PinState::Live;
    Pin* raw = p.get();
    const int i = static_cast<int>(s);
    m.by_created[i].emplace(raw->created, raw);
    m.by_use[i].emplace(std::make_pair(raw->last_use, raw->created), raw);
    m.by_reuse[i].emplace(ReuseHistory::index_key(*raw), raw);
    m.pins[i].emplace(raw->key, std::move(p));
    return raw;
  }
};

}  // namespace pins::testing
