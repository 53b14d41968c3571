// The whole-cluster chaos run shared by the simulation tests and the soak tool (tools/soak).
// The whole cluster under a random workload and random faults, in the deterministic simulator:
// two GPU owners with small segments (capacity eviction at work) and owner-hot write-back, one
// remote_cache owner; puts in atomic groups, local and remote reads, clients dying with reads open,
// keys evicted by hand, owner crashes, master restarts, and lost, duplicated and delayed (so
// reordered) owner<->master messages and failing fetches throughout; capacity eviction through the
// fenced reclaim transaction all along, racing readers, puts and write-backs. Checked on every read: the bytes are a value some put of that key
// wrote (no slot reused under a reader: S2; no torn or foreign copy). Checked at the end, faults off:
// nothing left in flight (no reclaim, fence or selection debt either; S4 to the byte), and the
// master's routes and the owners' live entries name each other.
// Each run prints its seed; FLUXON_SEED=<seed> replays one.
#pragma once
#include <algorithm>
#include <map>
#include <random>
#include <set>

#include "helpers.hpp"

namespace fluxon::test {


inline std::vector<uint8_t> value_of(const std::string& key, uint64_t version) {
  std::vector<uint8_t> b(4096);
  uint64_t h = std::hash<std::string>{}(key) ^ (version * 0x9e3779b97f4a7c15ull);
  for (size_t i = 0; i < b.size(); i += 8) {
    h ^= h << 13, h ^= h >> 7, h ^= h << 17;
    for (size_t j = 0; j < 8; ++j) b[i + j] = uint8_t(h >> (8 * j));
  }
  return b;
}

struct Chaos {
  sim::Cluster& c;
  std::mt19937_64 rng;
  std::vector<std::string> keys;
  std::map<std::string, std::set<std::vector<uint8_t>>> written;  // every value committed per key
  std::vector<uint64_t> sessions;                                   // per GPU owner
  uint64_t version = 1, reads = 0, read_keys = 0, put_ok = 0, put_failed = 0, bad = 0, crashes = 0;
  std::map<std::string, uint64_t> refusals;
  // write_through puts committed, per (owner, session): their futures must all end (PutLive).
  std::map<std::pair<int, uint64_t>, std::set<uint64_t>> write_through;
  uint64_t write_through_ok = 0, write_through_failed = 0;
  // HA: a master event is a failover (the leader paused, a standby leads the next term) or the
  // paused old leader running again, its lease gone; else a master restart.
  bool failovers = false;
  uint64_t failovers_done = 0, resumes = 0;
  // The faults beyond the links: partitions between owners' data planes, a slow data plane, clock
  // leaps, an owner dying in the middle of a reclaim. A stream of their own decides them.
  std::mt19937_64 frng;
  uint64_t partitions = 0, slow_spells = 0, clock_jumps = 0, mid_reclaim_crashes = 0;
  std::map<std::pair<int, int>, int> heal_at;  // a cut pair of owners -> the step it heals
  bool slow = false;
  int slow_until = 0;

  Chaos(sim::Cluster& cluster, uint64_t seed) : c(cluster), rng(seed), frng(seed * 0x9e3779b97f4a7c15ull + 7) {
    for (int i = 0; i < 3000; ++i) keys.push_back("chaos-" + std::to_string(i));
    sessions = {c.open_session(0), c.open_session(1)};
  }

