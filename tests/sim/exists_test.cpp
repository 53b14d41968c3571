// exists (the existence question of SGLang's prefetch thread) and remove_prefix (its clear()),
// through the deterministic simulator: what they answer, and that they claim, pin and fetch nothing.
#include "helpers.hpp"

using namespace fluxon;
using namespace fluxon::test;

namespace {

wire::ExistsReplyT exists(sim::Cluster& c, int o, uint64_t s, std::vector<std::string> keys,
                          std::vector<uint32_t> groups = {}, uint64_t expected_len = 0, uint32_t max_wait_ms = 0) {
  wire::ExistsReqT q;
  q.keys = std::move(keys);
  q.atomic_group_lens = std::move(groups);
  q.expected_len = expected_len;
  q.max_wait_ms = max_wait_ms;
  auto r = c.call(o, s, make_envelope(std::move(q)));
  auto* e = r.body.AsExistsReply();
  REQUIRE_MESSAGE(e, "exists failed: ", envelope_status(r).to_string());
  return *e;
}

}  // namespace

TEST_CASE("exists: the local prefix, then the master's routes for the rest, group-aligned, nothing claimed or fetched") {
  sim::Cluster c(seed_from_env(701), small_owner(), 2);
  c.run_for(10);
  const uint64_t s0 = c.open_session(0), s1 = c.open_session(1);
  put_live_routes(c, 0, s0, {"k0", "k1", "k2", "k3"});
  put_live_routes(c, 1, s1, {"a0", "a1"});
  const auto before = c.owner(1).stats();
  auto r = exists(c, 1, s1, {"a0", "a1", "k0", "k1", "k2", "none", "k3"});
  CHECK(r.prefix_len == 5);
  CHECK(r.local_len == 2);
  CHECK(r.master_answered);
  CHECK(exists(c, 1, s1, {"a0", "a1", "k0", "k1", "k2", "none", "k3"}, {2, 2, 3}).prefix_len == 4);
  CHECK(exists(c, 1, s1, {"a0", "a1", "k0"}, {3}).prefix_len == 3);
  CHECK(exists(c, 1, s1, {"none", "a0"}).prefix_len == 0);
  const auto after = c.owner(1).stats();
  CHECK(after.slots_prepared == before.slots_prepared);
  CHECK(after.slots_committed == before.slots_committed);
  CHECK(after.holders == 0);
  CHECK(after.active_get_handles == 0);
  CHECK(after.flights_starting + after.flights_started + after.flights_finishing == 0);
  CHECK(c.master().inflight_get_count() == 0);  // no remote get began
  CHECK(c.owner(1).counters().get_flights_started_total == 0);
}

TEST_CASE("exists: a value of another length is missing, locally and at the master") {
  sim::Cluster c(seed_from_env(702), small_owner(), 2);
  c.run_for(10);
  const uint64_t s0 = c.open_session(0), s1 = c.open_session(1);
  put_live_routes(c, 0, s0, {"r0", "r1"});
  put_live_routes(c, 1, s1, {"l0"});
  CHECK(exists(c, 1, s1, {"l0", "r0", "r1"}, {}, 4096).prefix_len == 3);
  CHECK(exists(c, 1, s1, {"l0", "r0"}, {}, 8192).prefix_len == 0);  // local mismatch
  auto r = exists(c, 0, s0, {"r0", "l0"}, {}, 4096);
  CHECK(r.prefix_len == 2);
  CHECK(c.owner(1).counters().exists_len_mismatch_total == 1);
}

TEST_CASE("exists: the master away is given up after max_wait_ms and answered with the local prefix") {
  sim::Cluster c(seed_from_env(703), small_owner(), 2);
  c.run_for(10);
  const uint64_t s0 = c.open_session(0), s1 = c.open_session(1);
  put_live_routes(c, 0, s0, {"m0"});
  put_live_routes(c, 1, s1, {"n0"});
  c.to_master.drop = 1.0;  // the master cannot be reached
  const Millis t0 = c.now();
  auto r = exists(c, 1, s1, {"n0", "m0"}, {}, 0, 200);
  CHECK(r.prefix_len == 1);
  CHECK(r.local_len == 1);
  CHECK_FALSE(r.master_answered);
  CHECK(c.now() - t0 < 400);
  CHECK(c.owner(1).counters().exists_master_unanswered_total == 1);
  c.to_master.drop = 0;
  CHECK(exists(c, 1, s1, {"n0", "m0"}).prefix_len == 2);
}

