// Owner-hot write-back and single-copy demotion: the master's rules (all or none, never the last
// copy, idempotent) and whole clusters in the deterministic simulator, with and without faults.
// Each test prints its seed; replay a failure with FLUXON_SEED=<seed>.
#include <algorithm>
#include <map>
#include <set>

#include "helpers.hpp"

using namespace fluxon;
using namespace fluxon::test;

namespace {

void w_register(MasterCore& m, uint32_t node, const std::string& role) {
  wire::RegisterOwnerT r;
  r.node_id = node;
  r.generation = 1;
  r.role = role;
  r.segment_len = 1 << 20;
  REQUIRE(m.handle(make_envelope(std::move(r))).body.AsRegisterOwnerReply());
}
void w_put(MasterCore& m, uint32_t node, uint64_t put_id, const std::string& key) {
  REQUIRE(m_put(m, node, put_id, key, 0).body.AsPutDoneReply()->results[0] == wire::PutItemResult::Live);
}
// Node `to` fetches key from whoever holds it and publishes its copy (a 4 KiB slot at 8192, its own
// cohort: the get id is its instance).
void w_copy(MasterCore& m, uint32_t to, const std::string& key, uint64_t get_id) {
  REQUIRE(m_start(m, to, key, get_id) == wire::GetStartStatus::Started);
  wire::BatchGetDoneT d;
  d.node_id = to;
  d.generation = 1;
  d.items.push_back(std::make_unique<wire::GetDoneItemT>(wire::GetDoneItemT{{}, key, get_id, 8192, get_id, 0, 4096}));
  REQUIRE(m.handle(make_envelope(std::move(d))).body.AsBatchGetDoneReply()->results[0] == wire::GetDoneStatus::Live);
}
template <class T>
T w_items(uint32_t node, const std::vector<std::pair<std::string, uint64_t>>& keys) {
  T req;
  req.node_id = node;
  req.generation = 1;
  for (const auto& [key, put_id] : keys)
    req.items.push_back(std::make_unique<wire::WriteBackItemT>(wire::WriteBackItemT{{}, key, node, 1, put_id}));
  return req;
}
std::vector<wire::WriteBackStatus> w_back(MasterCore& m, uint32_t node,
                                          const std::vector<std::pair<std::string, uint64_t>>& keys) {
  return m.handle(make_envelope(w_items<wire::WriteBackT>(node, keys))).body.AsWriteBackReply()->status;
}
// One reclaim step of node's copies; the answer's result.
wire::ReclaimResult w_reclaim(MasterCore& m, uint32_t node, uint64_t epoch, wire::ReclaimStep st, bool demote,
                              const std::vector<ReclaimCopy>& copies) {
  return m_reclaim(m, node, 1, epoch, st, demote, false, copies).result;
}
// Single-copy demotion of node's copies of `keys` (each (key, put): the put's cohort, a 4 KiB slot at
// 0): a fenced reclaim with demote set - Fence, then Commit once fenced. Returns the Fence's answer.
wire::ReclaimResult w_demote(MasterCore& m, uint32_t node, const std::vector<std::pair<std::string, uint64_t>>& keys,
                             uint64_t epoch) {
  std::vector<ReclaimCopy> copies;
  for (const auto& [key, put_id] : keys) copies.push_back({key, node, put_id, put_id, 0, 4096});
  auto step = [&](wire::ReclaimStep st) { return w_reclaim(m, node, epoch, st, true, copies); };
  const auto fenced = step(wire::ReclaimStep::Fence);
  if (fenced == wire::ReclaimResult::Fenced || fenced == wire::ReclaimResult::AlreadyInProgress)
    CHECK(step(wire::ReclaimStep::Commit) == wire::ReclaimResult::Completed);
  return fenced;
}

}  // namespace

