// A client's bytes at the owner's trust boundary (OwnerDriver::on_client_bytes: the channel and CAF
// paths alike) of a real owner core in the simulated cluster, whose state carries over from input
// to input. Any crash, sanitizer report or exception is a finding.
#include "fluxon/sim/sim.hpp"

using namespace fluxon;

namespace {
sim::Cluster& cluster() {
  static sim::Cluster* c = [] {
    OwnerConfig cfg;
    cfg.dram_bytes = 8ull << 20;
    cfg.grant_bytes = 1ull << 20;
    cfg.publish_retry_ms = 50;
    cfg.hard_timeout_ms = 300;
    auto* cl = new sim::Cluster(1, cfg, 2, {"sglang_owner", "remote_cache"});
    cl->run_for(10);
    cl->open_session(0);  // session 1: the seeds' requests name it
    return cl;
  }();
  return *c;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  sim::Cluster& c = cluster();
  (void)c.driver(0).on_client_bytes(data, size, c.now(), [](uint64_t) {});
  c.run_for(2);
  c.drop_replies();  // nobody collects them here
  return 0;
}
