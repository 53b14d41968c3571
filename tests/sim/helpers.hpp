#pragma once
#include <doctest/doctest.h>

#include <functional>

#include "fluxon/sim/sim.hpp"

namespace fluxon::test {

inline OwnerConfig small_owner() {
  OwnerConfig c;
  c.dram_bytes = 8ull << 20;
  c.grant_bytes = 1ull << 20;  // 256 slots of 4 KiB per grant
  c.publish_retry_ms = 50;
  c.get_handle_ttl_ms = 1000;
  c.hard_timeout_ms = 300;
  return c;
}

inline Envelope put_start(sim::Cluster& c, int owner, uint64_t s, std::vector<std::string> keys,
                          uint64_t value_len = 4096, std::vector<uint32_t> groups = {},
                          std::vector<std::string> parents = {}, std::vector<uint32_t> depths = {}) {
  wire::PutStartReqT p;
  p.keys = std::move(keys);
  p.value_len = value_len;
  p.atomic_group_lens = std::move(groups);
  p.radix_parent_keys = std::move(parents);
  p.content_depths = std::move(depths);
  return c.call(owner, s, make_envelope(std::move(p)));
}

inline uint64_t put_commit(sim::Cluster& c, int owner, uint64_t s, std::vector<std::string> keys,
                           std::vector<uint32_t> groups = {}) {
  auto r = put_start(c, owner, s, std::move(keys), 4096, std::move(groups));
  auto* ps = r.body.AsPutStartReply();
  REQUIRE_MESSAGE(ps, "put_start failed: ", envelope_status(r).to_string());
  auto cr = c.call(owner, s, make_envelope(wire::PutCommitReqT{{}, ps->put_id}));
  REQUIRE(cr.body.AsPutCommitReply());
  return ps->put_id;
}

// put_commit, then run until the batch's routes are live (V3).
inline void put_live_routes(sim::Cluster& c, int owner, uint64_t s, const std::vector<std::string>& keys) {
  put_commit(c, owner, s, keys);
  REQUIRE(c.run_until([&] { return c.owner(owner).local_state(keys.back()) == 2; }, 60000));
}

inline Envelope get_start(sim::Cluster& c, int owner, uint64_t s, std::vector<std::string> keys,
                          std::vector<uint32_t> groups = {}, bool best_effort = true) {
  wire::GetStartReqT g;
  g.keys = std::move(keys);
  g.atomic_group_lens = std::move(groups);
  g.prefix_best_effort = best_effort;
  return c.call(owner, s, make_envelope(std::move(g)));
}

inline void release_all(sim::Cluster& c, int owner, uint64_t s, const wire::GetStartReplyT& g) {
  wire::AckBatchT ack;
  auto hd = std::make_unique<wire::HandleDoneT>();
  hd->handle_id = g.handle_id;
  hd->release_holding_ids = g.holding_ids;
  ack.handles.push_back(std::move(hd));
  c.note(owner, s, make_envelope(std::move(ack)));
}

// `puts` puts of two atomic groups of 5 keys ("<prefix><p>-<i>") on owner 0, each value
// pattern(key); `every_ms` of simulated time after each. Returns the groups.
inline std::vector<std::vector<std::string>> put_group_pairs(
    sim::Cluster& c, uint64_t s, const std::string& prefix, int puts,
    const std::function<std::vector<uint8_t>(const std::string&)>& pattern, Millis every_ms = 0) {
  std::vector<std::vector<std::string>> groups;
  for (int p = 0; p < puts; ++p) {
    std::vector<std::string> keys;
    for (int i = 0; i < 10; ++i) keys.push_back(prefix + std::to_string(p) + "-" + std::to_string(i));
    auto r = put_start(c, 0, s, keys, 4096, {5, 5});
    auto* ps = r.body.AsPutStartReply();
    REQUIRE_MESSAGE(ps, envelope_status(r).to_string());
    for (size_t i = 0; i < keys.size(); ++i) c.write(0, ps->offsets[i], pattern(keys[i]));
    REQUIRE(c.call(0, s, make_envelope(wire::PutCommitReqT{{}, ps->put_id})).body.AsPutCommitReply());
    groups.emplace_back(keys.begin(), keys.begin() + 5);
    groups.emplace_back(keys.begin() + 5, keys.end());
    if (every_ms) c.run_for(every_ms);
  }
  return groups;
}

inline std::vector<std::string> keys_of(const std::string& prefix, int n) {
  std::vector<std::string> k;
  for (int i = 0; i < n; ++i) k.push_back(prefix + std::to_string(i));
  return k;
}

inline uint64_t seed_from_env(uint64_t dflt) {
  if (const char* s = std::getenv("FLUXON_SEED")) return std::strtoull(s, nullptr, 10);
  return dflt;
}

// The master driven directly (node generations are 1).
// One PutDone item of node's put `put_id` (a 4 KiB value in a 4 KiB slot), to send once or again.
inline wire::PutDoneT m_put_done(uint32_t node, uint64_t put_id, const std::string& key, uint64_t offset) {
  wire::PutDoneT pd;
  pd.node_id = node;
  pd.generation = 1;
  pd.put_id = put_id;
  pd.items.push_back(std::make_unique<wire::RouteItemT>());
  pd.items[0]->key = key;
  pd.items[0]->offset = offset;
  pd.items[0]->len = 4096;
  pd.items[0]->slot_size = 4096;
  return pd;
}
// A copy a Reclaim request names (its origin's generation is 1).
struct ReclaimCopy {
  std::string key;
  uint32_t origin_node = 0;
  uint64_t put_id = 0, instance = 0, offset = 0, slot_size = 4096;
  uint32_t group = 0;
};
// One Reclaim step of node's copies; the reply (its epoch checked).
inline wire::ReclaimReplyT m_reclaim(MasterCore& m, uint32_t node, uint64_t generation, uint64_t epoch,
                                     wire::ReclaimStep step, bool demote, bool tp, const std::vector<ReclaimCopy>& copies) {
  wire::ReclaimT r;
  r.node_id = node;
  r.generation = generation;
  r.epoch = epoch;
  r.step = step;
  r.demote = demote;
  r.tp_closure = tp;
  for (const auto& c : copies) {
    auto w = std::make_unique<wire::ReclaimMemberT>();
    w->key = c.key;
    w->origin_node = c.origin_node;
    w->origin_generation = 1;
    w->put_id = c.put_id;
    w->instance = c.instance;
    w->group = c.group;
    w->offset = c.offset;
    w->slot_size = c.slot_size;
    r.members.push_back(std::move(w));
  }
  auto rep = m.handle(make_envelope(std::move(r)));
  REQUIRE(rep.body.AsReclaimReply());
  CHECK(rep.body.AsReclaimReply()->epoch == epoch);
  return *rep.body.AsReclaimReply();
}
// As an owner does: it registers (generation 1, a data address) before it publishes - the master
// reads from registered holders only. Tests that register a role themselves did it before.
inline void m_ensure_registered(MasterCore& m, uint32_t node) {
  if (auto it = m.owners().find(node); it != m.owners().end() && it->second.registered) return;
  wire::RegisterOwnerT reg;
  reg.node_id = node;
  reg.generation = 1;
  reg.role = "gpu";
  reg.segment_len = 1 << 30;
  reg.data_host = "127.0.0.1";
  reg.data_port = uint16_t(20000 + node);
  m.handle(make_envelope(std::move(reg)));
}
inline Envelope m_put(MasterCore& m, uint32_t node, uint64_t put_id, const std::string& key, uint64_t offset) {
  m_ensure_registered(m, node);
  return m.handle(make_envelope(m_put_done(node, put_id, key, offset)));
}
inline wire::GetStartStatus m_start(MasterCore& m, uint32_t node, const std::string& key, uint64_t get_id, Millis now = 0) {
  m_ensure_registered(m, node);
  wire::BatchGetStartT g;
  g.node_id = node;
  g.generation = 1;
  g.items.push_back(std::make_unique<wire::GetItemT>(wire::GetItemT{{}, key, get_id}));
  return m.handle(make_envelope(std::move(g)), now).body.AsBatchGetStartReply()->items[0]->status;
}
inline wire::GetDoneStatus m_done(MasterCore& m, uint32_t node, const std::string& key, uint64_t get_id, uint64_t off) {
  m_ensure_registered(m, node);
  wire::BatchGetDoneT d;
  d.node_id = node;
  d.generation = 1;
  d.items.push_back(std::make_unique<wire::GetDoneItemT>(wire::GetDoneItemT{{}, key, get_id, off}));
  return m.handle(make_envelope(std::move(d))).body.AsBatchGetDoneReply()->results[0];
}
inline bool m_remove(MasterCore& m, uint32_t node, const std::string& key, uint32_t origin, uint64_t put_id, bool* busy) {
  wire::RemoveRoutesT rr;
  auto it = std::make_unique<wire::RemoveRouteT>();
  it->key = key;
  it->node_id = node;
  it->generation = 1;
  it->put_id = put_id;
  it->origin_node = origin;
  it->origin_generation = 1;
  rr.items.push_back(std::move(it));
  auto rep = m.handle(make_envelope(std::move(rr)));
  *busy = rep.body.AsRemoveRoutesReply()->busy[0];
  return rep.body.AsRemoveRoutesReply()->removed[0];
}

}  // namespace fluxon::test