TEST_CASE("master: a write-back queues one task per version, demotion is all or none and never drops the last copy") {
  MasterCore m;
  w_register(m, 1, "sglang_owner");
  w_register(m, 3, "sglang_owner");
  w_put(m, 1, 7, "a");
  w_put(m, 1, 7, "b");
  using S = wire::WriteBackStatus;
  // No target-role owner yet: refused, nothing queued (never another GPU owner).
  CHECK(w_back(m, 1, {{"a", 7}}) == std::vector<S>{S::NoTarget});
  CHECK(m.replica_tasks_queued() == 0);
  w_register(m, 2, "remote_cache");
  CHECK(w_back(m, 1, {{"a", 7}, {"b", 7}}) == std::vector<S>{S::Queued, S::Queued});
  CHECK(w_back(m, 1, {{"a", 7}, {"b", 7}}) == std::vector<S>{S::Queued, S::Queued});  // T1: re-sent
  CHECK(m.replica_tasks_queued() == 2);
  CHECK(w_back(m, 1, {{"a", 6}}) == std::vector<S>{S::Obsolete});   // not the version it holds
  CHECK(w_back(m, 3, {{"a", 7}}) == std::vector<S>{S::Obsolete});   // node 3 holds no copy
  // Demotion before the copy exists: refused, both keys stay (all or none).
  using D = wire::ReclaimResult;
  w_copy(m, 2, "a", 100);
  CHECK(w_back(m, 1, {{"a", 7}, {"b", 7}}) == std::vector<S>{S::Backed, S::Queued});
  CHECK(w_demote(m, 1, {{"a", 7}, {"b", 7}}, 1) == D::Kept);
  CHECK(m.replica_nodes("a") == std::vector<uint32_t>{1, 2});
  CHECK(m.replica_nodes("b") == std::vector<uint32_t>{1});
  CHECK(m.reclaim_fence_count() == 0);
  // A copy on another GPU owner does not count: only target roles back a demotion.
  w_copy(m, 3, "b", 101);
  CHECK(w_demote(m, 1, {{"a", 7}, {"b", 7}}, 2) == D::Kept);
  w_copy(m, 2, "b", 102);
  // A remote get reading the source copy: Busy, nothing dropped, nothing fenced.
  wire::BatchGetStartT g;
  g.node_id = 4;
  g.generation = 1;
  g.items.push_back(std::make_unique<wire::GetItemT>(wire::GetItemT{{}, "a", 200}));
  auto started = m.handle(make_envelope(std::move(g)));
  REQUIRE(started.body.AsBatchGetStartReply()->items[0]->source_node == 1);  // the first replica, none read
  CHECK(w_demote(m, 1, {{"a", 7}, {"b", 7}}, 3) == D::RetryableBusy);
  CHECK(m.replica_nodes("a") == std::vector<uint32_t>{1, 2});
  CHECK(m.reclaim_fence_count() == 0);
  wire::BatchGetRevokeT rv;
  rv.node_id = 4;
  rv.generation = 1;
  rv.items.push_back(std::make_unique<wire::GetItemT>(wire::GetItemT{{}, "a", 200}));
  m.handle(make_envelope(std::move(rv)));
  CHECK(w_demote(m, 1, {{"a", 7}, {"b", 7}}, 4) == D::Fenced);
  CHECK(m.replica_nodes("a") == std::vector<uint32_t>{2});
  auto b_nodes = m.replica_nodes("b");
  std::sort(b_nodes.begin(), b_nodes.end());
  CHECK(b_nodes == std::vector<uint32_t>{2, 3});
  CHECK(w_demote(m, 1, {{"a", 7}, {"b", 7}}, 4) == D::Completed);  // T1: the same epoch again
  CHECK(m.counters().demoted_keys_total == 2);
  CHECK(m.counters().owner_hot_demotion_cohorts == 1);
  // T1: a demotion committed, its reply lost, the remote copy evicted since: the same epoch again
  // is still Completed (the source copy is gone at the master), and drops nothing more.
  w_put(m, 1, 8, "d");
  w_copy(m, 2, "d", 104);
  CHECK(w_demote(m, 1, {{"d", 8}}, 5) == D::Fenced);
  bool busy = false;
  REQUIRE(m_remove(m, 2, "d", 1, 8, &busy));
  CHECK(m.route_count() == 2);  // "d" is gone everywhere
  CHECK(w_demote(m, 1, {{"d", 8}}, 5) == D::Completed);
  CHECK(w_demote(m, 3, {{"d", 8}}, 6) == D::Completed);  // another node: no copy of its own to fence
  CHECK(m.counters().demoted_keys_total == 3);
  // The remote copy goes first: a later demotion of that key is refused, its source stays.
  w_put(m, 1, 9, "c");
  w_copy(m, 2, "c", 103);
  REQUIRE(m_remove(m, 2, "c", 1, 9, &busy));
  CHECK(w_demote(m, 1, {{"c", 9}}, 7) == D::Kept);
  CHECK(m.replica_nodes("c") == std::vector<uint32_t>{1});
  CHECK(m.counters().demote_kept_total == 3);
  CHECK(m.reclaim_fence_count() == 0);
}

