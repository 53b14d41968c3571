// RouteRegistry: the route table, the owner registry, cohort sizes, tombstones and the KV-event log.
#include "fluxon/master/route_registry.hpp"

#include <algorithm>
#include <cstring>

namespace fluxon {

Route& RouteRegistry::emplace_prepared(std::string_view key, size_t i, Version v, uint64_t len) {
  auto [it, _] = routes_.emplace(key, probes_[i], Route{v, len, {}});
  return it->second;
}

void RouteRegistry::count_cohort(uint32_t node, const Replica& rep, int delta) {
  const CohortKey k{node, rep.generation, rep.instance, rep.group};
  if (delta > 0) ++*cohorts_.try_emplace(k, 0).first;
  else if (uint32_t* n = cohorts_.find(k); n && --*n == 0) cohorts_.erase(k);
}

void RouteRegistry::add_replica(std::string_view key, Route& r, Replica rep) {
  count_cohort(rep.node_id, rep, +1);
  events_.stored(key, rep.node_id, r.ver);
  r.replicas.push_back(rep);
  replicas_++;
  counters.replicas_published_total++;
}

void RouteRegistry::replace_own(std::string_view key, Route& r, const Version& v, uint64_t len, uint64_t offset,
                                uint64_t instance, uint32_t group, uint64_t slot_size) {
  Replica& rep = r.replicas[0];
  events_.removed(key, rep.node_id, r.ver, "replaced");
  events_.stored(key, rep.node_id, v);
  r.ver = v;
  r.len = len;
  count_cohort(rep.node_id, rep, -1);
  rep.offset = offset;
  rep.instance = instance;
  rep.group = group;
  rep.slot_size = slot_size;
  count_cohort(rep.node_id, rep, +1);
}

RouteRegistry::Dropped RouteRegistry::drop_replica(std::string_view key, uint32_t node_id, bool tombstone,
                                                   const char* cause, Millis now) {
  auto it = routes_.find(key);
  if (it == routes_.end()) return {};
  auto& reps = it->second.replicas;
  size_t at = 0;
  while (at < reps.size() && reps[at].node_id != node_id) ++at;
  if (at == reps.size()) return {};
  if (tombstone) entomb(key, node_id, it->second.ver, reps[at].generation, now);
  events_.removed(key, node_id, it->second.ver, cause);
  count_cohort(node_id, reps[at], -1);
  reps.erase_at(at);
  replicas_--;
  counters.replicas_removed_total++;
  if (reps.empty()) {
    routes_.erase(it);
    counters.routes_removed_total++;
    return {true, nullptr};
  }
  return {true, &it->second};
}

std::vector<std::string> RouteRegistry::keys_of(uint32_t node_id) const {
  // A restarted owner is rare; a scan of the table then saves a per-node key index (a second copy of
  // every key) on every publication.
  std::vector<std::string> keys;
  for (const auto& [k, r] : routes_)
    if (r.find(node_id)) keys.emplace_back(k);
  return keys;
}

bool RouteRegistry::is_replica_target(uint32_t node_id) const {
  auto it = owners_.find(node_id);
  if (it == owners_.end()) return false;
  return std::find(replica_roles_.begin(), replica_roles_.end(), it->second.role) != replica_roles_.end();
}

bool RouteRegistry::target_besides(uint32_t node) const {
  for (const auto& [other, info] : owners_)
    if (other != node && is_replica_target(other)) return true;
  return false;
}

bool RouteRegistry::backed_elsewhere(const Route& r, uint32_t source) const {
  for (const auto& rep : r.replicas)
    if (rep.node_id != source && is_replica_target(rep.node_id)) return true;
  return false;
}

namespace {
// A 64-bit hash of bytes, 8 at a time through a 128-bit multiply; seeds give independent hashes.
uint64_t mix_hash(std::string_view s, uint64_t seed) {
  auto mul = [](uint64_t a, uint64_t b) {
    const unsigned __int128 r = (unsigned __int128)a * b;
    return uint64_t(r) ^ uint64_t(r >> 64);
  };
  uint64_t h = seed ^ (s.size() * 0x9e3779b97f4a7c15ull);
  size_t i = 0;
  for (; i + 8 <= s.size(); i += 8) {
    uint64_t w;
    std::memcpy(&w, s.data() + i, 8);
    h = mul(h ^ w, 0xbf58476d1ce4e5b9ull);
  }
  uint64_t w = 0;
  std::memcpy(&w, s.data() + i, s.size() - i);
  return mul(h ^ w ^ 0x94d049bb133111ebull, 0x2545f4914f6cdd1dull);
}
}  // namespace

RouteRegistry::TombKey RouteRegistry::tomb_key(std::string_view key, uint32_t node) {
  return TombKey{mix_hash(key, 0x8a5cd789635d2dffull), mix_hash(key, 0x3c6ef372fe94f82bull), node};
}

void RouteRegistry::entomb(std::string_view key, uint32_t node, const Version& ver, uint64_t generation, Millis now) {
  const TombKey tk = tomb_key(key, node);
  // A newer tombstone of the same writer stays (it covers this version too), with a new expiry.
  const Removed* t = tombstones_.find(tk);
  const bool older = t && t->generation == generation && t->ver.origin_node == ver.origin_node &&
                     t->ver.origin_generation == ver.origin_generation && ver.put_id < t->ver.put_id;
  if (older) tombstones_.renew(tk, now + kTombstoneMs);
  else tombstones_.set(tk, Removed{ver, generation}, now + kTombstoneMs);
  if (ver.origin_node == node) {
    OwnEntombed& hi = own_entombed_[node];
    if (generation > hi.generation) hi = OwnEntombed{generation, ver.put_id};
    else if (generation == hi.generation) hi.put_id = std::max(hi.put_id, ver.put_id);
  }
}

bool RouteRegistry::tomb_possible(uint32_t node, uint64_t generation, uint64_t put_id) const {
  if (tombstones_.empty()) return false;
  auto it = own_entombed_.find(node);
  if (it == own_entombed_.end()) return false;
  // A tombstone covers only its own generation and put_ids up to its own; every one of this node's
  // generation is at most hi.put_id (older generations' never match a current item).
  if (generation != it->second.generation) return generation < it->second.generation;
  return put_id <= it->second.put_id;
}

bool RouteRegistry::entombed(std::string_view key, uint32_t node, uint64_t generation, const Version& v) const {
  if (tombstones_.empty()) return false;
  const Removed* t = tombstones_.find(tomb_key(key, node));
  return t && t->covers(generation, v);
}

bool RouteRegistry::refuse_or_clear_tomb(std::string_view key, uint32_t node, uint64_t generation, const Version& v) {
  const TombKey tk = tomb_key(key, node);
  const Removed* t = tombstones_.find(tk);
  if (!t) return false;
  if (t->covers(generation, v)) return true;
  tombstones_.erase(tk);
  return false;
}

Envelope RouteRegistry::read_events(const wire::KvEventsReqT& req) {
  counters.kv_event_reads_total++;
  const KvEventLog::Read r = events_.read(req.epoch, req.seq, req.prefix, req.max);
  if (r.lost) counters.kv_event_reads_lost_total++;
  wire::KvEventsReplyT rep;
  rep.epoch = events_.epoch();
  rep.next_seq = r.next_seq;
  rep.first_seq = r.first_seq;
  rep.lost = r.lost;
  rep.events.reserve(r.events.size());
  for (const KvEvent& e : r.events) {
    auto w = std::make_unique<wire::KvEventT>();
    w->seq = e.seq;
    w->kind = e.kind == KvEvent::Kind::kStored ? wire::KvEventKind::Stored : wire::KvEventKind::Removed;
    w->key = std::string(e.key);
    w->node = e.node;
    w->origin_node = e.ver.origin_node;
    w->origin_generation = e.ver.origin_generation;
    w->put_id = e.ver.put_id;
    w->cause = e.cause;
    rep.events.push_back(std::move(w));
  }
  return make_envelope(std::move(rep));
}

std::string RouteRegistry::derived_bounds_violation() const {
  uint64_t members = 0;
  bool zero = false;
  cohorts_.for_each([&](const CohortKey&, uint32_t n) {
    zero |= n == 0;
    members += n;
  });
  if (zero) return "cohorts: an entry of count 0";
  if (members != replicas_ || cohorts_.size() > replicas_)
    return "cohorts: " + std::to_string(cohorts_.size()) + " entries counting " + std::to_string(members) +
           " members for " + std::to_string(replicas_) + " replicas";
  return "";
}

}  // namespace fluxon
