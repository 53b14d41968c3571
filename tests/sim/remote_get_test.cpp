// Remote gets (L3) through the deterministic simulator: per-key singleflight, batched master
// jobs, the data plane, activity fences, and convergence under faults (G1-G10, T1, S2).
// Each test prints its seed; replay a failure with FLUXON_SEED=<seed>.
#include <algorithm>
#include <set>

#include "helpers.hpp"

using namespace fluxon;
using namespace fluxon::test;

namespace {

std::vector<uint8_t> pattern(const std::string& key, uint64_t len) {
  std::vector<uint8_t> b(len);
  uint64_t h = std::hash<std::string>{}(key);
  for (uint64_t i = 0; i < len; ++i) b[i] = uint8_t((h >> ((i % 8) * 8)) + i * 131);
  return b;
}

// Puts keys on owner `o` with their bytes written into the simulated segment, and waits until
// their routes are live.
void put_live(sim::Cluster& c, int o, uint64_t s, const std::vector<std::string>& keys,
              std::vector<uint32_t> groups = {}) {
  auto r = put_start(c, o, s, keys, 4096, std::move(groups));
  auto* ps = r.body.AsPutStartReply();
  REQUIRE_MESSAGE(ps, "put_start failed: ", envelope_status(r).to_string());
  for (size_t i = 0; i < keys.size(); ++i) c.write(o, ps->offsets[i], pattern(keys[i], 4096));
  REQUIRE(c.call(o, s, make_envelope(wire::PutCommitReqT{{}, ps->put_id})).body.AsPutCommitReply());
  REQUIRE(c.run_until([&] { return c.owner(o).local_state(keys.back()) == 2; }, 60000));
}

Envelope transfer(sim::Cluster& c, int o, uint64_t s, uint64_t handle, uint32_t consume) {
  return c.call(o, s, make_envelope(wire::GetTransferReqT{{}, handle, consume}));
}

void release(sim::Cluster& c, int o, uint64_t s, const std::vector<uint64_t>& holdings) {
  wire::AckBatchT ack;
  ack.release = holdings;
  c.note(o, s, make_envelope(std::move(ack)));
}

void cancel(sim::Cluster& c, int o, uint64_t s, uint64_t handle) {
  wire::AckBatchT ack;
  auto hd = std::make_unique<wire::HandleDoneT>();
  hd->handle_id = handle;
  ack.handles.push_back(std::move(hd));
  c.note(o, s, make_envelope(std::move(ack)));
}

// Nothing of the read path is left in flight: no flights, jobs, prepared or pending slots, and
// no prepared get at the master.
void check_quiet(sim::Cluster& c) {
  REQUIRE(c.run_until([&] {
    for (int o : {0, 1}) {
      auto st = c.owner(o).stats();
      if (st.flights_starting + st.flights_started + st.flights_finishing + st.get_jobs + st.pending_gets +
              st.slots_prepared + st.slots_pending != 0)
        return false;
    }
    return c.master().inflight_get_count() == 0;
  }, 60000));
}

}  // namespace

TEST_CASE("L3: a key put on one owner is fetched by another through the data plane, bytes intact") {
  sim::Cluster c(seed_from_env(101), small_owner(), 2);
  c.run_for(10);
  const uint64_t sa = c.open_session(0), sb = c.open_session(1);
  auto keys = keys_of("l3-", 6);
  put_live(c, 0, sa, keys);
  auto g = get_start(c, 1, sb, keys);
  auto* r = g.body.AsGetStartReply();
  REQUIRE(r);
  CHECK(r->transferable_len == 6);
  CHECK(r->owner_rpc);
  CHECK(r->leader_keys == 6);
  CHECK(r->local_keys == 0);
  CHECK(r->holding_ids.empty());  // OwnerRpc: the items come with get_transfer
  auto t = transfer(c, 1, sb, r->handle_id, 6);
  auto* tr = t.body.AsGetTransferReply();
  REQUIRE_MESSAGE(tr, envelope_status(t).to_string());
  REQUIRE(tr->offsets.size() == 6);
  for (size_t i = 0; i < keys.size(); ++i) CHECK(c.read(1, tr->offsets[i]) == pattern(keys[i], 4096));
  // The fetched copy is a replica at the master and a local entry on B: the next get is local.
  for (const auto& k : keys) CHECK(c.master().replica_nodes(k) == std::vector<uint32_t>{1, 2});
  CHECK(c.owner(1).local_state(keys[0]) == 2);
  release(c, 1, sb, tr->holding_ids);
  auto g2 = get_start(c, 1, sb, keys);
  auto* r2 = g2.body.AsGetStartReply();
  CHECK(r2->transferable_len == 6);
  CHECK_FALSE(r2->owner_rpc);
  CHECK(r2->local_keys == 6);
  release_all(c, 1, sb, *r2);
  CHECK(c.owner(1).counters().transfer_batches_total == 1);  // one payload batch for the one peer
  check_quiet(c);
}

TEST_CASE("G1 G6 G8 G9: overlapping batches share per-key flights and, arriving together, one BatchGetStart") {
  sim::Cluster c(seed_from_env(111), small_owner(), 2);
  c.run_for(10);
  const uint64_t sa = c.open_session(0), sb = c.open_session(1), sb2 = c.open_session(1);
  put_live(c, 0, sa, keys_of("ov-", 8));
  c.to_master.min_delay = c.to_master.max_delay = 50;  // both batches arrive while the first flies
  const auto k = keys_of("ov-", 8);
  std::vector<std::string> b1(k.begin(), k.begin() + 6), b2(k.begin() + 2, k.end());
  wire::GetStartReqT q1, q2;
  q1.keys = b1;
  q2.keys = b2;
  const uint64_t t1 = c.send(1, sb, make_envelope(std::move(q1)));
  const uint64_t t2 = c.send(1, sb2, make_envelope(std::move(q2)));
  auto e1 = c.wait(t1), e2 = c.wait(t2);
  auto *r1 = e1.body.AsGetStartReply(), *r2 = e2.body.AsGetStartReply();
  REQUIRE(r1);
  REQUIRE(r2);
  CHECK(r1->transferable_len == 6);
  CHECK(r2->transferable_len == 6);
  // G1: the second batch leads only the keys nobody flies yet and joins the rest.
  CHECK(r1->leader_keys == 6);
  CHECK(r2->joined_keys == 4);
  CHECK(r2->leader_keys == 2);
  const auto& oc = c.owner(1).counters();
  CHECK(oc.get_joins_total == 4);
  CHECK(oc.get_leader_requests_total == 2);
  CHECK(oc.get_master_batches_total == 1);  // G8 per batch, G9 across the two that arrived together
  CHECK(c.master().counters().get_start_total == 1);
  CHECK(c.master().counters().get_start_keys_total == 8);  // G6: never a key twice
  auto x1 = transfer(c, 1, sb, r1->handle_id, 6), x2 = transfer(c, 1, sb2, r2->handle_id, 6);
  auto *p1 = x1.body.AsGetTransferReply(), *p2 = x2.body.AsGetTransferReply();
  REQUIRE(p1);
  REQUIRE(p2);
  CHECK(oc.transfer_keys_total == 8);  // one fetch per key, whatever the overlap
  // G7: the shared keys are one slot, seen by both readers.
  for (int i = 0; i < 4; ++i) CHECK(p1->offsets[2 + i] == p2->offsets[i]);
  for (int i = 0; i < 6; ++i) CHECK(c.read(1, p1->offsets[i]) == pattern(b1[i], 4096));
  release(c, 1, sb, p1->holding_ids);
  release(c, 1, sb2, p2->holding_ids);
  check_quiet(c);
}

