#include "fluxon/master/master_core.hpp"
#include "helpers.hpp"

using namespace fluxon;
using namespace fluxon::test;

TEST_CASE("put_start conflicts name indices and reasons, and reserve nothing") {
  sim::Cluster c(seed_from_env(101), small_owner());
  const uint64_t s = c.open_session(0);
  put_commit(c, 0, s, {"c-exists"});
  auto p = put_start(c, 0, s, {"c-inflight"});
  REQUIRE(p.body.AsPutStartReply());
  const auto before = c.owner(0).stats();
  auto r = put_start(c, 0, s, {"c-new", "c-exists", "c-inflight"});
  Status st = envelope_status(r);
  CHECK(st.code() == Code::kKeyConflict);
  CHECK(st.indices == std::vector<uint32_t>{1, 2});
  REQUIRE(st.reasons.size() == 2);
  CHECK(st.reasons[0] == ConflictReason::kExists);
  CHECK(st.reasons[1] == ConflictReason::kInflight);
  const auto after = c.owner(0).stats();
  CHECK(after.slots_prepared == before.slots_prepared);
  CHECK(after.active_put_plans == before.active_put_plans);
}

TEST_CASE("put_abort releases keys and slots, commit twice and abort after commit are rejected") {
  sim::Cluster c(seed_from_env(102), small_owner());
  const uint64_t s = c.open_session(0);
  auto p = put_start(c, 0, s, keys_of("ab-", 4));
  const uint64_t id = p.body.AsPutStartReply()->put_id;
  CHECK(c.owner(0).stats().slots_prepared == 4);
  CHECK(c.call(0, s, make_envelope(wire::PutAbortReqT{{}, id})).body.AsPutAbortReply());
  CHECK(c.owner(0).stats().slots_prepared == 0);
  CHECK(c.owner(0).stats().active_put_plans == 0);
  CHECK(envelope_status(c.call(0, s, make_envelope(wire::PutAbortReqT{{}, id}))).code() == Code::kInvalidArgument);
  // the keys are free again
  auto id2 = put_commit(c, 0, s, keys_of("ab-", 4));
  CHECK(envelope_status(c.call(0, s, make_envelope(wire::PutCommitReqT{{}, id2}))).code() == Code::kInvalidArgument);
  CHECK(envelope_status(c.call(0, s, make_envelope(wire::PutAbortReqT{{}, id2}))).code() == Code::kInvalidArgument);
}

TEST_CASE("a plan of another session cannot be committed") {
  sim::Cluster c(seed_from_env(103), small_owner());
  const uint64_t s1 = c.open_session(0), s2 = c.open_session(0);
  auto p = put_start(c, 0, s1, {"x"});
  const uint64_t id = p.body.AsPutStartReply()->put_id;
  CHECK(envelope_status(c.call(0, s2, make_envelope(wire::PutCommitReqT{{}, id}))).code() == Code::kInvalidArgument);
}

TEST_CASE("owner re-validates arguments from the wire") {
  sim::Cluster c(seed_from_env(104), small_owner());
  const uint64_t s = c.open_session(0);
  CHECK(envelope_status(put_start(c, 0, s, {})).code() == Code::kInvalidArgument);
  CHECK(envelope_status(put_start(c, 0, s, {"a", "a"})).code() == Code::kInvalidArgument);
  CHECK(envelope_status(put_start(c, 0, s, {"a"}, 0)).code() == Code::kInvalidArgument);
  CHECK(envelope_status(put_start(c, 0, s, {"a"}, (1 << 20) + 1)).code() == Code::kInvalidArgument);
  CHECK(envelope_status(put_start(c, 0, s, {"a", "b"}, 4096, {1})).code() == Code::kInvalidArgument);
  CHECK(c.owner(0).stats().slots_prepared == 0);
}

