// The client core inside the whole-cluster simulation: real ClientCores (the code KvClient runs)
// put, read, cancel and release against simulated owners through faulty master links, with their
// plans, handles, futures, batched acknowledgements and generation gate, and check every byte.
#include <map>
#include <memory>

#include "fluxon/client/client_core.hpp"
#include "helpers.hpp"

using namespace fluxon;
using namespace fluxon::test;

namespace {

// A simulated KvClient: the ClientCore over one owner of the cluster. The segment's addresses are
// a real arena (plan blobs hold pointers into it); the bytes live in the simulator's segment.
class SimClient {
 public:
  SimClient(sim::Cluster& c, int owner) : c_(c), owner_(owner), core_(/*max_wait_ms=*/0) {
    arena_.reset(new uint8_t[kArena]);
    const uint64_t session = c.open_session(owner);
    core_.attach(ClientCore::OwnerView{/*link=*/1, c.owner(owner).generation(), session, c.owner(owner).node_id(),
                                       /*handle_ttl_ms=*/1000, arena_.get(), kArena});
    core_.acknowledge();
  }

  // put_start, write each value through its plan pointer, commit: the future id (0: refused).
  uint64_t put(const std::vector<std::string>& keys, const std::map<std::string, std::vector<uint8_t>>& values) {
    auto req = core_.put_start(keys, 4096, PutOptionalArgs{false, false});
    REQUIRE(req.ok());
    Envelope rep = call(std::move(*req));
    if (!envelope_status(rep).is_ok()) return 0;
    auto plan = core_.put_started(rep, keys.size(), 4096, nullptr);
    REQUIRE(plan.ok());
    const auto* blob = reinterpret_cast<const uint64_t*>(*plan);
    CHECK(blob[0] == kPlanMagic);
    for (size_t i = 0; i < keys.size(); ++i) c_.write(owner_, offset_of(blob[2 + i]), values.at(keys[i]));
    auto p = core_.take_plan(*plan, true, "commit");
    REQUIRE(p.ok());
    const uint64_t future = next_future_++;
    auto commit = core_.put_commit(*p, future);
    REQUIRE(commit.ok());
    if (!call(std::move(*commit)).body.AsPutCommitReply()) {
      core_.commit_failed(*p);
      return 0;
    }
    pending_.insert(future);
    return future;
  }

  // get_start then get_transfer of the whole prefix: the values read (missing keys: none).
  std::vector<std::vector<uint8_t>> get(const std::vector<std::string>& keys, bool cancel) {
    auto req = core_.get_start(keys, true, std::nullopt);
    REQUIRE(req.ok());
    Envelope rep = call(std::move(*req));
    std::vector<std::vector<uint8_t>> got;
    if (!envelope_status(rep).is_ok()) return got;
    auto started = core_.get_started(rep, keys.size(), std::nullopt, c_.now());
    REQUIRE(started.ok());
    if (cancel || started->second.transferable_len == 0) {
      CHECK(core_.cancel(started->first).is_ok());
      send_acks();
      return got;
    }
    auto t = core_.take_handle(started->first, std::nullopt);
    REQUIRE(t.ok());
    if (!core_.begin_transfer(*t, c_.now()).is_ok()) return got;
    std::optional<Envelope> reply;
    if (t->request) {
      reply = call(std::move(*t->request));
      if (!envelope_status(*reply).is_ok()) return got;  // a remote key failed: the whole call did
    }
    auto plan = core_.finish_transfer(*t, reply ? &*reply : nullptr, nullptr);
    REQUIRE(plan.ok());
    const auto* blob = reinterpret_cast<const uint64_t*>(*plan);
    for (uint64_t i = 0; i < blob[1]; ++i) {
      auto bytes = c_.read(owner_, offset_of(blob[2 + i]));
      bytes.resize(blob[2 + blob[1] + i]);
      got.push_back(std::move(bytes));
    }
    auto p = core_.take_plan(*plan, false, "release_views");
    REQUIRE(p.ok());
    core_.release_views(std::move(*p));
    send_acks();
    return got;
  }

