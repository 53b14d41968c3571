// LocalIndex on its own: an entry, its cohort and its tier places never disagree (A1's bookkeeping).
#include <doctest/doctest.h>

#include <unordered_set>

#include "fluxon/owner/local_index.hpp"
#include "fluxon/owner/replica_budget.hpp"

using namespace fluxon;

namespace {
LocalIndex::Entry entry(uint64_t put_id, uint32_t group, uint64_t len = 4096) {
  LocalIndex::Entry e;
  e.put_id = put_id;
  e.group = group;
  e.len = len;
  return e;
}
}  // namespace

TEST_CASE("LocalIndex: entries join their cohort, erasing one leaves the rest, the last takes the cohort") {
  LocalIndex ix(64 << 20, 0, true);
  ix.insert("a", entry(7, 0));
  ix.insert("b", entry(7, 0));
  ix.insert("c", entry(7, 1));
  REQUIRE(ix.cohort({7, 0}));
  CHECK(*ix.cohort({7, 0}) == std::vector<std::string>{"a", "b"});
  ix.enter_resident("a", {7, 0}, 4096);
  ix.erase(ix.find("a"));
  CHECK_FALSE(ix.contains("a"));
  CHECK_FALSE(ix.resident().contains("a"));
  CHECK(*ix.cohort({7, 0}) == std::vector<std::string>{"b"});
  CHECK_FALSE(ix.erase_if_copy("b", 8));  // another copy's identity: kept
  CHECK(ix.erase_if_copy("b", 7));
  CHECK(ix.cohort({7, 0}) == nullptr);
  CHECK(ix.size() == 1);
}

TEST_CASE("LocalIndex: the exact cohort takes the other TP ranks' same group, and only with tp_cohorts") {
  for (bool tp : {true, false}) {
    LocalIndex ix(64 << 20, 0.5, tp);
    ix.insert("sglang:h1_m_0_2", entry(1, 0));
    ix.insert("sglang:h2_m_0_2", entry(1, 0));
    ix.insert("sglang:h1_m_1_2", entry(2, 3));  // rank 1's copy of the group, another batch
    ix.insert("sglang:h9_m_1_2", entry(5, 0));  // unrelated
    auto exact = ix.exact_cohort({1, 0});
    if (tp)
      CHECK(exact == std::vector<LocalIndex::CohortId>{{1, 0}, {2, 3}});
    else
      CHECK(exact == std::vector<LocalIndex::CohortId>{{1, 0}});
    REQUIRE(ix.hot());
  }
  CHECK(tp_siblings("k_1_4.mamba") == std::vector<std::string>{"k_0_4.mamba", "k_2_4.mamba", "k_3_4.mamba"});
  CHECK(tp_siblings("no-suffix").empty());
  CHECK(tp_siblings("k_3_2").empty());  // rank >= size: not a TP suffix
}

TEST_CASE("LocalIndex: an erased entry leaves the hot tier too") {
  LocalIndex ix(64 << 20, 0.5, false);
  ix.insert("h", entry(3, 0));
  ix.enter_resident("h", {3, 0}, 4096);
  (void)ix.hot()->insert("h", {3, 0}, 4096);
  ix.erase(ix.find("h"));
  CHECK_FALSE(ix.hot()->contains("h"));
  CHECK_FALSE(ix.resident().contains("h"));
}

#include "fluxon/owner/eviction.hpp"

namespace {
// A live entry `key` of its own put (group 0) in a new 4 KiB slot, continuing `parent` ("": none) at
// `depth`, entered into the resident tier (the most recent); its slot.
SlotRef live_entry(ReservePool& pool, LocalIndex& ix, const std::string& key, uint64_t put_id,
                   const std::string& parent = "", uint32_t depth = LocalIndex::kNoDepth) {
  auto c = pool.try_claim(4096, 1);
  REQUIRE((c.ok() && c.value()));
  SlotRef s = (*c.value())[0];
  pool.commit_local(s);
  pool.route_live(s);
  LocalIndex::Entry e;
  e.put_id = put_id;
  e.slot = s;
  e.len = 4096;
  e.live = true;
  ix.insert(key, e, &parent, depth);
  ix.enter_resident(key, {put_id, 0}, 4096);
  return s;
}
// n live entries k0..k(n-1), each its own put (put_id i + 1) in a 4 KiB slot, in the resident tier
// in that order (k0 the coldest); their slots.
std::vector<SlotRef> live_entries(ReservePool& pool, LocalIndex& ix, int n) {
  std::vector<SlotRef> slots;
  for (int i = 0; i < n; ++i) slots.push_back(live_entry(pool, ix, "k" + std::to_string(i), uint64_t(i + 1)));
  return slots;
}
}  // namespace