TEST_CASE("G9: batches that arrive apart are not held back: one BatchGetStart each, at once") {
  sim::Cluster c(seed_from_env(112), small_owner(), 2);
  c.run_for(10);
  const uint64_t sa = c.open_session(0), sb = c.open_session(1);
  put_live(c, 0, sa, keys_of("apart-", 4));
  for (int i = 0; i < 2; ++i) {
    auto g = get_start(c, 1, sb, {"apart-" + std::to_string(2 * i), "apart-" + std::to_string(2 * i + 1)});
    auto* r = g.body.AsGetStartReply();
    REQUIRE(r);
    CHECK(r->transferable_len == 2);
    auto t = transfer(c, 1, sb, r->handle_id, 2);
    REQUIRE(t.body.AsGetTransferReply());
    release(c, 1, sb, t.body.AsGetTransferReply()->holding_ids);
  }
  CHECK(c.owner(1).counters().get_master_batches_total == 2);
  CHECK(c.master().counters().get_start_total == 2);
  check_quiet(c);
}

TEST_CASE("G4 G5: results are scattered back to their indices, everything past transferable_len goes at once") {
  sim::Cluster c(seed_from_env(121), small_owner(), 2);
  c.run_for(10);
  const uint64_t sa = c.open_session(0), sb = c.open_session(1);
  put_live(c, 0, sa, {"g5-r1", "g5-r3", "g5-r4"});
  put_live(c, 1, sb, {"g5-l0"});
  // local, remote, missing everywhere, remote, remote: the prefix ends at the miss.
  auto g = get_start(c, 1, sb, {"g5-l0", "g5-r1", "g5-m2", "g5-r3", "g5-r4"});
  auto* r = g.body.AsGetStartReply();
  REQUIRE(r);
  CHECK(r->raw_prefix_hit_len == 2);
  CHECK(r->transferable_len == 2);
  CHECK(r->first_miss_index == 2);
  CHECK(r->local_keys == 1);
  CHECK(r->leader_keys == 1);
  // The tail's flights were revoked with the decision: no fetch, no prepared get left for them.
  CHECK(c.owner(1).counters().get_revoked_total == 2);
  CHECK(c.owner(1).counters().get_suffix_released_total == 3);  // the miss's waiter and two leaders
  auto t = transfer(c, 1, sb, r->handle_id, 2);
  auto* tr = t.body.AsGetTransferReply();
  REQUIRE(tr);
  CHECK(c.read(1, tr->offsets[1]) == pattern("g5-r1", 4096));
  CHECK(c.owner(1).counters().transfer_keys_total == 1);
  release(c, 1, sb, tr->holding_ids);
  check_quiet(c);
  CHECK(c.master().counters().get_revoked_total == 2);

  // A1 across sources: a group of a local and a remote key is whole or not at all.
  auto g2 = get_start(c, 1, sb, {"g5-l0", "g5-r3", "g5-m2", "g5-r4"}, {2, 2});
  auto* r2 = g2.body.AsGetStartReply();
  CHECK(r2->raw_prefix_hit_len == 2);
  CHECK(r2->transferable_len == 2);
  CHECK(r2->prefix_hit_groups == 1);
  cancel(c, 1, sb, r2->handle_id);
  check_quiet(c);
}

TEST_CASE("G5: a shorter consume_prefix_len revokes the tail's fetches, a bad one leaves the handle usable") {
  sim::Cluster c(seed_from_env(131), small_owner(), 2);
  c.run_for(10);
  const uint64_t sa = c.open_session(0), sb = c.open_session(1);
  auto keys = keys_of("cp-", 4);
  put_live(c, 0, sa, keys);
  c.data.min_delay = c.data.max_delay = 30;
  auto g = get_start(c, 1, sb, keys, {2, 2});
  auto* r = g.body.AsGetStartReply();
  REQUIRE(r->transferable_len == 4);
  auto bad = transfer(c, 1, sb, r->handle_id, 3);  // cuts a group
  CHECK(envelope_status(bad).code() == Code::kInvalidArgument);
  auto t = transfer(c, 1, sb, r->handle_id, 2);
  auto* tr = t.body.AsGetTransferReply();
  REQUIRE(tr);
  CHECK(tr->offsets.size() == 2);
  release(c, 1, sb, tr->holding_ids);
  check_quiet(c);
  CHECK(c.owner(1).local_state("cp-0") == 2);
  CHECK(c.owner(1).local_state("cp-3") == 0);  // the tail was never published here
  CHECK(c.master().replica_nodes("cp-3") == std::vector<uint32_t>{1});
}

TEST_CASE("G7: a failed fetch is one terminal state for every waiter, nothing leaks") {
  sim::Cluster c(seed_from_env(141), small_owner(), 2);
  c.run_for(10);
  const uint64_t sa = c.open_session(0), sb = c.open_session(1), sb2 = c.open_session(1);
  auto keys = keys_of("fail-", 3);
  put_live(c, 0, sa, keys);
  c.data.drop = 1.0;  // every fetch fails
  auto g1 = get_start(c, 1, sb, keys);
  auto g2 = get_start(c, 1, sb2, keys);
  auto *r1 = g1.body.AsGetStartReply(), *r2 = g2.body.AsGetStartReply();
  REQUIRE(r1->transferable_len == 3);
  REQUIRE(r2->transferable_len == 3);
  auto x1 = transfer(c, 1, sb, r1->handle_id, 3);
  auto x2 = transfer(c, 1, sb2, r2->handle_id, 3);
  CHECK(envelope_status(x1).code() == Code::kKeyNotFound);
  CHECK(envelope_status(x2).code() == Code::kKeyNotFound);
  CHECK(envelope_status(x1).message().find("fetch from node 1 failed") != std::string::npos);
  check_quiet(c);
  CHECK(c.owner(1).stats().holders == 0);
  CHECK(c.master().replica_nodes("fail-0") == std::vector<uint32_t>{1});
  // The next attempt starts a fresh flight and succeeds.
  c.data.drop = 0;
  auto g3 = get_start(c, 1, sb, keys);
  auto x3 = transfer(c, 1, sb, g3.body.AsGetStartReply()->handle_id, 3);
  REQUIRE(x3.body.AsGetTransferReply());
  CHECK(c.read(1, x3.body.AsGetTransferReply()->offsets[2]) == pattern("fail-2", 4096));
}