TEST_CASE("reserve waits: a claim waits for a free slot, then times out naming its stage") {
  auto cfg = small_owner();
  cfg.dram_bytes = 1 << 20;  // one grant: 256 slots of 4 KiB
  sim::Cluster c(seed_from_env(105), cfg);
  const uint64_t s = c.open_session(0);
  auto big = put_start(c, 0, s, keys_of("w-", 256));
  REQUIRE(big.body.AsPutStartReply());
  // Too many for the pool, ever: NoSpace at once.
  CHECK(envelope_status(put_start(c, 0, s, keys_of("n-", 257))).code() == Code::kNoSpace);
  // One more: waits and fails at the hard timeout with stage=refill.
  auto t0 = c.now();
  auto r = put_start(c, 0, s, {"one-more"});
  Status st = envelope_status(r);
  CHECK(st.code() == Code::kLocalReserveTimeout);
  CHECK(st.stage == "refill");
  CHECK(c.now() - t0 >= 300);
  CHECK(c.owner(0).counters().reserve_soft_wait_total >= 1);
  // A waiting claim succeeds once slots are freed.
  Outbox out;
  Envelope req = make_envelope(wire::PutStartReqT{});
  req.body.AsPutStartReq()->keys = {"later"};
  req.body.AsPutStartReq()->value_len = 4096;
  req.session_id = s;
  c.owner(0).on_client_request(777, req, c.now(), out);
  CHECK(out.empty());  // waiting
  Outbox out2;
  Envelope abort = make_envelope(wire::PutAbortReqT{{}, big.body.AsPutStartReply()->put_id});
  abort.session_id = s;
  c.owner(0).on_client_request(778, abort, c.now(), out2);
  bool served = false;
  for (auto& o : out2) served |= o.token == 777 && o.env.body.AsPutStartReply() != nullptr;
  CHECK(served);
}

TEST_CASE("claim_turn: later claims queue behind the first waiter and name claim_turn") {
  auto cfg = small_owner();
  cfg.dram_bytes = 1 << 20;
  sim::Cluster c(seed_from_env(106), cfg);
  const uint64_t s = c.open_session(0);
  REQUIRE(put_start(c, 0, s, keys_of("w-", 256)).body.AsPutStartReply());
  Outbox out;
  for (uint64_t tok : {901, 902}) {
    Envelope req = make_envelope(wire::PutStartReqT{});
    req.body.AsPutStartReq()->keys = {"q" + std::to_string(tok)};
    req.body.AsPutStartReq()->value_len = 4096;
    req.session_id = s;
    c.owner(0).on_client_request(tok, req, c.now(), out);
  }
  CHECK(out.empty());
  Outbox all, out2;
  c.owner(0).tick(c.now() + 1000, all);
  for (auto& o : all)
    if (o.kind == OwnerOut::Kind::kReply) out2.push_back(std::move(o));  // (master traffic aside)
  REQUIRE(out2.size() == 2);
  CHECK(envelope_status(out2[0].env).stage == "refill");
  CHECK(envelope_status(out2[1].env).stage == "claim_turn");
}

TEST_CASE("get handle TTL releases holdings through the cancel path") {
  sim::Cluster c(seed_from_env(107), small_owner());
  const uint64_t s = c.open_session(0);
  put_commit(c, 0, s, keys_of("ttl-", 3));
  auto g = get_start(c, 0, s, keys_of("ttl-", 3));
  CHECK(c.owner(0).stats().active_get_handles == 1);
  CHECK(c.owner(0).stats().holders == 3);
  c.run_for(1001);
  CHECK(c.owner(0).stats().active_get_handles == 0);
  CHECK(c.owner(0).stats().holders == 0);
  CHECK(c.owner(0).counters().handle_ttl_expired_total == 1);
}

