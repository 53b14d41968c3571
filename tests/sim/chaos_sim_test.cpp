// The whole cluster under random work and faults: the seeds CI runs by name (more: tools/soak).
// Each run prints its seed; FLUXON_SEED=<seed> replays one.
#include "chaos.hpp"

using namespace fluxon;
using namespace fluxon::test;

TEST_CASE("whole cluster: random puts, reads, deaths, evictions, write-backs and master restarts under faults") {
  for (uint64_t seed : {seed_from_env(401), uint64_t(402), uint64_t(403)}) chaos_run(seed, false);
}

TEST_CASE("whole cluster with the master's T1/T2 tiers: random puts, reads, deaths, evictions, write-backs and master restarts under faults") {
  for (uint64_t seed : {seed_from_env(411), uint64_t(412)}) chaos_run(seed, true);
}

TEST_CASE("whole cluster with master failovers: E1 E2 - leaders paused and replaced by standbys of newer terms, resumed with their leases gone, under faults") {
  // 100082: a paused leader answering as if it led (E1 broken) and owners taking its older term's
  // replies (E2 broken) loses routes there (checked: master route false, live entry true). Such
  // seeds are rare (1 in 90 from 100000 on; none of 400-699): found with tools/soak under the mutant.
  for (uint64_t seed : {seed_from_env(421), uint64_t(422), uint64_t(100082)}) chaos_run(seed, false, true);
}
