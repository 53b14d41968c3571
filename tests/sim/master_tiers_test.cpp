// The master's route tiers T1/T2 (the design's "Master 两级 Moka 提前写回" and E16ba): the master
// alone, driven by hand, and a whole cluster in the deterministic simulator. Each cluster test
// prints its seed; replay a failure with FLUXON_SEED=<seed>.
#include <algorithm>

#include "helpers.hpp"

using namespace fluxon;
using namespace fluxon::test;

namespace {

constexpr uint64_t kSeg = 64 << 10;  // 16 slots of 4 KiB

void t_register(MasterCore& m, uint32_t node, const std::string& role) {
  wire::RegisterOwnerT r;
  r.node_id = node;
  r.generation = 1;
  r.role = role;
  r.segment_len = kSeg;
  REQUIRE(m.handle(make_envelope(std::move(r))).body.AsRegisterOwnerReply());
}
// node's put `put_id` of key (4 KiB in a 4 KiB slot): the reply, with the victims it carries.
Envelope t_put(MasterCore& m, uint32_t node, uint64_t put_id, const std::string& key, Millis now = 0) {
  auto r = m.handle(make_envelope(m_put_done(node, put_id, key, put_id * 4096)), now);
  REQUIRE(r.body.AsPutDoneReply());
  REQUIRE(r.body.AsPutDoneReply()->results[0] == wire::PutItemResult::Live);
  return r;
}
// Node `to` fetches key and publishes its copy.
void t_copy(MasterCore& m, uint32_t to, const std::string& key, uint64_t get_id, Millis now = 0) {
  REQUIRE(m_start(m, to, key, get_id, now) == wire::GetStartStatus::Started);
  wire::BatchGetDoneT d;
  d.node_id = to;
  d.generation = 1;
  d.items.push_back(std::make_unique<wire::GetDoneItemT>(wire::GetDoneItemT{{}, key, get_id, get_id * 4096, get_id, 0, 4096}));
  REQUIRE(m.handle(make_envelope(std::move(d)), now).body.AsBatchGetDoneReply()->results[0] == wire::GetDoneStatus::Live);
}
// Any request of node: its reply's victims as (key, demote).
std::vector<std::pair<std::string, bool>> victims_of(const Envelope& r) {
  std::vector<std::pair<std::string, bool>> out;
  for (const auto& v : r.evict) out.emplace_back(v->key, v->demote);
  return out;
}
std::vector<std::pair<std::string, bool>> poll_victims(MasterCore& m, uint32_t node, Millis now = 0) {
  wire::BatchGetRevokeT rv;  // an empty request of the node: only its reply's victims matter
  rv.node_id = node;
  rv.generation = 1;
  return victims_of(m.handle(make_envelope(std::move(rv)), now));
}
// T2 at half of each node's 16 slots; node 1 (a GPU owner) puts k0..k8, node 2 (remote_cache) copies
// each: node 2's T2 goes over by one with its ninth copy and hands its coldest, k0.
void ring_b(MasterCore& m) {
  m.set_tiers(0.5, 0);
  t_register(m, 1, "sglang_owner");
  t_register(m, 2, "remote_cache");
  for (uint64_t i = 0; i < 9; ++i) {
    t_put(m, 1, 10 + i, "k" + std::to_string(i));
    t_copy(m, 2, "k" + std::to_string(i), 600 + i);
  }
}
std::vector<std::string> replica_poll(MasterCore& m, uint32_t node, uint64_t poll_id) {
  wire::ReplicaPollT p;
  p.node_id = node;
  p.generation = 1;
  p.max = 64;
  p.poll_id = poll_id;
  return m.handle(make_envelope(std::move(p))).body.AsReplicaPollReply()->keys;
}

}  // namespace