TEST_CASE("partial consume: tail holdings go back, the prefix stays held until release_views") {
  sim::Cluster c(seed_from_env(108), small_owner());
  const uint64_t s = c.open_session(0);
  put_commit(c, 0, s, keys_of("pc-", 4));
  auto g = get_start(c, 0, s, keys_of("pc-", 4));
  auto* r = g.body.AsGetStartReply();
  wire::AckBatchT ack;
  auto hd = std::make_unique<wire::HandleDoneT>();
  hd->handle_id = r->handle_id;
  hd->release_holding_ids = {r->holding_ids[2], r->holding_ids[3]};
  ack.handles.push_back(std::move(hd));
  c.note(0, s, make_envelope(std::move(ack)));
  CHECK(c.owner(0).stats().active_get_handles == 0);
  CHECK(c.owner(0).stats().holders == 2);
  c.run_for(2000);  // the TTL no longer applies to a consumed handle
  CHECK(c.owner(0).stats().holders == 2);
  wire::AckBatchT rel;
  rel.release = {r->holding_ids[0], r->holding_ids[1]};
  c.note(0, s, make_envelope(std::move(rel)));
  CHECK(c.owner(0).stats().holders == 0);
}

TEST_CASE("holding IDs are non-zero and unique across concurrent exports of one slot") {
  sim::Cluster c(seed_from_env(109), small_owner());
  const uint64_t s = c.open_session(0);
  put_commit(c, 0, s, {"h"});
  auto a = get_start(c, 0, s, {"h"});
  auto b = get_start(c, 0, s, {"h"});
  auto ha = a.body.AsGetStartReply()->holding_ids[0];
  auto hb = b.body.AsGetStartReply()->holding_ids[0];
  CHECK(ha != 0);
  CHECK(hb != 0);
  CHECK(ha != hb);
  CHECK(a.body.AsGetStartReply()->offsets[0] == b.body.AsGetStartReply()->offsets[0]);
}

TEST_CASE("closing a session releases its plans, handles and holdings") {
  sim::Cluster c(seed_from_env(110), small_owner());
  const uint64_t s = c.open_session(0);
  put_commit(c, 0, s, keys_of("cs-", 2));
  REQUIRE(put_start(c, 0, s, {"open-plan"}).body.AsPutStartReply());
  get_start(c, 0, s, keys_of("cs-", 2));
  Outbox out;
  c.owner(0).close_session(s, out);
  auto st = c.owner(0).stats();
  CHECK(st.active_put_plans == 0);
  CHECK(st.slots_prepared == 0);
  CHECK(st.holders == 0);
  CHECK(st.active_get_handles == 0);
  CHECK(envelope_status(get_start(c, 0, s, {"cs-0"})).code() == Code::kClosed);
}

TEST_CASE("a request for another generation is refused") {
  sim::Cluster c(seed_from_env(111), small_owner());
  const uint64_t s = c.open_session(0);
  wire::GetStartReqT g;
  g.keys = {"k"};
  Envelope e = make_envelope(std::move(g), s, c.owner(0).generation() + 1);
  CHECK(envelope_status(c.call(0, s, std::move(e))).code() == Code::kGenerationMismatch);
}

TEST_CASE("T2: without reject_if_exist a newer version replaces the route, the old slot is freed") {
  sim::Cluster c(seed_from_env(112), small_owner());
  c.run_for(5);
  const uint64_t s = c.open_session(0);
  put_commit(c, 0, s, {"ver"});
  REQUIRE(c.run_until([&] { return c.owner(0).local_state("ver") == 2; }, 1000));
  const uint64_t free0 = c.owner(0).stats().slots_free;
  wire::PutStartReqT p;
  p.keys = {"ver"};
  p.value_len = 4096;
  p.reject_if_exist_same_key = false;
  auto r = c.call(0, s, make_envelope(std::move(p)));
  REQUIRE(r.body.AsPutStartReply());
  const uint64_t id2 = r.body.AsPutStartReply()->put_id;
  REQUIRE(c.call(0, s, make_envelope(wire::PutCommitReqT{{}, id2})).body.AsPutCommitReply());
  REQUIRE(c.run_until([&] { return c.owner(0).stats().publish_jobs == 0 && c.owner(0).local_state("ver") == 2; }, 2000));
  CHECK(c.master().route_put_id("ver") == id2);
  CHECK(c.master().route_count() == 1);
  CHECK(c.owner(0).stats().slots_committed == 1);
  CHECK(c.owner(0).stats().slots_free == free0);  // one slot in, one slot out
}