TEST_CASE("Eviction S4: the debt already on its way counts, a round takes at most its cap, owned cohorts are skipped") {
  ReservePool pool(8 << 20, 1 << 20, std::nullopt);
  LocalIndex ix(8 << 20, 0, false);
  Eviction ev({true, 8192, 0});
  const std::vector<SlotRef> slots = live_entries(pool, ix, 5);
  auto never = [](LocalIndex::CohortId) { return false; };
  const Eviction::Marks none{never, never};
  auto v = ev.select(ix, pool, 4096, 3 * 4096, 0, none);
  CHECK(v.size() == 2);  // the cap: 8 KiB a round
  const uint64_t debt = 8192;
  CHECK(ev.select(ix, pool, 4096, 8192, debt, none).empty());  // already on its way
  CHECK(ev.select(ix, pool, 4096, 3 * 4096, debt, none).size() == 1);
  // Two candidates are left; one a transaction owns is never selected: the other is.
  std::vector<LocalIndex::CohortId> left;
  for (int i = 0; i < 5; ++i)
    if (ix.resident().contains("k" + std::to_string(i))) left.emplace_back(uint64_t(i + 1), 0);
  REQUIRE(left.size() == 2);
  const Eviction::Marks owns_first{[&](LocalIndex::CohortId c) { return c == left[0]; }, never};
  CHECK(ev.select(ix, pool, 4096, 1 << 20, 0, owns_first) == std::vector<LocalIndex::CohortId>{left[1]});
  // The last candidate, held by a reader, is never taken.
  const uint32_t last = uint32_t(left[0].first - 1);
  CHECK(ix.resident().contains("k" + std::to_string(last)));
  pool.add_holder(slots[last]);
  CHECK(ev.select(ix, pool, 4096, 1 << 20, 0, none).empty());
  pool.release_holder(slots[last]);
  CHECK(ev.select(ix, pool, 4096, 1 << 20, 0, none) == std::vector<LocalIndex::CohortId>{left[0]});
  Eviction off({false, 8192, 0});
  CHECK(off.select(ix, pool, 4096, 1 << 20, 0, none).empty());
}

TEST_CASE("eviction: recoverable first - remote-complete cohorts go before colder ones, a cohort a write-back copies goes last") {
  ReservePool pool(1 << 20, 1 << 20, {});
  LocalIndex ix(1 << 20, 0, false);
  Eviction ev({true, 1 << 20, 0});
  live_entries(pool, ix, 4);  // k0 the coldest ... k3 the newest
  ix.mark_remote_complete({3, 0});  // k2: a target owner holds it
  auto never = [](LocalIndex::CohortId) { return false; };
  const Eviction::Marks marks{never, [](LocalIndex::CohortId c) { return c.first == 1; }};  // k0 is being copied
  using V = std::vector<LocalIndex::CohortId>;
  CHECK(ev.select(ix, pool, 4096, 4096, 0, marks) == V{{3, 0}});      // the recoverable one, though newer
  CHECK(ev.select(ix, pool, 4096, 4096, 0, marks) == V{{2, 0}});      // then the coldest unpinned
  CHECK(ev.select(ix, pool, 4096, 2 * 4096, 0, marks) == V{{4, 0}, {1, 0}});  // the pinned one last
}

TEST_CASE("eviction: the recoverable-first pass judges the cold end only (scan_limit) - a round costs a bounded walk, not every entry") {
  // 100 entries, the newest remote-complete. With the whole order in reach, pass 0 finds it; with
  // 2 entries per shard, it lies past the cold end and the round takes the coldest instead.
  for (const uint64_t limit : {uint64_t(16384), uint64_t(2)}) {
    ReservePool pool(1 << 20, 1 << 20, {});
    LocalIndex ix(1 << 20, 0, false);
    Eviction::Config cfg{true, 1 << 20, 0};
    cfg.scan_limit = limit;
    Eviction ev(cfg);
    live_entries(pool, ix, 100);  // k0 the coldest ... k99 the newest (cohort {100, 0})
    ix.mark_remote_complete({100, 0});
    auto never = [](LocalIndex::CohortId) { return false; };
    const Eviction::Marks none{never, never};
    using V = std::vector<LocalIndex::CohortId>;
    CHECK(ev.select(ix, pool, 4096, 4096, 0, none) == (limit == 2 ? V{{1, 0}} : V{{100, 0}}));
  }
}

