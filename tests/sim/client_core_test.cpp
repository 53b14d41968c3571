// The client core inside the whole-cluster simulation: real ClientCores (the code KvClient runs)
// put, read, cancel and release against simulated owners through faulty master links, with their
// plans, handles, futures, batched acknowledgements and generation gate, and check every byte.
#include <map>
#include <memory>

#include "fluxon/client/client_core.hpp"
#include "fluxon/runtime/channel.hpp"
#include "helpers.hpp"

using namespace fluxon;
using namespace fluxon::test;

namespace {

// A session's shared-memory channel inside the simulation: the shipped rings (channel::Producer and
// Consumer) over plain memory. The owner's side does what the owner's poller and actor do - take
// each entry, refuse a malformed one by ending the session, serve calls and notes, reply into the
// response ring - and runs when the simulation lets it: every `slowness` turns of a waiting client
// (a slow owner) and whenever the client finds its request ring full.
class SimChannel {
 public:
  SimChannel(sim::Cluster& c, int owner, uint64_t session, uint32_t ring_bytes, int slowness)
      : c_(c), owner_(owner), session_(session), cap_(ring_bytes), slowness_(slowness), req_mem_(ring_bytes),
        resp_mem_(ring_bytes) {
    req_p_ = channel::Producer(&req_, req_mem_.data(), cap_);
    req_c_ = channel::Consumer(&req_, req_mem_.data(), cap_);
    resp_p_ = channel::Producer(&resp_, resp_mem_.data(), cap_);
    resp_c_ = channel::Consumer(&resp_, resp_mem_.data(), cap_);
  }

  // Owner side: drain the request ring (the owner's own drain), serve each entry, reply.
  void serve() {
    while (!closed_) {
      channel::Drained d = channel::drain_requests(req_c_, 64, [&](channel::Entry&& e) {
        if (closed_) return;
        auto env = decode(e.payload);
        if (e.kind == channel::Kind::kNote) {
          if (env.ok()) c_.note(owner_, session_, std::move(**env));
          return;
        }
        Envelope rep = env.ok() ? c_.call(owner_, session_, std::move(**env)) : error_envelope(env.status());
        Bytes b = encode(rep);
        bool wake;
        if (resp_p_.push(channel::Kind::kReply, e.id, b.data(), uint32_t(b.size()), &wake) !=
            channel::Producer::Push::kOk)
          dropped_replies_++;
      });
      if (d.refused) {
        refused_++;
        end();  // the owner cuts the client off: its session ends, its holdings are released
      }
      if (d.entries == 0) return;
    }
  }

  // Client side: a call over the ring (a request too large for it goes the other way, as the
  // link does); Closed when the owner cut the channel off.
  Envelope call(Envelope req) {
    Bytes b = encode(req);
    if (b.size() > channel::max_payload(cap_) / 4) {
      fallbacks_++;
      return c_.call(owner_, session_, std::move(req));
    }
    const uint64_t id = next_id_++;
    if (!push(channel::Kind::kCall, id, b)) return error_envelope(Status(Code::kClosed, "channel closed"));
    for (int turn = 1;; ++turn) {
      if (closed_) return error_envelope(Status(Code::kClosed, "channel closed"));
      channel::Entry e;
      auto r = resp_c_.pop(e, nullptr);
      REQUIRE(r != channel::Consumer::Pop::kCorrupt);
      if (r == channel::Consumer::Pop::kEntry) {
        if (e.id != id) continue;  // the reply of a call given up earlier
        auto env = decode(e.payload);
        REQUIRE(env.ok());
        return std::move(**env);
      }
      if (turn % slowness_ == 0) serve();
      else c_.run_for(1);
    }
  }
  void note(Envelope n) {
    Bytes b = encode(n);
    if (b.size() > channel::max_payload(cap_) / 4) return c_.note(owner_, session_, std::move(n));
    push(channel::Kind::kNote, 0, b);
  }
  // The client process dies: what it published still reaches the owner, then its socket closes.
  void client_dies() {
    serve();
    end();
  }
  // A misbehaving client: an entry of an unknown kind, published as is.
  void publish_garbage() {
    const uint64_t t = req_.tail.load();
    const uint32_t head[4] = {8, 77, 0, 0};
    for (int i = 0; i < 16; ++i) req_mem_[(t + i) % cap_] = reinterpret_cast<const uint8_t*>(head)[i];
    req_.tail.store(t + channel::entry_bytes(8));
    req_p_ = channel::Producer(&req_, req_mem_.data(), cap_);  // the client's next entry goes after it
  }
  bool closed() const { return closed_; }
  uint64_t refused() const { return refused_; }
  uint64_t fallbacks() const { return fallbacks_; }
  uint64_t full_waits() const { return full_waits_; }
  uint64_t dropped_replies() const { return dropped_replies_; }
  uint64_t bytes_through() const { return req_.tail.load() + resp_.tail.load(); }