TEST_CASE("master: a late duplicate PutDone of a removed version never resurrects its route") {
  MasterCore m;
  wire::PutDoneT pd;
  pd.node_id = 1;
  pd.generation = 5;
  pd.put_id = 7;
  auto item = std::make_unique<wire::RouteItemT>();
  item->key = "k";
  pd.items.push_back(std::move(item));
  auto put = make_envelope(pd);
  CHECK(m.handle(put).body.AsPutDoneReply()->results[0] == wire::PutItemResult::Live);
  wire::RemoveRoutesT rr;
  auto r = std::make_unique<wire::RemoveRouteT>();
  r->key = "k";
  r->node_id = 1;
  r->generation = 5;
  r->put_id = 7;
  rr.items.push_back(std::move(r));
  CHECK(m.handle(make_envelope(std::move(rr))).body.AsRemoveRoutesReply()->removed[0]);
  CHECK(m.handle(put).body.AsPutDoneReply()->results[0] == wire::PutItemResult::Exists);
  CHECK(m.route_count() == 0);
  pd.put_id = 8;  // a newer version is welcome
  CHECK(m.handle(make_envelope(pd)).body.AsPutDoneReply()->results[0] == wire::PutItemResult::Live);
}

namespace {
OwnerConfig one_grant_owner() {
  auto cfg = small_owner();
  cfg.dram_bytes = 1 << 20;  // one grant: 256 slots of 4 KiB
  cfg.hard_timeout_ms = 2000;
  cfg.eviction_free_watermark = 0;  // these tests are about claims: eviction only when one waits
  return cfg;
}
}  // namespace

TEST_CASE("S1/S3: a full pool evicts cold complete cohorts, route first, and the waiting put proceeds") {
  sim::Cluster c(seed_from_env(201), one_grant_owner());
  c.run_for(5);
  const uint64_t s = c.open_session(0);
  for (int b = 0; b < 16; ++b) put_commit(c, 0, s, keys_of("ev" + std::to_string(b) + "-", 16), {8, 8});
  REQUIRE(c.run_until([&] { return c.owner(0).stats().slots_committed == 256; }, 5000));
  // Batches 8..15 are read (hot); 0..7 are cold.
  for (int rep = 0; rep < 3; ++rep)
    for (int b = 8; b < 16; ++b) {
      auto g = get_start(c, 0, s, keys_of("ev" + std::to_string(b) + "-", 16), {8, 8});
      release_all(c, 0, s, *g.body.AsGetStartReply());
    }
  auto r = put_start(c, 0, s, keys_of("new-", 16), 4096, {16});
  REQUIRE_MESSAGE(r.body.AsPutStartReply(), envelope_status(r).to_string());
  // Reclaims the free-slot watermark started ahead of claims may still be on their way.
  REQUIRE(c.run_until([&] { return c.owner(0).stats().publish_jobs == 0 && c.owner(0).reclaims_in_flight() == 0; },
                      5000));
  const auto& ctr = c.owner(0).counters();
  CHECK(ctr.evicted_keys_total >= 16);
  CHECK(ctr.evicted_keys_total % 8 == 0);  // whole cohorts of 8
  // Every group is either whole or gone, locally and at the master (A1 for eviction).
  int groups_gone = 0;
  for (int b = 0; b < 16; ++b)
    for (int g = 0; g < 2; ++g) {
      int present = 0, routed = 0;
      for (int i = 0; i < 8; ++i) {
        const std::string k = "ev" + std::to_string(b) + "-" + std::to_string(g * 8 + i);
        present += c.owner(0).local_state(k) != 0;
        routed += c.master().route_put_id(k) != 0;
      }
      CHECK((present == 0 || present == 8));
      CHECK(routed == present);
      if (present == 0) {
        groups_gone++;
        CHECK(b < 8);  // only cold batches went
      }
    }
  CHECK(groups_gone * 8 == int(ctr.evicted_keys_total));
  CHECK(c.owner(0).pool().counts().grants == 1);  // capacity unchanged (S5)
}

