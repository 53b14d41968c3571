#include "fluxon/owner/eviction.hpp"

#include <algorithm>
#include <set>
#include <utility>

namespace fluxon {

std::vector<LocalIndex::CohortId> Eviction::select(LocalIndex& index, const ReservePool& pool, uint64_t slot_size,
                                                   uint64_t bytes, uint64_t debt, const Marks& marks,
                                                   std::optional<uint32_t> drain) {
  if (!cfg_.enabled || debt >= bytes) return {};  // S4: bytes in flight are a debt already
  const uint64_t want = std::min(bytes - debt, cfg_.max_bytes_per_round);
  std::vector<std::pair<std::string, LocalIndex::ResidentRef>> chosen;
  // The pass: 0 remote-complete only, 1 leaves only, 2 anything not pinned, 3 anything.
  int pass = 0;
  // Cohorts this pass turned down for what they are (taken, pinned, not remote-complete, held or
  // being published, not a leaf). Each selection scans the order from its start, and without this every scan judged again
  // every cohort ahead of the first eligible one: quadratic in the entries, a whole core at 7,000
  // of them (profiled: a 28 MiB owner of 4 KiB pages in the tier order with chains spent its ticks
  // in cohort_is_leaf, the held check and exact_cohort, and its puts waited up to 0.9 s). Nothing a
  // cohort is judged on changes within a select but one thing - a parent whose children go may be
  // a leaf now: rest_of_cohort forgets those.
  std::set<LocalIndex::CohortId> turned_down;
  int judged_pass = -1;
  uint64_t judged_class = ~0ull;
  auto cohort_ok = [&](const LocalIndex::CohortId& id) {
    if (marks.taken(id)) return false;
    // A write-back copying it pins it until the last pass - except in the depth order, where the
    // deepest goes first even while copied (the target would take it as its own next victim).
    if (pass < 3 && marks.pinned(id) && !(pass == 1 && index.depth_order())) return false;
    if (pass == 0) {
      for (const auto& c : index.exact_cohort(id))
        if (!index.remote_complete(c)) return false;
    }
    // Never a cohort that cannot go whole now: a member a reader holds would keep it Busy until
    // restored; a member whose route is still on its way to the master gets the reclaim refused
    // (Closure), backed off and tried again while a claim waits - the depth order met this most,
    // its deepest pages being the ones just written.
    return !index.cohort_busy(id, pool);
  };
  // Prefix-aware (some entry names its parent page): cohorts that no held page continues go first,
  // in the tier's own order, one at a time, and their parents may follow in the same round: a chain
  // is eaten from its tail. Then, or without chains, anything in the tier's order. (The leaves in
  // recency order instead - WeightedCache::Order::kRecency - won on fluxon_cache_bench's trace,
  // which has no GPU tier in front, and lost in `fluxon workload`: L2 hits 5.7% -> 3.4% with
  // write-through, 10.3% -> 5.5% with write-back, 8 MiB owner.)
  LocalIndex::Going going;
  // A page the leaf walk passed may be a leaf now: the walk starts again from the cold end.
  bool rejudge = false;
  // The rest of the exact cohort of chosen[at] goes with it (the same transaction); its parents
  // lose those children. The members leave the tier when the pass ends (`leaving`): removed now,
  // they would send the pass's walk back to the cold end each time (a Scan resumes over its own
  // removals only); until then `whole` keeps them from being judged again.
  std::vector<std::pair<std::string, uint64_t>> leaving;
  std::set<LocalIndex::CohortId> whole;
  auto rest_of_cohort = [&](size_t at) {
    uint64_t got = 0;
    for (const auto& id : index.exact_cohort({chosen[at].second.put_id, chosen[at].second.group})) {
      whole.insert(id);
      if (const auto* keys = index.cohort(id))
        for (const auto& key : *keys) {
          if (key != chosen[at].first) {
            auto it = index.find(key);
            if (it != index.end() && it->second.live) {
              const auto r = index.resident().peek(key);
              if (r && r->put_id == id.first) {
                leaving.emplace_back(key, id.first);
                got += pool.slot_size(it->second.slot);
              }
            }
          }
          if (const auto* p = index.parent_of(key)) {
            going[*p]++;
            auto pit = index.find(*p);  // judged before its children went: judge it again
            if (pit != index.end())
              for (const auto& c : index.exact_cohort({pit->second.put_id, pit->second.group}))
                if (turned_down.erase(c)) rejudge = true;
          }
        }
    }
    return got;
  };
  auto flush_leaving = [&] {
    for (const auto& [key, put_id] : leaving) index.leave_resident(key, put_id);
    leaving.clear();
  };
  // A leaf: no page continues any member of its exact cohort - none here, none on its way.
  auto is_leaf = [&](const LocalIndex::ResidentRef& r) {
    if (!index.cohort_is_leaf({r.put_id, r.group}, going)) return false;
    if (!marks.continued || marks.continued->empty()) return true;
    for (const auto& id : index.exact_cohort({r.put_id, r.group}))
      if (const auto* keys = index.cohort(id))
        for (const auto& key : *keys)
          if (marks.continued->count(key)) return false;
    return true;
  };
  // Whether a page resident as `r` may go in this pass; `leaf`: and no page continues it. `find()`
  // gives its entry: the depth pass has it already, the others look it up only for a cohort not
  // turned down.
  auto eligible = [&](auto find, const LocalIndex::ResidentRef& r, uint64_t size_class, bool leaf) {
    if (pass != judged_pass || size_class != judged_class) {
      turned_down.clear();
      judged_pass = pass;
      judged_class = size_class;
    }
    const LocalIndex::CohortId id{r.put_id, r.group};
    if (turned_down.count(id) || whole.count(id)) return false;
    // Pass 0 wants the whole exact cohort remote-complete: this cohort first (no key lookup).
    if (pass == 0 && !index.remote_complete(id)) {
      turned_down.insert(id);
      return false;
    }
    // This key's own state (another key of the cohort may differ): not remembered.
    const auto it = find();
    if (it == index.end() || it->second.put_id != r.put_id || !it->second.live) return false;
    if (size_class && pool.slot_size(it->second.slot) != size_class) return false;
    if (!size_class && drain && pool.grant_of(it->second.slot) != *drain) return false;
    if (cohort_ok(id) && (!leaf || is_leaf(r))) return true;
    turned_down.insert(id);
    return false;
  };
  auto leaves = [&](uint64_t need, uint64_t size_class) {
    uint64_t got = 0;
    auto leaf = [&](const std::string& k, const LocalIndex::ResidentRef& r) {
      return eligible([&] { return index.find(k); }, r, size_class, true);
    };
    // One walk for the whole pass: each pick goes on where the last one stopped, the cohorts turned
    // down stay so (turned_down) but for parents losing children - then the walk starts again from
    // the cold end. Unbounded: a chain is eaten from its tail, each parent found again behind the
    // walk (bounded by scan_limit, a cold chain's prefix went once the budget ran out).
    LocalIndex::Tier::Scan scan;
    while (got < need) {
      const size_t at = chosen.size();
      if (std::exchange(rejudge, false)) scan.reset();
      const uint64_t g = index.resident().evict_some_if(1, leaf, &chosen, LocalIndex::Tier::Order::kPolicy, &scan);
      if (g == 0) break;
      index.left_resident(chosen[at].first);
      got += g + rest_of_cohort(at);
    }
    return got;
  };
  // eviction_order: prefix_depth - the leaves in the depth order (stale first, then the deepest).
  auto by_depth = [&](uint64_t need, uint64_t size_class) {
    uint64_t got = 0;
    while (got < need) {
      std::string pick;
      LocalIndex::ResidentRef ref;
      index.depth_order()->visit([&](const std::string& k) {
        auto it = index.find(k);
        if (it == index.end() || !index.resident().contains(k)) return false;
        const LocalIndex::ResidentRef r{it->second.put_id, it->second.group};
        if (!eligible([&] { return it; }, r, size_class, true)) return false;
        pick = k;
        ref = r;
        return true;
      });
      if (pick.empty() || !index.leave_resident(pick, ref.put_id)) break;
      got += pool.slot_size(index.find(pick)->second.slot);
      chosen.emplace_back(std::move(pick), ref);
      got += rest_of_cohort(chosen.size() - 1);
    }
    return got;
  };
  // The preference pass (0: remote-complete only) looks at the cold end of the order only
  // (cfg_.scan_limit entries per shard): past it, the later passes take the order as it is.
  auto any = [&](uint64_t need, uint64_t size_class) {
    const size_t at = chosen.size();
    LocalIndex::Tier::Scan scan(pass == 0 ? cfg_.scan_limit : ~uint64_t(0));
    const uint64_t g = index.resident().evict_some_if(
        need, [&](const std::string& k, const LocalIndex::ResidentRef& r) {
          return eligible([&] { return index.find(k); }, r, size_class, false);
        }, &chosen, LocalIndex::Tier::Order::kPolicy, &scan);
    for (size_t i = at; i < chosen.size(); ++i) index.left_resident(chosen[i].first);
    return g;
  };
  // Slots of the claim's own class first: anything else helps only once a whole grant is empty
  // (with `drain`, the other classes' entries come from the grant being drained only).
  uint64_t got = 0;
  for (const uint64_t size_class : {slot_size, uint64_t(0)})
    for (pass = 0; pass < 4 && got < want; ++pass) {
      if (pass == 1 && index.depth_order()) got += by_depth(want - got, size_class);
      else if (pass == 1 && index.chained()) got += leaves(want - got, size_class);
      else if (pass != 1) got += any(want - got, size_class);
      flush_leaving();
    }
  std::vector<LocalIndex::CohortId> cohorts;
  cohorts.reserve(chosen.size());
  for (const auto& [key, ref] : chosen) cohorts.emplace_back(ref.put_id, ref.group);
  return cohorts;
}

std::vector<std::pair<uint64_t, uint64_t>> Eviction::deficits(const ReservePool& pool) {
  std::vector<std::pair<uint64_t, uint64_t>> out;
  for (const auto& [size, slots] : pool.class_slots()) {
    // What claims took since the last look: the next interval will likely take as much again.
    uint64_t& seen = claimed_seen_[size];
    const uint64_t taken = pool.claimed(size) - seen;
    seen = pool.claimed(size);
    if (cfg_.free_watermark <= 0 || pool.can_carve()) continue;
    const auto [free, total] = slots;
    const uint64_t target = uint64_t(double(total) * cfg_.free_watermark) + taken;
    if (free < target) out.emplace_back(size, (std::min(target, total) - std::min(free, target)) * size);
  }
  return out;
}

}  // namespace fluxon
