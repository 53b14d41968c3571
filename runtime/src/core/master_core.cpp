#include "fluxon/core/master_core.hpp"

namespace fluxon {

uint64_t MasterCore::route_put_id(const std::string& key) const {
  auto it = routes_.find(key);
  return it == routes_.end() ? 0 : it->second.put_id;
}

uint64_t MasterCore::admit_generation(uint32_t node_id, uint64_t generation) {
  OwnerInfo& o = owners_[node_id];
  if (generation <= o.generation && o.generation != 0) return 0;
  uint64_t dropped = 0;
  if (o.generation != 0) {
    auto& keys = node_keys_[node_id];
    for (const auto& k : keys) {
      auto it = routes_.find(k);
      if (it != routes_.end() && it->second.node_id == node_id) {
        routes_.erase(it);
        dropped++;
      }
    }
    keys.clear();
    counters_.routes_removed_total += dropped;
  }
  o.generation = generation;
  counters_.owners_registered_total++;
  return dropped;
}

Envelope MasterCore::handle(const Envelope& req) {
  if (auto* r = req.body.AsRegisterOwner()) {
    if (r->generation != owners_[r->node_id].generation) {
      // An older generation re-registering late is refused; a newer one takes over.
      if (r->generation < owners_[r->node_id].generation) {
        counters_.errors_total++;
        return error_envelope(Status(Code::kGenerationMismatch, "node " + std::to_string(r->node_id) +
                                                                    " generation " + std::to_string(r->generation) +
                                                                    " is older than the registered one"));
      }
    }
    wire::RegisterOwnerReplyT rep;
    rep.routes_dropped = admit_generation(r->node_id, r->generation);
    owners_[r->node_id].role = r->role;
    owners_[r->node_id].segment_len = r->segment_len;
    return make_envelope(std::move(rep));
  }
  if (auto* pd = req.body.AsPutDone()) {
    counters_.put_done_total++;
    OwnerInfo& o = owners_[pd->node_id];
    if (pd->generation > o.generation) admit_generation(pd->node_id, pd->generation);
    wire::PutDoneReplyT rep;
    rep.put_id = pd->put_id;
    rep.results.reserve(pd->items.size());
    bool duplicate = false;
    for (const auto& item : pd->items) {
      if (pd->generation < o.generation) {
        rep.results.push_back(wire::PutItemResult::StaleGeneration);
        counters_.put_done_stale_total++;
        continue;
      }
      auto it = routes_.find(item->key);
      if (it != routes_.end()) {
        Route& r = it->second;
        const bool same_owner = r.node_id == pd->node_id && r.generation == pd->generation;
        if (same_owner && r.put_id == pd->put_id) {  // T1: the same identity again
          rep.results.push_back(wire::PutItemResult::Live);
          duplicate = true;
          continue;
        }
        if (same_owner && pd->put_id > r.put_id) {  // a newer local version replaces it (T2)
          r = Route{pd->node_id, pd->generation, pd->put_id, item->offset, item->len};
          rep.results.push_back(wire::PutItemResult::Live);
          counters_.routes_published_total++;
          continue;
        }
        rep.results.push_back(wire::PutItemResult::Exists);  // stale or another owner's key
        counters_.put_done_exists_total++;
        continue;
      }
      auto tomb = tombstones_.find(item->key);
      if (tomb != tombstones_.end() && tomb->second.node_id == pd->node_id &&
          tomb->second.generation == pd->generation && pd->put_id <= tomb->second.put_id) {
        rep.results.push_back(wire::PutItemResult::Exists);  // a removed version stays removed
        counters_.put_done_exists_total++;
        continue;
      }
      if (tomb != tombstones_.end()) tombstones_.erase(tomb);
      routes_.emplace(item->key, Route{pd->node_id, pd->generation, pd->put_id, item->offset, item->len});
      node_keys_[pd->node_id].insert(item->key);
      rep.results.push_back(wire::PutItemResult::Live);
      counters_.routes_published_total++;
    }
    if (duplicate) counters_.put_done_duplicate_total++;
    return make_envelope(std::move(rep));
  }
  if (auto* lk = req.body.AsLookup()) {
    counters_.lookups_total++;
    counters_.lookup_keys_total += lk->keys.size();
    wire::LookupReplyT rep;
    for (const auto& k : lk->keys) {
      auto info = std::make_unique<wire::RouteInfoT>();
      auto it = routes_.find(k);
      if (it != routes_.end()) {
        counters_.lookup_hits_total++;
        info->found = true;
        info->node_id = it->second.node_id;
        info->generation = it->second.generation;
        info->put_id = it->second.put_id;
        info->offset = it->second.offset;
        info->len = it->second.len;
      }
      rep.routes.push_back(std::move(info));
    }
    return make_envelope(std::move(rep));
  }
  if (auto* rr = req.body.AsRemoveRoutes()) {
    wire::RemoveRoutesReplyT rep;
    for (const auto& item : rr->items) {
      auto it = routes_.find(item->key);
      // Only the exact version goes: never a newer one (identity beats flags).
      const bool match = it != routes_.end() && it->second.node_id == item->node_id &&
                         it->second.generation == item->generation && it->second.put_id == item->put_id;
      if (match) {
        tombstones_[item->key] = it->second;
        routes_.erase(it);
        node_keys_[item->node_id].erase(item->key);
        counters_.routes_removed_total++;
      }
      rep.removed.push_back(match);
    }
    return make_envelope(std::move(rep));
  }
  if (req.body.AsMasterStatsReq()) {
    wire::MasterStatsReplyT rep;
    rep.routes = routes_.size();
    rep.owners = owners_.size();
    rep.put_done_total = counters_.put_done_total;
    rep.put_done_duplicate_total = counters_.put_done_duplicate_total;
    rep.lookups_total = counters_.lookups_total;
    return make_envelope(std::move(rep));
  }
  if (auto* p = req.body.AsPing()) return make_envelope(wire::PongT{{}, p->seq});
  counters_.errors_total++;
  counters_.malformed_total++;
  return error_envelope(Status(Code::kMalformedMessage, std::string("master: unexpected message ") + body_name(req)));
}

}  // namespace fluxon