TEST_CASE("DepthOrder: stale first (oldest first), then the deepest, the least recently touched of a depth first") {
  DepthOrder o(/*stale_bytes=*/3 * 4096);
  o.admit("root", 0, 4096);
  o.admit("a1", 1, 4096);
  o.admit("b1", 1, 4096);
  o.admit("a2", 2, 4096);
  auto order = [&] {
    std::vector<std::string> v;
    o.visit([&](const std::string& k) {
      v.push_back(k);
      return false;
    });
    return v;
  };
  using V = std::vector<std::string>;
  CHECK(order() == V{"a2", "a1", "b1", "root"});  // nothing stale: deepest first, a1 older than b1
  o.touch("a1");
  CHECK(order() == V{"a2", "b1", "a1", "root"});  // a read makes it the most recent of its depth
  o.admit("c3", 3, 4096);                         // the clock moves 4 KiB: root is older than 3 admissions
  CHECK(o.stale("root"));
  CHECK(order() == V{"root", "c3", "a2", "b1", "a1"});  // untouched too long: first, though shallowest
  o.touch("root");
  CHECK_FALSE(o.stale("root"));
  o.erase("c3");
  CHECK(order() == V{"a2", "b1", "a1", "root"});
  CHECK(o.size() == 4);
  CHECK(DepthOrder::kUnknown > 1000000);  // no depth: ordered as the deepest
  // What a newcomer may be and not be the next victim: nothing stale, so the deepest here (a2: 2).
  CHECK(o.keep_cut() == std::optional<uint32_t>(2));
  o.admit("d1", 1, 4096);
  o.admit("d1b", 1, 4096);
  o.admit("d1c", 1, 4096);
  o.admit("d1d", 1, 4096);  // b1 and root untouched for more than 3 admissions: stale, they go first
  CHECK(o.stale("b1"));
  CHECK(o.keep_cut() == std::nullopt);
  CHECK(DepthOrder(4096).keep_cut() == std::nullopt);  // empty
}

TEST_CASE("DepthOrder: kAdaptive - the stale horizon is twice the 90th percentile of the re-read intervals, and follows them") {
  DepthOrder o(DepthOrder::kAdaptive);
  CHECK(o.adaptive());
  CHECK(o.stale_bytes() == UINT64_MAX);  // nothing seen yet: nothing stale
  // A loop of `live` sessions re-read in turn while one new page is admitted per read: every
  // re-read comes `live` pages (of 4 KiB) after the last one.
  uint64_t fresh = 0, turn = 0;
  auto sessions = [&](int live) {
    for (int i = 0; i < live; ++i) o.admit("live" + std::to_string(i), 1, 4096);
    turn = 0;
  };
  auto loop = [&](int live, uint64_t reads) {
    for (uint64_t n = 0; n < reads; ++n) {
      o.admit("new" + std::to_string(fresh++), 5, 4096);
      o.touch("live" + std::to_string(turn++ % live));
    }
  };
  sessions(10);
  loop(10, DepthOrder::kAdaptTouches - 1);
  CHECK(o.stale_bytes() == UINT64_MAX);  // one read short of the first setting
  CHECK_FALSE(o.stale("new0"));
  loop(10, 1);
  // 40 KiB between reads: the bucket below 64 KiB, twice that is 128 KiB (32 pages).
  CHECK(o.stale_bytes() == (uint64_t(128) << 10));
  CHECK(o.stale("new0"));                          // untouched for 4,000 admissions
  CHECK_FALSE(o.stale("new" + std::to_string(fresh - 30)));  // 30 pages ago: within the horizon
  for (int i = 0; i < 10; ++i) CHECK_FALSE(o.stale("live" + std::to_string(i)));
  std::vector<std::string> first;
  o.visit([&](const std::string& k) {
    first.push_back(k);
    return true;
  });
  CHECK(first == std::vector<std::string>{"new0"});  // stale goes first, the oldest
  // The sessions wait longer now (100 of them): one window later the horizon follows (400 KiB
  // between reads: the bucket below 512 KiB, twice that 1 MiB), and a page 200 admissions old
  // is live again.
  sessions(100);
  loop(100, DepthOrder::kAdaptTouches);
  CHECK(o.stale_bytes() == (uint64_t(1) << 20));
  CHECK_FALSE(o.stale("new" + std::to_string(fresh - 200)));
  CHECK(o.stale("new" + std::to_string(fresh - 300)));
  // Back to 10 sessions: the old counts fade by half at each setting, so three windows later the
  // horizon is 128 KiB again (kept whole, the 4,096 long intervals would hold it at 1 MiB for nine).
  sessions(10);
  loop(10, 3 * DepthOrder::kAdaptTouches);
  CHECK(o.stale_bytes() == (uint64_t(128) << 10));
  // A fixed horizon never moves.
  DepthOrder fixed(4096);
  CHECK_FALSE(fixed.adaptive());
  CHECK(fixed.stale_bytes() == 4096);
}

