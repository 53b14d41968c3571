// The client inside the whole-cluster simulation: the shipped ClientDriver and ClientCore (the code
// KvClient runs) put, read, cancel and release against simulated owners through faulty master
// links, over the shared-memory channel or directly, with their plans, handles, futures, batched
// acknowledgements, generation gate, reconnects and sessions given up; every byte is checked.
#include <map>
#include <memory>

#include "fluxon/client/client_core.hpp"
#include "fluxon/client/client_driver.hpp"
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

// A session of the simulation's client process: one OwnerLink over the owner's session, through
// the shared-memory channel (SimChannel) or directly. Its end is the client's session going down:
// the owner releases what it held. `stall`: the next call is sent but its answer comes too late
// (an owner that stalled past the call timeout).
class SimLink final : public OwnerLink {
 public:
  SimLink(sim::Cluster& c, int owner, LinkCallbacks cb, LinkInfo info, std::unique_ptr<SimChannel> ch, bool* stall,
          std::vector<SimLink*>& registry)
      : c_(c), owner_(owner), cb_(std::move(cb)), info_(std::move(info)), ch_(std::move(ch)), stall_(stall),
        registry_(registry) {
    registry_.push_back(this);
  }
  ~SimLink() override {
    std::erase(registry_, this);
    if (c_.owner(owner_).generation() != info_.generation) return;  // that owner process is gone
    if (ch_) ch_->client_dies();  // what it published reaches the owner, then its socket closes
    else c_.close_session(owner_, info_.session_id);
  }
  const LinkInfo& info() const override { return info_; }
  Result<std::unique_ptr<Envelope>> call(const Envelope& req, uint32_t timeout_ms) override {
    if (ch_) return std::make_unique<Envelope>(ch_->call(req));
    const uint64_t token = c_.send(owner_, info_.session_id, req);
    if (*stall_) {
      *stall_ = false;
      return Status(Code::kTimeout, "sim: the owner stalled");  // its answer lands later, unread
    }
    auto rep = c_.try_wait(token, timeout_ms);
    if (!rep) return Status(Code::kTimeout, "sim: no answer within " + std::to_string(timeout_ms) + " ms");
    return std::make_unique<Envelope>(std::move(*rep));
  }
  Result<std::unique_ptr<Envelope>> call_raw(Bytes bytes, uint32_t timeout_ms) override {
    auto env = decode(bytes);
    if (!env.ok()) return std::make_unique<Envelope>(error_envelope(env.status()));
    return call(**env, timeout_ms);
  }
  void notify(const Envelope& note) override {
    if (ch_) ch_->note(note);
    else c_.note(owner_, info_.session_id, note);
  }
  Result<std::unique_ptr<Envelope>> call_master(const Envelope&, uint32_t) override {
    return invalid_argument("no master in the client's process");
  }
  // The owner's PutLive notes for this session, handed to the client as the session actor does.
  void deliver_notes() {
    for (auto& live : c_.take_put_live(owner_, info_.session_id)) {
      Envelope env = make_envelope(std::move(live));
      cb_.on_note(env);
    }
  }
  void owner_down() { cb_.on_down(); }
  SimChannel* channel() { return ch_.get(); }

 private:
  sim::Cluster& c_;
  int owner_;
  LinkCallbacks cb_;
  LinkInfo info_;
  std::unique_ptr<SimChannel> ch_;
  bool* stall_;
  std::vector<SimLink*>& registry_;
};

// The simulation's ClientPorts: sessions on one owner of the cluster. The segment's addresses are
// one real arena (plan blobs hold pointers into it) for every generation; the bytes live in the
// simulator's segment. The flusher is a turn of the test loop.
class SimPorts final : public ClientPorts {
 public:
  static constexpr uint64_t kArena = 8ull << 20;  // small_owner's segment
  SimPorts(sim::Cluster& c, int owner, uint32_t ring_bytes, int slowness)
      : c_(c), owner_(owner), ring_bytes_(ring_bytes), slowness_(slowness), arena_(new uint8_t[kArena]) {}