TEST_CASE("master T1: a route T1 evicts gets a write-back from its source, a get the master serves brings it back, and T1 frees nothing") {
  MasterCore m;
  m.set_tiers(0.9, 0.5);  // T2: 14 slots of node 1's 16; T1: 8
  t_register(m, 1, "sglang_owner");
  t_register(m, 2, "remote_cache");
  t_register(m, 3, "sglang_owner");
  CHECK(m.tier_sizes(1).t1_capacity == kSeg / 2);
  CHECK(m.tier_sizes(2).t1_capacity == 0);  // a target-role node writes nothing back
  for (uint64_t i = 0; i < 8; ++i) t_put(m, 1, 10 + i, "k" + std::to_string(i));
  CHECK(m.counters().tier1_triggered_total == 0);
  CHECK(m.replica_tasks_queued() == 0);
  CHECK(m.tier_sizes(1).t1 == 8 * 4096);
  t_put(m, 1, 18, "k8");  // T1 is full: its coldest route leaves it
  CHECK(m.counters().tier1_triggered_total == 1);
  CHECK(m.counters().tier1_queued_total == 1);
  CHECK(!m.in_tier1(1, "k0"));
  CHECK(m.tier_sizes(1).t2 == 9 * 4096);  // inclusive: T2 keeps it, and the route stays
  CHECK(m.replica_nodes("k0") == std::vector<uint32_t>{1});
  // The write-back is a replica task for the target-role owner, from the source.
  CHECK(replica_poll(m, 2, 1) == std::vector<std::string>{"k0"});
  // A get the master serves from node 1 brings k0 back into T1 (its coldest leaves instead).
  REQUIRE(m_start(m, 3, "k0", 500) == wire::GetStartStatus::Started);
  CHECK(m.counters().tier1_promotions_total == 1);
  CHECK(m.in_tier1(1, "k0"));
  CHECK(m.counters().tier1_triggered_total == 2);
  // A route with a target copy that T1 lets go: nothing to write back (backed).
  t_copy(m, 2, "k2", 600);
  for (uint64_t i = 9; i < 17; ++i) t_put(m, 1, 10 + i, "k" + std::to_string(i));
  CHECK(!m.in_tier1(1, "k2"));
  CHECK(m.counters().tier1_backed_total == 1);
  CHECK(m.counters().tier1_triggered_total == m.counters().tier1_stale_total + m.counters().tier1_backed_total +
                                                  m.counters().tier1_no_target_total + m.counters().tier1_queued_total);
  // Nothing T1 did removed a route.
  CHECK(m.counters().replicas_removed_total == 0);
}

TEST_CASE("master T1 without a target-role owner: an eviction queues nothing (strict placement, no GPU owner takes it)") {
  MasterCore m;
  m.set_tiers(0.9, 0.25);
  t_register(m, 1, "sglang_owner");
  t_register(m, 3, "sglang_owner");
  for (uint64_t i = 0; i < 6; ++i) t_put(m, 1, 10 + i, "k" + std::to_string(i));
  CHECK(m.counters().tier1_no_target_total == 2);
  CHECK(m.replica_tasks_queued() == 0);
}