namespace {

std::vector<uint8_t> wpattern(const std::string& key) {
  std::vector<uint8_t> b(4096);
  const uint64_t h = std::hash<std::string>{}(key);
  for (uint64_t i = 0; i < b.size(); ++i) b[i] = uint8_t((h >> ((i % 8) * 8)) + i * 7);
  return b;
}

OwnerConfig hot_owner(bool demote) {
  OwnerConfig c = small_owner();
  c.hot_writeback_ratio = 0.05;  // 8 MiB segment: about 100 slots of 4 KiB stay hot
  c.writeback_demote = demote;
  c.writeback_timeout_ms = 20000;
  return c;
}

// 40 puts of 2 atomic groups of 5 keys on owner 0 (node 1), bytes written; returns the groups.
// 40 puts of two groups of 5; `chains`: every 4 puts are one prefix chain (radix_parent_keys),
// each key's content depth its place in the chain.
std::vector<std::vector<std::string>> fill(sim::Cluster& c, uint64_t s, bool chains = false) {
  std::vector<std::vector<std::string>> groups;
  std::string last;
  for (int p = 0; p < 40; ++p) {
    std::vector<std::string> keys, parents;
    std::vector<uint32_t> depths;
    if (p % 4 == 0) last.clear();
    for (int i = 0; i < 10; ++i) {
      keys.push_back("wb-" + std::to_string(p) + "-" + std::to_string(i));
      parents.push_back(last);
      depths.push_back(uint32_t((p % 4) * 10 + i));
      last = keys.back();
    }
    auto r = put_start(c, 0, s, keys, 4096, {5, 5}, chains ? parents : std::vector<std::string>{},
                       chains ? depths : std::vector<uint32_t>{});
    auto* ps = r.body.AsPutStartReply();
    REQUIRE_MESSAGE(ps, envelope_status(r).to_string());
    for (size_t i = 0; i < keys.size(); ++i) c.write(0, ps->offsets[i], wpattern(keys[i]));
    REQUIRE(c.call(0, s, make_envelope(wire::PutCommitReqT{{}, ps->put_id})).body.AsPutCommitReply());
    groups.emplace_back(keys.begin(), keys.begin() + 5);
    groups.emplace_back(keys.begin() + 5, keys.end());
  }
  return groups;
}

// fill() with inclusive write-back (hot_owner(false)), until its write-backs landed: the cohorts
// written back are remote-complete, both copies stay.
std::vector<std::vector<std::string>> fill_written_back(sim::Cluster& c, uint64_t s) {
  auto groups = fill(c, s);
  REQUIRE(c.run_until(
      [&] { return c.owner(0).writebacks_pending() == 0 && c.owner(0).counters().writeback_backed_keys_total > 0; },
      60000));
  return groups;
}

// Every key has a copy somewhere; each group is here whole or not at all; returns groups demoted.
size_t check_copies(sim::Cluster& c, const std::vector<std::vector<std::string>>& groups) {
  size_t gone = 0;
  for (const auto& g : groups) {
    int here = 0;
    for (const auto& k : g) {
      const auto nodes = c.master().replica_nodes(k);
      CHECK_MESSAGE(!nodes.empty(), "the last copy of ", k, " went");
      here += c.owner(0).local_state(k) == 2;
      if (c.owner(0).local_state(k) == 0) CHECK(nodes == std::vector<uint32_t>{2});
    }
    CHECK_MESSAGE((here == 0 || here == 5), "a cohort was split: ", here, " of 5 left");
    gone += here == 0;
  }
  return gone;
}

}  // namespace

TEST_CASE("write-back admission: a write-back deeper than every pressed target keeps is declined, a shallower one, a write_through's or a spill's is not") {
  MasterCore m;
  w_register(m, 1, "sglang_owner");
  w_register(m, 2, "remote_cache");
  for (const auto& k : {"d3", "d9", "wt9", "q9"}) w_put(m, 1, 7, k);
  using S = wire::WriteBackStatus;
  auto item = [](const std::string& key, int32_t depth, bool declinable) {
    auto w = std::make_unique<wire::WriteBackItemT>(wire::WriteBackItemT{{}, key, 1, 1, 7});
    w->depth = depth;
    w->declinable = declinable;
    return w;
  };
  auto back = [&](std::vector<std::unique_ptr<wire::WriteBackItemT>> items) {
    wire::WriteBackT w;
    w.node_id = 1;
    w.generation = 1;
    w.items = std::move(items);
    return m.handle(make_envelope(std::move(w))).body.AsWriteBackReply()->status;
  };
  auto poll = [&](int32_t keep) {
    wire::ReplicaPollT p;
    p.node_id = 2;
    p.generation = 1;
    p.max = 64;
    p.keep_depth = keep;
    return m.handle(make_envelope(std::move(p))).body.AsReplicaPollReply()->keys;
  };
  // A target with room (keep_depth -1) takes anything: queued at depth 9.
  CHECK(poll(-1).empty());
  std::vector<std::unique_ptr<wire::WriteBackItemT>> first;
  first.push_back(item("q9", 9, true));
  CHECK(back(std::move(first)) == std::vector<S>{S::Queued});
  // The target is full and keeps down to depth 5: a depth-9 task already queued is not handed to it.
  CHECK(poll(5).empty());
  CHECK(m.counters().replica_tasks_declined_total == 1);
  std::vector<std::unique_ptr<wire::WriteBackItemT>> items;
  items.push_back(item("d3", 3, true));    // it keeps depth 3: queued
  items.push_back(item("d9", 9, true));    // its next victim: declined, no task
  items.push_back(item("wt9", 9, false));  // a write_through put's (or a spill's): never declined
  items.push_back(item("q9", 9, true));    // asked again: declined now
  CHECK(back(std::move(items)) == std::vector<S>{S::Queued, S::Declined, S::Queued, S::Declined});
  CHECK(m.counters().writeback_declined_total == 2);
  CHECK(poll(5) == std::vector<std::string>{"d3", "wt9"});
  // Depth not known: never declined.
  w_put(m, 1, 7, "nodepth");
  std::vector<std::unique_ptr<wire::WriteBackItemT>> unknown;
  unknown.push_back(item("nodepth", -1, true));
  CHECK(back(std::move(unknown)) == std::vector<S>{S::Queued});
}

