// An owner's bytes at the master (decode, then the MasterGate and MasterCore the daemon runs), with
// the master's state carried over from input to input; after each, the derived bounds must hold.
#include <cstdio>
#include <cstdlib>

#include "fluxon/master/master_gate.hpp"

using namespace fluxon;

namespace {
struct Master {
  MasterCore core;
  MasterGate gate;
  Millis now = 0;
  Master() {
    core.set_kv_events(64, 1);
    for (uint32_t node : {1u, 2u}) {
      wire::RegisterOwnerT r;
      r.node_id = node;
      r.generation = 1;
      r.role = node == 2 ? "remote_cache" : "sglang_owner";
      r.segment_len = 1 << 24;
      (void)core.handle(make_envelope(std::move(r)), 0);
    }
  }
};
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static Master* m = new Master;
  auto env = decode(data, size);
  if (!env.ok()) return 0;
  m->now += 7;
  (void)encode(m->gate.serve(m->core, **env, m->now, true, ""));
  m->core.tick(m->now);
  if (const std::string v = m->core.derived_bounds_violation(); !v.empty()) {
    std::fprintf(stderr, "master bounds violated: %s\n", v.c_str());
    std::abort();
  }
  return 0;
}