TEST_CASE("master T2: over its share a node's coldest routes are handed on its next reply, recoverable ones first, and a victim its owner keeps goes back") {
  MasterCore m;
  m.set_tiers(0.5, 0);  // T2: 8 slots of each node; no T1
  t_register(m, 1, "sglang_owner");
  t_register(m, 2, "remote_cache");
  for (uint64_t i = 0; i < 8; ++i) CHECK(t_put(m, 1, 10 + i, "k" + std::to_string(i)).evict.empty());
  t_copy(m, 2, "k5", 600);  // a target copy of k5 (and the get made k5 the newest in node 1's T2)
  // Over by one slot: the recoverable route goes first, to be demoted, whatever its recency.
  auto r = t_put(m, 1, 18, "k8");
  CHECK(victims_of(r) == std::vector<std::pair<std::string, bool>>{{"k5", true}});
  CHECK(m.counters().tier2_recoverable_total == 1);
  CHECK(m.tier_sizes(1).t2 == 8 * 4096);
  CHECK(m.tier_sizes(1).victims == 4096);
  // Then the coldest: k0, as a plain eviction (no copy: the last route may go).
  CHECK(victims_of(t_put(m, 1, 19, "k9")) == std::vector<std::pair<std::string, bool>>{{"k0", false}});
  CHECK(m.tier_victims(1).size() == 2);
  CHECK(poll_victims(m, 1).empty());  // handed once: not again on every reply
  // The owner keeps k0 (held): handed again after the bound (a lost reply), then back into T2.
  Millis now = 0;
  for (int round = 0; round < 2; ++round) {
    now += MasterCore::kTierHandMs;
    m.tick(now);
    auto again = poll_victims(m, 1, now);
    CHECK(std::count(again.begin(), again.end(), std::make_pair(std::string("k0"), false)) == 1);
  }
  // (k5 too: nobody reclaimed it either.)
  now += MasterCore::kTierHandMs;
  m.tick(now);
  CHECK(m.counters().tier2_restored_total == 2);
  // Restored, T2 is over again: it selected again (k0 and k5 came back as the newest).
  CHECK(m.tier_sizes(1).t2 <= m.tier_sizes(1).t2_capacity);
  CHECK(m.counters().tier2_selected_total == 4);
  // A victim whose replica goes (its owner's reclaim, here a removal) ends.
  const auto now_victims = m.tier_victims(1);
  REQUIRE(!now_victims.empty());
  const std::string gone = now_victims.begin()->first;
  bool busy = false;
  const uint64_t put_id = 10 + std::stoull(gone.substr(1));
  REQUIRE(m_remove(m, 1, gone, 1, put_id, &busy));
  CHECK(m.tier_victims(1).count(gone) == 0);
  const auto& c = m.counters();
  CHECK(c.tier2_selected_total == c.tier2_ended_total + c.tier2_restored_total + m.tier_victims(1).size());
  // S5: nothing changed a capacity.
  CHECK(m.tier_sizes(1).t2_capacity == kSeg / 2);
}

TEST_CASE("master T2 on a target-role node (ring B): the copies the master placed are bounded there too, and its Size eviction may drop the last route") {
  MasterCore m;
  ring_b(m);
  // Node 2's T2 went over by one with its ninth copy: its coldest copy was handed on that reply.
  const auto v2 = m.tier_victims(2);
  REQUIRE(v2.size() == 1);
  CHECK(v2.begin()->first == "k0");
  CHECK(v2.begin()->second == 2);  // handed
  CHECK(m.tier_sizes(2).t2 == 8 * 4096);
  // Its owner reclaims it (here: a removal); node 1 still holds k0. Then node 1's copies go too
  // (its own T2 is over as well): the last route of k0 may go - a later get misses.
  bool busy = false;
  REQUIRE(m_remove(m, 2, "k0", 1, 10, &busy));
  CHECK(m.tier_victims(2).empty());
  REQUIRE(m_remove(m, 1, "k0", 1, 10, &busy));
  CHECK(m.route_count() == 8);
  CHECK(m_start(m, 3, "k0", 900) == wire::GetStartStatus::Miss);
}

TEST_CASE("master T2 on a target-role node (ring B): a victim chosen as a duplicate whose other copy went meanwhile is Kept and chosen again - never the last copy for a duplicate's sake") {
  MasterCore m;
  ring_b(m);
  REQUIRE(m.tier_victims(2) == std::map<std::string, int>{{"k0", 2}});  // a duplicate: node 1 holds k0
  // Node 1's copy of k0 goes first (as a demotion relying on node 2's would): k0's last copy is node 2's.
  bool busy = false;
  REQUIRE(m_remove(m, 1, "k0", 1, 10, &busy));
  const ReclaimCopy k0{"k0", 1, 10, 600, 600 * 4096};
  const auto rep = m_reclaim(m, 2, 1, 1, wire::ReclaimStep::Fence, false, false, {k0});
  CHECK(rep.result == wire::ReclaimResult::Kept);
  CHECK(m.tier_victims(2).empty());
  CHECK(m.tier_sizes(2).t2 == 9 * 4096);  // back into T2, over its share again
  CHECK(m.counters().tier2_duplicate_kept_total == 1);
  // Chosen again on what is true now: a copy that still duplicates one on node 1, not k0.
  m.tick(1000);
  const auto again = m.tier_victims(2);
  REQUIRE(again.size() == 1);
  CHECK(again.begin()->first != "k0");
  CHECK(m.route_count() == 9);  // nothing lost
}