TEST_CASE("ReplicaBudget: the pressure is evicted per admitted slot over the last window, fading in proportion") {
  ReplicaBudget b;
  b.observe(0, 0, 100);
  CHECK(b.pressure() == 0.0);
  b.observe(100, 0, 100);  // a warm-up: admitted without evicting
  CHECK(b.pressure() == 0.0);
  b.observe(200, 100, 100);  // every slot of the next window paid for with an eviction
  CHECK(b.pressure() == doctest::Approx(0.5));
  b.observe(400, 300, 100);  // 100 + 200 admitted, 50 + 200 evicted, faded to the window of 100
  CHECK(b.pressure() == doctest::Approx(250.0 / 300.0));
  b.observe(10000, 9900, 100);  // the warm-up has faded
  CHECK(b.pressure() > 0.99);
}

TEST_CASE("ReplicaBudget kv_score_pressure_budget: candidates best first and whole within pages x pressure, none at rest, one decision per group for the TP ranks") {
  ReplicaBudget b;
  const std::vector<uint32_t> groups{2, 2, 2, 2};
  ReplicaBudgetArgs args{5, {0.2f, 0.9f, 0.5f, 0.7f}, {11, 12, 13, 14}, 1};  // one rank: nothing remembered
  auto mask = [](std::vector<bool> g) {  // per group -> per key
    std::vector<bool> m;
    for (bool v : g) m.insert(m.end(), {v, v});
    return m;
  };
  // At rest (nothing evicted): no replica at all - it would be a duplicate.
  b.observe(0, 0, 64);
  b.observe(64, 0, 64);
  auto r = mask({true, true, true, true});
  auto o = b.apply(r, groups, args);
  CHECK(r == mask({false, false, false, false}));
  CHECK(o.cut_keys == 8);
  // Every admission evicts: 5 pages -> the 0.9 and 0.7 groups (4 pages); the 0.5 group does not fit
  // whole in the page left, a non-candidate (the client's score rule said no) stays out.
  ReplicaBudgetArgs hot{5, {0.2f, 0.9f, 0.5f, 0.7f}, {21, 22, 23, 24}, 2};
  b.observe(1000, 1000, 64);
  REQUIRE(b.pressure() > 0.99);
  r = mask({true, true, true, true});
  o = b.apply(r, groups, hot);
  CHECK(r == mask({false, true, false, true}));
  CHECK(o.kept_keys == 4);
  CHECK(o.cut_keys == 4);
  CHECK(o.memo_keys == 0);
  // The pressure falls before the other TP rank's put of the same groups: it gets the same answer.
  b.observe(50000, 1000, 64);
  REQUIRE(b.pressure() < 0.01);
  r = mask({true, true, true, true});
  o = b.apply(r, groups, hot);
  CHECK(r == mask({false, true, false, true}));
  CHECK(o.memo_keys == 8);
  CHECK(b.memo_size() == 0);  // both shares came: the decisions are gone
  // A third put of the groups (a new version, later) decides afresh: at this pressure, nothing.
  ReplicaBudgetArgs again = hot;
  again.shares = 1;
  r = mask({true, true, true, true});
  b.apply(r, groups, again);
  CHECK(r == mask({false, false, false, false}));
  // A decision whose other share never comes is dropped once the owner admitted kMemoTtlSlots more.
  b.observe(60000, 11000, 64);
  r = mask({true, false, false, false});
  b.apply(r, groups, ReplicaBudgetArgs{8, {1, 1, 1, 1}, {31, 32, 33, 34}, 2});
  CHECK(r == mask({true, false, false, false}));
  CHECK(b.memo_size() == 1);
  b.observe(60000 + ReplicaBudget::kMemoTtlSlots + 1, 11000 + ReplicaBudget::kMemoTtlSlots + 1, 64);
  r = mask({false, false, false, false});
  b.apply(r, groups, args);
  CHECK(b.memo_size() == 0);
  CHECK(b.memo_dropped() == 1);
}