  Result<Opened> open(LinkCallbacks cb) override {
    LinkInfo info;
    info.node_id = c_.owner(owner_).node_id();
    info.generation = c_.owner(owner_).generation();
    info.session_id = c_.open_session(owner_);
    info.segment_len = kArena;
    info.get_handle_ttl_ms = 1000;
    auto ch = ring_bytes_ ? std::make_unique<SimChannel>(c_, owner_, info.session_id, ring_bytes_, slowness_) : nullptr;
    auto link = std::make_unique<SimLink>(c_, owner_, std::move(cb), info, std::move(ch), &stall, links_);
    Opened o;
    o.link = std::unique_ptr<OwnerLink>(std::move(link));
    o.view = std::make_unique<Arena>(arena_.get());
    return o;
  }
  Millis now() override { return c_.now(); }
  void acks_waiting() override { flush_due_ = true; }

  bool take_flush_due() { return std::exchange(flush_due_, false); }
  // The links the driver holds, the newest last.
  std::vector<SimLink*>& links() { return links_; }
  uint64_t offset_of(uint64_t ptr) const { return ptr - reinterpret_cast<uint64_t>(arena_.get()); }
  bool stall = false;

 private:
  class Arena final : public SegmentView {
   public:
    explicit Arena(uint8_t* base) : base_(base) {}
    uint8_t* base() const override { return base_; }
    uint64_t size() const override { return kArena; }

   private:
    uint8_t* base_;
  };
  sim::Cluster& c_;
  int owner_;
  uint32_t ring_bytes_;
  int slowness_;
  std::unique_ptr<uint8_t[]> arena_;
  std::vector<SimLink*> links_;
  bool flush_due_ = false;
};

// A simulated KvClient: the shipped ClientDriver (and its ClientCore) over SimPorts.
class SimClient {
 public:
  // ring_bytes > 0: over a shared-memory channel of that ring size (slowness: see SimChannel).
  SimClient(sim::Cluster& c, int owner, uint32_t ring_bytes = 0, int slowness = 1)
      : c_(c), owner_(owner), ports_(c, owner, ring_bytes, slowness),
        driver_(ClientPolicy{/*max_wait_ms=*/0, /*rpc_timeout_ms=*/120000, /*embedded=*/false}, ports_) {
    REQUIRE(driver_.open().is_ok());
  }
  ~SimClient() { driver_.close(); }

  // put_start, write each value through its plan pointer, commit: whether it was committed.
  bool put(const std::vector<std::string>& keys, const std::map<std::string, std::vector<uint8_t>>& values) {
    auto plan = driver_.put_start(keys, 4096, PutOptionalArgs{false, false});
    if (!plan.ok()) return false;
    const auto* blob = reinterpret_cast<const uint64_t*>(*plan);
    CHECK(blob[0] == kPlanMagic);
    for (size_t i = 0; i < keys.size(); ++i) c_.write(owner_, ports_.offset_of(blob[2 + i]), values.at(keys[i]));
    auto f = driver_.put_commit(*plan);
    if (!f.ok()) return false;
    pending_.push_back(*f);
    return true;
  }

  // get_start then get_transfer of the whole prefix: the values read (missing keys: none).
  std::vector<std::vector<uint8_t>> get(const std::vector<std::string>& keys, bool cancel) {
    std::vector<std::vector<uint8_t>> got;
    auto started = driver_.get_start(keys, true, std::nullopt);
    if (!started.ok()) return got;
    if (cancel || started->second.transferable_len == 0) {
      CHECK(driver_.cancel(started->first).is_ok());
      return got;
    }
    auto plan = driver_.get_transfer(started->first, std::nullopt);
    if (!plan.ok()) return got;  // a remote key failed: the whole call did
    const auto* blob = reinterpret_cast<const uint64_t*>(*plan);
    for (uint64_t i = 0; i < blob[1]; ++i) {
      auto bytes = c_.read(owner_, ports_.offset_of(blob[2 + i]));
      bytes.resize(blob[2 + blob[1] + i]);
      got.push_back(std::move(bytes));
    }
    CHECK(driver_.release_views(*plan).is_ok());
    return got;
  }

