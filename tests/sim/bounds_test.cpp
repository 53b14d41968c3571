// The owner's queues have bounds (OwnerConfig::Limits); past one it refuses in words, counted, and
// grows no further.
#include "helpers.hpp"

using namespace fluxon;
using namespace fluxon::test;

TEST_CASE("bounds: claims past claim_waiters are refused at once (claim_turn), the queue does not grow") {
  OwnerConfig cfg = small_owner();
  cfg.dram_bytes = 1ull << 20;  // one grant of 256 slots
  cfg.limits.claim_waiters = 3;
  cfg.eviction = false;
  sim::Cluster c(seed_from_env(801), cfg, 1);
  c.run_for(10);
  const uint64_t s = c.open_session(0);
  put_commit(c, 0, s, keys_of("full-", 256));  // every slot used, nothing evictable
  std::vector<uint64_t> tokens;
  for (int i = 0; i < 5; ++i) {
    wire::PutStartReqT p;
    p.keys = {"w" + std::to_string(i)};
    p.value_len = 4096;
    tokens.push_back(c.send(0, s, make_envelope(std::move(p))));
  }
  auto r3 = c.wait(tokens[3]);
  auto st = envelope_status(r3);
  CHECK(st.code() == Code::kLocalReserveTimeout);
  CHECK(st.stage == "claim_turn");
  CHECK(st.message().find("the bound") != std::string::npos);
  CHECK(envelope_status(c.wait(tokens[4])).code() == Code::kLocalReserveTimeout);
  CHECK(c.owner(0).counters().claim_queue_full_total == 2);
  for (int i = 0; i < 3; ++i)  // the three queued ones time out as before
    CHECK(envelope_status(c.wait(tokens[i])).code() == Code::kLocalReserveTimeout);
}

TEST_CASE("bounds: with publish_jobs batches waiting for an unreachable master, put_start is refused") {
  OwnerConfig cfg = small_owner();
  cfg.limits.publish_jobs = 4;
  sim::Cluster c(seed_from_env(802), cfg, 2);
  c.run_for(10);
  const uint64_t s = c.open_session(0);
  c.to_master.drop = 1.0;
  for (int i = 0; i < 4; ++i) put_commit(c, 0, s, {"b" + std::to_string(i)});  // local-read-ready (V1)
  auto r = put_start(c, 0, s, {"b4"});
  CHECK(envelope_status(r).code() == Code::kTimeout);
  CHECK(c.owner(0).counters().publish_backlog_full_total == 1);
  c.to_master.drop = 0;  // the master answers again: the backlog drains and puts go on
  REQUIRE(c.run_until([&] { return c.owner(0).local_state("b3") == 2; }, 60000));
  put_commit(c, 0, s, {"b4"});
}

TEST_CASE("bounds: past flights a remote key is a miss, past exists_questions the local prefix is the answer") {
  OwnerConfig cfg = small_owner();
  cfg.limits.flights = 2;
  cfg.limits.exists_questions = 0;
  sim::Cluster c(seed_from_env(803), cfg, 2);
  c.run_for(10);
  const uint64_t s0 = c.open_session(0), s1 = c.open_session(1);
  put_live_routes(c, 0, s0, {"r0", "r1", "r2"});
  auto g = get_start(c, 1, s1, {"r0", "r1", "r2"});
  REQUIRE(g.body.AsGetStartReply());
  CHECK(g.body.AsGetStartReply()->transferable_len == 2);  // the third would be a third flight
  CHECK(c.owner(1).counters().flights_full_total == 1);
  wire::ExistsReqT q;
  q.keys = {"r0"};
  auto e = c.call(1, s1, make_envelope(std::move(q)));
  REQUIRE(e.body.AsExistsReply());
  CHECK(e.body.AsExistsReply()->prefix_len == 0);  // not asked: the bound is 0
  CHECK(c.owner(1).counters().exists_full_total == 1);
}

TEST_CASE("bounds: sessions past the bound are refused in words, and a closed one makes room") {
  OwnerConfig cfg = small_owner();
  cfg.limits.sessions = 2;
  sim::Cluster c(seed_from_env(805), cfg, 1);
  c.run_for(10);
  const uint64_t a = c.open_session(0);
  (void)c.open_session(0);
  auto refused = c.call(0, 0, make_envelope(wire::HelloT{}));
  CHECK(envelope_status(refused).code() == Code::kNoSpace);
  CHECK(envelope_status(refused).message().find("the bound") != std::string::npos);
  CHECK(c.owner(0).counters().sessions_full_total == 1);
  c.close_session(0, a);
  CHECK(c.call(0, 0, make_envelope(wire::HelloT{})).body.AsHelloReply());
}

