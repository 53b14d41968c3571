// OwnerDriver: the one path from an owner core's output to its effects, shared by the simulator
// and the CAF owner actor, with the fault points written once (fluxon/driver/fault_points.hpp).
#include "helpers.hpp"

using namespace fluxon;
using namespace fluxon::test;

TEST_CASE("T1 fault points: master_request faults placed once fire in the simulation (the daemon test scrapes the same point)") {
  // The same FaultPoints and OwnerDriver run in the daemon (tests/python/test_daemons.py,
  // test_t1_fault_points_with_real_processes_...: fluxon_owner_faults_injected_total{point=
  // "master_request"}); here the simulator drives the point from its seed.
  sim::Cluster c(seed_from_env(31), small_owner(), 2);
  c.run_for(10);
  c.to_master = LinkFaults{0.4, 0.4, 1, 30};
  const uint64_t s = c.open_session(0);
  auto& f = c.driver(0).faults();
  // At least 10 batches, and on until each fault has fired (any seed: the odds are per message).
  int batches = 0;
  auto all_fired = [&] {
    return f.fired(FaultPoints::k_master_request, FaultPoints::kDropped) > 0 &&
           f.fired(FaultPoints::k_master_request, FaultPoints::kDuplicated) > 0 &&
           f.fired(FaultPoints::k_master_request, FaultPoints::kDelayed) > 0;
  };
  for (; batches < 100 && (batches < 10 || !all_fired()); ++batches)
    put_live_routes(c, 0, s, {"k" + std::to_string(batches) + "a", "k" + std::to_string(batches) + "b"});
  CHECK(f.fired(FaultPoints::k_master_request, FaultPoints::kDropped) > 0);
  CHECK(f.fired(FaultPoints::k_master_request, FaultPoints::kDuplicated) > 0);
  CHECK(f.fired(FaultPoints::k_master_request, FaultPoints::kDelayed) > 0);
  CHECK(f.fired(FaultPoints::k_master_reply, FaultPoints::kDropped) == 0);  // that point is quiet
  // T1 through the faults: every batch is live once, every route named at the master.
  CHECK(c.master().route_count() == uint64_t(2 * batches));
  CHECK(c.owner(0).stats().routes == uint64_t(2 * batches));
}

TEST_CASE("fault points: a plan with no faults draws nothing (the simulation's sequence is the plan's)") {
  FaultPlan plan;
  std::mt19937_64 rng(5), same(5);
  FaultPoints p(&plan, &rng);
  for (int i = 0; i < 100; ++i) {
    CHECK(p.link(FaultPoints::k_master_request).n == 1);
    CHECK_FALSE(p.fetch().fail);
  }
  CHECK(rng() == same());  // untouched
  plan.fetch.drop = 1;
  CHECK(p.fetch().fail);
  CHECK(p.fired(FaultPoints::k_fetch, FaultPoints::kDropped) == 1);
}