TEST_CASE("owner-hot write-back: evicted cohorts get a copy on the remote_cache owner, then leave whole (E16ap)") {
  sim::Cluster c(seed_from_env(301), hot_owner(true), 2, {"sglang_owner", "remote_cache"});
  c.run_for(10);
  const uint64_t s = c.open_session(0);
  const auto groups = fill(c, s);
  REQUIRE(c.run_until([&] { return c.owner(0).writebacks_pending() == 0 && c.owner(0).counters().demoted_keys_total > 0; },
                      60000));
  c.run_for(200);
  const auto& oc = c.owner(0).counters();
  MESSAGE("hot evicted " << oc.hot_evicted_keys_total << ", cohorts written back " << oc.writeback_cohorts_total
                         << ", demoted " << oc.demoted_cohorts_total << " (" << oc.demoted_keys_total << " keys), kept "
                         << oc.demote_kept_total << ", abandoned " << oc.writeback_abandoned_total);
  const size_t gone = check_copies(c, groups);
  CHECK(gone == oc.demoted_cohorts_total);
  CHECK(gone >= 40);                                      // 400 keys, about 100 stay hot
  CHECK(c.owner(0).hot_bytes() <= uint64_t((8 << 20) * 0.05));
  CHECK(oc.demoted_keys_total == c.master().counters().demoted_keys_total);
  CHECK(c.owner(1).counters().replica_done_total >= oc.demoted_keys_total);
  CHECK(oc.writeback_abandoned_total == 0);
  CHECK(oc.demote_kept_total == 0);
  // Every key handed to a demotion transaction ended demoted (none kept, none replaced), and no
  // transaction or fence is left.
  CHECK(c.owner(0).reclaims_in_flight() == 0);
  CHECK(oc.demote_started_keys_total == oc.demoted_keys_total);
  CHECK(c.master().reclaim_fence_count() == 0);
  // V3/A1: what is live here is in the hot tier, or its cohort left whole (checked above); no cold
  // key stays behind unwritten.
  for (const auto& g : groups)
    for (const auto& k : g)
      if (c.owner(0).local_state(k) == 2) CHECK_MESSAGE(c.owner(0).in_hot_tier(k), k, " is live but neither hot nor written back");
  // A demoted key reads back from the remote_cache owner (L3), bytes intact; the newest stay local.
  auto g = get_start(c, 0, s, {groups.front().front(), groups.back().back()});
  auto* r = g.body.AsGetStartReply();
  REQUIRE(r->transferable_len == 2);
  CHECK(r->leader_keys == 1);
  CHECK(r->local_keys == 1);
  auto t = c.call(0, s, make_envelope(wire::GetTransferReqT{{}, r->handle_id, 2}));
  REQUIRE(t.body.AsGetTransferReply());
  CHECK(c.read(0, t.body.AsGetTransferReply()->offsets[0]) == wpattern(groups.front().front()));
  CHECK(c.read(0, t.body.AsGetTransferReply()->offsets[1]) == wpattern(groups.back().back()));
}

TEST_CASE("owner-hot write-back carries the prefix chain and depths: demoted pages on the remote_cache owner continue the same pages") {
  sim::Cluster c(seed_from_env(305), hot_owner(true), 2, {"sglang_owner", "remote_cache"});
  c.run_for(10);
  const uint64_t s = c.open_session(0);
  const auto groups = fill(c, s, /*chains=*/true);
  REQUIRE(c.run_until([&] { return c.owner(0).writebacks_pending() == 0 && c.owner(0).counters().demoted_keys_total > 0; },
                      60000));
  c.run_for(200);
  size_t checked = 0;
  for (int p = 0; p < 40; ++p)
    for (int i = 0; i < 10; ++i) {
      const std::string k = "wb-" + std::to_string(p) + "-" + std::to_string(i);
      if (c.owner(1).local_state(k) != 2) continue;
      const std::string want = i > 0 ? "wb-" + std::to_string(p) + "-" + std::to_string(i - 1)
                               : p % 4 ? "wb-" + std::to_string(p - 1) + "-9" : std::string();
      CHECK_MESSAGE(c.owner(1).prefix_parent(k) == want, k);
      CHECK_MESSAGE(c.owner(1).prefix_depth(k) == uint32_t((p % 4) * 10 + i), k);  // the depth order's input
      ++checked;
    }
  CHECK(checked >= 200);  // most of the 400 keys went to the target
}

TEST_CASE("owner-hot write-back without demotion: both copies stay (inclusive write-back)") {
  sim::Cluster c(seed_from_env(311), hot_owner(false), 2, {"sglang_owner", "remote_cache"});
  c.run_for(10);
  const uint64_t s = c.open_session(0);
  const auto groups = fill(c, s);
  REQUIRE(c.run_until([&] { return c.owner(0).writebacks_pending() == 0 && c.owner(0).counters().writeback_backed_keys_total > 0; },
                      60000));
  CHECK(check_copies(c, groups) == 0);
  CHECK(c.owner(0).counters().demoted_keys_total == 0);
  size_t both = 0;
  for (const auto& g : groups)
    for (const auto& k : g) both += c.master().replica_nodes(k) == std::vector<uint32_t>{1, 2};
  CHECK(both == c.owner(0).counters().writeback_backed_keys_total);
}