TEST_CASE("bounds: get_starts waiting for the master past pending_gets are decided at once, with what is known") {
  OwnerConfig cfg = small_owner();
  cfg.limits.pending_gets = 1;
  sim::Cluster c(seed_from_env(806), cfg, 2);
  c.run_for(10);
  const uint64_t sa = c.open_session(0), sb = c.open_session(1);
  put_live_routes(c, 0, sa, {"p0", "p1"});
  c.to_master.min_delay = c.to_master.max_delay = 200;  // the master's answer is slow
  wire::GetStartReqT q1, q2;
  q1.keys = {"p0"};
  q2.keys = {"p1"};
  const uint64_t t1 = c.send(1, sb, make_envelope(std::move(q1)));
  const uint64_t t2 = c.send(1, sb, make_envelope(std::move(q2)));
  // The second could not wait: answered now, its key not known yet (a miss, nothing pinned).
  auto r2 = c.wait(t2, 1);
  REQUIRE(r2.body.AsGetStartReply());
  CHECK(r2.body.AsGetStartReply()->transferable_len == 0);
  CHECK(c.owner(1).counters().pending_gets_full_total == 1);
  auto r1 = c.wait(t1);
  REQUIRE(r1.body.AsGetStartReply());
  CHECK(r1.body.AsGetStartReply()->transferable_len == 1);
}

TEST_CASE("bounds: with handles unconsumed at the bound, get_start is refused before pinning anything") {
  OwnerConfig cfg = small_owner();
  cfg.limits.handles = 2;
  sim::Cluster c(seed_from_env(807), cfg, 1);
  c.run_for(10);
  const uint64_t s = c.open_session(0);
  put_commit(c, 0, s, {"h0", "h1"});
  auto g1 = get_start(c, 0, s, {"h0"}), g2 = get_start(c, 0, s, {"h1"});
  REQUIRE(g1.body.AsGetStartReply());
  REQUIRE(g2.body.AsGetStartReply());
  const uint64_t holders = c.owner(0).stats().holders;
  auto refused = get_start(c, 0, s, {"h0", "h1"});
  CHECK(envelope_status(refused).code() == Code::kTimeout);
  CHECK(envelope_status(refused).message().find("the bound") != std::string::npos);
  CHECK(c.owner(0).stats().holders == holders);  // nothing pinned by the refused call
  CHECK(c.owner(0).counters().handles_full_total == 1);
  release_all(c, 0, s, *g1.body.AsGetStartReply());
  c.run_for(1);
  CHECK(get_start(c, 0, s, {"h0"}).body.AsGetStartReply());  // a consumed handle makes room
}

TEST_CASE("bounds: with reclaims at their bound waiting for the master, capacity eviction pauses, counted") {
  OwnerConfig cfg = small_owner();
  cfg.dram_bytes = 1ull << 20;  // one grant of 256 slots
  cfg.limits.reclaims = 1;
  cfg.eviction_free_watermark = 0;
  cfg.eviction_max_bytes_per_round = 4096;  // one cohort per round
  sim::Cluster c(seed_from_env(810), cfg, 2);
  c.run_for(10);
  const uint64_t s = c.open_session(0);
  for (int i = 0; i < 256; ++i) put_live_routes(c, 0, s, {"e" + std::to_string(i)});
  c.to_master.drop = 1.0;  // fences never come back
  wire::PutStartReqT p;
  p.keys = {"new0", "new1"};
  p.value_len = 4096;
  (void)c.send(0, s, make_envelope(std::move(p)));
  c.run_for(1000);
  const auto& oc = c.owner(0).counters();
  CHECK(oc.evicted_keys_total == 1);  // one round's cohort on its way, then the bound
  CHECK(c.owner(0).reclaims_in_flight() == 1);
  CHECK(oc.eviction_paused_total > 0);
}

TEST_CASE("bounds: with removals at remove_jobs waiting for the master, remove_prefix is refused, counted") {
  OwnerConfig cfg = small_owner();
  cfg.limits.remove_jobs = 1;
  sim::Cluster c(seed_from_env(811), cfg, 2);
  c.run_for(10);
  const uint64_t s = c.open_session(0);
  put_live_routes(c, 0, s, {"a0", "b0"});
  c.to_master.drop = 1.0;  // removals never come back
  wire::RemovePrefixReqT first;
  first.prefix = "a";
  CHECK(c.call(0, s, make_envelope(std::move(first))).body.AsRemovePrefixReply());
  wire::RemovePrefixReqT second;
  second.prefix = "b";
  auto r = c.call(0, s, make_envelope(std::move(second)));
  CHECK(envelope_status(r).code() == Code::kNoSpace);
  CHECK(envelope_status(r).message().find("remove_prefix") != std::string::npos);
  CHECK(c.owner(0).counters().remove_jobs_full_total == 1);
  CHECK(c.owner(0).local_state("b0") == 2);  // nothing of the refused request was removed
}

namespace {
void register_node(MasterCore& m, uint32_t node, uint64_t generation) {
  wire::RegisterOwnerT r;
  r.node_id = node;
  r.generation = generation;
  r.role = "sglang_owner";
  r.segment_len = 64 << 20;
  REQUIRE(m.handle(make_envelope(std::move(r))).body.AsRegisterOwnerReply());
}
}  // namespace