TEST_CASE("pressure: the free-slot watermark evicts cold cohorts ahead of claims, so puts do not wait") {
  auto cfg = one_grant_owner();
  cfg.eviction_free_watermark = 0.1;  // keep 25 of 256 slots free
  sim::Cluster c(seed_from_env(203), cfg);
  c.run_for(5);
  const uint64_t s = c.open_session(0);
  for (int b = 0; b < 60; ++b) {
    put_commit(c, 0, s, keys_of("pw" + std::to_string(b) + "-", 8), {8});
    c.run_for(50);  // ticks: the watermark keeps up between puts
  }
  const auto& ctr = c.owner(0).counters();
  MESSAGE("evicted " << ctr.evicted_keys_total << " keys in " << ctr.pressure_evictions_total << " pressure rounds; "
                     << ctr.reserve_waits_total << " claims waited");
  CHECK(ctr.pressure_evictions_total > 0);
  CHECK(ctr.evicted_keys_total >= 60 * 8 - 256);
  CHECK(ctr.evicted_keys_total % 8 == 0);  // whole cohorts
  CHECK(ctr.reserve_waits_total == 0);      // no put waited for a removal
  c.run_for(500);                           // the next pressure rounds (eviction_interval_ms apart)
  CHECK(c.owner(0).stats().slots_free >= 25);
  CHECK(c.owner(0).pool().counts().grants == 1);  // S5
  // With the watermark off, the same puts wait for evictions once the pool is full.
  cfg.eviction_free_watermark = 0;
  sim::Cluster d(seed_from_env(203), cfg);
  d.run_for(5);
  const uint64_t sd = d.open_session(0);
  for (int b = 0; b < 60; ++b) {
    put_commit(d, 0, sd, keys_of("pw" + std::to_string(b) + "-", 8), {8});
    d.run_for(50);
  }
  CHECK(d.owner(0).counters().reserve_waits_total > 0);
  CHECK(d.owner(0).counters().pressure_evictions_total == 0);
}

TEST_CASE("S2 and eviction: entries a reader holds are never chosen, the claim times out instead") {
  auto cfg = one_grant_owner();
  cfg.get_handle_ttl_ms = 60000;  // the readers keep their pins through the whole wait
  sim::Cluster c(seed_from_env(202), cfg);
  c.run_for(5);
  const uint64_t s = c.open_session(0);
  for (int b = 0; b < 16; ++b) put_commit(c, 0, s, keys_of("held" + std::to_string(b) + "-", 16));
  REQUIRE(c.run_until([&] { return c.owner(0).stats().slots_committed == 256; }, 5000));
  std::vector<std::string> all;
  for (int b = 0; b < 16; ++b)
    for (auto& k : keys_of("held" + std::to_string(b) + "-", 16)) all.push_back(k);
  auto g = get_start(c, 0, s, all);  // every page held by a reader
  REQUIRE(g.body.AsGetStartReply()->transferable_len == 256);
  auto r = put_start(c, 0, s, {"one-more"});
  CHECK(envelope_status(r).code() == Code::kLocalReserveTimeout);
  CHECK(c.owner(0).counters().evicted_keys_total == 0);
  release_all(c, 0, s, *g.body.AsGetStartReply());
  auto r2 = put_start(c, 0, s, {"one-more"});
  CHECK(r2.body.AsPutStartReply());
  CHECK(c.owner(0).counters().evicted_keys_total == 1);
}