TEST_CASE("activity fence: a source copy a peer reads is not freed under it (S2 across owners)") {
  for (uint64_t seed : {seed_from_env(151), uint64_t(152), uint64_t(153)}) {
    sim::Cluster c(seed, small_owner(), 2);
    c.run_for(10);
    const uint64_t sa = c.open_session(0), sb = c.open_session(1);
    auto keys = keys_of("fence-", 4);
    put_live(c, 0, sa, keys);
    c.data.min_delay = c.data.max_delay = 200;  // the fetch takes 200 ms
    auto g = get_start(c, 1, sb, keys);
    auto* r = g.body.AsGetStartReply();
    REQUIRE(r->transferable_len == 4);
    const uint64_t tt = c.send(1, sb, make_envelope(wire::GetTransferReqT{{}, r->handle_id, 4}));
    c.run_for(20);  // the fetch is on the wire now
    // The source drops the keys and writes new values: a freed slot would be reused right away.
    for (const auto& k : keys) c.remove_key(0, k);
    c.run_for(50);
    CHECK(c.master().counters().remove_busy_total > 0);
    auto fresh = keys_of("fresh-", 4);
    auto ps = put_start(c, 0, sa, fresh);
    if (auto* p = ps.body.AsPutStartReply()) {
      for (size_t i = 0; i < fresh.size(); ++i) c.write(0, p->offsets[i], pattern(fresh[i], 4096));
      c.call(0, sa, make_envelope(wire::PutCommitReqT{{}, p->put_id}));
    }
    auto t = c.wait(tt);
    auto* tr = t.body.AsGetTransferReply();
    REQUIRE_MESSAGE(tr, envelope_status(t).to_string());
    for (size_t i = 0; i < keys.size(); ++i) CHECK(c.read(1, tr->offsets[i]) == pattern(keys[i], 4096));
    release(c, 1, sb, tr->holding_ids);
    check_quiet(c);
  }
}

TEST_CASE("T1: remote gets under lost, duplicated and delayed master messages and failing fetches converge") {
  for (uint64_t seed : {seed_from_env(161), uint64_t(162), uint64_t(163), uint64_t(164)}) {
    sim::Cluster c(seed, small_owner(), 2);
    c.run_for(10);
    const uint64_t sa = c.open_session(0), sb = c.open_session(1);
    std::vector<std::string> all;
    for (int b = 0; b < 6; ++b) {
      auto ks = keys_of("t1r-" + std::to_string(b) + "-", 4);
      put_live(c, 0, sa, ks);
      all.insert(all.end(), ks.begin(), ks.end());
    }
    for (auto* l : {&c.to_master, &c.from_master}) {
      l->drop = 0.3;
      l->duplicate = 0.3;
      l->min_delay = 1;
      l->max_delay = 40;
    }
    c.data.drop = 0.2;
    c.data.max_delay = 30;
    int ok = 0, failed = 0;
    std::mt19937_64 rng(seed);
    for (int round = 0; round < 12; ++round) {
      // Overlapping windows of the key space, so joins, leaders and local hits mix.
      const size_t start = rng() % (all.size() - 6);
      std::vector<std::string> ks(all.begin() + long(start), all.begin() + long(start + 6));
      auto g = get_start(c, 1, sb, ks);
      auto* r = g.body.AsGetStartReply();
      REQUIRE(r);
      if (r->transferable_len == 0) continue;
      if (!r->owner_rpc) {
        for (uint32_t i = 0; i < r->transferable_len; ++i) CHECK(c.read(1, r->offsets[i]) == pattern(ks[i], 4096));
        release_all(c, 1, sb, *r);
        ok++;
        continue;
      }
      auto t = transfer(c, 1, sb, r->handle_id, r->transferable_len);
      if (auto* tr = t.body.AsGetTransferReply()) {
        for (uint32_t i = 0; i < r->transferable_len; ++i) CHECK(c.read(1, tr->offsets[i]) == pattern(ks[i], 4096));
        release(c, 1, sb, tr->holding_ids);
        ok++;
      } else {
        // A failed fetch, or one whose GetDone the lossy links kept past the transfer deadline.
        const Code code = envelope_status(t).code();
        CHECK((code == Code::kKeyNotFound || code == Code::kTimeout));
        failed++;
      }
    }
    CHECK(ok > 0);
    for (auto* l : {&c.to_master, &c.from_master}) l->drop = l->duplicate = 0;
    c.data.drop = 0;
    check_quiet(c);
    // One route per key, and every replica the master names is a live local entry of that owner.
    for (const auto& k : all) {
      auto nodes = c.master().replica_nodes(k);
      REQUIRE(!nodes.empty());
      for (uint32_t n : nodes) CHECK(c.owner(int(n) - 1).local_state(k) == 2);
      if (c.owner(1).local_state(k) == 2) CHECK(std::count(nodes.begin(), nodes.end(), 2u) == 1);
    }
    MESSAGE("seed " << seed << ": " << ok << " restores, " << failed << " failed fetches, " << c.messages_dropped()
                    << " messages dropped, " << c.transfers_failed() << " fetches failed");
  }
}

TEST_CASE("a client that dies with remote fetches in flight leaves nothing behind") {
  sim::Cluster c(seed_from_env(171), small_owner(), 2);
  c.run_for(10);
  const uint64_t sa = c.open_session(0), sb = c.open_session(1);
  auto keys = keys_of("die-", 5);
  put_live(c, 0, sa, keys);
  c.data.min_delay = c.data.max_delay = 200;
  auto g = get_start(c, 1, sb, keys);
  REQUIRE(g.body.AsGetStartReply()->owner_rpc);
  c.run_for(20);
  c.close_session(1, sb);
  check_quiet(c);
  CHECK(c.owner(1).stats().holders == 0);
  CHECK(c.owner(1).stats().active_get_handles == 0);
}

TEST_CASE("a key being fetched is inflight for put_start, the handle TTL releases a forgotten remote handle") {
  sim::Cluster c(seed_from_env(181), small_owner(), 2);
  c.run_for(10);
  const uint64_t sa = c.open_session(0), sb = c.open_session(1);
  put_live(c, 0, sa, {"inf-0"});
  c.data.min_delay = c.data.max_delay = 200;
  auto g = get_start(c, 1, sb, {"inf-0"});
  REQUIRE(g.body.AsGetStartReply()->owner_rpc);
  auto p = put_start(c, 1, sb, {"inf-0"});
  Status s = envelope_status(p);
  CHECK(s.code() == Code::kKeyConflict);
  CHECK(s.reasons == std::vector<ConflictReason>{ConflictReason::kInflight});
  // Forgotten handle: the TTL (1 s here) runs the cancel path.
  c.run_for(1500);
  CHECK(c.owner(1).counters().handle_ttl_expired_total == 1);
  check_quiet(c);
  CHECK(c.owner(1).stats().holders == 0);
}

// ---- the master's side of remote gets, driven directly ------------------------------------------