TEST_CASE("bounds: the master's prepared gets stop at their bound (Busy, counted) and make room as they end") {
  MasterCore m;
  m.set_get_bound(8);
  register_node(m, 1, 1);
  register_node(m, 2, 1);
  for (uint64_t i = 0; i < 12; ++i) REQUIRE(m_put(m, 1, 100 + i, "g" + std::to_string(i), i * 4096).body.AsPutDoneReply());
  std::vector<wire::GetStartStatus> got;
  for (uint64_t i = 0; i < 12; ++i) got.push_back(m_start(m, 2, "g" + std::to_string(i), 1 + i));
  CHECK(std::count(got.begin(), got.end(), wire::GetStartStatus::Started) == 8);
  CHECK(std::count(got.begin(), got.end(), wire::GetStartStatus::Busy) == 4);
  CHECK(m.inflight_get_count() == 8);
  CHECK(m.counters().refused_gets_total == 4);
  CHECK(m.derived_bounds_violation() == "");
  // One ends: one more may start.
  CHECK(m_done(m, 2, "g0", 1, 900 * 4096) == wire::GetDoneStatus::Live);
  CHECK(m_start(m, 2, "g8", 50) == wire::GetStartStatus::Started);
  CHECK(m_start(m, 2, "g9", 51) == wire::GetStartStatus::Busy);
  CHECK(m.counters().refused_gets_total == 5);
  CHECK(m.derived_bounds_violation() == "");
}

TEST_CASE("bounds: the master's read leases and cohort sizes follow its gets and replicas through random gets, removals, TTLs and restarts") {
  // reads_ counts exactly the prepared gets (per source), cohorts_ exactly the replicas (per cohort):
  // checked after every step of a random mix, so neither can grow apart from what it counts.
  const uint64_t seed = seed_from_env(2907);
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  MasterCore m(/*get_ttl_ms=*/500);
  m.set_get_bound(64);
  uint64_t generation[4] = {0, 1, 1, 1};
  for (uint32_t n = 1; n <= 3; ++n) register_node(m, n, 1);
  uint64_t next_id = 1;
  Millis now = 0;
  std::map<std::pair<std::string, uint32_t>, uint64_t> started;  // (key, requester) -> get id
  for (int step = 0; step < 6000; ++step) {
    const std::string key = "k" + std::to_string(rng() % 40);
    const uint32_t node = 1 + uint32_t(rng() % 3);
    const uint64_t gen = generation[node];
    switch (rng() % 8) {
      case 0:
      case 1: {  // a put of the key from node
        wire::PutDoneT pd = m_put_done(node, next_id++, key, (rng() % 1000) * 4096);
        pd.generation = gen;
        (void)m.handle(make_envelope(std::move(pd)), now);
        break;
      }
      case 2:
      case 3: {  // node starts a remote get of the key
        wire::BatchGetStartT g;
        g.node_id = node;
        g.generation = gen;
        const uint64_t id = next_id++;
        g.items.push_back(std::make_unique<wire::GetItemT>(wire::GetItemT{{}, key, id}));
        auto r = m.handle(make_envelope(std::move(g)), now);
        if (r.body.AsBatchGetStartReply()->items[0]->status == wire::GetStartStatus::Started) started[{key, node}] = id;
        break;
      }
      case 4: {  // a started get of node ends: done (its copy published) or revoked
        auto it = started.lower_bound({key, 0});
        if (it == started.end()) break;
        const auto [k, requester] = it->first;
        const uint64_t id = it->second;
        started.erase(it);
        if (rng() % 2) {
          wire::BatchGetDoneT d;
          d.node_id = requester;
          d.generation = generation[requester];
          d.items.push_back(std::make_unique<wire::GetDoneItemT>(
              wire::GetDoneItemT{{}, k, id, (rng() % 1000) * 4096, id, 0, 4096}));
          (void)m.handle(make_envelope(std::move(d)), now);
        } else {
          wire::BatchGetRevokeT rv;
          rv.node_id = requester;
          rv.generation = generation[requester];
          rv.items.push_back(std::make_unique<wire::GetItemT>(wire::GetItemT{{}, k, id}));
          (void)m.handle(make_envelope(std::move(rv)), now);
        }
        break;
      }
      case 5: {  // node removes its copy of the key (whatever version it names: maybe refused)
        wire::RemoveRoutesT rr;
        auto it = std::make_unique<wire::RemoveRouteT>();
        it->key = key;
        it->node_id = node;
        it->generation = gen;
        it->put_id = rng() % next_id;
        rr.items.push_back(std::move(it));
        (void)m.handle(make_envelope(std::move(rr)), now);
        break;
      }
      case 6:  // time passes: gets past their TTL end
        now += Millis(rng() % 300);
        m.tick(now);
        break;
      case 7:
        if (rng() % 20 == 0) {  // node restarts: its replicas and gets go
          register_node(m, node, ++generation[node]);
          for (auto it = started.begin(); it != started.end();) it = it->first.second == node ? started.erase(it) : std::next(it);
        }
        break;
    }
    const std::string broken = m.derived_bounds_violation();
    REQUIRE_MESSAGE(broken.empty(), "step " << step << ": " << broken);
  }
  CHECK(m.replica_count() > 0);
  CHECK(m.counters().get_started_total > 100);
}