TEST_CASE("eviction can be switched off") {
  auto cfg = one_grant_owner();
  cfg.eviction = false;
  cfg.hard_timeout_ms = 200;
  sim::Cluster c(seed_from_env(203), cfg);
  c.run_for(5);
  const uint64_t s = c.open_session(0);
  for (int b = 0; b < 16; ++b) put_commit(c, 0, s, keys_of("off" + std::to_string(b) + "-", 16));
  REQUIRE(c.run_until([&] { return c.owner(0).stats().slots_committed == 256; }, 5000));
  CHECK(envelope_status(put_start(c, 0, s, {"x"})).code() == Code::kLocalReserveTimeout);
  CHECK(c.owner(0).counters().evicted_keys_total == 0);
}

TEST_CASE("S3: eviction takes the exact TP cohort: a group goes with the other ranks' copies") {
  sim::Cluster c(seed_from_env(204), one_grant_owner());
  c.run_for(5);
  const uint64_t s = c.open_session(0);
  auto rank_keys = [](int b, int r) {
    std::vector<std::string> k;
    for (int i = 0; i < 8; ++i) k.push_back("sess:g" + std::to_string(b) + "p" + std::to_string(i) + "_model_" +
                                            std::to_string(r) + "_2_tag");
    return k;
  };
  // Rank 0 writes every group before rank 1 does: the oldest entries are all rank 0's copies.
  for (int r = 0; r < 2; ++r)
    for (int b = 0; b < 16; ++b) put_commit(c, 0, s, rank_keys(b, r), {8});  // each rank its own batch
  REQUIRE(c.run_until([&] { return c.owner(0).stats().slots_committed == 256; }, 5000));
  REQUIRE(put_start(c, 0, s, keys_of("fresh-", 24)).body.AsPutStartReply());
  CHECK(c.owner(0).counters().evicted_keys_total >= 24);
  for (int b = 0; b < 16; ++b) {
    const bool r0 = c.owner(0).local_state(rank_keys(b, 0)[0]) != 0;
    const bool r1 = c.owner(0).local_state(rank_keys(b, 1)[0]) != 0;
    CHECK_MESSAGE(r0 == r1, "group " << b << " kept on one rank only");
  }
}

TEST_CASE("A2 T1: one publish job owns a put batch - PutDone re-sent whole under one identity until answered, no per-key fallback") {
  sim::Cluster c(seed_from_env(151), small_owner(), 2);
  c.run_for(10);
  const uint64_t s = c.open_session(0);
  c.to_master.drop = 0.7;  // most attempts are lost
  const uint64_t put_id = put_commit(c, 0, s, keys_of("a2-", 6), {2, 4});
  std::vector<wire::PutLiveT> live;
  REQUIRE(c.run_until([&] {
    for (auto& l : c.take_put_live(0, s)) live.push_back(std::move(l));
    return !live.empty();
  }, 60000));
  c.to_master.drop = 0;
  c.run_for(1000);
  for (auto& l : c.take_put_live(0, s)) live.push_back(std::move(l));
  // One outcome for the batch, for all of it: every key is live, under the batch's one identity.
  REQUIRE(live.size() == 1);
  CHECK(live[0].put_id == put_id);
  CHECK(!live[0].error);
  CHECK(c.owner(0).counters().publish_retry_total > 0);  // the faults did bite
  CHECK(c.master().counters().put_done_total == c.master().counters().put_done_duplicate_total + 1);
  for (const auto& k : keys_of("a2-", 6)) CHECK(c.master().replica_nodes(k) == std::vector<uint32_t>{1});
  CHECK(c.owner(0).stats().publish_jobs == 0);
}