TEST_CASE("T1: owner-hot write-back under lost, duplicated and delayed master messages and failing fetches") {
  for (uint64_t seed : {321, 322, 323}) {
    sim::Cluster c(seed_from_env(seed), hot_owner(true), 2, {"sglang_owner", "remote_cache"});
    c.run_for(10);
    const uint64_t s = c.open_session(0);
    c.to_master = {0.25, 0.25, 1, 20};
    c.from_master = {0.25, 0.25, 1, 20};
    c.data.drop = 0.2;
    const auto groups = fill(c, s);
    // Reads keep part of the data hot while the rest is written back.
    for (int round = 0; round < 5; ++round) {
      auto g = get_start(c, 0, s, groups[size_t(round) * 7]);
      if (auto* r = g.body.AsGetStartReply()) {
        if (r->transferable_len > 0 && r->owner_rpc) c.call(0, s, make_envelope(wire::GetTransferReqT{{}, r->handle_id, r->transferable_len}));
        release_all(c, 0, s, *r);
      }
    }
    REQUIRE(c.run_until([&] { return c.owner(0).writebacks_pending() == 0; }, 120000));
    c.to_master = c.from_master = sim::kQuietLink;
    c.data.drop = 0;
    REQUIRE(c.run_until([&] { return c.owner(0).reclaims_in_flight() == 0; }, 60000));
    c.run_for(2000);
    const auto& oc = c.owner(0).counters();
    // The demotions reconcile: each key handed to one ended demoted, kept or obsolete.
    CHECK(oc.demote_started_keys_total ==
          oc.demoted_keys_total + oc.demote_kept_keys_total + oc.demote_obsolete_keys_total);
    CHECK(c.master().reclaim_fence_count() == 0);
    MESSAGE("seed " << c.seed() << ": demoted " << oc.demoted_cohorts_total << " cohorts, kept " << oc.demote_kept_total
                    << ", abandoned " << oc.writeback_abandoned_total << ", requests " << oc.writeback_requests_total);
    const size_t gone = check_copies(c, groups);
    CHECK(gone == oc.demoted_cohorts_total);
    CHECK(gone > 0);
    CHECK(c.master().counters().demoted_keys_total == oc.demoted_keys_total);
  }
}

TEST_CASE("owner-hot write-back: a TP cohort (the same group of every rank) is written back and demoted together") {
  OwnerConfig cfg = hot_owner(true);
  sim::Cluster c(seed_from_env(331), cfg, 2, {"sglang_owner", "remote_cache"});
  c.run_for(10);
  const uint64_t s0 = c.open_session(0), s1 = c.open_session(0);
  // Rank 0 and rank 1 put their copies of the same pages in separate puts, as two TP ranks do.
  std::vector<std::vector<std::string>> ranks(2);
  for (int p = 0; p < 40; ++p)
    for (int r = 0; r < 2; ++r) {
      std::vector<std::string> keys;
      for (int i = 0; i < 4; ++i) keys.push_back("tp" + std::to_string(p) + "-" + std::to_string(i) + "_" + std::to_string(r) + "_2");
      auto reply = put_start(c, 0, r == 0 ? s0 : s1, keys, 4096, {4});
      auto* ps = reply.body.AsPutStartReply();
      REQUIRE(ps);
      for (size_t i = 0; i < keys.size(); ++i) c.write(0, ps->offsets[i], wpattern(keys[i]));
      REQUIRE(c.call(0, r == 0 ? s0 : s1, make_envelope(wire::PutCommitReqT{{}, ps->put_id})).body.AsPutCommitReply());
      ranks[r].insert(ranks[r].end(), keys.begin(), keys.end());
    }
  REQUIRE(c.run_until([&] { return c.owner(0).writebacks_pending() == 0 && c.owner(0).counters().demoted_keys_total > 0; },
                      60000));
  c.run_for(200);
  // Page p's group is here on both ranks or on neither: never one rank's half of a TP cohort.
  int gone = 0;
  for (int p = 0; p < 40; ++p) {
    int here[2] = {0, 0};
    for (int r = 0; r < 2; ++r)
      for (int i = 0; i < 4; ++i) here[r] += c.owner(0).local_state(ranks[r][size_t(p * 4 + i)]) == 2;
    CHECK_MESSAGE(here[0] == here[1], "page group ", p, ": rank 0 has ", here[0], ", rank 1 has ", here[1]);
    CHECK((here[0] == 0 || here[0] == 4));
    gone += here[0] == 0;
  }
  CHECK(gone > 0);
  CHECK(c.owner(0).counters().demoted_keys_total == uint64_t(gone) * 8);
}

namespace {
Envelope m_get(MasterCore& m, uint32_t node, const std::string& key, uint64_t get_id, bool revoke) {
  auto items = [&](auto& msg) {
    msg.node_id = node;
    msg.generation = 1;
    msg.items.push_back(std::make_unique<wire::GetItemT>(wire::GetItemT{{}, key, get_id}));
  };
  if (revoke) {
    wire::BatchGetRevokeT rv;
    items(rv);
    return m.handle(make_envelope(std::move(rv)));
  }
  wire::BatchGetStartT g;
  items(g);
  return m.handle(make_envelope(std::move(g)));
}
}  // namespace