  void put(int o) {
    const size_t n = 1 + rng() % 8;
    std::vector<std::string> batch;
    std::set<std::string> seen;
    // Like SGLang, back up only pages the owner does not hold (else the whole put is a conflict).
    for (int tries = 0; batch.size() < n && tries < 64; ++tries) {
      const auto& k = keys[rng() % keys.size()];
      if (c.owner(o).local_state(k) == 0 && seen.insert(k).second) batch.push_back(k);
    }
    if (batch.empty()) return;
    const size_t m = batch.size();
    std::vector<uint32_t> groups;
    for (size_t left = m; left > 0;) {
      const uint32_t g = uint32_t(1 + rng() % left);
      groups.push_back(g);
      left -= g;
    }
    // A quarter of the puts are write_through: synchronous placement on the remote_cache owner.
    const bool through = rng() % 4 == 0;
    wire::PutStartReqT req;
    req.keys = batch;
    req.value_len = 4096;
    req.atomic_group_lens = groups;
    req.write_through = through;
    auto r = c.call(o, sessions[o], make_envelope(std::move(req)));
    auto* ps = r.body.AsPutStartReply();
    if (!ps) {
      put_failed++;  // no slot in time, or a key being written: a cache may refuse
      refusals[envelope_status(r).to_string().substr(0, 60)]++;
      return;
    }
    const uint64_t v = version++;
    for (size_t i = 0; i < batch.size(); ++i) {
      c.write(o, ps->offsets[i], value_of(batch[i], v));
      written[batch[i]].insert(value_of(batch[i], v));
    }
    if (c.call(o, sessions[o], make_envelope(wire::PutCommitReqT{{}, ps->put_id})).body.AsPutCommitReply()) {
      put_ok++;
      if (through) write_through[{o, sessions[o]}].insert(ps->put_id);
    } else {
      put_failed++;
    }
  }

  void check(const std::string& key, const std::vector<uint8_t>& got, int o = -1, uint64_t off = 0) {
    auto w = written.find(key);
    if (w == written.end() || !w->second.count(got)) {
      MESSAGE("bad read at t=" << c.now() << " owner " << o << " off " << off);
      bad++;
      FAIL_CHECK("read of ", key, " returned bytes no put of it wrote");
    }
  }

  void get(int o, bool die) {
    const size_t start = rng() % keys.size(), n = 1 + rng() % 12;
    std::vector<std::string> ks;
    for (size_t i = 0; i < n; ++i) ks.push_back(keys[(start + i) % keys.size()]);
    auto g = get_start(c, o, sessions[o], ks);
    auto* r = g.body.AsGetStartReply();
    if (!r) return;
    reads++;
    if (die) {  // the client dies with the read open: the owner releases what it held
      write_through.erase({o, sessions[o]});  // its futures die with it
      c.close_session(o, sessions[o]);
      sessions[o] = c.open_session(o);
      return;
    }
    if (r->transferable_len > 0 && r->owner_rpc) {
      auto t = c.call(o, sessions[o], make_envelope(wire::GetTransferReqT{{}, r->handle_id, r->transferable_len}));
      if (auto* tr = t.body.AsGetTransferReply())
        for (size_t i = 0; i < tr->offsets.size(); ++i, read_keys++) check(ks[i], c.read(o, tr->offsets[i]), o, tr->offsets[i]);
    } else {
      for (size_t i = 0; i < r->transferable_len; ++i, read_keys++) check(ks[i], c.read(o, r->offsets[i]), o, r->offsets[i]);
    }
    release_all(c, o, sessions[o], *r);
  }

  static constexpr LinkFaults kData{0.1, 0, 1, 5}, kSlowData{0.1, 0, 40, 400};

  void faults(int i) {
    // Partitions and slow spells last 50-250 steps, then heal.
    for (auto it = heal_at.begin(); it != heal_at.end();)
      if (it->second <= i) {
        c.partition_owners(it->first.first, it->first.second, false);
        it = heal_at.erase(it);
      } else {
        ++it;
      }
    if (slow && slow_until <= i) {
      slow = false;
      c.data = kData;
    }
    const uint64_t y = frng() % 1000;
    if (y < 3) {  // a data-plane partition between two owners
      const int a = int(frng() % 3), b = (a + 1 + int(frng() % 2)) % 3;
      if (heal_at.emplace(std::pair{std::min(a, b), std::max(a, b)}, i + 50 + int(frng() % 200)).second) {
        partitions++;
        c.partition_owners(a, b, true);
      }
    } else if (y < 5 && !slow) {  // a slow data plane for a while
      slow = true;
      slow_spells++;
      slow_until = i + 50 + int(frng() % 200);
      c.data = kSlowData;
    } else if (y < 6) {
      clock_jumps++;
      c.jump_clock(Millis(500 + frng() % 5000));
    }
    // Once per run: an owner process dies while one of its reclaim transactions is open.
    if (mid_reclaim_crashes == 0 && i > 200 && frng() % 8 == 0)
      for (int o : {0, 1, 2})
        if (c.owner(o).reclaims_in_flight() > 0) {
          mid_reclaim_crashes++;
          crash_owner(o);
          break;
        }
  }