TEST_CASE("readiness: an owner with an expected capacity is ready once every warm-up grant is faulted in, a dynamic one at once") {
  OwnerCoreConfig cfg;
  cfg.grant_bytes = 1ull << 20;
  cfg.expected_capacity = ExpectedCapacity{64 << 10, 3ull << 20};  // 16 slots a grant: 3 grants
  OwnerCore core(cfg, 1, "ready", 8ull << 20);
  CHECK(core.warmup_bytes() == 3ull << 20);
  CHECK_FALSE(core.ready());
  const auto ranges = core.take_new_grant_ranges();  // the warm-up: handed to the ports to fault in
  REQUIRE(ranges.size() == 3);
  auto gauge = [&](const char* name) {
    const auto s = core.stats_reply();
    for (const auto& v : s.values)
      if (v->name == name) return v->value;
    FAIL("no gauge ", name);
    return uint64_t(0);
  };
  CHECK(gauge("warmup_bytes") == 3ull << 20);
  CHECK(gauge("warmed_bytes") == 0);
  core.on_populated(ranges[0].second);
  core.on_populated(ranges[1].second);
  CHECK_FALSE(core.ready());  // one grant is still being faulted in
  CHECK(gauge("warmed_bytes") == 2ull << 20);
  core.on_populated(ranges[2].second);
  CHECK(core.ready());
  CHECK(gauge("warmed_bytes") == 3ull << 20);
  // Later grants (dynamic growth) do not count past the warm-up.
  core.on_populated(1ull << 20);
  CHECK(gauge("warmed_bytes") == 3ull << 20);
  OwnerCoreConfig dyn;
  dyn.grant_bytes = 1ull << 20;
  OwnerCore d(dyn, 1, "dynamic", 8ull << 20);
  CHECK(d.warmup_bytes() == 0);
  CHECK(d.ready());
}

TEST_CASE("idle grants shrink: a dynamic owner gives back a grant whose every slot stayed free for idle_grant_shrink_ms, never one in use, never the expected capacity (S5)") {
  OwnerConfig cfg = small_owner();  // 8 grants of 1 MiB, 256 slots of 4 KiB each
  cfg.idle_grant_shrink_ms = 2000;
  sim::Cluster c(seed_from_env(111), cfg);
  c.run_for(10);
  const uint64_t s = c.open_session(0);
  std::vector<std::string> keys;
  for (int i = 0; i < 300; ++i) keys.push_back("shrink-" + std::to_string(i));  // two grants
  for (size_t i = 0; i < keys.size(); i += 50)
    put_commit(c, 0, s, std::vector<std::string>(keys.begin() + long(i), keys.begin() + long(std::min(i + 50, keys.size()))));
  c.run_for(500);
  REQUIRE(c.owner(0).stats().grants == 2);
  // Everything but one key goes: one grant is idle, the other keeps a committed slot.
  for (size_t i = 0; i + 1 < keys.size(); ++i) c.remove_key(0, keys[i]);
  c.run_for(1000);
  CHECK(c.owner(0).stats().grants == 2);  // idle, but not for long enough yet
  c.run_for(3000);
  CHECK(c.owner(0).stats().grants == 1);
  CHECK(c.owner(0).counters().grants_shrunk_total == 1);
  CHECK(c.owner(0).local_state(keys.back()) == 2);  // the grant in use stayed, its value readable
  // Capacity is unchanged: the segment can carve all 8 grants again.
  std::vector<std::string> more;
  for (int i = 0; i < 1800; ++i) more.push_back("again-" + std::to_string(i));
  for (size_t i = 0; i < more.size(); i += 100)
    put_commit(c, 0, s, std::vector<std::string>(more.begin() + long(i), more.begin() + long(i + 100)));
  c.run_for(500);
  CHECK(c.owner(0).stats().grants == 8);
  // With an expected capacity, its grants are the floor: idle or not, none is given back.
  OwnerConfig ex = small_owner();
  ex.idle_grant_shrink_ms = 2000;
  ex.expected_capacity = ExpectedCapacity{4096, 4ull << 20};
  sim::Cluster e(seed_from_env(112), ex);
  e.run_for(10000);
  CHECK(e.owner(0).stats().grants == 4);
  CHECK(e.owner(0).counters().grants_shrunk_total == 0);
}

