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