 private:
  bool push(channel::Kind k, uint64_t id, const Bytes& b) {
    while (!closed_) {
      bool wake;
      auto r = req_p_.push(k, id, b.data(), uint32_t(b.size()), &wake);
      if (r == channel::Producer::Push::kOk) return true;
      REQUIRE(r == channel::Producer::Push::kFull);
      full_waits_++;
      serve();  // the owner frees room
    }
    return false;
  }
  void end() {
    if (closed_) return;
    closed_ = true;
    c_.close_session(owner_, session_);
  }

  sim::Cluster& c_;
  int owner_;
  uint64_t session_;
  uint32_t cap_;
  int slowness_;
  channel::RingCtl req_{}, resp_{};
  std::vector<uint8_t> req_mem_, resp_mem_;
  channel::Producer req_p_, resp_p_;
  channel::Consumer req_c_, resp_c_;
  bool closed_ = false;
  uint64_t next_id_ = 1, refused_ = 0, fallbacks_ = 0, full_waits_ = 0, dropped_replies_ = 0;
};

// A simulated KvClient: the ClientCore over one owner of the cluster. The segment's addresses are
// a real arena (plan blobs hold pointers into it); the bytes live in the simulator's segment.
class SimClient {
 public:
  // ring_bytes > 0: over a shared-memory channel of that ring size (slowness: see SimChannel).
  SimClient(sim::Cluster& c, int owner, uint32_t ring_bytes = 0, int slowness = 1)
      : c_(c), owner_(owner), core_(/*max_wait_ms=*/0) {
    arena_.reset(new uint8_t[kArena]);
    const uint64_t session = c.open_session(owner);
    if (ring_bytes) ch_ = std::make_unique<SimChannel>(c, owner, session, ring_bytes, slowness);
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
    for (auto& a : core_.take_acks(flush)) {
      if (ch_) ch_->note(std::move(a.note));
      else c_.note(owner_, core_.owner().session, std::move(a.note));
    }
  }
  ClientCore& core() { return core_; }
  SimChannel* channel() { return ch_.get(); }
  size_t pending() const { return pending_.size(); }

 private:
  static constexpr uint64_t kArena = 8ull << 20;  // small_owner's segment
  uint64_t offset_of(uint64_t ptr) const { return ptr - reinterpret_cast<uint64_t>(arena_.get()); }
  Envelope call(Envelope req) {
    if (ch_) return ch_->call(core_.addressed(std::move(req)));
    return c_.call(owner_, core_.owner().session, core_.addressed(std::move(req)));
  }