TEST_CASE("T1 G6: a get id is answered once - a late duplicate of an ended or refused BatchGetStart starts nothing, no get is orphaned") {
  MasterCore m;
  w_register(m, 1, "sglang_owner");
  w_register(m, 4, "sglang_owner");
  w_put(m, 1, 7, "a");
  using S = wire::GetStartStatus;
  // The owner's BatchGetStart went out twice (a duplicate, delayed): the first is answered, the
  // owner's flight has no reader left and is revoked, then the duplicate arrives.
  CHECK(m_get(m, 4, "a", 10, false).body.AsBatchGetStartReply()->items[0]->status == S::Started);
  CHECK(m_get(m, 4, "a", 10, false).body.AsBatchGetStartReply()->items[0]->status == S::Started);  // T1: same answer
  CHECK(m_get(m, 4, "a", 10, true).body.AsBatchGetRevokeReply()->known[0]);
  CHECK(m_get(m, 4, "a", 10, false).body.AsBatchGetStartReply()->items[0]->status == S::Miss);
  CHECK(m.inflight_get_count() == 0);  // nothing fences node 1's copy of "a" now
  // A later get of the same key (a newer flight: a higher id) starts as usual.
  CHECK(m_get(m, 4, "a", 11, false).body.AsBatchGetStartReply()->items[0]->status == S::Started);
  CHECK(m.inflight_get_count() == 1);
  // An answer that starts nothing is final too: a Busy get (an older one of the key reads) whose
  // duplicate arrives after the older one ended does not start then.
  CHECK(m_get(m, 4, "a", 12, false).body.AsBatchGetStartReply()->items[0]->status == S::Busy);
  CHECK(m_get(m, 4, "a", 11, true).body.AsBatchGetRevokeReply()->known[0]);
  CHECK(m_get(m, 4, "a", 12, false).body.AsBatchGetStartReply()->items[0]->status == S::Miss);
  CHECK(m.inflight_get_count() == 0);
  CHECK(m_get(m, 4, "a", 13, false).body.AsBatchGetStartReply()->items[0]->status == S::Started);
  CHECK(m.inflight_get_count() == 1);
  // The requester restarts (ids start again at 1): its new gets start.
  wire::RegisterOwnerT r;
  r.node_id = 4;
  r.generation = 2;
  r.role = "sglang_owner";
  m.handle(make_envelope(std::move(r)));
  wire::BatchGetStartT g;
  g.node_id = 4;
  g.generation = 2;
  g.items.push_back(std::make_unique<wire::GetItemT>(wire::GetItemT{{}, "a", 1}));
  CHECK(m.handle(make_envelope(std::move(g))).body.AsBatchGetStartReply()->items[0]->status == S::Started);
}

TEST_CASE("bounds: with write-backs at their bound, a cohort the hot tier evicts stays here uncopied, counted") {
  OwnerConfig cfg = hot_owner(true);
  cfg.limits.writebacks = 0;
  sim::Cluster c(seed_from_env(808), cfg, 2, {"sglang_owner", "remote_cache"});
  c.run_for(10);
  const uint64_t s = c.open_session(0);
  (void)fill(c, s);
  c.run_for(500);
  const auto& oc = c.owner(0).counters();
  CHECK(oc.hot_evicted_keys_total > 0);
  CHECK(oc.writebacks_full_total > 0);
  CHECK(oc.writeback_cohorts_total == 0);  // nothing queued past the bound
  CHECK(oc.demoted_keys_total == 0);       // and nothing dropped: the entries stay
  CHECK(c.owner(0).writebacks_pending() == 0);
}

TEST_CASE("master T1: a demotion Fence answered Kept stays Kept for its epoch - a late duplicate never fences copies the owner kept") {
  MasterCore m;
  w_register(m, 1, "sglang_owner");
  w_register(m, 2, "remote_cache");
  w_put(m, 1, 7, "a");
  using D = wire::ReclaimResult;
  CHECK(w_demote(m, 1, {{"a", 7}}, 5) == D::Kept);  // no target copy yet: the owner keeps its copy
  w_copy(m, 2, "a", 1);                            // the target's copy lands afterwards
  CHECK(w_demote(m, 1, {{"a", 7}}, 5) == D::Kept);  // the same epoch again (a duplicate): still Kept
  CHECK(m.reclaim_fence_count() == 0);
  CHECK(m.replica_nodes("a") == std::vector<uint32_t>{1, 2});
  CHECK(w_demote(m, 1, {{"a", 7}}, 6) == D::Fenced);  // a new attempt is decided anew
  CHECK(m.replica_nodes("a") == std::vector<uint32_t>{2});
}

TEST_CASE("master: a demotion keeps the target copy it relies on - no reclaim or removal of that copy while it is fenced, and it waits for one in progress") {
  MasterCore m;
  w_register(m, 1, "sglang_owner");
  w_register(m, 2, "remote_cache");
  w_put(m, 1, 7, "a");
  w_copy(m, 2, "a", 1);
  // A one-member reclaim Fence or Commit of node's copy of key (origin node 1's put `put_id`).
  auto reclaim = [&](uint32_t node, uint64_t epoch, wire::ReclaimStep st, bool demote, const std::string& key,
                     uint64_t put_id, uint64_t instance, uint64_t offset, uint64_t slot_size) {
    return w_reclaim(m, node, epoch, st, demote, {{key, 1, put_id, instance, offset, slot_size}});
  };
  using D = wire::ReclaimResult;
  using St = wire::ReclaimStep;
  // Node 2's copy: get 1's (w_copy).
  auto target = [&](uint64_t epoch, St st) { return reclaim(2, epoch, st, false, "a", 7, 1, 8192, 4096); };
  auto source = [&](uint64_t epoch, St st) { return reclaim(1, epoch, st, true, "a", 7, 7, 0, 4096); };
  REQUIRE(source(10, St::Fence) == D::Fenced);
  // The demotion stands: the target's own eviction of that copy waits, and so does its removal.
  CHECK(target(20, St::Fence) == D::RetryableBusy);
  bool busy = false;
  CHECK_FALSE(m_remove(m, 2, "a", 1, 7, &busy));
  CHECK(busy);
  CHECK(m.counters().demote_relied_busy_total == 2);
  REQUIRE(source(10, St::Commit) == D::Completed);
  CHECK(m.replica_nodes("a") == std::vector<uint32_t>{2});  // the route stays, served by the target
  // The other way round: the target's eviction of its copy is fenced first; a demotion waits.
  w_put(m, 1, 8, "b");
  w_copy(m, 2, "b", 2);
  REQUIRE(reclaim(2, 21, St::Fence, false, "b", 8, 2, 8192, 4096) == D::Fenced);
  CHECK(reclaim(1, 11, St::Fence, true, "b", 8, 8, 0, 4096) == D::RetryableBusy);
  CHECK(m.replica_nodes("b") == std::vector<uint32_t>{1, 2});
}

