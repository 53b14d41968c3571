// Invariant tests run through the deterministic simulator. Each prints its seed; a failing seed
// is replayed with FLUXON_SEED=<seed>.
#include "helpers.hpp"

using namespace fluxon;
using namespace fluxon::test;

TEST_CASE("V1: with the master delayed, a same-owner get hits right after commit") {
  for (uint64_t seed : {seed_from_env(1), uint64_t(2), uint64_t(3)}) {
    sim::Cluster c(seed, small_owner());
    c.run_for(10);
    c.to_master.min_delay = c.to_master.max_delay = 5000;  // master RPCs take 5 s
    const uint64_t s = c.open_session(0);
    auto keys = keys_of("v1-", 8);
    put_commit(c, 0, s, keys);
    // No simulated time has passed for the master: the route cannot exist yet.
    CHECK(c.master().route_count() == 0);
    auto g = get_start(c, 0, s, keys);
    auto* r = g.body.AsGetStartReply();
    REQUIRE(r);
    CHECK(r->transferable_len == 8);
    CHECK(r->holding_ids.size() == 8);
    CHECK(c.owner(0).local_state("v1-0") == 1);  // pending local visible, not live
    CHECK(c.take_put_live(0, s).empty());           // the future is not done
    release_all(c, 0, s, *r);
    REQUIRE(c.run_until([&] { return c.master().route_count() == 8; }, 20000));
    REQUIRE(c.run_until([&] { return c.owner(0).local_state("v1-0") == 2; }, 20000));
    auto live = c.take_put_live(0, s);
    REQUIRE(live.size() == 1);
    CHECK(live[0].error == nullptr);
  }
}

TEST_CASE("V2: before the route exists, the master and a second owner do not see the key") {
  sim::Cluster c(seed_from_env(11), small_owner(), 2);
  c.run_for(10);
  c.to_master.min_delay = c.to_master.max_delay = 3000;
  const uint64_t s0 = c.open_session(0), s1 = c.open_session(1);
  put_commit(c, 0, s0, {"v2-a"});
  auto look = c.master().handle(make_envelope(wire::LookupT{{}, {"v2-a"}}));
  CHECK_FALSE(look.body.AsLookupReply()->routes[0]->found);
  auto g1 = get_start(c, 1, s1, {"v2-a"});
  CHECK(g1.body.AsGetStartReply()->transferable_len == 0);
  auto g0 = get_start(c, 0, s0, {"v2-a"});
  CHECK(g0.body.AsGetStartReply()->transferable_len == 1);  // the local one does (V1)
  release_all(c, 0, s0, *g0.body.AsGetStartReply());
  REQUIRE(c.run_until([&] { return c.master().route_count() == 1; }, 10000));
  auto look2 = c.master().handle(make_envelope(wire::LookupT{{}, {"v2-a"}}));
  CHECK(look2.body.AsLookupReply()->routes[0]->found);
  CHECK(look2.body.AsLookupReply()->routes[0]->node_id == 1);
}

TEST_CASE("V3: Committed(route_live) waits for the master route and the future follows it") {
  sim::Cluster c(seed_from_env(21), small_owner());
  c.run_for(10);
  c.to_master.min_delay = c.to_master.max_delay = 400;
  const uint64_t s = c.open_session(0);
  put_commit(c, 0, s, keys_of("v3-", 4));
  auto st = c.owner(0).stats();
  CHECK(st.slots_pending_local_visible == 4);
  CHECK(st.slots_committed == 0);
  c.run_for(399);
  CHECK(c.owner(0).stats().slots_committed == 0);
  CHECK(c.take_put_live(0, s).empty());
  REQUIRE(c.run_until([&] { return c.owner(0).stats().slots_committed == 4; }, 2000));
  CHECK(c.master().route_count() == 4);
  CHECK(c.take_put_live(0, s).size() == 1);
}

TEST_CASE("T1: lost and duplicated PutDone requests/replies converge to one route and one slot per key") {
  for (uint64_t seed : {seed_from_env(31), uint64_t(32), uint64_t(33), uint64_t(34)}) {
    sim::Cluster c(seed, small_owner());
    c.run_for(10);
    c.to_master = {0.4, 0.4, 1, 30};
    c.from_master = {0.4, 0.4, 1, 30};
    const uint64_t s = c.open_session(0);
    for (int b = 0; b < 10; ++b) put_commit(c, 0, s, keys_of("t1-" + std::to_string(b) + "-", 16), {8, 8});
    REQUIRE(c.run_until([&] { return c.owner(0).stats().slots_committed == 160; }, 60000));
    c.to_master = sim::kQuietLink;
    c.from_master = sim::kQuietLink;
    c.run_for(500);
    CHECK(c.master().route_count() == 160);
    auto st = c.owner(0).stats();
    CHECK(st.slots_committed == 160);
    CHECK(st.slots_pending_local_visible == 0);
    CHECK(st.slots_prepared == 0);
    CHECK(st.routes == 160);
    CHECK(st.publish_jobs == 0);
    CHECK(c.take_put_live(0, s).size() == 10);  // exactly one terminal note per batch
    CHECK(c.messages_dropped() > 0);
    CHECK(c.messages_duplicated() > 0);
    // Every route names the version the owner holds.
    for (int b = 0; b < 10; ++b)
      for (auto& k : keys_of("t1-" + std::to_string(b) + "-", 16)) CHECK(c.master().route_put_id(k) == uint64_t(b + 1));
  }
}