  // A turn of the client's other threads: the session actor hands over the PutLive notes, the
  // flusher sends what waits. Futures done since: `settled`, `refused` those that did not go live.
  void turn(uint64_t& settled, uint64_t& refused) {
    for (auto* l : ports_.links()) l->deliver_notes();
    if (ports_.take_flush_due()) driver_.flush_acks();
    std::erase_if(pending_, [&](const KvFuture& f) {
      auto outcome = f.outcome();
      if (!outcome) return false;
      settled++;
      refused += !outcome->is_ok();
      return true;
    });
  }
  // The owner process died: the session actor reports it on each link.
  void owner_down() {
    for (auto* l : std::vector<SimLink*>(ports_.links())) l->owner_down();
  }
  ClientDriver& driver() { return driver_; }
  SimPorts& ports() { return ports_; }
  // A note addressed as the driver addresses them, to the newest session.
  Envelope addressed(Envelope e) {
    e.session_id = ports_.links().back()->info().session_id;
    e.generation = ports_.links().back()->info().generation;
    return e;
  }
  SimChannel* channel() { return ports_.links().back()->channel(); }
  size_t pending() const { return pending_.size(); }

 private:
  sim::Cluster& c_;
  int owner_;
  SimPorts ports_;
  ClientDriver driver_;
  std::vector<KvFuture> pending_;
};

std::vector<uint8_t> value_of(const std::string& key, uint64_t version) {
  std::vector<uint8_t> v(4096);
  const uint64_t h = std::hash<std::string>{}(key) ^ (version * 0x9E3779B97F4A7C15ull);
  for (size_t i = 0; i < v.size(); ++i) v[i] = uint8_t(h >> ((i % 8) * 8)) ^ uint8_t(i);
  return v;
}

}  // namespace