  void step() {
    const uint64_t x = rng() % 1000;
    const int o = int(rng() % 2);
    if (x < 450) put(o);
    else if (x < 900) get(o, false);
    else if (x < 960) get(o, true);
    else if (x < (failovers ? 990u : 995u)) c.remove_key(o, keys[rng() % keys.size()]);
    else master_event();
  }

  void master_event() {
    if (!failovers) return c.restart_master();
    if (c.master_paused()) {
      resumes++;
      return c.resume_old_master();
    }
    if (rng() % 3 == 0) return c.restart_master();
    failovers_done++;
    c.failover_master();
  }

  // An owner process dies (its reads, puts, reclaims and fetches with it) and the next generation
  // starts empty; its clients connect again.
  void crash_owner(int o) {
    crashes++;
    for (auto it = write_through.begin(); it != write_through.end();)
      it = it->first.first == o ? write_through.erase(it) : std::next(it);  // the futures see the restart
    c.restart_owner(o);
    if (o < 2) sessions[o] = c.open_session(o);
  }
};


// One seeded run; `tiers`: the master's T1/T2 route tiers decide what leaves the owners (their
// own hot tiers off, as the design runs them), else owner-hot write-back does.
inline void chaos_run(uint64_t seed, bool tiers, bool failovers = false) {
  {
    OwnerConfig cfg = small_owner();
    cfg.dram_bytes = 2ull << 20;  // 512 slots of 4 KiB: 3000 keys do not fit, eviction runs
    cfg.hot_writeback_ratio = tiers ? 0 : 0.9;  // write-back starts late: capacity eviction runs too
    cfg.writeback_timeout_ms = 20000;
    if (tiers) cfg.spill_free_ratio = 0.1;  // and puts that go live under pressure spill
    sim::Cluster c(seed, cfg, 3, {"sglang_owner", "sglang_owner", "remote_cache"});
    if (tiers) c.set_master_tiers(0.8, 0.6);
    c.run_for(10);
    Chaos w(c, seed);
    w.failovers = failovers;
    c.to_master = {0.1, 0.1, 1, 20};
    c.from_master = {0.1, 0.1, 1, 20};
    c.data = Chaos::kData;
    for (int i = 0; i < 2500; ++i) {
      if (i == 1000) w.crash_owner(int(w.rng() % 3));  // one owner process dies midway
      w.step();
      w.faults(i);
    }
    MESSAGE("seed " << seed << ": " << w.partitions << " owner partitions (" << c.fetches_partitioned()
                    << " fetches cut), " << w.slow_spells << " slow data-plane spells, " << w.clock_jumps
                    << " clock jumps, " << w.mid_reclaim_crashes << " owner crashes with a reclaim open");
    for (int a : {0, 1, 2})
      for (int b : {0, 1, 2}) c.partition_owners(a, b, false);
    if (c.master_paused()) w.master_event();  // the old leader runs again
    if (failovers) {
      uint64_t stale = 0;
      for (int o : {0, 1, 2}) stale += c.owner(o).counters().stale_term_replies_total;
      MESSAGE("seed " << seed << ": " << w.failovers_done << " failovers (term " << c.master_term() << "), "
                      << w.resumes << " paused leaders resumed; replies of an older term refused by owners: "
                      << stale);
      CHECK(w.failovers_done > 0);
      CHECK(c.master_term() == w.failovers_done);
    }
    // Faults off; let every retry and timer run out.
    c.to_master = c.from_master = sim::kQuietLink;
    c.data = sim::kQuietLink;
    // Every write_through future of a live client ends once: with its remote copy or an error.
    // (Once no publish job is left either: a put still publishing starts its write-through after.)
    REQUIRE(c.run_until([&] {
      return c.owner(0).writebacks_pending() + c.owner(1).writebacks_pending() + c.owner(0).stats().publish_jobs +
                 c.owner(1).stats().publish_jobs ==
             0;
    }, 300000));
    c.run_for(100);
    for (auto& [os, ids] : w.write_through) {
      std::set<uint64_t> noted;
      for (const auto& n : c.take_put_live(os.first, os.second)) {
        if (!ids.count(n.put_id)) continue;
        CHECK_MESSAGE(noted.insert(n.put_id).second, "put ", n.put_id, " noted twice");
        (n.error ? w.write_through_failed : w.write_through_ok)++;
      }
      for (uint64_t id : ids) CHECK_MESSAGE(noted.count(id), "write_through put ", id, " never completed");
    }
    for (int o : {0, 1}) {
      const auto& oc = c.owner(o).counters();
      CHECK(oc.write_through_puts_total == oc.write_through_backed_total + oc.write_through_failed_total);
    }
    for (int o : {0, 1}) c.close_session(o, w.sessions[o]);
    const bool drained = c.run_until([&] {
      for (int o : {0, 1, 2}) {
        auto st = c.owner(o).stats();
        if (st.flights_starting + st.flights_started + st.flights_finishing + st.get_jobs + st.pending_gets +
                st.slots_prepared + st.slots_pending + st.publish_jobs + st.holders + st.active_put_plans +
                    st.replica_flights + st.replica_retries_waiting !=
                0 ||
            c.owner(o).writebacks_pending() != 0 || c.owner(o).reclaims_in_flight() != 0)
          return false;
      }
      return c.master().inflight_get_count() == 0 && c.master().reclaim_count() == 0 &&
             c.master().replica_tasks_queued() == 0;
    }, 300000);
    if (!drained)
      for (int o : {0, 1, 2}) {
        auto st = c.owner(o).stats();
        MESSAGE("node " << o + 1 << " still: flights " << st.flights_starting << "/" << st.flights_started << "/"
                        << st.flights_finishing << " get jobs " << st.get_jobs << " pending gets " << st.pending_gets
                        << " prepared " << st.slots_prepared << " pending " << st.slots_pending << " publish jobs "
                        << st.publish_jobs << " holders " << st.holders << " plans " << st.active_put_plans
                        << " write-backs " << c.owner(o).writebacks_pending() << " reclaims " << st.reclaims
                        << "; master gets " << c.master().inflight_get_count() << " reclaims "
                        << c.master().reclaim_count());
      }
    REQUIRE(drained);
    CHECK(c.master().reclaim_fence_count() == 0);

    c.run_for(2000);
    // The master's routes and the owners' live entries name each other, key by key.
    uint64_t routes = 0, mismatched = 0;
    for (const auto& k : w.keys) {
      const auto nodes = c.master().replica_nodes(k);
      routes += !nodes.empty();
      for (int o : {0, 1, 2}) {
        const bool route = std::find(nodes.begin(), nodes.end(), uint32_t(o + 1)) != nodes.end();
        const bool live = c.owner(o).local_state(k) == 2;
        if (route != live) {
          mismatched++;
          FAIL_CHECK("key ", k, " on node ", o + 1, ": master route ", route, ", live entry ", live);
        }
      }
    }
    for (int o : {0, 1, 2}) {
      auto st = c.owner(o).stats();
      CHECK(st.slots_committed == st.routes);  // every committed slot is a live route's, and back
      // S4: every selected byte ended (committed, restored or obsolete); no debt, no transaction left.
      const auto& oc = c.owner(o).counters();
      CHECK(oc.evicted_bytes_total ==
            oc.reclaim_committed_bytes_total + oc.reclaim_restored_bytes_total + oc.reclaim_obsolete_bytes_total);
      CHECK(oc.evicted_keys_total ==
            oc.reclaim_committed_keys_total + oc.reclaim_restored_keys_total + oc.reclaim_obsolete_keys_total);
      CHECK(c.owner(o).eviction_debt_bytes() == 0);
      CHECK(c.owner(o).reclaims_in_flight() == 0);
      CHECK(st.slots_pending_local_visible == 0);
    }
    const auto& a = c.owner(0).counters();
    MESSAGE("seed " << seed << ": " << w.put_ok << " puts (" << w.put_failed << " refused), " << w.reads << " reads of "
                    << w.read_keys << " keys checked, " << routes << " keys routed at the end; node 1 evicted "
                    << a.evicted_keys_total << " keys, demoted " << a.demoted_keys_total << ", remote gets "
                    << a.get_leader_keys_total << "; messages dropped " << c.messages_dropped() << ", duplicated "
                    << c.messages_duplicated() << "; fetches failed " << c.transfers_failed() << "; owner crashes "
                    << w.crashes);
    for (int o : {0, 1, 2}) {
      const auto& oc = c.owner(o).counters();
      MESSAGE("node " << o + 1 << " reclaims: " << oc.reclaim_started_total << " transactions, keys committed "
                      << oc.reclaim_committed_keys_total << ", restored " << oc.reclaim_restored_keys_total
                      << ", obsolete " << oc.reclaim_obsolete_keys_total << "; deferred: activity "
                      << oc.reclaim_master_activity_total << ", partial " << oc.reclaim_master_partial_total
                      << ", closure " << oc.reclaim_master_closure_total << ", holder "
                      << oc.reclaim_owner_holder_total << ", write " << oc.reclaim_owner_write_total);
    }
    for (const auto& [why, n] : w.refusals) MESSAGE(n << " x " << why);
    const auto& b = c.owner(1).counters();
    MESSAGE("write_through: " << a.write_through_puts_total + b.write_through_puts_total << " puts, "
                              << a.write_through_backed_total + b.write_through_backed_total
                              << " with their remote copy, "
                              << a.write_through_failed_total + b.write_through_failed_total
                              << " failed; of the live clients' futures " << w.write_through_ok << " ok, "
                              << w.write_through_failed << " failed");
    CHECK(a.write_through_backed_total + b.write_through_backed_total > 0);
    CHECK(w.bad == 0);
    CHECK(mismatched == 0);
    CHECK(w.read_keys > (tiers ? 200u : 250u));  // reads ran at scale (partitions and slow spells cut some)
    CHECK(a.evicted_keys_total + c.owner(1).counters().evicted_keys_total > 0);
    CHECK(a.demoted_keys_total + c.owner(1).counters().demoted_keys_total > 0);
    if (tiers) {
      // The master's selections reconcile (since its last restart): each ended, came back, or waits.
      const auto& m = c.master().counters();
      size_t waiting = 0;
      for (uint32_t n : {1u, 2u, 3u}) waiting += c.master().tier_victims(n).size();
      MESSAGE("tiers: T1 triggered " << m.tier1_triggered_total << ", queued " << m.tier1_queued_total
                                     << "; T2 selected " << m.tier2_selected_total << " (recoverable "
                                     << m.tier2_recoverable_total << ", fenced " << m.tier2_fenced_total
                                     << ", shortfall " << m.tier2_shortfall_total << "), ended " << m.tier2_ended_total
                                     << ", restored " << m.tier2_restored_total << ", waiting " << waiting);
      CHECK(m.tier2_selected_total == m.tier2_ended_total + m.tier2_restored_total + waiting);
      CHECK(m.tier1_triggered_total == m.tier1_stale_total + m.tier1_backed_total + m.tier1_no_target_total +
                                           m.tier1_queued_total);
      uint64_t taken = 0;
      for (int o : {0, 1, 2}) {
        const auto& oc = c.owner(o).counters();
        CHECK(oc.tier_victims_total == oc.tier_victims_stale_total + oc.tier_victims_taken_total +
                                           oc.tier_victims_busy_total + oc.tier_victims_evicted_total +
                                           oc.tier_victims_demoted_total);
        taken += oc.tier_victims_evicted_total + oc.tier_victims_demoted_total;
        // S5: T2 bounds what a node holds, never its capacity.
        const auto t = c.master().tier_sizes(uint32_t(o + 1));
        CHECK(t.t2_capacity == uint64_t(double(2ull << 20) * 0.8));
      }
      CHECK(taken > 0);
      MESSAGE("spilled keys: node 1 " << a.spill_keys_total << ", node 2 " << c.owner(1).counters().spill_keys_total);
      CHECK(a.spill_keys_total + c.owner(1).counters().spill_keys_total > 0);
    }
  }
}

}  // namespace fluxon::test
