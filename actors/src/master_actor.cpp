// The master actor: decode, MasterCore::handle, encode. In the HA mode it answers only while its
// Campaign says it leads (E1), stamps every reply with its term (E2), and starts from an empty core
// at each new term: the owners resync their live routes to it, as to a restarted master.
#include <chrono>
#include <csignal>
#include <cstdio>

#include "caf_types.hpp"
#include "daemon_util.hpp"
#include "fluxon/actors/runtime.hpp"
#include "fluxon/master/master_gate.hpp"
#include "fluxon/master/status_board.hpp"
#include "fluxon/master/status_page.hpp"
#include "fluxon/runtime/campaign.hpp"
#include "fluxon/runtime/metrics.hpp"
#include "fluxon/runtime/recorder.hpp"
#include "fluxon/runtime/log.hpp"

namespace fluxon::actors {

namespace {

struct MasterState {
  MasterState() = default;  // not an aggregate: see OwnerState (CAF constructs states from the actor pointer)
  MasterCore core;
  MasterConfig cfg;
  std::shared_ptr<Campaign> campaign;  // the HA mode; null: the single master, term 0, always serving
  // Leadership and terms around the core: gate.term is the term the core serves (HA: since its last
  // reset); its counters not_leader, newer_term.
  MasterGate gate;
  uint64_t core_resets_total = 0;
  AuthKeyPtr key;                         // the cluster key (null: no auth)
  std::shared_ptr<GateStats> gate_stats;  // the gate in front of this master (daemons)
  std::unique_ptr<Metrics> metrics;
  std::unique_ptr<TrafficRecorder> recorder;  // FLUXON_RECORD: owners' requests, for the fuzzers' corpus
  uint64_t metrics_refreshes = 0;
  // The status page (`/` and `/api/status` on the metrics port): sampled and rendered each tick.
  StatusBoard board;
  StatusBoard::Header header;
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
  if (st.gate_stats) {
    const auto& g = *st.gate_stats;
    if (st.key) {
      m.counter("fluxon_master_auth_handshakes_total", "Connections that proved the cluster key", g.handshakes_ok.load());
      m.counter("fluxon_master_auth_failed_handshakes_total", "Connections that failed to prove the cluster key",
                g.handshakes_failed.load());
      const char* help = "What was refused from nodes that did not prove the cluster key";
      m.counter("fluxon_master_auth_refused_total", help, g.refused_calls.load(), {{"what", "request"}});
      m.counter("fluxon_master_auth_refused_total", help, g.refused_notes.load(), {{"what", "note"}});
    }
    m.counter("fluxon_master_gate_dropped_total", "Messages of no public kind sent to the master's port (dropped)",
              g.refused_other.load());
  }
  const bool leads = !st.campaign || st.campaign->serving();
  m.gauge("fluxon_master_leader", "1 while this master serves as the leader (always, with one master), 0 on a standby",
          leads ? 1 : 0);
  m.gauge("fluxon_master_term", "The leader's term (etcd's revision of its election; 0 with one master): this "
          "master's while it leads, the one it last saw lead otherwise", double(st.campaign ? st.campaign->term() : 0));
  if (st.campaign) {
    m.counter("fluxon_master_elections_won_total", "Elections this master won", st.campaign->elections_won());
    m.counter("fluxon_master_step_downs_total", "Times this master stopped leading (lease lost or not renewed in time)",
              st.campaign->step_downs());
    m.counter("fluxon_master_etcd_errors_total", "etcd calls that failed or timed out", st.campaign->etcd_errors());
    m.counter("fluxon_master_not_leader_total", "Requests refused because this master did not lead", st.gate.not_leader_total);
    m.counter("fluxon_master_newer_term_total", "Requests that named a newer term than this master's (it was deposed)",
              st.gate.newer_term_total);
    m.counter("fluxon_master_core_resets_total", "New terms this master started from an empty state", st.core_resets_total);
  }
  // The status page's document, from the same tick.
  st.board.sample(now_ms(), st.core);
  st.header.leading = leads;
  st.header.term = st.campaign ? st.campaign->term() : 0;
  m.set_page("/api/status", st.board.json(now_ms(), wall_ms(), st.core, st.header));
  // Last, so a scraper that saw it move sees everything this refresh wrote (tests wait for it: once a second).
  m.counter("fluxon_master_metrics_refreshes_total", "Times this page was refreshed from the master's state",
            ++st.metrics_refreshes);
}

// epoch names the core's KV-event log in readers' cursors: the term it serves (HA), or this
// master's start time in ms (one master: a restarted master's log is another log).
void fresh_core(MasterState& st, uint64_t epoch) {
  st.core = MasterCore(st.cfg.get_inflight_ttl_ms, st.cfg.replica_target_roles());
  st.core.set_tiers(st.cfg.replica_cache_capacity_ratio, st.cfg.replica_writeback_tier1_capacity_ratio);
  st.core.set_kv_events(st.cfg.kv_event_log_capacity, epoch);
  if (st.key) {
    // A grant outlives the prepared get it reads for (get_inflight_ttl_ms), with 10 s for clocks.
    const uint64_t ttl = uint64_t(st.cfg.get_inflight_ttl_ms) + 10000;
    st.core.set_grant_signer([key = st.key, ttl](const MasterCore::GrantRequest& r) {
      const Grant g = make_grant(*key, r.requester_node, r.requester_generation, r.source_generation, r.offset, r.len,
                                 wall_ms() + ttl);
      return std::string(g.begin(), g.end());
    });
  }
}

// HA: whether this master may answer now; a new term starts from an empty core (E2).
bool leads(MasterState& st) {
  if (!st.campaign) return true;
  if (!st.campaign->serving()) return false;
  if (const uint64_t t = st.campaign->term(); t != st.gate.term) {
    fresh_core(st, t);
    st.gate.term = t;
    st.core_resets_total++;
  }
  return true;
}

Envelope serve(MasterState& st, Envelope& req) {
  const bool leading = leads(st);
  const std::string hint = leading || !st.campaign ? std::string() : st.campaign->leader_address();
  bool deposed = false;
  Envelope rep = st.gate.serve(st.core, req, now_ms(), leading, hint, &deposed);
  if (deposed && st.campaign) st.campaign->poke();  // an owner saw a newer leader: this one is deposed, whatever it believes
  return rep;
}

caf::behavior master_actor(caf::stateful_actor<MasterState>* self, MasterConfig mcfg, std::string cluster,
                           bool metrics, std::shared_ptr<Campaign> campaign, AuthKeyPtr key,
                           std::shared_ptr<GateStats> gate_stats) {
  self->state.cfg = mcfg;
  self->state.header.cluster = cluster;
  self->state.header.version = FLUXON_VERSION;
  self->state.header.address = mcfg.address();
  self->state.header.started_ms = wall_ms();
  self->state.key = std::move(key);
  self->state.gate_stats = std::move(gate_stats);
  self->state.campaign = std::move(campaign);
  fresh_core(self->state, uint64_t(std::chrono::duration_cast<std::chrono::milliseconds>(
                                        std::chrono::system_clock::now().time_since_epoch())
                                        .count()));
  if (metrics) self->state.recorder = TrafficRecorder::from_env("master_request");
  if (metrics && mcfg.metrics_port != 0) {
    try {
      self->state.metrics = std::make_unique<Metrics>(
          mcfg.listen_host, mcfg.metrics_port,
          std::vector<Metrics::Page>{{"/", "text/html; charset=utf-8", status_page_html()},
                                     {"/api/status", "application/json", "{}"}});
    } catch (const std::exception& e) {
      logging::logf(logging::Level::kWarn, "master", "metrics on port %u disabled: %s\n", mcfg.metrics_port, e.what());
    }
  }
  self->send(self, tick_atom::value);
  return {
      [=](Blob& req) -> Blob {
        if (self->state.recorder) self->state.recorder->record(req.bytes.data(), req.bytes.size());
        auto env = decode(req.bytes);
        if (!env.ok()) {
          self->state.core.count_malformed();
          return Blob{encode(error_envelope(env.status()))};
        }
        return Blob{encode(serve(self->state, **env))};
      },
      [=](Note&) { self->state.core.count_malformed(); },  // the master takes no one-way notes
      [=](tick_atom) {
        if (leads(self->state)) self->state.core.tick(now_ms());
        export_metrics(self->state);
        self->delayed_send(self, std::chrono::seconds(1), tick_atom::value);
      },
  };
}

}  // namespace

caf::actor spawn_master(caf::actor_system& sys, const ClusterConfig& cfg, bool metrics) {
  return sys.spawn(master_actor, cfg.master, cfg.cluster_name, metrics, std::shared_ptr<Campaign>{}, AuthKeyPtr{},
                   std::shared_ptr<GateStats>{});
}

}  // namespace fluxon::actors

