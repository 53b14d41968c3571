// The master actor: decode, MasterCore::handle, encode. Nothing else lives here.
#include <csignal>
#include <cstdio>

#include "caf_types.hpp"
#include "daemon_util.hpp"
#include "fluxon/actors/runtime.hpp"
#include "fluxon/master/master_core.hpp"
#include "fluxon/runtime/metrics.hpp"

namespace fluxon::actors {

namespace {

struct MasterState {
  MasterState() = default;  // not an aggregate: see OwnerState (CAF constructs states from the actor pointer)
  MasterCore core;
  std::unique_ptr<Metrics> metrics;
  uint64_t metrics_refreshes = 0;
  static inline const char* name = "fluxon_master";
};

void export_metrics(MasterState& st) {
  if (!st.metrics) return;
  auto& m = *st.metrics;
  register_counters(m, st.core.counters());
  register_gauges(m, st.core.stats());
  for (const auto& [node, n] : st.core.replica_targets())
    m.counter("fluxon_master_replica_targets_total", "Replica tasks handed to each target node", n,
              {{"node", std::to_string(node)}});
  for (uint32_t node : st.core.tier_nodes()) {
    const auto t = st.core.tier_sizes(node);
    const std::string n = std::to_string(node);
    const char* help = "Slot bytes of a node's routes in the master's tiers (t2, t1), its victims, and the tiers' capacities";
    m.gauge("fluxon_master_node_tier_bytes", help, double(t.t2), {{"node", n}, {"tier", "t2"}});
    m.gauge("fluxon_master_node_tier_bytes", help, double(t.t1), {{"node", n}, {"tier", "t1"}});
    m.gauge("fluxon_master_node_tier_bytes", help, double(t.victims), {{"node", n}, {"tier", "t2_victims"}});
    m.gauge("fluxon_master_node_tier_bytes", help, double(t.t2_capacity), {{"node", n}, {"tier", "t2_capacity"}});
    m.gauge("fluxon_master_node_tier_bytes", help, double(t.t1_capacity), {{"node", n}, {"tier", "t1_capacity"}});
  }
  // Last, so a scraper that saw it move sees everything this refresh wrote (tests wait for it: once a second).
  m.counter("fluxon_master_metrics_refreshes_total", "Times this page was refreshed from the master's state",
            ++st.metrics_refreshes);
}

caf::behavior master_actor(caf::stateful_actor<MasterState>* self, MasterConfig mcfg, bool metrics) {
  self->state.core = MasterCore(mcfg.get_inflight_ttl_ms, mcfg.replica_target_roles());
  self->state.core.set_tiers(mcfg.replica_cache_capacity_ratio, mcfg.replica_writeback_tier1_capacity_ratio);
  if (metrics && mcfg.metrics_port != 0) {
    try {
      self->state.metrics = std::make_unique<Metrics>(mcfg.listen_host, mcfg.metrics_port);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "fluxon master: metrics on port %u disabled: %s\n", mcfg.metrics_port, e.what());
    }
  }
  self->send(self, tick_atom::value);
  return {
      [=](Blob& req) -> Blob {
        auto env = decode(req.bytes);
        if (!env.ok()) {
          self->state.core.count_malformed();
          return Blob{encode(error_envelope(env.status()))};
        }
        return Blob{encode(self->state.core.handle(**env, now_ms()))};
      },
      [=](Note&) { self->state.core.count_malformed(); },  // the master takes no one-way notes
      [=](tick_atom) {
        self->state.core.tick(now_ms());
        export_metrics(self->state);
        self->delayed_send(self, std::chrono::seconds(1), tick_atom::value);
      },
  };
}

}  // namespace

caf::actor spawn_master(caf::actor_system& sys, const ClusterConfig& cfg, bool metrics) {
  return sys.spawn(master_actor, cfg.master, metrics);
}

}  // namespace fluxon::actors

namespace fluxon {

int run_master_daemon(const ClusterConfig& cfg) {
  actors::block_stop_signals();
  caf::actor_system_config acfg;
  actors::configure(acfg, true);
  caf::actor_system sys{acfg};
  auto master = actors::spawn_master(sys, cfg, true);
  auto port = sys.middleman().publish(master, cfg.master.port, cfg.master.listen_host.c_str(), true);
  if (!port) {
    std::fprintf(stderr, "fluxon master: cannot listen on %s:%u: %s\n", cfg.master.listen_host.c_str(),
                 cfg.master.port, sys.render(port.error()).c_str());
    caf::anon_send_exit(master, caf::exit_reason::user_shutdown);
    return 1;
  }
  std::printf("fluxon master: cluster %s listening on %s:%u (metrics %s)\n", cfg.cluster_name.c_str(),
              cfg.master.listen_host.c_str(), *port,
              cfg.master.metrics_port ? std::to_string(cfg.master.metrics_port).c_str() : "off");
  std::fflush(stdout);
  const int sig = actors::wait_stop_signal();
  std::printf("fluxon master: signal %d, stopping\n", sig);
  caf::anon_send_exit(master, caf::exit_reason::user_shutdown);
  return 0;
}

}  // namespace fluxon
