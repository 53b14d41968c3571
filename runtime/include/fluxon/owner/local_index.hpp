// LocalIndex: what an owner holds and can serve now (V1) — its entries by key, the cohorts they
// form (A1: an atomic group of one put or get batch), the resident tier that orders capacity
// eviction (W-TinyLFU weighted by slot size) and, with owner-hot write-back, the hot tier. Every way
// into and out of the index goes through here, so an entry, its cohort and its tier places never
// disagree. Plain state: no clocks, no I/O, no calls into other components.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string_view>
#include <string>
#include <unordered_map>
#include <map>
#include <set>
#include <utility>
#include <vector>

#include "fluxon/core/depth_order.hpp"
#include "fluxon/master/master_core.hpp"
#include "fluxon/runtime/flat_map.hpp"
#include "fluxon/runtime/key_index.hpp"
#include "fluxon/runtime/prefix_chains.hpp"
#include "fluxon/runtime/reserve_pool.hpp"
#include "fluxon/runtime/weighted_cache.hpp"

namespace fluxon {

class LocalIndex {
 public:
  struct Entry {
    uint64_t put_id = 0;        // local identity: the put, or the get batch that fetched it
    SlotRef slot;
    uint64_t len = 0;
    bool live = false;          // Committed(route_live)
    uint32_t group = 0;         // atomic group inside its batch: (put_id, group) is the cohort
    Version ver;                // the value's version at the master (this owner's put, or the origin)
  };
  struct ResidentRef {          // a tier's value: the entry's identity
    uint64_t put_id = 0;
    uint32_t group = 0;
  };
  using CohortId = std::pair<uint64_t, uint32_t>;
  using Tier = WeightedCache<std::string, ResidentRef>;
  using Map = KeyIndex<Entry>;
  using Node = Map::value_type;  // (key, Entry): its address lasts until the entry is erased

  // segment_len sizes the tiers; hot_ratio > 0 enables the hot tier (that share of the segment);
  // tp_cohorts: a cohort's exact set includes the other TP ranks' same group (SGLang's key suffix).
  // depth_stale_bytes set: the prefix-depth order (DepthOrder) orders capacity eviction and the hot
  // tier's write-backs instead of the tiers' W-TinyLFU (eviction_order: prefix_depth).
  LocalIndex(uint64_t segment_len, double hot_ratio, bool tp_cohorts,
             std::optional<uint64_t> depth_stale_bytes = std::nullopt);
  static constexpr uint32_t kNoDepth = DepthOrder::kUnknown;

  // The entry of key, or null (end()).
  Node* find(std::string_view key) { return entries_.find(key); }
  const Node* find(std::string_view key) const { return entries_.find(key); }
  static constexpr Node* end() { return nullptr; }
  // out[i] = find(keys[i]) for a whole batch, its memory misses overlapped (KeyIndex::find_many);
  // hashes[i]: the key's hash, which touch_many() takes again.
  template <class Keys>
  void find_many(const Keys& keys, size_t n, const Node** out, uint64_t* hashes) const {
    entries_.find_many(keys, n, out, hashes);
  }
  bool contains(std::string_view key) const { return entries_.find(key) != nullptr; }
  // The entry (key, Entry) that holds `slot`, or null.
  const Node* at_slot(SlotRef slot) const {
    auto* at = by_slot_.find(slot.packed());
    return at ? *at : nullptr;
  }
  Entry& at(std::string_view key) {
    Node* n = entries_.find(key);
    if (!n) throw std::out_of_range("LocalIndex::at: no entry");
    return n->second;
  }
  const Map& entries() const { return entries_; }
  size_t size() const { return entries_.size(); }