TEST_CASE("eviction: prefix_depth - the deepest leaf goes first, stale before deep, remote-complete before both") {
  ReservePool pool(1 << 20, 1 << 20, {});
  LocalIndex ix(1 << 20, 0, false, /*depth_stale_bytes=*/uint64_t(64) << 10);
  Eviction ev({true, 1 << 20, 0});
  // Two sessions: s (root s0, s1, s2) and t (root t0, t1); t's pages entered last, so recency
  // alone would take s0 first.
  std::vector<std::pair<std::string, std::string>> pages{{"s0", ""}, {"s1", "s0"}, {"s2", "s1"}, {"t0", ""},
                                                         {"t1", "t0"}};
  for (size_t i = 0; i < pages.size(); ++i) {
    const auto& [k, parent] = pages[i];
    // s's depths are given (content_depths); t1's follows from its parent's.
    const uint32_t depth = k[0] == 's' ? uint32_t(k[1] - '0') : (k == "t0" ? 0 : LocalIndex::kNoDepth);
    live_entry(pool, ix, k, uint64_t(i + 1), parent, depth);
  }
  CHECK(ix.depth_of("t1") == 1);
  CHECK(ix.depth_of("s2") == 2);
  auto never = [](LocalIndex::CohortId) { return false; };
  const Eviction::Marks none{never, never};
  using V = std::vector<LocalIndex::CohortId>;
  // Each selected cohort's reclaim commits (the entry goes) before the next round.
  auto round = [&] {
    auto v = ev.select(ix, pool, 4096, 4096, 0, none);
    for (const auto& c : v)
      for (const auto& k : std::vector<std::string>(*ix.cohort(c))) ix.erase(ix.find(k));
    return v;
  };
  CHECK(round() == V{{3, 0}});  // s2: the deepest, though t's pages are newer
  ix.touch("t1");
  ix.touch("s1");
  CHECK(round() == V{{5, 0}});  // s1 and t1 at depth 1: t1 was read before s1
  ix.mark_remote_complete({1, 0});  // s0: a target owner holds it - recoverable, before s1
  CHECK(round() == V{{1, 0}});
  CHECK(round() == V{{2, 0}});  // s1 (depth 1) before the root t0
  CHECK(round() == V{{4, 0}});
  CHECK(round().empty());
}

TEST_CASE("eviction: prefix_depth - the deepest goes first even while a write-back copies it, not a shallower page in its place") {
  // A write-back pins its cohort in the tier order (the copy would be lost). In the depth order the
  // deepest page is what the CPU owner would take as its own next victim: pinning it there made
  // eviction take shallower pages instead - the prefixes the next turns need (fluxon workload, 25%:
  // 35% -> 44% hits without the pin).
  ReservePool pool(1 << 20, 1 << 20, {});
  LocalIndex ix(1 << 20, 0, false, /*depth_stale_bytes=*/uint64_t(64) << 10);
  Eviction ev({true, 1 << 20, 0});
  live_entry(pool, ix, "r0", 1, "", 0);
  live_entry(pool, ix, "r1", 2, "r0", 1);
  live_entry(pool, ix, "r2", 3, "r1", 2);  // the deepest, being written back
  auto never = [](LocalIndex::CohortId) { return false; };
  const Eviction::Marks marks{never, [](LocalIndex::CohortId c) { return c.first == 3; }};
  using V = std::vector<LocalIndex::CohortId>;
  CHECK(ev.select(ix, pool, 4096, 4096, 0, marks) == V{{3, 0}});
}