TEST_CASE("E16ba: with T1, a T2 victim without a copy waits for its write-back - handed for demotion once the copy is published, as a plain eviction once the bound passed (a shortfall, counted)") {
  MasterCore m;
  m.set_tiers(0.5, 0.25);  // T2: 8 slots, T1: 4
  t_register(m, 1, "sglang_owner");
  t_register(m, 2, "remote_cache");
  for (uint64_t i = 0; i < 8; ++i) t_put(m, 1, 10 + i, "k" + std::to_string(i));
  CHECK(m.counters().tier1_queued_total == 4);  // T1 let k0..k3 go: their write-backs are queued
  // Over T2: a victim, fenced - no copy yet - and not handed.
  auto r = t_put(m, 1, 18, "k8");
  CHECK(r.evict.empty());
  CHECK(m.counters().tier2_fenced_total == 1);
  auto fenced = m.tier_victims(1);
  REQUIRE(fenced.size() == 1);
  CHECK(fenced.begin()->second == 0);
  const std::string a = fenced.begin()->first;
  // Its write-back is queued (by T1 or by the fence): the target pulls it and publishes its copy.
  const auto tasks = replica_poll(m, 2, 1);
  CHECK(std::count(tasks.begin(), tasks.end(), a) == 1);
  t_copy(m, 2, a, 700, 5);
  CHECK(m.counters().tier2_fence_backed_total == 1);
  CHECK(poll_victims(m, 1, 6) == std::vector<std::pair<std::string, bool>>{{a, true}});
  bool busy = false;  // its owner demotes it (here: removes its copy)
  REQUIRE(m_remove(m, 1, a, 1, 10 + std::stoull(a.substr(1)), &busy));
  // The next victim's copy never comes: after the bound it goes plain, its bytes a shortfall.
  t_put(m, 1, 19, "k9", 10);
  auto next = m.tier_victims(1);
  next.erase(a);
  REQUIRE(next.size() == 1);
  const std::string b = next.begin()->first;
  CHECK(next.begin()->second == 0);
  CHECK(poll_victims(m, 1, 20).empty());
  m.tick(10 + MasterCore::kWriteBackTaskMs);
  CHECK(m.counters().tier2_shortfall_total == 1);
  CHECK(m.counters().tier2_shortfall_bytes_total == 4096);
  CHECK(poll_victims(m, 1, 11 + MasterCore::kWriteBackTaskMs) == std::vector<std::pair<std::string, bool>>{{b, false}});
}

namespace {

std::vector<uint8_t> tpattern(const std::string& key) {
  std::vector<uint8_t> b(4096);
  const uint64_t h = std::hash<std::string>{}(key);
  for (uint64_t i = 0; i < b.size(); ++i) b[i] = uint8_t((h >> ((i % 8) * 8)) + i * 11);
  return b;
}

}  // namespace