TEST_CASE("E2 fencing: an owner stamps its requests with the newest term and refuses replies of older ones") {
  OwnerCore core(small_owner(), 1, "seg", 8ull << 20);
  MasterCore master;
  Outbox out;
  core.start(0, out);
  auto to_master = [&] {
    std::vector<OwnerOut> m;
    for (auto& o : out)
      if (o.kind == OwnerOut::Kind::kMaster) m.push_back(std::move(o));
    out.clear();
    return m;
  };
  auto reg = to_master();
  REQUIRE(reg.size() == 1);
  CHECK(reg[0].env.term == 0);  // nothing seen yet
  // The leader of term 7 answers: the owner takes its term.
  Envelope rep = master.handle(reg[0].env, 0);
  rep.term = 7;
  core.on_master_reply(reg[0].token, rep, 1, out);
  CHECK(core.master_term() == 7);
  CHECK(core.counters().stale_term_replies_total == 0);
  // etcd names a newer leader (term 9): every request from now on says 9...
  core.see_master_term(9);
  core.see_master_term(8);  // never lowered
  CHECK(core.master_term() == 9);
  core.on_master_reconnected(2, out);
  auto again = to_master();
  REQUIRE_FALSE(again.empty());
  for (auto& o : again) CHECK(o.env.term == 9);
  // ...and the deposed leader's answer (term 7) is refused: counted, not acted on.
  Envelope stale = master.handle(again[0].env, 3);
  stale.term = 7;
  core.on_master_reply(again[0].token, stale, 3, out);
  CHECK(core.counters().stale_term_replies_total == 1);
  CHECK(core.master_term() == 9);
  Envelope fresh = master.handle(again[0].env, 4);
  fresh.term = 9;
  core.on_master_reply(again[0].token, fresh, 4, out);
  CHECK(core.counters().stale_term_replies_total == 1);
}

TEST_CASE("S1 S5: a value size new to a full owner gets a grant of another size drained for it, not LocalReserveTimeout") {
  // Every grant serves 16 KiB slots and puts of that size keep evicting and reusing them: no grant
  // ever empties by chance. A 4 KiB put then needs one grant emptied whole (found by `fluxon
  // overload`: such a put waited the whole hard timeout).
  OwnerConfig cfg = small_owner();  // 8 grants of 1 MiB: 64 slots of 16 KiB each
  cfg.hard_timeout_ms = 20000;
  sim::Cluster c(91, cfg);
  c.run_for(10);
  const uint64_t s = c.open_session(0);
  auto put = [&](const std::vector<std::string>& ks, uint64_t len) {
    auto r = put_start(c, 0, s, ks, len);
    auto* ps = r.body.AsPutStartReply();
    if (!ps) return envelope_status(r);
    REQUIRE(c.call(0, s, make_envelope(wire::PutCommitReqT{{}, ps->put_id})).body.AsPutCommitReply());
    return Status::ok();
  };
  for (int b = 0; b < 48; ++b) {  // 768 keys of 16 KiB through 512 slots
    const auto ks = keys_of("big-" + std::to_string(b) + "-", 16);
    REQUIRE(put(ks, 16384).is_ok());
    REQUIRE(c.run_until([&] { return c.owner(0).local_state(ks.back()) == 2; }, 60000));
  }
  CHECK(c.owner(0).counters().evicted_keys_total > 0);
  CHECK(c.owner(0).stats().grants == 8);
  const Millis t0 = c.now();
  const Status st = put(keys_of("small-", 4), 4096);
  CHECK_MESSAGE(st.is_ok(), st.to_string());
  MESSAGE("a 4 KiB put on an owner full of 16 KiB slots took " << c.now() - t0 << " simulated ms");
  CHECK(c.now() - t0 < 2000);
  // Capacity unchanged (S5): the grant changed class, the pool still has 8.
  CHECK(c.owner(0).stats().grants == 8);
  // And the 16 KiB size still has its other grants.
  CHECK(put(keys_of("big-after-", 16), 16384).is_ok());
}