TEST_CASE("G6 (master): one prepared get per (key, requester), another requester is never serialised") {
  MasterCore m;
  m_put(m, 1, 7, "k", 0);
  CHECK(m_start(m, 2, "k", 100) == wire::GetStartStatus::Started);
  CHECK(m_start(m, 2, "k", 100) == wire::GetStartStatus::Started);  // T1: the same get again
  CHECK(m_start(m, 2, "k", 101) == wire::GetStartStatus::Busy);     // a second get of the same requester
  CHECK(m_start(m, 3, "k", 200) == wire::GetStartStatus::Started);  // another owner: fine
  CHECK(m_start(m, 1, "k", 300) == wire::GetStartStatus::AlreadyLocal);
  CHECK(m_start(m, 2, "nope", 102) == wire::GetStartStatus::Miss);
  CHECK(m.inflight_get_count() == 2);
  CHECK(m_done(m, 2, "k", 100, 8192) == wire::GetDoneStatus::Live);
  CHECK(m_done(m, 2, "k", 100, 8192) == wire::GetDoneStatus::Live);   // T1: a re-sent Done converges
  CHECK(m_done(m, 2, "k", 100, 12288) == wire::GetDoneStatus::Stale); // another slot: not this get's
  CHECK(m.replica_nodes("k") == std::vector<uint32_t>{1, 2});
  // T2: the second requester's Done of the same version publishes its own replica.
  CHECK(m_done(m, 3, "k", 200, 4096) == wire::GetDoneStatus::Live);
  CHECK(m.replica_nodes("k") == std::vector<uint32_t>{1, 2, 3});
  CHECK(m.inflight_get_count() == 0);
}

TEST_CASE("master: a source is fenced while read, Done of a removed or replaced version is stale, TTL ends gets") {
  MasterCore m(1000);
  m_put(m, 1, 7, "k", 0);
  REQUIRE(m_start(m, 2, "k", 100, 0) == wire::GetStartStatus::Started);
  bool busy = false;
  CHECK_FALSE(m_remove(m, 1, "k", 1, 7, &busy));
  CHECK(busy);  // the activity fence: node 1's copy is being read
  m.tick(999);
  CHECK(m.inflight_get_count() == 1);
  m.tick(1000);  // TTL: the get expires, its fence goes
  CHECK(m.inflight_get_count() == 0);
  CHECK(m_remove(m, 1, "k", 1, 7, &busy));
  CHECK_FALSE(busy);
  CHECK(m.route_count() == 0);
  CHECK(m_done(m, 2, "k", 100, 0) == wire::GetDoneStatus::Stale);  // expired and gone: never published
  CHECK(m.route_count() == 0);

  // A newer local version replaces the route while a peer fetches the old one: its Done is stale.
  m_put(m, 1, 8, "v", 0);
  REQUIRE(m_start(m, 2, "v", 101) == wire::GetStartStatus::Started);
  CHECK(m_put(m, 1, 9, "v", 4096).body.AsPutDoneReply()->results[0] == wire::PutItemResult::Live);
  CHECK_FALSE(m_remove(m, 1, "v", 1, 8, &busy));  // the old slot is still being read
  CHECK(busy);
  CHECK(m_done(m, 2, "v", 101, 0) == wire::GetDoneStatus::Stale);
  CHECK(m_remove(m, 1, "v", 1, 8, &busy) == false);  // absent now: the owner may free the old slot
  CHECK_FALSE(busy);
  CHECK(m.replica_nodes("v") == std::vector<uint32_t>{1});
}

TEST_CASE("master: the last replica's removal removes the route, a late duplicate PutDone of a replica stays dead") {
  MasterCore m;
  m_put(m, 1, 7, "k", 0);
  REQUIRE(m_start(m, 2, "k", 100) == wire::GetStartStatus::Started);
  REQUIRE(m_done(m, 2, "k", 100, 4096) == wire::GetDoneStatus::Live);
  bool busy = false;
  CHECK(m_remove(m, 1, "k", 1, 7, &busy));  // origin's copy goes; node 2 still serves the key
  CHECK(m.route_count() == 1);
  CHECK(m.replica_nodes("k") == std::vector<uint32_t>{2});
  CHECK(m_remove(m, 2, "k", 1, 7, &busy));
  CHECK(m.route_count() == 0);
  // Node 2 re-publishing its removed copy late (a resync that crossed the removal) is refused.
  wire::PutDoneT pd;
  pd.node_id = 2;
  pd.generation = 1;
  pd.put_id = 55;
  pd.items.push_back(std::make_unique<wire::RouteItemT>());
  pd.items[0]->key = "k";
  pd.items[0]->offset = 4096;
  pd.items[0]->len = 4096;
  pd.items[0]->origin_node = 1;
  pd.items[0]->origin_generation = 1;
  pd.items[0]->origin_put_id = 7;
  CHECK(m.handle(make_envelope(std::move(pd))).body.AsPutDoneReply()->results[0] == wire::PutItemResult::Exists);
  CHECK(m.route_count() == 0);
}

TEST_CASE("an owner alone in its cluster answers misses without the master, with a peer it asks") {
  sim::Cluster one(seed_from_env(191), small_owner(), 1);
  one.run_for(10);
  const uint64_t s = one.open_session(0);
  put_live(one, 0, s, {"alone-0"});  // a master reply tells the owner it is alone
  auto g = get_start(one, 0, s, {"alone-0", "alone-1"});
  CHECK(g.body.AsGetStartReply()->transferable_len == 1);
  release_all(one, 0, s, *g.body.AsGetStartReply());
  CHECK(one.master().counters().get_start_total == 0);
  CHECK(one.owner(0).counters().get_alone_misses_total == 1);

  sim::Cluster two(seed_from_env(192), small_owner(), 2);
  two.run_for(10);
  const uint64_t s2 = two.open_session(0);
  put_live(two, 0, s2, {"alone-0"});
  auto g2 = get_start(two, 0, s2, {"alone-0", "alone-1"});
  CHECK(g2.body.AsGetStartReply()->transferable_len == 1);
  release_all(two, 0, s2, *g2.body.AsGetStartReply());
  CHECK(two.master().counters().get_start_total == 1);
  CHECK(two.owner(0).counters().get_alone_misses_total == 0);
}

// ---- replica tasks ------------------------------------------------------------------------------

namespace {
Envelope put_opts(sim::Cluster& c, int o, uint64_t s, std::vector<std::string> keys, bool make_replica,
                  bool write_through, std::vector<bool> mask = {}, std::vector<std::string> parents = {},
                  std::vector<uint32_t> depths = {}) {
  wire::PutStartReqT p;
  p.keys = keys;
  p.radix_parent_keys = std::move(parents);
  p.content_depths = std::move(depths);
  p.value_len = 4096;
  p.make_replica_task = make_replica;
  p.write_through = write_through;
  p.make_replica_task_mask = std::move(mask);
  auto r = c.call(o, s, make_envelope(std::move(p)));
  auto* ps = r.body.AsPutStartReply();
  REQUIRE_MESSAGE(ps, envelope_status(r).to_string());
  for (size_t i = 0; i < keys.size(); ++i) c.write(o, ps->offsets[i], pattern(keys[i], 4096));
  REQUIRE(c.call(o, s, make_envelope(wire::PutCommitReqT{{}, ps->put_id})).body.AsPutCommitReply());
  return r;
}
}  // namespace