  // PutLive notes the owner sent this session: the futures they complete.
  // Each future settles once; `settled` counts them, `refused` those the master refused.
  void take_notes(uint64_t& settled, uint64_t& refused) {
    for (auto& live : c_.take_put_live(owner_, core_.owner().session))
      for (auto& [future, st] : core_.on_note(core_.owner().link, make_envelope(std::move(live)))) {
        CHECK(pending_.erase(future) == 1);
        settled++;
        refused += !st.is_ok();
      }
  }
  void send_acks(bool flush = false) {
    for (auto& a : core_.take_acks(flush)) c_.note(owner_, core_.owner().session, std::move(a.note));
  }
  ClientCore& core() { return core_; }
  size_t pending() const { return pending_.size(); }

 private:
  static constexpr uint64_t kArena = 8ull << 20;  // small_owner's segment
  uint64_t offset_of(uint64_t ptr) const { return ptr - reinterpret_cast<uint64_t>(arena_.get()); }
  Envelope call(Envelope req) { return c_.call(owner_, core_.owner().session, core_.addressed(std::move(req))); }

  sim::Cluster& c_;
  int owner_;
  ClientCore core_;
  std::unique_ptr<uint8_t[]> arena_;
  uint64_t next_future_ = 1;
  std::set<uint64_t> pending_;
};

std::vector<uint8_t> value_of(const std::string& key, uint64_t version) {
  std::vector<uint8_t> v(4096);
  const uint64_t h = std::hash<std::string>{}(key) ^ (version * 0x9E3779B97F4A7C15ull);
  for (size_t i = 0; i < v.size(); ++i) v[i] = uint8_t(h >> ((i % 8) * 8)) ^ uint8_t(i);
  return v;
}

}  // namespace

TEST_CASE("whole cluster with client cores: V1 V3 G5 T1 - puts, reads, cancels and releases of real ClientCores under faults") {
  const uint64_t seed = seed_from_env(77);
  sim::Cluster c(seed, small_owner(), 3);
  c.run_for(10);
  c.to_master = LinkFaults{0.1, 0.1, 1, 20};
  c.from_master = LinkFaults{0.1, 0.1, 1, 20};
  c.data = LinkFaults{0.1, 0, 1, 5};
  std::mt19937_64 rng(seed);
  std::vector<std::unique_ptr<SimClient>> clients;
  for (int o : {0, 1, 2}) clients.push_back(std::make_unique<SimClient>(c, o));
  std::map<std::string, std::set<std::vector<uint8_t>>> written;  // every value a put of the key wrote
  uint64_t settled = 0, refused = 0;
  uint64_t version = 1, reads = 0, keys_read = 0, bad = 0, puts = 0;
  for (int step = 0; step < 600; ++step) {
    const size_t who = rng() % clients.size();
    SimClient& cl = *clients[who];
    const uint64_t x = rng() % 100;
    // Each client writes its own keys (rewrites supersede its earlier versions); reads go to anyone's
    // (remote gets, joins, local hits).
    const size_t range = x < 40 ? who : rng() % clients.size(), start = rng() % 300, n = 1 + rng() % 8;
    std::vector<std::string> keys;
    for (size_t i = 0; i < n; ++i) keys.push_back("k" + std::to_string(range) + "_" + std::to_string((start + i) % 300));
    if (x < 40) {
      std::map<std::string, std::vector<uint8_t>> values;
      const uint64_t v = version++;
      for (const auto& k : keys) {
        values[k] = value_of(k, v);
        written[k].insert(values[k]);
      }
      puts += cl.put(keys, values) != 0;
    } else {
      const auto got = cl.get(keys, x >= 90);  // some reads are cancelled
      reads++;
      for (size_t i = 0; i < got.size(); ++i, keys_read++)
        if (!written[keys[i]].count(got[i])) {
          bad++;
          FAIL_CHECK("read of ", keys[i], " returned bytes no put of it wrote");
        }
    }
    for (auto& k : clients) k->take_notes(settled, refused);
    if (step % 50 == 0) c.restart_master();  // the owners re-publish (T1): futures still settle
  }
  c.to_master = c.from_master = c.data = sim::kQuietLink;
  for (auto& k : clients) k->send_acks(/*flush=*/true);
  REQUIRE(c.run_until([&] {
    size_t waiting = 0;
    for (auto& k : clients) {
      k->take_notes(settled, refused);
      waiting += k->pending();
    }
    return waiting == 0;
  }, 60000));
  c.run_for(2000);
  // V3: every committed put's future settled once; T1 and the re-publications lose none.
  CHECK(settled == puts);
  for (int o : {0, 1, 2}) {
    auto st = c.owner(o).stats();
    CHECK(st.holders == 0);  // every view released, every cancelled handle and tail given back (G5)
    CHECK(st.active_get_handles == 0);
    CHECK(st.active_put_plans == 0);
    CHECK(clients[o]->core().put_plans() + clients[o]->core().read_plans() + clients[o]->core().handles() == 0);
  }
  CHECK(bad == 0);
  MESSAGE("seed " << seed << ": " << puts << " puts settled (" << refused << " refused by the master), " << reads << " reads of " << keys_read
                  << " keys checked; messages dropped " << c.messages_dropped());
}