TEST_CASE("remove_prefix: every value under the prefix leaves, route first, other prefixes stay, empty is refused") {
  sim::Cluster c(seed_from_env(704), small_owner(), 2);
  c.run_for(10);
  const uint64_t s0 = c.open_session(0), s1 = c.open_session(1);
  put_live_routes(c, 0, s0, {"dep1:a", "dep1:b", "dep2:a"});
  auto r = c.call(0, s0, make_envelope(wire::RemovePrefixReqT{{}, "dep1:"}));
  REQUIRE(r.body.AsRemovePrefixReply());
  CHECK(r.body.AsRemovePrefixReply()->removed == 2);
  REQUIRE(c.run_until([&] { return c.master().route_count() == 1; }, 60000));
  CHECK(exists(c, 1, s1, {"dep1:a"}).prefix_len == 0);  // gone at the master too
  CHECK(exists(c, 1, s1, {"dep2:a"}).prefix_len == 1);
  CHECK(c.owner(0).local_state("dep1:a") == 0);
  auto e = c.call(0, s0, make_envelope(wire::RemovePrefixReqT{{}, ""}));
  CHECK(envelope_status(e).code() == Code::kInvalidArgument);
}

TEST_CASE("remove_prefix and rewrites: routes leave in RemoveRoutes jobs of many (2000 routes: 2 jobs, a batch's 50 replaced versions: 1), within the remove_jobs bound") {
  OwnerConfig cfg = small_owner();  // 2048 slots of 4 KiB
  cfg.limits.remove_jobs = 4;
  sim::Cluster c(seed_from_env(705), cfg, 2);
  c.run_for(10);
  const uint64_t s = c.open_session(0);
  std::vector<std::string> keys;
  for (int b = 0; b < 20; ++b) {
    std::vector<std::string> batch;
    for (int i = 0; i < 100; ++i) batch.push_back("p:" + std::to_string(b * 100 + i));
    put_live_routes(c, 0, s, batch);
    keys.insert(keys.end(), batch.begin(), batch.end());
  }
  REQUIRE(c.master().route_count() == 2000);
  c.to_master.drop = 1.0;  // the answers never come: the jobs stay in flight to be counted
  auto r = c.call(0, s, make_envelope(wire::RemovePrefixReqT{{}, "p:"}));
  REQUIRE(r.body.AsRemovePrefixReply());
  CHECK(r.body.AsRemovePrefixReply()->removed == 2000);
  CHECK(c.owner(0).removals_in_flight() == 2);  // one message per key: 2000 jobs past the bound of 4
  c.to_master.drop = 0;
  REQUIRE(c.run_until([&] { return c.master().route_count() == 0 && c.owner(0).removals_in_flight() == 0; }, 60000));
  CHECK(c.owner(0).local_state("p:0") == 0);

  // A batch rewriting 50 live keys: their replaced versions leave together.
  std::vector<std::string> again(keys.begin(), keys.begin() + 50);
  put_live_routes(c, 0, s, again);
  c.to_master.drop = 1.0;
  wire::PutStartReqT p;
  p.keys = again;
  p.value_len = 4096;
  p.reject_if_exist_same_key = false;
  auto ps = c.call(0, s, make_envelope(std::move(p)));
  REQUIRE(ps.body.AsPutStartReply());
  REQUIRE(c.call(0, s, make_envelope(wire::PutCommitReqT{{}, ps.body.AsPutStartReply()->put_id})).body.AsPutCommitReply());
  CHECK(c.owner(0).removals_in_flight() == 1);
  c.to_master.drop = 0;
  REQUIRE(c.run_until([&] { return c.owner(0).removals_in_flight() == 0 && c.owner(0).local_state("p:49") == 2; }, 60000));
  CHECK(c.master().route_count() == 50);
}