TEST_CASE("replica tasks: !write_through && make_replica_task && mask[i] puts a copy on the remote_cache owner only") {
  sim::Cluster c(seed_from_env(201), small_owner(), 3, {"sglang_owner", "sglang_owner", "remote_cache"});
  c.run_for(10);
  const uint64_t s = c.open_session(0);
  put_opts(c, 0, s, {"rep-a0", "rep-a1"}, true, false);                    // broadcast: both
  put_opts(c, 0, s, {"rep-b0", "rep-b1"}, true, false, {true, false});     // per key
  put_opts(c, 0, s, {"rep-d0"}, false, false);                             // local only: none
  REQUIRE(c.run_until([&] { return c.owner(2).counters().replica_done_total == 3; }, 20000));
  c.run_for(500);
  for (const auto& k : {"rep-a0", "rep-a1", "rep-b0"}) {
    CHECK(c.master().replica_nodes(k) == std::vector<uint32_t>{1, 3});
    CHECK(c.owner(2).local_state(k) == 2);
  }
  for (const auto& k : {"rep-b1", "rep-d0"}) CHECK(c.master().replica_nodes(k) == std::vector<uint32_t>{1});
  CHECK(c.owner(1).local_state("rep-a0") == 0);  // never another GPU owner (strict target roles)
  CHECK(c.master().replica_targets().at(3) == 3);
  CHECK(c.master().replica_targets().count(2) == 0);
  CHECK(c.owner(0).counters().replica_keys_requested_total == 3);
  CHECK(c.owner(2).counters().replica_failed_total == 0);
  // The copy is the source's bytes.
  const uint64_t s2 = c.open_session(2);
  auto g = get_start(c, 2, s2, {"rep-a0"});
  REQUIRE(g.body.AsGetStartReply()->local_keys == 1);
  CHECK(c.read(2, g.body.AsGetStartReply()->offsets[0]) == pattern("rep-a0", 4096));
  release_all(c, 2, s2, *g.body.AsGetStartReply());
  check_quiet(c);
}

namespace {
// The PutLive note of put `put_id` to session `s` of owner `o`, once it came (nullopt: not yet).
std::optional<wire::PutLiveT> live_note(sim::Cluster& c, int o, uint64_t s, uint64_t put_id,
                                        std::vector<wire::PutLiveT>& seen) {
  for (auto& n : c.take_put_live(o, s)) seen.push_back(std::move(n));
  for (auto& n : seen)
    if (n.put_id == put_id) return std::move(n);
  return std::nullopt;
}
}  // namespace

TEST_CASE("write_through: the put's future completes once a target-role owner holds every key - a synchronous remote placement") {
  sim::Cluster c(seed_from_env(203), small_owner(), 3, {"sglang_owner", "sglang_owner", "remote_cache"});
  c.run_for(10);
  const uint64_t s = c.open_session(0);
  std::vector<wire::PutLiveT> seen;
  const uint64_t wt = put_opts(c, 0, s, {"wt-0", "wt-1"}, false, true).body.AsPutStartReply()->put_id;
  const uint64_t plain = put_opts(c, 0, s, {"wt-plain"}, false, false).body.AsPutStartReply()->put_id;
  // The plain put completes when its route is live; the write_through one only with its copy there.
  std::optional<wire::PutLiveT> wt_live;
  REQUIRE(c.run_until([&] { return (wt_live = live_note(c, 0, s, wt, seen)).has_value(); }, 20000));
  CHECK(!wt_live->error);
  // When the note came, the master already listed the target's copy of every key (not later).
  CHECK(c.master().replica_nodes("wt-0") == std::vector<uint32_t>{1, 3});
  CHECK(c.master().replica_nodes("wt-1") == std::vector<uint32_t>{1, 3});
  CHECK(c.owner(1).local_state("wt-0") == 0);  // a target role, never the other GPU owner
  const auto p = live_note(c, 0, s, plain, seen);
  REQUIRE(p);
  CHECK(!p->error);
  c.run_for(500);
  CHECK(c.master().replica_nodes("wt-plain") == std::vector<uint32_t>{1});  // no copy asked, none made
  const auto& oc = c.owner(0).counters();
  CHECK(oc.write_through_puts_total == 1);
  CHECK(oc.write_through_backed_total == 1);
  CHECK(oc.write_through_failed_total == 0);
  CHECK(oc.replica_keys_requested_total == 0);
  // The local copies stay (L2), recoverable now: capacity eviction may take them first.
  CHECK(c.owner(0).local_state("wt-0") == 2);
  check_quiet(c);
}

TEST_CASE("write_through without a target-role owner: the future fails naming the placement, the value stays local") {
  sim::Cluster c(seed_from_env(204), small_owner(), 2, {"sglang_owner", "sglang_owner"});
  c.run_for(10);
  const uint64_t s = c.open_session(0);
  std::vector<wire::PutLiveT> seen;
  const uint64_t wt = put_opts(c, 0, s, {"wt-none"}, false, true).body.AsPutStartReply()->put_id;
  std::optional<wire::PutLiveT> live;
  REQUIRE(c.run_until([&] { return (live = live_note(c, 0, s, wt, seen)).has_value(); }, 20000));
  REQUIRE(live->error);
  CHECK(live->error->message.find("no owner of a target role") != std::string::npos);
  CHECK(live->error->message.find("remote_only_node_roles") != std::string::npos);
  CHECK(c.owner(0).local_state("wt-none") == 2);  // published and readable here: only the copy is missing
  CHECK(c.master().replica_nodes("wt-none") == std::vector<uint32_t>{1});
  CHECK(c.owner(0).counters().write_through_failed_total == 1);
  check_quiet(c);
}

TEST_CASE("replica tasks carry the prefix chain and depths: the remote_cache owner's copies continue the same pages as their sources") {
  sim::Cluster c(seed_from_env(205), small_owner(), 2, {"sglang_owner", "remote_cache"});
  c.run_for(10);
  const uint64_t s = c.open_session(0);
  // Two puts of one chain: ch0 <- ch1 <- ch2 (the second put continues the first's last page). The
  // first gives its depths; the second's follows from its parent's here.
  put_opts(c, 0, s, {"ch0", "ch1"}, true, false, {}, {"", "ch0"}, {0, 1});
  put_opts(c, 0, s, {"ch2"}, true, false, {}, {"ch1"});
  REQUIRE(c.run_until([&] { return c.owner(1).counters().replica_done_total == 3; }, 20000));
  CHECK(c.owner(0).prefix_parent("ch1") == "ch0");
  CHECK(c.owner(1).prefix_parent("ch0") == "");
  CHECK(c.owner(1).prefix_parent("ch1") == "ch0");
  CHECK(c.owner(1).prefix_parent("ch2") == "ch1");
  CHECK(c.owner(0).prefix_depth("ch2") == 2);
  for (uint32_t d = 0; d < 3; ++d) CHECK(c.owner(1).prefix_depth("ch" + std::to_string(d)) == d);
  check_quiet(c);
}