TEST_CASE("eviction: a cohort with a member still on its way to the master (its route not yet live) is not selected") {
  ReservePool pool(1 << 20, 1 << 20, {});
  LocalIndex ix(1 << 20, 0, /*tp_cohorts=*/true);
  Eviction ev({true, 1 << 20, 0});
  // a_0_2 (rank 0's copy, the coldest) is live; rank 1's copy of the same group, a_1_2, is committed
  // here but its route is not acknowledged yet; b_0_2 is live and the most recent.
  live_entry(pool, ix, "a_0_2", 1);
  auto c = pool.try_claim(4096, 1);
  REQUIRE((c.ok() && c.value()));
  const SlotRef pending = (*c.value())[0];
  pool.commit_local(pending);
  LocalIndex::Entry e;
  e.put_id = 2;
  e.slot = pending;
  e.len = 4096;
  ix.insert("a_1_2", e);
  live_entry(pool, ix, "b_0_2", 3);
  auto never = [](LocalIndex::CohortId) { return false; };
  const Eviction::Marks none{never, never};
  using V = std::vector<LocalIndex::CohortId>;
  REQUIRE(ix.exact_cohort({1, 0}) == V{{1, 0}, {2, 0}});
  // Without the rule a_0_2 would go alone, and the master (which may list a_1_2 already) would refuse
  // the reclaim as not the whole cohort.
  CHECK(ev.select(ix, pool, 4096, 4096, 0, none) == V{{3, 0}});
  // Acknowledged: the cohort goes whole.
  pool.route_live(pending);
  ix.find("a_1_2")->second.live = true;
  ix.enter_resident("a_1_2", {2, 0}, 4096);
  CHECK(ev.select(ix, pool, 4096, 2 * 4096, 0, none) == V{{1, 0}, {2, 0}});
}

TEST_CASE("eviction: prefix_depth - a page untouched while the owner admitted the stale bytes goes before deeper live ones") {
  ReservePool pool(1 << 20, 1 << 20, {});
  LocalIndex ix(1 << 20, 0, false, /*depth_stale_bytes=*/uint64_t(8) << 10);
  Eviction ev({true, 1 << 20, 0});
  // k0 (depth 0) is admitted first, then k1..k3 at depths 1..3 (no chain: each its own leaf).
  for (uint32_t i = 0; i < 4; ++i) live_entry(pool, ix, "k" + std::to_string(i), i + 1, "", i);
  auto never = [](LocalIndex::CohortId) { return false; };
  const Eviction::Marks none{never, never};
  using V = std::vector<LocalIndex::CohortId>;
  // k0 entered 12 KiB of admissions ago (more than 8 KiB): stale; k1 8 KiB ago: not yet.
  CHECK(ix.depth_order()->stale("k0"));
  CHECK_FALSE(ix.depth_order()->stale("k1"));
  CHECK(ev.select(ix, pool, 4096, 4096, 0, none) == V{{1, 0}});  // stale: first, though the shallowest
  // Then the deepest first, whatever their age (an LRU would take k1, the oldest).
  CHECK(ev.select(ix, pool, 4096, 2 * 4096, 0, none) == V{{4, 0}, {3, 0}});
  CHECK(ev.select(ix, pool, 4096, 4096, 0, none) == V{{2, 0}});
}

TEST_CASE("eviction: a page a put on its way continues is no leaf - the deepest page goes only once nothing continues it") {
  ReservePool pool(1 << 20, 1 << 20, {});
  for (const bool depth : {false, true}) {
    CAPTURE(depth);
    LocalIndex ix(1 << 20, 0, false, depth ? std::optional<uint64_t>(uint64_t(1) << 30) : std::nullopt);
    Eviction ev({true, 1 << 20, 0});
    // One chain a0 <- a1 <- a2 (a2 the deepest leaf), and b0 alone, the most recent.
    const std::vector<std::pair<std::string, std::string>> pages{{"a0", ""}, {"a1", "a0"}, {"a2", "a1"}, {"b0", ""}};
    for (size_t i = 0; i < pages.size(); ++i)
      live_entry(pool, ix, pages[i].first, 10 * (depth ? 2 : 1) + i, pages[i].second,
                 pages[i].first == "b0" ? 0 : uint32_t(pages[i].first[1] - '0'));
    auto never = [](LocalIndex::CohortId) { return false; };
    const std::unordered_set<std::string> continued{"a2"};  // a claim waits to write a3 after a2
    const Eviction::Marks marks{never, never, &continued};
    using V = std::vector<LocalIndex::CohortId>;
    const uint64_t base = 10 * (depth ? 2 : 1);
    // Without the claim a2 (the deepest leaf, and the oldest leaf) would go; with it, b0.
    CHECK(ev.select(ix, pool, 4096, 4096, 0, marks) == V{{base + 3, 0}});
  }
}