TEST_CASE("client core: the generation gate refuses a stale mapping until it is acknowledged") {
  ClientCore core(0);
  uint8_t arena[64];
  core.attach({1, 7, 1, 1, 1000, arena, sizeof(arena)});
  core.acknowledge();
  CHECK(core.gate().is_ok());
  core.attach({2, 8, 2, 1, 1000, arena, sizeof(arena)});  // the owner restarted: a new connection
  CHECK(core.gate().code() == Code::kGenerationMismatch);
  core.acknowledge();
  CHECK(core.gate().is_ok());
  // A full batch of acknowledgements goes at once, addressed to the session it belongs to.
  for (size_t i = 0; i < ClientCore::kAckBatch; ++i) {
    wire::GetStartReplyT r;
    r.transferable_len = 0;
    r.handle_id = i + 1;
    auto got = core.get_started(make_envelope(std::move(r)), 1, std::nullopt, 0);
    REQUIRE(got.ok());
    CHECK(core.cancel(got->first).is_ok());
  }
  auto acks = core.take_acks(false);
  REQUIRE(acks.size() == 1);
  CHECK(acks[0].at.id == 2);
  CHECK(acks[0].note.generation == 8);
  CHECK(acks[0].note.session_id == 2);
  CHECK(acks[0].note.body.AsAckBatch()->handles.size() == ClientCore::kAckBatch);
}

TEST_CASE("client core: a plan names its connection - after a session reset to the same generation it is refused, its views acknowledged to its own session") {
  ClientCore core(0);
  uint8_t arena[2 * 4096];
  core.attach({1, 7, 11, 1, 1000, arena, sizeof(arena)});
  core.acknowledge();
  wire::PutStartReplyT ps;
  ps.put_id = 5;
  ps.offsets = {0};
  auto put = core.put_started(make_envelope(std::move(ps)), 1, 4096, nullptr);
  REQUIRE(put.ok());
  wire::GetStartReplyT gs;
  gs.transferable_len = 1;
  gs.handle_id = 3;
  gs.offsets = {4096};
  gs.lens = {4096};
  gs.holding_ids = {9};
  auto got = core.get_started(make_envelope(std::move(gs)), 1, std::nullopt, 0);
  REQUIRE(got.ok());
  auto t = core.take_handle(got->first, std::nullopt);
  REQUIRE(t.ok());
  REQUIRE(core.begin_transfer(*t, 0).is_ok());
  auto read = core.finish_transfer(*t, nullptr, nullptr);
  REQUIRE(read.ok());
  (void)core.take_acks(true);
  // The owner did not answer in time: the shell gave the session up and opened another one to the
  // same owner generation. The old connection's mapping stays while its plans exist.
  core.attach({2, 7, 12, 1, 1000, arena, sizeof(arena)});
  CHECK(core.gate().is_ok());
  CHECK(core.references(1));
  auto p = core.take_plan(*put, true, "commit");
  REQUIRE(p.ok());
  CHECK(core.put_commit(*p, 1).status().code() == Code::kGenerationMismatch);
  auto r = core.take_plan(*read, false, "release_views");
  REQUIRE(r.ok());
  core.release_views(std::move(*r));
  auto acks = core.take_acks(true);
  REQUIRE(acks.size() == 1);
  CHECK(acks[0].at.id == 1);
  CHECK(acks[0].note.session_id == 11);  // the holding is the old session's
  CHECK_FALSE(core.references(1));
}