TEST_CASE("peer reads: a remote get's fetch counts as a read of the source's copies, a replica task's copy does not") {
  sim::Cluster c(seed_from_env(103), small_owner(), 3, {"sglang_owner", "sglang_owner", "remote_cache"});
  c.run_for(10);
  const uint64_t sa = c.open_session(0), sb = c.open_session(1);
  put_live(c, 0, sa, keys_of("pr-", 4));
  // A reader on owner 1 fetches two of them: owner 0's copies were read, as by a local get.
  auto read = [&](std::vector<std::string> keys) {
    const uint32_t n = uint32_t(keys.size());
    auto g = get_start(c, 1, sb, std::move(keys));
    REQUIRE(g.body.AsGetStartReply());
    REQUIRE(g.body.AsGetStartReply()->transferable_len == n);
    auto t = transfer(c, 1, sb, g.body.AsGetStartReply()->handle_id, n);
    REQUIRE(t.body.AsGetTransferReply());
    release(c, 1, sb, t.body.AsGetTransferReply()->holding_ids);
  };
  read({"pr-0", "pr-1"});
  CHECK(c.owner(0).counters().peer_read_keys_total == 2);
  // A replica task copies the other two to the remote_cache owner: a copy, not a read.
  put_opts(c, 0, sa, {"pr-r0", "pr-r1"}, true, false);
  REQUIRE(c.run_until([&] { return c.owner(2).counters().replica_done_total == 2; }, 20000));
  c.run_for(200);
  CHECK(c.owner(0).counters().peer_read_keys_total == 2);
  CHECK(c.owner(2).counters().peer_read_keys_total == 0);
  // Reading the remote_cache owner's copy from owner 1 is a read there.
  read({"pr-r0"});
  CHECK(c.owner(0).counters().peer_read_keys_total + c.owner(2).counters().peer_read_keys_total == 3);
  check_quiet(c);
}

namespace {
// A put of rank `rank` (of 2) of four 2-page groups g0..g3, named the same on both ranks' ids,
// every group a candidate, under kv_score_pressure_budget (`pages` at full pressure).
Envelope put_budgeted(sim::Cluster& c, uint64_t s, const std::string& tag, int rank, uint32_t pages) {
  wire::PutStartReqT p;
  for (int g = 0; g < 4; ++g)
    for (int k = 0; k < 2; ++k) p.keys.push_back(tag + "-g" + std::to_string(g) + "p" + std::to_string(k) + "_" +
                                                 std::to_string(rank) + "_2");
  p.value_len = 4096;
  p.atomic_group_lens = {2, 2, 2, 2};
  p.make_replica_task = true;
  p.replica_budget_pages = pages;
  p.replica_group_priorities = {0.2f, 0.9f, 0.5f, 0.7f};
  for (int g = 0; g < 4; ++g) p.replica_group_ids.push_back(std::hash<std::string>()(tag + std::to_string(g)));
  p.replica_decision_shares = 2;
  auto keys = p.keys;
  auto r = c.call(0, s, make_envelope(std::move(p)));
  auto* ps = r.body.AsPutStartReply();
  REQUIRE_MESSAGE(ps, envelope_status(r).to_string());
  for (size_t i = 0; i < keys.size(); ++i) c.write(0, ps->offsets[i], pattern(keys[i], 4096));
  REQUIRE(c.call(0, s, make_envelope(wire::PutCommitReqT{{}, ps->put_id})).body.AsPutCommitReply());
  return r;
}
}  // namespace

TEST_CASE("replica budget (kv_score_pressure_budget): no replica while the owner has room, the best whole groups within pages x pressure once it evicts, the same groups for both TP ranks") {
  sim::Cluster c(seed_from_env(207), small_owner(), 2, {"sglang_owner", "remote_cache"});
  c.run_for(10);
  const uint64_t r0 = c.open_session(0), r1 = c.open_session(0);  // two TP ranks behind one owner
  const auto& oc = c.owner(0).counters();
  put_budgeted(c, r0, "rest", 0, 5);  // room: a replica would only be a duplicate
  put_budgeted(c, r1, "rest", 1, 5);
  CHECK(oc.replica_budget_cut_keys_total == 16);
  CHECK(oc.replica_budget_shared_keys_total == 8);  // the second rank took the first's decisions
  CHECK(oc.replica_keys_requested_total == 0);
  // Fill the owner (2,048 slots) well past its capacity: from now on every admission evicts.
  for (int b = 0; b < 80; ++b) {
    std::vector<std::string> keys;
    for (int i = 0; i < 64; ++i) keys.push_back("fill-" + std::to_string(b) + "-" + std::to_string(i));
    put_opts(c, 0, r0, keys, false, false);
  }
  REQUIRE(oc.evicted_keys_total > 0);
  put_budgeted(c, r0, "hot", 0, 5);
  CHECK(c.owner(0).stats().replica_budget_pressure_permille >= 800);
  put_budgeted(c, r1, "hot", 1, 5);
  // 5 pages at a pressure >= 0.8: the 0.9 and the 0.7 groups (4 pages); 0.5 does not fit whole.
  CHECK(oc.replica_budget_kept_keys_total == 8);
  CHECK(oc.replica_keys_requested_total == 8);
  REQUIRE(c.run_until([&] { return c.owner(1).counters().replica_done_total == 8; }, 20000));
  c.run_for(500);
  for (int rank = 0; rank < 2; ++rank)
    for (int g = 0; g < 4; ++g) {
      const std::string k = "hot-g" + std::to_string(g) + "p1_" + std::to_string(rank) + "_2";
      CHECK_MESSAGE(c.owner(1).local_state(k) == (g == 1 || g == 3 ? 2 : 0), k);
    }
  check_quiet(c);
}

TEST_CASE("S3: the source evicts without waiting for replicas, a replica then serves the key (L3)") {
  sim::Cluster c(seed_from_env(211), small_owner(), 3, {"sglang_owner", "sglang_owner", "remote_cache"});
  c.run_for(10);
  const uint64_t s0 = c.open_session(0), s1 = c.open_session(1);
  put_opts(c, 0, s0, {"s3-a", "s3-b"}, true, false);
  REQUIRE(c.run_until([&] { return c.owner(2).counters().replica_done_total == 2; }, 20000));
  c.remove_key(0, "s3-a");  // capacity eviction at the source: route first, nothing asked of node 3
  REQUIRE(c.run_until([&] { return c.master().replica_nodes("s3-a") == std::vector<uint32_t>{3}; }, 5000));
  CHECK(c.master().counters().removed_with_copies_left_total == 1);
  CHECK(c.master().counters().removed_last_copy_total == 0);
  auto g = get_start(c, 1, s1, {"s3-a", "s3-b"});
  auto* r = g.body.AsGetStartReply();
  REQUIRE(r->transferable_len == 2);
  auto t = transfer(c, 1, s1, r->handle_id, 2);
  REQUIRE(t.body.AsGetTransferReply());
  CHECK(c.read(1, t.body.AsGetTransferReply()->offsets[0]) == pattern("s3-a", 4096));
  release(c, 1, s1, t.body.AsGetTransferReply()->holding_ids);
  // With no owner of a target role, a replica task is refused, never placed on a GPU owner.
  sim::Cluster two(seed_from_env(212), small_owner(), 2);
  two.run_for(10);
  const uint64_t t0 = two.open_session(0);
  put_opts(two, 0, t0, {"nt-a"}, true, false);
  two.run_for(500);
  CHECK(two.master().counters().replica_tasks_no_target_total == 1);
  CHECK(two.master().replica_nodes("nt-a") == std::vector<uint32_t>{1});
}

