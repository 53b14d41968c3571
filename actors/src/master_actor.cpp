// The master actor: decode, MasterCore::handle, encode. Nothing else lives here.
#include <csignal>
#include <cstdio>

#include "caf_types.hpp"
#include "daemon_util.hpp"
#include "fluxon/actors/runtime.hpp"
#include "fluxon/core/master_core.hpp"
#include "fluxon/runtime/metrics.hpp"

namespace fluxon::actors {

namespace {

struct MasterState {
  MasterState() = default;  // not an aggregate: see OwnerState (CAF constructs states from the actor pointer)
  MasterCore core;
  std::unique_ptr<Metrics> metrics;
  static inline const char* name = "fluxon_master";
};

void export_metrics(MasterState& st) {
  if (!st.metrics) return;
  auto& m = *st.metrics;
  const auto& c = st.core.counters();
  m.gauge("fluxon_master_routes", "Live routes in the global route table", double(st.core.route_count()));
  m.gauge("fluxon_master_owners", "Registered owners", double(st.core.owner_count()));
  m.counter("fluxon_master_put_done_total", "PutDone requests handled", c.put_done_total);
  m.counter("fluxon_master_put_done_duplicate_total", "PutDone re-sent with an identity already live (T1)",
            c.put_done_duplicate_total);
  m.counter("fluxon_master_put_done_exists_total", "PutDone items refused: another version holds the key",
            c.put_done_exists_total);
  m.counter("fluxon_master_put_done_stale_total", "PutDone items from an old owner generation", c.put_done_stale_total);
  m.counter("fluxon_master_routes_published_total", "Routes published", c.routes_published_total);
  m.counter("fluxon_master_routes_removed_total", "Routes removed", c.routes_removed_total);
  m.counter("fluxon_master_lookups_total", "Lookup requests", c.lookups_total);
  m.counter("fluxon_master_lookup_keys_total", "Keys looked up", c.lookup_keys_total);
  m.counter("fluxon_master_lookup_hits_total", "Keys found by lookups", c.lookup_hits_total);
  m.gauge("fluxon_master_replicas", "Replicas behind the live routes", double(st.core.replica_count()));
  m.gauge("fluxon_master_inflight_gets", "Prepared remote gets (started, not done or revoked)",
          double(st.core.inflight_get_count()));
  m.counter("fluxon_master_replicas_published_total", "Replicas published (puts and remote gets)",
            c.replicas_published_total);
  m.counter("fluxon_master_replicas_removed_total", "Replicas removed", c.replicas_removed_total);
  m.counter("fluxon_master_get_start_total", "BatchGetStart requests", c.get_start_total);
  m.counter("fluxon_master_get_start_keys_total", "Keys asked by BatchGetStart", c.get_start_keys_total);
  m.counter("fluxon_master_get_started_total", "Remote gets started (a source replica fenced)", c.get_started_total);
  m.counter("fluxon_master_get_miss_total", "BatchGetStart keys without a route", c.get_miss_total);
  m.counter("fluxon_master_get_busy_total", "BatchGetStart keys already inflight for the requester",
            c.get_busy_total);
  m.counter("fluxon_master_get_done_total", "Remote gets done", c.get_done_total);
  m.counter("fluxon_master_get_done_stale_total", "GetDone items refused: the version changed or went",
            c.get_done_stale_total);
  m.counter("fluxon_master_get_revoked_total", "Remote gets revoked", c.get_revoked_total);
  m.counter("fluxon_master_get_ttl_expired_total", "Remote gets expired by the inflight TTL",
            c.get_ttl_expired_total);
  m.counter("fluxon_master_remove_busy_total", "Route removals refused while a get read the replica",
            c.remove_busy_total);
  m.gauge("fluxon_master_replica_tasks_queued", "Replica tasks waiting for a target owner",
          double(st.core.replica_tasks_queued()));
  m.counter("fluxon_master_replica_tasks_total", "Replica tasks created by published puts", c.replica_tasks_total);
  m.counter("fluxon_master_replica_tasks_assigned_total", "Replica tasks handed to a target owner",
            c.replica_tasks_assigned_total);
  m.counter("fluxon_master_replica_tasks_no_target_total", "Replica tasks refused: no owner of a target role",
            c.replica_tasks_no_target_total);
  m.counter("fluxon_master_replica_tasks_obsolete_total", "Replica tasks dropped: version gone or already there",
            c.replica_tasks_obsolete_total);
  m.counter("fluxon_master_replica_polls_total", "ReplicaPoll requests from target owners", c.replica_polls_total);
  m.counter("fluxon_master_removed_with_copies_left_total",
            "Source copies removed while another owner's copy still serves the key", c.removed_with_copies_left_total);
  m.counter("fluxon_master_removed_last_copy_total", "Removals of a key's last copy (later reads miss)",
            c.removed_last_copy_total);
  m.counter("fluxon_master_writeback_keys_total", "Keys owners asked to write back", c.writeback_keys_total);
  m.counter("fluxon_master_writeback_tasks_total", "Replica tasks queued for write-backs", c.writeback_tasks_total);
  m.counter("fluxon_master_writeback_backed_total", "Write-back keys found held by a target-role owner",
            c.writeback_backed_total);
  m.counter("fluxon_master_writeback_obsolete_total", "Write-back keys whose sender held no copy of that version",
            c.writeback_obsolete_total);
  m.counter("fluxon_master_writeback_no_target_total", "Write-back keys refused: no target-role owner",
            c.writeback_no_target_total);
  m.counter("fluxon_master_demoted_keys_total", "Source copies dropped by single-copy demotion",
            c.demoted_keys_total);
  m.counter("fluxon_master_demote_kept_total", "Demotions refused: a key had no target copy of its version",
            c.demote_kept_total);
  m.counter("fluxon_master_demote_busy_total", "Demotions deferred: a remote get read a source copy",
            c.demote_busy_total);
  m.counter("fluxon_master_owner_hot_demotion_attempts_total", "Demote requests (owner_hot_demotion_attempts)",
            c.owner_hot_demotion_attempts);
  m.counter("fluxon_master_owner_hot_demotion_cohorts_total",
            "Demote requests granted, each an exact cohort set (owner_hot_demotion_cohorts)", c.owner_hot_demotion_cohorts);
  m.counter("fluxon_master_owner_hot_demotion_selected_bytes_total",
            "Value bytes whose source copies demotion dropped (owner_hot_demotion_selected_bytes)",
            c.owner_hot_demotion_selected_bytes);
  for (const auto& [node, n] : st.core.replica_targets())
    m.counter("fluxon_master_replica_targets_total", "Replica tasks handed to each target node", n,
              {{"node", std::to_string(node)}});
  m.counter("fluxon_master_errors_total", "Requests answered with an error", c.errors_total);
  m.counter("fluxon_master_malformed_total", "Malformed or unexpected messages rejected", c.malformed_total);
}

caf::behavior master_actor(caf::stateful_actor<MasterState>* self, MasterConfig mcfg, bool metrics) {
  self->state.core = MasterCore(mcfg.get_inflight_ttl_ms, mcfg.replica_target_roles);
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