TEST_CASE("master T1/T2 in a whole cluster: T1 writes back ahead, T2's victims leave the GPU owner as whole demoted cohorts, nothing is lost, everything reconciles at rest") {
  OwnerConfig cfg = small_owner();     // 8 MiB: 2048 slots
  cfg.eviction_free_watermark = 0;     // the owner evicts only what a claim waits for: T2 decides here
  sim::Cluster c(seed_from_env(801), cfg, 2, {"sglang_owner", "remote_cache"});
  c.set_master_tiers(0.5, 0.3);        // T2: 1024 slots of each owner, T1: 614 of the GPU owner's
  c.run_for(10);
  const uint64_t s = c.open_session(0);
  const auto groups = put_group_pairs(c, s, "t-", 150, tpattern);  // 1500 keys: T2 must let about 476 go
  // At rest: every route published, T2 within its share, no victim or transaction left.
  REQUIRE(c.run_until([&] {
    return c.owner(0).stats().publish_jobs == 0 && c.master().tier_sizes(1).t2 <= c.master().tier_sizes(1).t2_capacity &&
           c.master().tier_victims(1).empty() && c.owner(0).reclaims_in_flight() == 0 &&
           c.master().tier_victims(2).empty() && c.owner(1).reclaims_in_flight() == 0;
  }, 120000));
  c.run_for(1000);
  const auto& m = c.master().counters();
  const auto& oc = c.owner(0).counters();
  MESSAGE("T1 triggered " << m.tier1_triggered_total << " (queued " << m.tier1_queued_total << "), T2 selected "
                          << m.tier2_selected_total << " (recoverable " << m.tier2_recoverable_total << ", fenced "
                          << m.tier2_fenced_total << ", fence backed " << m.tier2_fence_backed_total << ", shortfall "
                          << m.tier2_shortfall_total << ", restored " << m.tier2_restored_total << "); owner took "
                          << oc.tier_victims_demoted_total << " demoted, " << oc.tier_victims_evicted_total
                          << " evicted, " << oc.tier_victims_taken_total << " with their cohort, " << oc.tier_victims_busy_total << " busy, " << oc.tier_victims_stale_total
                          << " stale; demoted keys " << oc.demoted_keys_total << "; handed " << m.tier2_handed_total << " ended " << m.tier2_ended_total);
  CHECK(m.tier1_queued_total >= 800);
  CHECK(m.tier2_selected_total >= 476);
  CHECK(m.tier2_shortfall_total == 0);  // a quiet network: every write-back beat its fence
  CHECK(oc.tier_victims_demoted_total > 0);
  // S5 and T2's bound: the GPU owner holds no more than T2's share, its capacity untouched.
  const auto t = c.master().tier_sizes(1);
  CHECK(t.t2 <= t.t2_capacity);
  CHECK(t.t2_capacity == (8u << 20) / 2);
  CHECK(c.owner(0).stats().routes * 4096 <= t.t2_capacity);
  // Nothing lost: every key has a copy; every group is on the GPU owner whole or not at all (A1).
  size_t gone = 0;
  for (const auto& g : groups) {
    int here = 0;
    for (const auto& k : g) {
      CHECK_MESSAGE(!c.master().replica_nodes(k).empty(), "the last copy of ", k, " went");
      here += c.owner(0).local_state(k) == 2;
    }
    CHECK_MESSAGE((here == 0 || here == 5), "a cohort was split: ", here, " of 5 left");
    gone += here == 0;
  }
  CHECK(gone * 5 == oc.demoted_keys_total + oc.evicted_keys_total - oc.reclaim_restored_keys_total);
  // The reconciliations: the master's selections, the owner's transactions (S4), no fence left.
  CHECK(m.tier2_selected_total == m.tier2_ended_total + m.tier2_restored_total + c.master().tier_victims(1).size() +
                                      c.master().tier_victims(2).size());
  CHECK(oc.tier_victims_total == oc.tier_victims_stale_total + oc.tier_victims_taken_total + oc.tier_victims_busy_total +
                                     oc.tier_victims_evicted_total + oc.tier_victims_demoted_total);
  CHECK(c.owner(0).eviction_debt_bytes() == 0);
  CHECK(c.master().reclaim_fence_count() == 0);
  CHECK(oc.evicted_bytes_total ==
        oc.reclaim_committed_bytes_total + oc.reclaim_restored_bytes_total + oc.reclaim_obsolete_bytes_total);
  // A demoted page reads back from the remote_cache owner, bytes intact.
  std::string first;
  for (const auto& grp : groups)
    if (first.empty() && c.owner(0).local_state(grp.front()) == 0) first = grp.front();
  REQUIRE(!first.empty());
  auto g = get_start(c, 0, s, {first});
  auto* r = g.body.AsGetStartReply();
  REQUIRE(r->transferable_len == 1);
  CHECK(r->leader_keys == 1);
  auto tr = c.call(0, s, make_envelope(wire::GetTransferReqT{{}, r->handle_id, 1}));
  REQUIRE(tr.body.AsGetTransferReply());
  CHECK(c.read(0, tr.body.AsGetTransferReply()->offsets[0]) == tpattern(first));
}