TEST_CASE("T1: a master restart with remote gets in flight converges: restores succeed or fail cleanly, nothing leaks") {
  for (uint64_t seed : {seed_from_env(221), uint64_t(222), uint64_t(223)}) {
    sim::Cluster c(seed, small_owner(), 2);
    c.run_for(10);
    const uint64_t sa = c.open_session(0), sb = c.open_session(1);
    auto keys = keys_of("mr-", 8);
    put_live(c, 0, sa, keys);
    c.data.min_delay = c.data.max_delay = 40;
    c.to_master.max_delay = c.from_master.max_delay = 20;
    auto g = get_start(c, 1, sb, keys);
    auto* r = g.body.AsGetStartReply();
    REQUIRE(r->transferable_len == 8);
    const uint64_t tt = c.send(1, sb, make_envelope(wire::GetTransferReqT{{}, r->handle_id, 8}));
    c.run_for(45);          // the fetch finished; its BatchGetDone is on the way
    c.restart_master();     // ... to a master that dies; the new one knows nothing until resync
    auto t = c.wait(tt);
    if (auto* tr = t.body.AsGetTransferReply()) {
      for (size_t i = 0; i < keys.size(); ++i) CHECK(c.read(1, tr->offsets[i]) == pattern(keys[i], 4096));
      release(c, 1, sb, tr->holding_ids);
    } else {
      const Code code = envelope_status(t).code();
      CHECK((code == Code::kKeyNotFound || code == Code::kTimeout));
    }
    check_quiet(c);
    // The resync gave the new master every live copy back, and only live ones.
    REQUIRE(c.run_until([&] { return c.master().route_count() == 8; }, 5000));
    for (const auto& k : keys)
      for (uint32_t n : c.master().replica_nodes(k)) CHECK(c.owner(int(n) - 1).local_state(k) == 2);
    // A fresh read works either way.
    auto g2 = get_start(c, 1, sb, keys);
    auto* r2 = g2.body.AsGetStartReply();
    REQUIRE(r2->transferable_len == 8);
    if (r2->owner_rpc) {
      auto t2 = transfer(c, 1, sb, r2->handle_id, 8);
      REQUIRE(t2.body.AsGetTransferReply());
      release(c, 1, sb, t2.body.AsGetTransferReply()->holding_ids);
    } else {
      release_all(c, 1, sb, *r2);
    }
    check_quiet(c);
  }
}

TEST_CASE("T1: replica tasks under lost, duplicated and delayed master messages and failing fetches converge") {
  uint64_t retries = 0;
  for (uint64_t seed : {seed_from_env(231), uint64_t(232), uint64_t(233)}) {
    sim::Cluster c(seed, small_owner(), 3, {"sglang_owner", "sglang_owner", "remote_cache"});
    c.run_for(50);
    const uint64_t s = c.open_session(0);
    for (auto* l : {&c.to_master, &c.from_master}) {
      l->drop = 0.25;
      l->duplicate = 0.25;
      l->max_delay = 30;
    }
    c.data.drop = 0.2;
    std::vector<std::string> all;
    for (int b = 0; b < 5; ++b) {
      auto ks = keys_of("rt1-" + std::to_string(b) + "-", 4);
      put_opts(c, 0, s, ks, true, false);
      all.insert(all.end(), ks.begin(), ks.end());
    }
    c.run_for(3000);
    for (auto* l : {&c.to_master, &c.from_master}) l->drop = l->duplicate = 0;
    c.data.drop = 0;
    check_quiet(c);
    const auto& oc = c.owner(2).counters();
    MESSAGE("seed " << seed << ": replicas done " << oc.replica_done_total << ", failed " << oc.replica_failed_total
                    << " (after " << oc.replica_retries_total << " retries), tasks received "
                    << oc.replica_tasks_received_total);
    CHECK(oc.replica_done_total > 0);
    retries += oc.replica_retries_total;  // 20% of the fetches fail: the target tries again
    size_t copies = 0;
    for (const auto& k : all) copies += c.owner(2).local_state(k) == 2;
    CHECK(copies + oc.replica_failed_total >= oc.replica_tasks_received_total - oc.replica_tasks_skipped_total);
    // With 3 attempts a copy is lost only if its fetch fails 3 times (0.8% here): these seeds get all.
    CHECK(copies == all.size());
    // Every copy the master names is live where it says, and no copy is named twice.
    for (const auto& k : all) {
      auto nodes = c.master().replica_nodes(k);
      CHECK(std::set<uint32_t>(nodes.begin(), nodes.end()).size() == nodes.size());
      for (uint32_t n : nodes) CHECK(c.owner(int(n) - 1).local_state(k) == 2);
      if (c.owner(2).local_state(k) == 2) {
        auto g = get_start(c, 2, c.open_session(2), {k});
        CHECK(c.read(2, g.body.AsGetStartReply()->offsets[0]) == pattern(k, 4096));
      }
    }
  }
  CHECK(retries > 0);
}

TEST_CASE("master: tombstones expire, so removed keys do not grow the master forever") {
  MasterCore m;
  m.tick(1000);
  for (int i = 0; i < 100; ++i) {
    const std::string k = "tomb-" + std::to_string(i);
    m_put(m, 1, 10 + i, k, uint64_t(i) * 4096);
    bool busy = false;
    CHECK(m_remove(m, 1, k, 1, 10 + i, &busy));
  }
  CHECK(m.tombstone_count() == 100);
  // Inside the window a late duplicate of a removed version stays dead ...
  CHECK(m_put(m, 1, 10, "tomb-0", 0).body.AsPutDoneReply()->results[0] == wire::PutItemResult::Exists);
  m.tick(1000 + 10 * 60 * 1000 - 1);
  CHECK(m.tombstone_count() == 100);
  m.tick(1000 + 10 * 60 * 1000);
  CHECK(m.tombstone_count() == 0);  // ... and after it the memory is back
  CHECK(m.route_count() == 0);
}

TEST_CASE("G2 G3: a leader's marker is visible the moment its get_start is handled - before the master hears of it") {
  sim::Cluster c(seed_from_env(141), small_owner(), 2);
  c.run_for(10);
  const uint64_t sa = c.open_session(0), sb = c.open_session(1), sb2 = c.open_session(1);
  put_live(c, 0, sa, {"m0", "m1"});
  c.to_master.min_delay = c.to_master.max_delay = 100;  // the BatchGetStart is still on its way
  wire::GetStartReqT q;
  q.keys = {"m0", "m1"};
  const uint64_t t = c.send(1, sb, make_envelope(std::move(q)));
  // Nothing has run yet: no snapshot-then-insert window in which a second reader could lead too.
  CHECK(c.owner(1).stats().flights_starting == 2);
  // A put of the key sees it inflight (reject_if_inflight_same_key), a second reader joins.
  wire::PutStartReqT p;
  p.keys = {"m0"};
  p.value_len = 4096;
  p.reject_if_inflight_same_key = true;
  auto refused = c.call(1, sb2, make_envelope(std::move(p)));
  REQUIRE(envelope_status(refused).code() == Code::kKeyConflict);
  CHECK(envelope_status(refused).reasons[0] == ConflictReason::kInflight);
  auto g2 = get_start(c, 1, sb2, {"m0", "m1"});
  REQUIRE(g2.body.AsGetStartReply());
  CHECK(g2.body.AsGetStartReply()->joined_keys == 2);
  CHECK(g2.body.AsGetStartReply()->leader_keys == 0);
  auto g1 = c.wait(t);
  REQUIRE(g1.body.AsGetStartReply());
  CHECK(g1.body.AsGetStartReply()->leader_keys == 2);
  CHECK(c.master().counters().get_start_keys_total == 2);  // one flight per key
}