namespace fluxon {

int run_master_daemon(const ClusterConfig& cfg, int index) {
  if (cfg.ha() && (index < 0 || size_t(index) >= cfg.masters.size())) {
    logging::logf(logging::Level::kError, "master", "--index %d: the config lists %zu masters (0..%zu)\n", index,
                 cfg.masters.size(), cfg.masters.size() - 1);
    return 2;
  }
  if (!cfg.ha() && index > 0) {
    logging::logf(logging::Level::kError, "master", "--index %d: the config has one master (no masters: list)\n", index);
    return 2;
  }
  const MasterConfig& mc = cfg.ha() ? cfg.masters[size_t(index)] : cfg.master;
  actors::block_stop_signals();
  caf::actor_system_config acfg;
  actors::configure(acfg, true);
  caf::actor_system sys{acfg};
  std::shared_ptr<Campaign> campaign;
  if (cfg.ha()) {
    ElectionCore::Options eo;
    eo.ttl_ms = cfg.etcd.lease_ttl_ms;
    eo.poll_ms = cfg.etcd.poll_ms();
    eo.address = mc.address();
    campaign = std::make_shared<Campaign>(cfg.etcd.endpoints, cfg.cluster_name, eo);
  }
  AuthKeyPtr key;
  if (cfg.auth.enabled()) {
    auto k = load_key_file(cfg.auth.key_file);
    if (!k.ok()) {
      logging::logf(logging::Level::kError, "master", "%s\n", k.status().to_string().c_str());
      return 2;
    }
    key = *k;
    logging::logf(logging::Level::kInfo, "master", "auth on: every connection proves the cluster key (key %s from %s)\n",
                 key->fingerprint().c_str(), cfg.auth.key_file.c_str());
  } else {
    logging::logf(logging::Level::kInfo, "master", "auth off (no auth.key_file): listening on loopback only\n");
  }
  auto gate_stats = std::make_shared<actors::GateStats>();
  auto master = sys.spawn(actors::master_actor, mc, cfg.cluster_name, true, campaign, key, gate_stats);
  auto gate = actors::spawn_gate(sys, master, key, gate_stats, "the master");
  auto port = sys.middleman().publish(gate, mc.port, mc.listen_host.c_str(), true);
  if (!port) {
    logging::logf(logging::Level::kError, "master", "cannot listen on %s:%u: %s\n", mc.listen_host.c_str(), mc.port,
                 sys.render(port.error()).c_str());
    caf::anon_send_exit(master, caf::exit_reason::user_shutdown);
    return 1;
  }
  // The port is this master's: now it campaigns (until elected it answers "not the leader").
  if (campaign) campaign->start();
  logging::logf(logging::Level::kInfo, "master", "cluster %s listening on %s:%u (metrics %s)%s\n", cfg.cluster_name.c_str(),
              mc.listen_host.c_str(), *port, mc.metrics_port ? std::to_string(mc.metrics_port).c_str() : "off",
              cfg.ha() ? (", campaigning through etcd as masters[" + std::to_string(index) + "]").c_str() : "");
  std::fflush(stdout);
  const int sig = actors::wait_stop_signal();
  logging::logf(logging::Level::kInfo, "master", "signal %d, stopping\n", sig);
  std::fflush(stdout);
  caf::anon_send_exit(master, caf::exit_reason::user_shutdown);
  campaign.reset();  // a leader resigns: its key goes now, and a standby takes over without waiting out the lease
  return 0;
}

}  // namespace fluxon