TEST_CASE("master: a demotion needs one target owner holding the whole cohort - members backed on different remote_cache owners stay (E16ap)") {
  MasterCore m;
  w_register(m, 1, "sglang_owner");
  w_register(m, 2, "remote_cache");
  w_register(m, 3, "remote_cache");
  w_put(m, 1, 7, "a");
  w_put(m, 1, 7, "b");  // one cohort: put 7, group 0
  w_copy(m, 2, "a", 1);
  w_copy(m, 3, "b", 2);  // a on node 2, b on node 3: each key has a copy, no owner has both
  CHECK(w_demote(m, 1, {{"a", 7}, {"b", 7}}, 1) == wire::ReclaimResult::Kept);
  CHECK(m.replica_nodes("a") == std::vector<uint32_t>{1, 2});
  w_copy(m, 3, "a", 3);  // node 3 holds both now
  CHECK(w_demote(m, 1, {{"a", 7}, {"b", 7}}, 2) == wire::ReclaimResult::Fenced);
  CHECK(m.counters().demoted_keys_total == 2);
}

TEST_CASE("recoverable-first eviction: with inclusive write-back, the written-back cohorts are remote-complete and capacity pressure takes them without losing a copy") {
  sim::Cluster c(seed_from_env(341), hot_owner(false), 2, {"sglang_owner", "remote_cache"});
  c.run_for(10);
  const uint64_t s = c.open_session(0);
  const auto groups = fill_written_back(c, s);
  const uint64_t backed = c.owner(0).counters().writeback_backed_keys_total * 4096;
  REQUIRE(backed > 0);
  // Fill the rest of the 8 MiB segment and more: capacity eviction starts.
  for (int p = 0; p < 200; ++p) {
    std::vector<std::string> keys;
    for (int i = 0; i < 10; ++i) keys.push_back("more-" + std::to_string(p) + "-" + std::to_string(i));
    auto r = put_start(c, 0, s, keys, 4096, {5, 5});
    auto* ps = r.body.AsPutStartReply();
    REQUIRE_MESSAGE(ps, envelope_status(r).to_string());
    REQUIRE(c.call(0, s, make_envelope(wire::PutCommitReqT{{}, ps->put_id})).body.AsPutCommitReply());
  }
  REQUIRE(c.run_until([&] { return c.owner(0).reclaims_in_flight() == 0; }, 60000));
  const auto& oc = c.owner(0).counters();
  MESSAGE("evicted " << oc.evicted_bytes_total << " B, recoverable " << oc.eviction_recoverable_bytes_total
                     << " B, shortfall " << oc.eviction_shortfall_bytes_total << " B; backed before " << backed << " B");
  REQUIRE(oc.evicted_bytes_total > 0);
  CHECK(oc.eviction_recoverable_bytes_total >= std::min(oc.evicted_bytes_total, backed));
  // What went first was recoverable: every key of the first fill still has a copy somewhere.
  if (oc.evicted_bytes_total <= backed)
    for (const auto& g : groups)
      for (const auto& k : g) CHECK_MESSAGE(!c.master().replica_nodes(k).empty(), k, " lost its last copy");
}