TEST_CASE("G10: a leader whose reader dies before the master answers leaves no marker behind") {
  sim::Cluster c(seed_from_env(142), small_owner(), 2);
  c.run_for(10);
  const uint64_t sa = c.open_session(0), sb = c.open_session(1);
  put_live(c, 0, sa, {"d0", "d1", "d2"});
  c.to_master.min_delay = c.to_master.max_delay = 50;
  wire::GetStartReqT q;
  q.keys = {"d0", "d1", "d2"};
  (void)c.send(1, sb, make_envelope(std::move(q)));
  c.close_session(1, sb);  // cancellation: the reader is gone with its leaders in the air
  REQUIRE(c.run_until([&] {
    auto st = c.owner(1).stats();
    return st.flights_starting + st.flights_started + st.flights_finishing + st.get_jobs == 0 &&
           c.master().inflight_get_count() == 0;
  }, 10000));
  CHECK(c.owner(1).stats().holders == 0);
  // The markers went with the flights: a new reader leads the keys again and reads them.
  c.to_master.min_delay = c.to_master.max_delay = 1;
  const uint64_t sb2 = c.open_session(1);
  auto g = get_start(c, 1, sb2, {"d0", "d1", "d2"});
  REQUIRE(g.body.AsGetStartReply());
  CHECK(g.body.AsGetStartReply()->leader_keys == 3);
  auto x = transfer(c, 1, sb2, g.body.AsGetStartReply()->handle_id, 3);
  REQUIRE(x.body.AsGetTransferReply());
  CHECK(c.read(1, x.body.AsGetTransferReply()->offsets[0]) == pattern("d0", 4096));
}

TEST_CASE("bounds: with replica retries at their bound, a failed replica fetch is final, counted") {
  OwnerConfig cfg = small_owner();
  cfg.limits.replica_retries = 0;
  sim::Cluster c(seed_from_env(809), cfg, 3, {"sglang_owner", "sglang_owner", "remote_cache"});
  c.run_for(10);
  const uint64_t s = c.open_session(0);
  c.data.drop = 1.0;  // every fetch fails
  put_opts(c, 0, s, {"rr0", "rr1"}, true, false);
  REQUIRE(c.run_until([&] { return c.owner(2).counters().replica_failed_total == 2; }, 20000));
  CHECK(c.owner(2).counters().replica_retries_total == 0);
  CHECK(c.owner(2).counters().replica_retries_full_total == 2);
  CHECK(c.owner(2).local_state("rr0") == 0);
}

TEST_CASE("replica pipeline (E16bh): at most replica_task_max_inflight replica fetches in flight across keys, every task done") {
  for (const uint32_t limit : {1u, 8u}) {
    CAPTURE(limit);
    OwnerConfig cfg = small_owner();
    cfg.replica_task_max_inflight = limit;
    sim::Cluster c(seed_from_env(205), cfg, 2, {"sglang_owner", "remote_cache"});
    c.run_for(10);
    const uint64_t s = c.open_session(0);
    std::vector<std::string> keys;
    for (int i = 0; i < 32; ++i) keys.push_back("pipe-" + std::to_string(i));
    put_opts(c, 0, s, keys, true, false);
    size_t peak = 0;
    REQUIRE(c.run_until(
        [&] {
          peak = std::max<size_t>(peak, c.owner(1).stats().replica_flights);
          return c.owner(1).counters().replica_done_total == 32;
        },
        60000));
    CHECK(peak <= limit);
    if (limit > 1) CHECK(peak > 1);  // the pipeline does run keys side by side
    for (const auto& k : keys) CHECK(c.owner(1).local_state(k) == 2);
  }
}

TEST_CASE("prefix-aware eviction of fetched copies: a prefix read's copies continue one another, so pressure takes the fetched chain from its tail") {
  for (const bool prefix_read : {true, false}) {
    CAPTURE(prefix_read);
    OwnerConfig cfg = small_owner();
    cfg.eviction_free_watermark = 0;  // evict what waiting claims need, no more
    sim::Cluster c(seed_from_env(207), cfg, 2);
    c.run_for(10);
    const uint64_t s0 = c.open_session(0), s1 = c.open_session(1);
    std::vector<std::string> chain;
    for (int i = 0; i < 300; ++i) chain.push_back("ch-" + std::to_string(i));
    for (size_t at = 0; at < chain.size(); at += 10)
      put_opts(c, 0, s0, {chain.begin() + long(at), chain.begin() + long(at) + 10}, false, false);
    REQUIRE(c.run_until([&] { return c.master().route_count() == 300; }, 10000));
    // Owner 1 fetches the chain in one read: as a prefix, or as separate keys (no chain known).
    wire::GetStartReqT g;
    g.keys = chain;
    g.prefix_best_effort = prefix_read;
    auto rep = c.call(1, s1, make_envelope(std::move(g)));
    REQUIRE(rep.body.AsGetStartReply());
    auto* r = rep.body.AsGetStartReply();
    REQUIRE(r->transferable_len == 300);
    auto t = transfer(c, 1, s1, r->handle_id, 300);
    REQUIRE(t.body.AsGetTransferReply());
    release(c, 1, s1, t.body.AsGetTransferReply()->holding_ids);
    c.run_for(100);
    REQUIRE(c.owner(1).local_state("ch-0") == 2);
    // Newer keys fill owner 1's 2048 slots and more: fewer evictions than the chain is long.
    for (int p = 0; p < 180; ++p) {
      std::vector<std::string> keys;
      for (int i = 0; i < 10; ++i) keys.push_back("fill-" + std::to_string(p) + "-" + std::to_string(i));
      put_opts(c, 1, s1, keys, false, false);
    }
    REQUIRE(c.run_until([&] { return c.owner(1).reclaims_in_flight() == 0; }, 20000));
    const uint64_t evicted = c.owner(1).counters().evicted_keys_total;
    MESSAGE("evicted " << evicted);
    REQUIRE(evicted > 0);
    REQUIRE(evicted < 300);
    if (prefix_read) {  // the tail went, the head stays servable
      CHECK(c.owner(1).local_state("ch-0") == 2);
      CHECK(c.owner(1).local_state("ch-299") == 0);
    } else {  // the coldest first: the head
      CHECK(c.owner(1).local_state("ch-0") == 0);
    }
  }
}

TEST_CASE("master: a holder that has not registered with this core is no source until it registers (a resync's PutDone that overtook its RegisterOwner)") {
  MasterCore m;
  // After a failover the new leader's core is empty: node 1's re-published route comes first.
  CHECK(m.handle(make_envelope(m_put_done(1, 7, "k", 0))).body.AsPutDoneReply());
  CHECK(m.route_count() == 1);
  CHECK(m_start(m, 2, "k", 100) == wire::GetStartStatus::Busy);  // its data address is unknown: a miss for now
  m_ensure_registered(m, 1);
  CHECK(m_start(m, 2, "k", 101) == wire::GetStartStatus::Started);
  // A new generation's first put (before it registers) is no source either.
  wire::PutDoneT pd = m_put_done(1, 8, "n", 4096);
  pd.generation = 2;
  CHECK(m.handle(make_envelope(std::move(pd))).body.AsPutDoneReply());
  CHECK(m_start(m, 3, "n", 200) == wire::GetStartStatus::Busy);
}