  // A new local entry (pending local visible, or a fetched replica), joined to its cohort and, when
  // `parent` names the page before it in its prefix (non-empty), to that chain. `depth`: pages
  // before it in its prefix (content_depths, or what its source knew); not given, one more than
  // its parent's when that is known here.
  void insert(const std::string& key, Entry e, const std::string* parent = nullptr, uint32_t depth = kNoDepth);
  // The entry leaves the index, its cohort and both tiers.
  void erase(Node* it);
  // Erases key's entry if it is still the copy of `put_id`; true when it did.
  bool erase_if_copy(const std::string& key, uint64_t put_id);
  // The entry went live: it enters the resident tier (the hot tier is admitted by its owner).
  void enter_resident(const std::string& key, ResidentRef ref, uint64_t weight) {
    (void)resident_.insert(key, ref, weight);
    if (order_) order_->admit(key, depth_of(key), weight);
  }
  // The copy of `put_id` leaves the resident tier (a reclaim owns it now); true when it was there.
  bool leave_resident(const std::string& key, uint64_t put_id) {
    const bool left = resident_.remove_if(key, [put_id](const ResidentRef& r) { return r.put_id == put_id; });
    if (left && order_) order_->erase(key);
    return left;
  }
  // key left the resident tier through the tier itself (evict_some_if): it leaves the depth order too.
  void left_resident(const std::string& key) {
    if (order_) order_->erase(key);
  }
  void touch(const std::string& key) {
    resident_.touch(key);
    if (hot_) hot_->touch(key);
    if (order_) order_->touch(key);
  }
  // touch(*keys[i]) for a batch (hashes[i]: find_many's), its tiers' memory misses overlapped.
  void touch_many(const std::string* const* keys, const uint64_t* hashes, size_t n) {
    resident_.touch_many(keys, hashes, n);
    if (hot_) hot_->touch_many(keys, hashes, n);
    if (order_)
      for (size_t i = 0; i < n; ++i) order_->touch(*keys[i]);
  }
  // The page's depth in its prefix (kNoDepth: not known).
  uint32_t depth_of(const std::string& key) const {
    auto it = depths_.find(key);
    return it == depths_.end() ? kNoDepth : it->second;
  }
  // The prefix-depth order, or null when the tiers' own order rules (eviction_order: tier).
  const DepthOrder* depth_order() const { return order_ ? &*order_ : nullptr; }
  Tier& resident() { return resident_; }
  uint64_t resident_bytes() const { return resident_.weighted_size(); }
  Tier* hot() { return hot_.get(); }
  const Tier* hot() const { return hot_.get(); }

  // The keys of a cohort, or null when none is left.
  const std::vector<std::string>* cohort(CohortId id) const;
  // The exact cohort of `id`: itself and, with tp_cohorts, the same group of the other TP ranks
  // (keys with SGLang's "_<rank>_<size>" suffix): a half-evicted TP cohort restores on no rank.
  std::vector<CohortId> exact_cohort(CohortId id) const;
  // The cohort cannot go whole now: a live member of the exact cohort of `id` is held by a reader,
  // or a member is committed here with its route not yet acknowledged - the master may list it
  // already and would refuse a reclaim without it as not the whole cohort (Closure).
  bool cohort_busy(CohortId id, const ReservePool& pool) const;
  // Prefix chains (radix_parent_keys): some entry named a parent; and whether no entry outside
  // the exact cohort of `id` continues one of its pages (a leaf: taking it orphans nothing).
  // Remote-complete cohorts: a write-back found every key of the exact cohort set backed on a
  // target-role owner (inclusive write-back: both copies stay). Evicting one loses no hit while
  // those copies stay; the master's unbacked notice withdraws the mark once the last one went.
  void mark_remote_complete(CohortId id) {
    if (cohorts_.count(id)) remote_complete_.insert(id);
  }
  bool remote_complete(CohortId id) const { return remote_complete_.count(id) != 0; }
  // The target's copy went (the master's unbacked notice): the cohort is this owner's own again.
  bool clear_remote_complete(CohortId id) { return remote_complete_.erase(id) != 0; }
  // `going`: pages -> their children already selected (they do not count).
  using Going = std::unordered_map<std::string, uint32_t>;
  bool chained() const { return chains_.linked() > 0; }
  bool cohort_is_leaf(CohortId id, const Going& going) const;
  const std::string* parent_of(const std::string& key) const { return chains_.parent(key); }

 private:
  Map entries_;
  // Live entries, weighted by slot size, ordered by W-TinyLFU: eviction's candidate order. Unbounded
  // (capacity is the segment's; only evict_some_if removes), no listener thread.
  Tier resident_;
  std::unique_ptr<Tier> hot_;
  std::map<CohortId, std::vector<std::string>> cohorts_;
  PrefixChains<std::string> chains_;
  std::set<CohortId> remote_complete_;
  std::unordered_map<std::string, uint32_t> depths_;  // known depths of the entries
  // SlotRef::packed() -> the entry held there (elements of entries_ keep their address until erased)
  FlatMap<uint64_t, const Node*, MixHash> by_slot_;
  std::optional<DepthOrder> order_;
  bool tp_cohorts_;
};

// A depth on the wire: -1 for not known.
inline int32_t wire_depth(uint32_t depth) { return depth == LocalIndex::kNoDepth ? -1 : int32_t(depth); }
inline uint32_t from_wire_depth(int32_t depth) { return depth < 0 ? LocalIndex::kNoDepth : uint32_t(depth); }

// SGLang's config suffix "_<tp_rank>_<tp_size>" (the last one that ends the key or is followed by
// '_' or '.'): the same key for the other ranks. Empty when the key has no such suffix.
std::vector<std::string> tp_siblings(const std::string& key);

}  // namespace fluxon