TEST_CASE("unbacked: when a target drops the last target copy of a written-back cohort the source hears of it - the mark goes, the cohort is written back again in its turn") {
  sim::Cluster c(seed_from_env(343), hot_owner(false), 2, {"sglang_owner", "remote_cache"});
  c.run_for(10);
  const uint64_t s = c.open_session(0);
  const auto groups = fill_written_back(c, s);
  std::string key;
  for (const auto& g : groups)
    if (key.empty() && c.master().replica_nodes(g[0]) == std::vector<uint32_t>{1, 2}) key = g[0];
  REQUIRE(!key.empty());
  REQUIRE(c.owner(0).remote_complete(key));
  // The remote_cache owner lets its copy go (its own eviction would do the same).
  c.remove_key(1, key);
  REQUIRE(c.run_until([&] { return c.master().replica_nodes(key) == std::vector<uint32_t>{1}; }, 20000));
  CHECK(c.master().counters().unbacked_noted_total == 1);
  // The notice rides on the source's next master reply (a put here).
  put_commit(c, 0, s, {"after-0"});
  REQUIRE(c.run_until([&] { return c.owner(0).counters().unbacked_keys_total > 0; }, 20000));
  // Not recoverable any more: capacity eviction would lose the last copy of it.
  CHECK_FALSE(c.owner(0).remote_complete(key));
  // Back in the hot tier: newer puts push it out again, and it is written back in its turn.
  for (int p = 0; p < 30 && c.master().replica_nodes(key) != std::vector<uint32_t>{1, 2}; ++p) {
    std::vector<std::string> keys;
    for (int i = 0; i < 10; ++i) keys.push_back("push-" + std::to_string(p) + "-" + std::to_string(i));
    put_commit(c, 0, s, keys, {5, 5});
    c.run_for(100);
  }
  REQUIRE(c.run_until([&] { return c.master().replica_nodes(key) == std::vector<uint32_t>{1, 2}; }, 60000));
  REQUIRE(c.run_until([&] { return c.owner(0).writebacks_pending() == 0; }, 60000));
  CHECK(c.owner(0).remote_complete(key));
}

namespace {

// `puts` puts of two groups of 5 on owner 0 of a GPU owner + remote_cache cluster; returns
// (keys without any copy at the end, groups); bytes written.
struct SpillRun {
  size_t lost = 0;
  std::vector<std::vector<std::string>> groups;
};
SpillRun spill_run(sim::Cluster& c, int puts) {
  c.run_for(10);
  const uint64_t s = c.open_session(0);
  SpillRun r;
  r.groups = put_group_pairs(c, s, "sp-", puts, wpattern, 5);  // a put every 5 ms: each goes live before the next few
  REQUIRE(c.run_until([&] {
    return c.owner(0).writebacks_pending() == 0 && c.owner(0).reclaims_in_flight() == 0 &&
           c.owner(0).stats().publish_jobs == 0;
  }, 120000));
  c.run_for(500);
  for (const auto& g : r.groups)
    for (const auto& k : g) r.lost += c.master().replica_nodes(k).empty();
  return r;
}

}  // namespace

TEST_CASE("spill: puts that go live while the pool is pressed are written back and demoted - the CPU owner takes the overflow as primary copies, nothing is lost that eviction would drop") {
  OwnerConfig cfg = small_owner();  // 8 MiB: 2048 slots in 8 grants
  cfg.eviction_free_watermark = 0;  // eviction only for a claim that finds no slot
  cfg.writeback_timeout_ms = 20000;
  // Without spill: 3,000 keys into 2,048 slots, and no copy anywhere else: eviction drops keys.
  sim::Cluster plain(seed_from_env(331), cfg, 2, {"sglang_owner", "remote_cache"});
  const auto without = spill_run(plain, 300);
  CHECK(without.lost > 500);
  CHECK(plain.owner(0).counters().spill_keys_total == 0);
  // With spill at 25%: once fewer than 512 slots are free or still to carve, each put that goes
  // live is written back and its copies here go.
  cfg.spill_free_ratio = 0.25;
  cfg.writeback_demote = false;  // (the hot tier's demotion switch: a spill demotes regardless)
  sim::Cluster c(seed_from_env(331), cfg, 2, {"sglang_owner", "remote_cache"});
  const auto with = spill_run(c, 300);
  const auto& oc = c.owner(0).counters();
  MESSAGE("without spill " << without.lost << " keys lost; with spill " << with.lost << " lost, "
                           << oc.spill_keys_total << " keys spilled (" << oc.spill_cohorts_total << " cohorts), "
                           << oc.demoted_keys_total << " demoted, " << oc.evicted_keys_total << " evicted");
  CHECK(oc.spill_keys_total >= 900);
  CHECK(oc.demoted_keys_total >= 900);
  CHECK(with.lost * 10 < without.lost);  // the overflow became the CPU owner's primary copies
  CHECK(oc.hot_evicted_keys_total == 0);
  // A1: each group is here whole or not at all; the spilled ones live on the CPU owner.
  for (const auto& g : with.groups) {
    int here = 0;
    for (const auto& k : g) here += c.owner(0).local_state(k) == 2;
    CHECK_MESSAGE((here == 0 || here == 5), "a cohort was split: ", here, " of 5 left");
  }
  // A spilled key reads back from the remote_cache owner, bytes intact.
  std::string spilled;
  for (auto g = with.groups.rbegin(); g != with.groups.rend() && spilled.empty(); ++g)
    if (c.owner(0).local_state(g->front()) == 0 && !c.master().replica_nodes(g->front()).empty()) spilled = g->front();
  REQUIRE(!spilled.empty());
  const uint64_t s = c.open_session(0);
  auto g = get_start(c, 0, s, {spilled});
  auto* r = g.body.AsGetStartReply();
  REQUIRE(r->transferable_len == 1);
  auto t = c.call(0, s, make_envelope(wire::GetTransferReqT{{}, r->handle_id, 1}));
  REQUIRE(t.body.AsGetTransferReply());
  CHECK(c.read(0, t.body.AsGetTransferReply()->offsets[0]) == wpattern(spilled));
  CHECK(c.owner(0).eviction_debt_bytes() == 0);
  CHECK(c.master().reclaim_fence_count() == 0);
}