  sim::Cluster& c_;
  int owner_;
  ClientCore core_;
  std::unique_ptr<uint8_t[]> arena_;
  std::unique_ptr<SimChannel> ch_;
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

TEST_CASE("whole cluster with client cores over shared-memory channels: V1 V3 G5 - small rings wrapping round, full rings, slow owners, a client dying mid-call, a client cut off for garbage") {
  const uint64_t seed = seed_from_env(78);
  sim::Cluster c(seed, small_owner(), 3);
  c.run_for(10);
  c.to_master = LinkFaults{0.05, 0.05, 1, 10};
  c.from_master = LinkFaults{0.05, 0.05, 1, 10};
  std::mt19937_64 rng(seed);
  // 4 KiB rings: a put of 8 keys is a few hundred bytes, so the rings wrap round hundreds of times;
  // owner 2 serves only every third turn of a waiting client.
  std::vector<std::unique_ptr<SimClient>> clients;
  for (int o : {0, 1, 2}) clients.push_back(std::make_unique<SimClient>(c, o, 4096, 1 + o));
  std::map<std::string, std::set<std::vector<uint8_t>>> written;
  uint64_t settled = 0, refused = 0, version = 1, puts = 0, bad = 0, keys_read = 0, bytes_through = 0;
  uint64_t cut_off = 0;
  std::vector<std::unique_ptr<SimClient>> gone;
  for (int step = 0; step < 500; ++step) {
    const size_t who = rng() % clients.size();
    SimClient& cl = *clients[who];
    const uint64_t x = rng() % 100;
    const size_t range = x < 40 ? who : rng() % clients.size(), start = rng() % 200, n = 1 + rng() % 8;
    std::vector<std::string> keys;
    for (size_t i = 0; i < n; ++i) keys.push_back("k" + std::to_string(range) + "_" + std::to_string((start + i) % 200));
    if (x < 40) {
      std::map<std::string, std::vector<uint8_t>> values;
      const uint64_t v = version++;
      for (const auto& k : keys) {
        values[k] = value_of(k, v);
        written[k].insert(values[k]);
      }
      puts += cl.put(keys, values) != 0;
    } else {
      const auto got = cl.get(keys, x >= 90);
      for (size_t i = 0; i < got.size(); ++i, keys_read++)
        if (!written[keys[i]].count(got[i])) {
          bad++;
          FAIL_CHECK("read of ", keys[i], " returned bytes no put of it wrote");
        }
    }
    for (auto& k : clients) k->take_notes(settled, refused);
    if (step == 200) {  // a burst of one-way notes to the slow owner: its ring fills, the client waits
      SimClient& burst = *clients[2];
      for (int i = 0; i < 200; ++i) burst.channel()->note(burst.core().addressed(make_envelope(wire::AckBatchT{})));
      CHECK(burst.channel()->full_waits() > 0);
    }
    if (step == 150 || step == 300) {
      // Owner 0's client dies holding views and a prepared put, a request of it still in the ring
      // (step 150), or is cut off for garbage with a request behind it (step 300, owner 1).
      const int o = step == 150 ? 0 : 1;
      SimClient& victim = *clients[o];
      for (int i = 0; i < 3; ++i) {
        auto req = victim.core().get_start({"k" + std::to_string(o) + "_" + std::to_string(i)}, true, std::nullopt);
        REQUIRE(req.ok());
        (void)victim.channel()->call(victim.core().addressed(std::move(*req)));  // a handle it never uses
      }
      auto prep = victim.core().put_start({"dead" + std::to_string(step)}, 4096, PutOptionalArgs{});
      REQUIRE(prep.ok());
      (void)victim.channel()->call(victim.core().addressed(std::move(*prep)));  // a plan it never commits
      if (step == 150) {
        victim.channel()->client_dies();
      } else {
        victim.channel()->publish_garbage();
        auto after = victim.core().get_start({"k1_0"}, true, std::nullopt);
        REQUIRE(after.ok());
        CHECK(envelope_status(victim.channel()->call(victim.core().addressed(std::move(*after)))).code() == Code::kClosed);
        cut_off += victim.channel()->refused();
      }
      CHECK(victim.channel()->closed());
      bytes_through += victim.channel()->bytes_through();
      // Its futures are not this test's to count any more; a new client takes its place.
      puts -= victim.pending();
      gone.push_back(std::move(clients[o]));
      clients[o] = std::make_unique<SimClient>(c, o, 4096, 1 + o);
    }
  }
  c.to_master = c.from_master = sim::kQuietLink;
  for (auto& k : clients) k->send_acks(/*flush=*/true);
  REQUIRE(c.run_until([&] {
    size_t waiting = 0;
    for (auto& k : clients) {
      k->take_notes(settled, refused);
      waiting += k->pending();
    }
    return waiting == 0;
  }, 60000));
  for (auto& k : clients) k->channel()->serve();  // the last acknowledgements
  c.run_for(2000);
  CHECK(settled == puts);  // V3 over the channel
  uint64_t full = 0;
  for (int o : {0, 1, 2}) {
    auto st = c.owner(o).stats();
    CHECK(st.holders == 0);  // G5: every view released, the dead and the cut-off client's too
    CHECK(st.active_get_handles == 0);
    CHECK(st.active_put_plans == 0);
    CHECK(clients[o]->channel()->dropped_replies() == 0);
    full += clients[o]->channel()->full_waits();
    bytes_through += clients[o]->channel()->bytes_through();
  }
  CHECK(bad == 0);  // V1: every byte read is a byte some put wrote
  CHECK(cut_off == 1);
  CHECK(bytes_through > 40 * 4096);  // the rings went round and round
  CHECK(full > 0);
  MESSAGE("seed " << seed << ": " << puts << " puts settled, " << keys_read << " keys read over 4 KiB rings ("
                  << bytes_through / 4096 << " laps, " << full << " waits on a full ring)");
}
