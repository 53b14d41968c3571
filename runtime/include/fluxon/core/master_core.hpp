// MasterCore: the global route table and owner registry as a plain state machine. Every request is
// answered synchronously from its envelope; identity (node, generation, put_id) makes every
// request idempotent, so duplicated or re-sent messages converge (T1, T2).
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <unordered_map>
#include <unordered_set>

#include "fluxon/messages/codec.hpp"

namespace fluxon {

struct MasterCounters {
  uint64_t put_done_total = 0, put_done_duplicate_total = 0, put_done_exists_total = 0;
  uint64_t put_done_stale_total = 0, routes_published_total = 0, routes_removed_total = 0;
  uint64_t lookups_total = 0, lookup_keys_total = 0, lookup_hits_total = 0;
  uint64_t owners_registered_total = 0, errors_total = 0, malformed_total = 0;
};

class MasterCore {
 public:
  Envelope handle(const Envelope& req);

  size_t route_count() const { return routes_.size(); }
  size_t owner_count() const { return owners_.size(); }
  const MasterCounters& counters() const { return counters_; }
  // The route's put_id, or 0 when there is none (tests).
  uint64_t route_put_id(const std::string& key) const;
  void count_malformed() { counters_.malformed_total++; counters_.errors_total++; }

 private:
  struct Route {
    uint32_t node_id;
    uint64_t generation;
    uint64_t put_id;
    uint64_t offset;
    uint64_t len;
  };
  struct OwnerInfo {
    uint64_t generation = 0;
    std::string role;
    uint64_t segment_len = 0;
  };
  // A newer generation of a node replaces the old one: its memory is gone, so are its routes.
  uint64_t admit_generation(uint32_t node_id, uint64_t generation);

  std::unordered_map<std::string, Route> routes_;
  // The last removed version of a key: a late duplicate of its PutDone (re-sent under T1, or a
  // re-publication racing the removal) must not bring the route back. Cleared by a newer version.
  std::unordered_map<std::string, Route> tombstones_;
  std::map<uint32_t, OwnerInfo> owners_;
  std::map<uint32_t, std::unordered_set<std::string>> node_keys_;
  MasterCounters counters_;
};

}  // namespace fluxon