#include "fluxon/core/retry_table.hpp"

namespace {
struct TestJob {
  std::string what;
  int64_t next_send = 0;
};
}  // namespace

TEST_CASE("RetryTable T1: every attempt's reply finds its job until it is settled, then none does") {
  RetryTable<TestJob> t;
  t.emplace(7, {"publish 7"});
  t.attempt(7, 100);
  t.attempt(7, 101);  // re-sent: both attempts stay answerable
  t.emplace(8, {"publish 8"});
  t.attempt(8, 102);
  CHECK(t.id_of(100) == 7u);
  CHECK(t.id_of(101) == 7u);
  CHECK(t.id_of(102) == 8u);
  CHECK(t.attempts_in_flight() == 3);
  CHECK(t.take(t.find(7)).what == "publish 7");  // a late reply to 100 or 101 finds nothing now
  CHECK_FALSE(t.id_of(100).has_value());
  CHECK_FALSE(t.id_of(101).has_value());
  t.forget(8);  // answered, the job goes on (a removal with busy items)
  CHECK(t.count(8) == 1);
  CHECK_FALSE(t.id_of(102).has_value());
  t.attempt(8, 103);
  CHECK(t.id_of(103) == 8u);
  t.erase(t.find(8));
  CHECK(t.empty());
  CHECK(t.attempts_in_flight() == 0);
}

TEST_CASE("RetryTable: due(now) is deadline-ordered and answers in id order, schedule() moves a job's time") {
  RetryTable<TestJob> t;
  for (uint64_t id : {5, 3, 9}) t.emplace(id, {"j"});
  t.schedule(5, 100);
  t.schedule(3, 300);
  t.schedule(9, 50);
  CHECK(t.due(10).empty());
  CHECK(t.due(100) == std::vector<uint64_t>{5, 9});  // id order, as a scan finds them
  t.schedule(9, 400);
  CHECK(t.due(350) == std::vector<uint64_t>{3, 5});
  CHECK(t.at(9).next_send == 400);
  t.erase(t.find(5));
  CHECK(t.due(1000) == std::vector<uint64_t>{3, 9});
  t.schedule(42, 1);  // unknown: nothing
  CHECK(t.due(1000).size() == 2);
}

#include "fluxon/owner/sessions.hpp"

TEST_CASE("Sessions: holdings are unique, non-zero, released only by their own session, a closed session gives them back") {
  ReservePool pool(8 << 20, 1 << 20, std::nullopt);
  auto c = pool.try_claim(4096, 1);
  REQUIRE((c.ok() && c.value()));
  SlotRef slot = (*c.value())[0];
  pool.commit_local(slot);
  pool.route_live(slot);
  Sessions ss;
  const uint64_t a = ss.open(), b = ss.open();
  CHECK(a != b);
  const uint64_t h1 = ss.hold(pool, slot, a), h2 = ss.hold(pool, slot, a), h3 = ss.hold(pool, slot, b);
  CHECK((h1 != 0 && h1 != h2 && h2 != h3));
  CHECK(pool.slot(slot).holder_refs == 3);
  ss.release(pool, h1, b);  // not b's: nothing
  CHECK(pool.slot(slot).holder_refs == 3);
  ss.release(pool, h1, a);
  CHECK(pool.slot(slot).holder_refs == 2);
  CHECK(ss.holding(h1) == nullptr);
  auto closed = ss.close(a);
  REQUIRE(closed);
  CHECK(ss.holding(h2) != nullptr);
  CHECK(ss.release_holdings(pool, a) == 1);  // h2
  CHECK(ss.holding(h2) == nullptr);
  CHECK(ss.holding(h3) != nullptr);  // b's stays
  CHECK(pool.slot(slot).holder_refs == 1);
  CHECK_FALSE(ss.contains(a));
  CHECK_FALSE(ss.close(a));
  CHECK(ss.holders() == 1);
  // A session known only by its holdings (it never opened a plan or a handle) gives them back too.
  const uint64_t h4 = ss.hold(pool, slot, 99);
  CHECK(pool.slot(slot).holder_refs == 2);
  CHECK_FALSE(ss.close(99));
  CHECK(ss.release_holdings(pool, 99) == 1);
  CHECK(ss.holding(h4) == nullptr);
  CHECK(pool.slot(slot).holder_refs == 1);
}