TEST_CASE("whole cluster with client drivers: V1 V3 G5 T1 - the shipped client policy (reconnect, sessions given up on a stall, flushed acknowledgements) under faults, owner and master restarts") {
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
  uint64_t version = 1, reads = 0, keys_read = 0, bad = 0, puts = 0, stalls = 0, mismatches = 0;
  for (int step = 0; step < 600; ++step) {
    const size_t who = rng() % clients.size();
    SimClient& cl = *clients[who];
    const uint64_t x = rng() % 100;
    // Each client writes its own keys (rewrites supersede its earlier versions); reads go to anyone's
    // (remote gets, joins, local hits).
    const size_t range = x < 40 ? who : rng() % clients.size(), start = rng() % 300, n = 1 + rng() % 8;
    std::vector<std::string> keys;
    for (size_t i = 0; i < n; ++i) keys.push_back("k" + std::to_string(range) + "_" + std::to_string((start + i) % 300));
    // Now and then the owner answers a call too late: the driver gives that session up, the next
    // call opens another, and the late answer's plan, handle or holdings go with the old session.
    if (rng() % 100 < 4) {
      cl.ports().stall = true;
      stalls++;
    }
    if (x < 40) {
      std::map<std::string, std::vector<uint8_t>> values;
      const uint64_t v = version++;
      for (const auto& k : keys) {
        values[k] = value_of(k, v);
        written[k].insert(values[k]);
      }
      puts += cl.put(keys, values);
    } else {
      const auto got = cl.get(keys, x >= 90);  // some reads are cancelled
      reads++;
      for (size_t i = 0; i < got.size(); ++i, keys_read++)
        if (!written[keys[i]].count(got[i])) {
          bad++;
          FAIL_CHECK("read of ", keys[i], " returned bytes no put of it wrote");
        }
    }
    cl.ports().stall = false;
    for (auto& k : clients) k->turn(settled, refused);
    if (step % 50 == 0) c.restart_master();  // the owners re-publish (T1): futures still settle
    if (step == 250 || step == 450) {
      // An owner process dies: its sessions' futures fail, the client reconnects to the next
      // generation and is refused until it maps it.
      const int o = step == 250 ? 1 : 2;
      c.restart_owner(o);
      clients[o]->owner_down();
      auto refused_call = clients[o]->driver().get_start({"k0_0"}, true, std::nullopt);
      CHECK(refused_call.status().code() == Code::kGenerationMismatch);
      mismatches += refused_call.status().code() == Code::kGenerationMismatch;
      auto seg = clients[o]->driver().segment();
      REQUIRE(seg.ok());
      CHECK(seg->generation == c.owner(o).generation());
    }
  }
  c.to_master = c.from_master = c.data = sim::kQuietLink;
  for (auto& k : clients) k->driver().flush_acks();
  REQUIRE(c.run_until([&] {
    size_t waiting = 0;
    for (auto& k : clients) {
      k->turn(settled, refused);
      waiting += k->pending();
    }
    return waiting == 0;
  }, 60000));
  c.run_for(2000);
  // V3: every committed put's future settled; T1, the re-publications, the stalls and the owner
  // restarts lose none.
  CHECK(settled == puts);
  CHECK(mismatches == 2);
  for (int o : {0, 1, 2}) {
    auto st = c.owner(o).stats();
    // Every view released, every cancelled handle and tail given back, and what late answers
    // created for a session given up released with it (G5).
    CHECK(st.holders == 0);
    CHECK(st.active_get_handles == 0);
    CHECK(st.active_put_plans == 0);
    CHECK(st.sessions == 1);  // the client's current session: every one given up is closed
    const auto reg = clients[o]->driver().registry();
    CHECK(reg.put_plans + reg.read_plans + reg.handles == 0);
  }
  CHECK(bad == 0);
  CHECK(stalls > 10);
  MESSAGE("seed " << seed << ": " << puts << " puts settled (" << refused << " refused or lost), " << reads << " reads of "
                  << keys_read << " keys checked; " << stalls << " sessions given up; messages dropped "
                  << c.messages_dropped());
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

TEST_CASE("whole cluster with client drivers over shared-memory channels: V1 V3 G5 - small rings wrapping round, full rings, slow owners, a client dying mid-call, a client cut off for garbage") {
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
    for (auto& k : clients) k->turn(settled, refused);
    if (step == 200) {  // a burst of one-way notes to the slow owner: its ring fills, the client waits
      SimClient& burst = *clients[2];
      for (int i = 0; i < 200; ++i) burst.channel()->note(burst.addressed(make_envelope(wire::AckBatchT{})));
      CHECK(burst.channel()->full_waits() > 0);
    }
    if (step == 150 || step == 300) {
      // Owner 0's client dies holding views and a prepared put, a request of it still in the ring
      // (step 150), or is cut off for garbage with a request behind it (step 300, owner 1).
      const int o = step == 150 ? 0 : 1;
      SimClient& victim = *clients[o];
      for (int i = 0; i < 3; ++i) {
        // A handle it never uses.
        REQUIRE(victim.driver().get_start({"k" + std::to_string(o) + "_" + std::to_string(i)}, true, std::nullopt).ok());
      }
      REQUIRE(victim.driver().put_start({"dead" + std::to_string(step)}, 4096, PutOptionalArgs{}).ok());  // never committed
      if (step == 150) {
        victim.channel()->client_dies();
      } else {
        victim.channel()->publish_garbage();
        CHECK(victim.driver().get_start({"k1_0"}, true, std::nullopt).status().code() == Code::kClosed);
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
  for (auto& k : clients) k->driver().flush_acks();
  REQUIRE(c.run_until([&] {
    size_t waiting = 0;
    for (auto& k : clients) {
      k->turn(settled, refused);
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