TEST_CASE("T1 A2: batches committed while PutDones are on their way go together - fewer messages, one identity and one note each, also when messages are lost") {
  for (uint64_t seed : {seed_from_env(35), uint64_t(36)}) {
    sim::Cluster c(seed, small_owner());  // publish_retry_ms 50
    c.run_for(10);
    c.to_master.min_delay = c.to_master.max_delay = 20;
    const uint64_t s = c.open_session(0);
    const uint64_t msgs0 = c.master().counters().put_done_messages_total;
    // A lone batch goes at once: live after one round trip.
    put_commit(c, 0, s, keys_of("w0-", 2));
    REQUIRE(c.run_until([&] { return c.owner(0).stats().slots_committed == 2; }, 100));
    CHECK(c.owner(0).counters().publish_coalesced_total == 0);
    // A stream: 40 batches, 2 ms apart, while each PutDone takes 40 ms to be answered.
    auto stream = [&](const std::string& prefix, int first) {
      for (int b = first; b < first + 40; ++b) {
        put_commit(c, 0, s, keys_of(prefix + std::to_string(b) + "-", 2));
        c.run_for(2);
      }
    };
    stream("w", 1);
    REQUIRE(c.run_until([&] { return c.owner(0).stats().slots_committed == 82; }, 5000));
    CHECK(c.master().route_count() == 82);
    CHECK(c.take_put_live(0, s).size() == 41);  // one terminal note per batch
    const uint64_t msgs = c.master().counters().put_done_messages_total - msgs0;
    CHECK(c.master().counters().put_done_total >= 41);
    CHECK(msgs < 20);  // one per batch without coalescing
    CHECK(c.owner(0).counters().publish_coalesced_total > 20);
    CHECK(c.owner(0).counters().publish_retry_total == 0);  // none waited as long as a retry
    MESSAGE("seed " << seed << ": 41 batches in " << msgs << " PutDone messages");
    // The same under loss and duplication of requests and replies: every batch converges.
    c.to_master = {0.3, 0.3, 5, 20};
    c.from_master = {0.3, 0.3, 5, 20};
    const uint64_t shared0 = c.owner(0).counters().publish_messages_shared_total;
    stream("x", 41);
    REQUIRE(c.run_until([&] { return c.owner(0).stats().slots_committed == 162; }, 60000));
    c.to_master = sim::kQuietLink;
    c.from_master = sim::kQuietLink;
    c.run_for(500);
    CHECK(c.owner(0).counters().publish_messages_shared_total > shared0);
    CHECK(c.messages_dropped() > 0);
    CHECK(c.master().route_count() == 162);
    CHECK(c.owner(0).stats().publish_jobs == 0);
    CHECK(c.take_put_live(0, s).size() == 40);
    for (int b = 0; b <= 80; ++b)
      CHECK(c.master().route_put_id((b <= 40 ? "w" : "x") + std::to_string(b) + "-1") == uint64_t(b + 1));
  }
}

TEST_CASE("A1: a local atomic group is a hit only when complete") {
  sim::Cluster c(seed_from_env(41), small_owner());
  c.run_for(10);
  const uint64_t s = c.open_session(0);
  put_commit(c, 0, s, {"a1-0", "a1-1", "a1-2"});
  // group [2, 2]: the second group misses a1-3, so only the first group transfers
  auto g = get_start(c, 0, s, {"a1-0", "a1-1", "a1-2", "a1-3"}, {2, 2});
  auto* r = g.body.AsGetStartReply();
  CHECK(r->raw_prefix_hit_len == 3);
  CHECK(r->transferable_len == 2);
  CHECK(r->prefix_hit_groups == 1);
  CHECK(r->first_miss_index == 3);
  CHECK(r->first_miss_group_index == 1);
  // G5: the hit a1-2 past transferable_len holds nothing
  CHECK(r->holding_ids.size() == 2);
  CHECK(c.owner(0).stats().holders == 2);
  release_all(c, 0, s, *r);
  CHECK(c.owner(0).stats().holders == 0);
  auto g2 = get_start(c, 0, s, {"a1-0", "a1-1", "a1-2", "a1-3"}, {4});
  CHECK(g2.body.AsGetStartReply()->transferable_len == 0);
  CHECK(c.owner(0).stats().holders == 0);
}

TEST_CASE("S2 through the owner: remove the route while a get holds the slot, and the reverse") {
  sim::Cluster c(seed_from_env(51), small_owner());
  c.run_for(10);
  const uint64_t s = c.open_session(0);
  put_commit(c, 0, s, {"s2-a", "s2-b"});
  REQUIRE(c.run_until([&] { return c.owner(0).stats().slots_committed == 2; }, 1000));
  const uint64_t free0 = c.owner(0).stats().slots_free;
  // route first: holder keeps the slot
  auto g = get_start(c, 0, s, {"s2-a"});
  Outbox out;
  c.owner(0).remove_key("s2-a", c.now(), out);
  REQUIRE(out.size() == 1);
  // deliver the removal through the cluster's network: the simplest way is to re-run it
  auto rep = c.master().handle(out[0].env);
  Outbox out2;
  c.owner(0).on_master_reply(out[0].token, rep, c.now(), out2);
  CHECK(c.master().route_count() == 1);
  CHECK(c.owner(0).stats().slots_free == free0);  // still held
  release_all(c, 0, s, *g.body.AsGetStartReply());
  CHECK(c.owner(0).stats().slots_free == free0 + 1);
  // holder first: release the holder, the route still pins the slot
  auto g2 = get_start(c, 0, s, {"s2-b"});
  release_all(c, 0, s, *g2.body.AsGetStartReply());
  CHECK(c.owner(0).stats().slots_free == free0 + 1);
  Outbox out3;
  c.owner(0).remove_key("s2-b", c.now(), out3);
  auto rep3 = c.master().handle(out3[0].env);
  Outbox out4;
  c.owner(0).on_master_reply(out3[0].token, rep3, c.now(), out4);
  CHECK(c.owner(0).stats().slots_free == free0 + 2);
  CHECK(c.master().route_count() == 0);
}

TEST_CASE("T1: a restarted master gets every live route back from its owners") {
  sim::Cluster c(seed_from_env(61), small_owner(), 2);
  c.run_for(10);
  const uint64_t s0 = c.open_session(0), s1 = c.open_session(1);
  for (int b = 0; b < 4; ++b) put_commit(c, 0, s0, keys_of("rs0-" + std::to_string(b) + "-", 8));
  put_commit(c, 1, s1, keys_of("rs1-", 5));
  // Every route live on both sides before the master goes.
  REQUIRE(c.run_until([&] { return c.master().route_count() == 37 && c.owner(0).stats().publish_jobs == 0 &&
                                   c.owner(1).stats().publish_jobs == 0; },
                      5000));
  c.to_master = {0.3, 0.3, 1, 40};  // the way back is lossy too
  c.restart_master();
  CHECK(c.master().route_count() == 0);
  REQUIRE(c.run_until([&] { return c.master().route_count() == 37 && c.owner(0).stats().publish_jobs == 0 &&
                                   c.owner(1).stats().publish_jobs == 0; },
                      30000));
  CHECK(c.master().route_put_id("rs0-2-3") == 3);
  CHECK(c.owner(0).stats().slots_committed == 32);
  CHECK(c.owner(0).stats().routes == 32);
  // One note per batch and none for the re-publication, on each owner.
  CHECK(c.take_put_live(0, s0).size() == 4);
  CHECK(c.take_put_live(1, s1).size() == 1);
}

TEST_CASE("S2 across a master restart: a key removed while its re-publication is in flight stays removed") {
  sim::Cluster c(seed_from_env(62), small_owner());
  c.run_for(10);
  const uint64_t s = c.open_session(0);
  put_commit(c, 0, s, {"gone", "kept"});
  REQUIRE(c.run_until([&] { return c.owner(0).stats().slots_committed == 2; }, 2000));
  const uint64_t free0 = c.owner(0).stats().slots_free;
  c.to_master = {0, 0.5, 50, 200};  // slow and duplicated: the re-publication races the removal
  c.restart_master();
  Outbox out;
  c.owner(0).remove_key("gone", c.now(), out);
  CHECK(out.empty());  // waits for the re-publication's outcome
  REQUIRE(c.run_until([&] { return c.owner(0).stats().publish_jobs == 0; }, 30000));
  c.to_master = sim::kQuietLink;
  c.run_for(500);  // late duplicates land
  CHECK(c.master().route_count() == 1);
  CHECK(c.master().route_put_id("gone") == 0);
  CHECK(c.master().route_put_id("kept") == 1);
  CHECK(c.owner(0).stats().slots_free == free0 + 1);
  CHECK(c.owner(0).local_state("gone") == 0);
}
