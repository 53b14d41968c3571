// The client's control channel: a session actor (receives notes, watches the owner) and blocking
// request/reply calls from the caller's thread. Embedded mode spawns the master and owner actors
// in this process; external mode reaches the owner as a CAF remote actor.
#include <cstdio>
#include <map>
#include <mutex>
#include <thread>

#include "caf_types.hpp"
#include "fluxon/actors/runtime.hpp"
#include "fluxon/runtime/channel.hpp"

namespace fluxon::actors {

namespace {

struct SessionState {
  SessionState() = default;  // not an aggregate: see OwnerState (CAF constructs states from the actor pointer)
  caf::actor owner;
  LinkCallbacks cb;
  // Calls to a remote owner waiting for their replies: the owner's death answers them all at once
  // (a CAF request to a node whose connection closed would otherwise wait out its timeout).
  std::map<uint64_t, caf::response_promise> calls;
  uint64_t next_call = 0;
  bool down = false;
  static inline const char* name = "fluxon_client_session";
};

Blob closed_reply(const std::string& why) { return Blob{encode(error_envelope(Status(Code::kClosed, why)))}; }

// prove: the owner is remote (behind its gate): the session proves the cluster key before its Hello.
caf::behavior session_actor(caf::stateful_actor<SessionState>* self, caf::actor owner, LinkCallbacks cb, bool prove,
                            AuthKeyPtr key, std::string peer) {
  self->state.owner = owner;
  self->state.cb = std::move(cb);
  self->monitor(owner);
  self->set_down_handler([=](caf::down_msg& dm) {
    if (dm.source != self->state.owner.address()) return;
    self->state.down = true;
    for (auto& [id, rp] : std::exchange(self->state.calls, {}))
      rp.deliver(closed_reply("the owner went away (its connection closed) while this call waited"));
    if (self->state.cb.on_down) self->state.cb.on_down();
  });
  return {
      // A call to the remote owner, answered by its reply, its timeout, or the owner's death.
      [=](call_atom, Blob& req, uint32_t timeout_ms) -> caf::response_promise {
        auto rp = self->make_response_promise();
        if (self->state.down) {
          rp.deliver(closed_reply("the owner is gone (its connection closed)"));
          return rp;
        }
        const uint64_t id = self->state.next_call++;
        self->state.calls.emplace(id, rp);
        self->request(self->state.owner, std::chrono::milliseconds(timeout_ms), std::move(req))
            .then(
                [=](Blob& r) {
                  auto it = self->state.calls.find(id);
                  if (it == self->state.calls.end()) return;  // answered by the owner's death
                  it->second.deliver(std::move(r));
                  self->state.calls.erase(it);
                },
                [=](caf::error& e) {
                  auto it = self->state.calls.find(id);
                  if (it == self->state.calls.end()) return;
                  it->second.deliver(std::move(e));
                  self->state.calls.erase(it);
                });
        return rp;
      },
      [=](Note& n) {
        auto env = decode(n.bytes);
        if (env.ok() && self->state.cb.on_note) self->state.cb.on_note(**env);
      },
      // A note to the owner: sent from this actor (the owner's gate admits this node's actors).
      [=](out_atom, Note& n) { self->send(self->state.owner, std::move(n)); },
      // The Hello goes out from this actor so that the owner learns where to send notes; before it,
      // this actor proves the cluster key to the owner's gate (its node is what gets admitted).
      [=](hello_atom, Blob& hello, uint32_t timeout_ms) -> caf::response_promise {
        auto rp = self->make_response_promise();
        auto send_hello = [=](Blob h) mutable {
          self->request(self->state.owner, std::chrono::milliseconds(timeout_ms), std::move(h))
              .then([rp](Blob& r) mutable { rp.deliver(std::move(r)); },
                    [rp](caf::error& e) mutable { rp.deliver(std::move(e)); });
        };
        if (!prove) {
          send_hello(std::move(hello));
          return rp;
        }
        prove_key(self, self->state.owner, key, std::chrono::milliseconds(timeout_ms), peer,
                  [=, h = std::move(hello)](Status proven) mutable {
                    if (!proven.is_ok()) return rp.deliver(Blob{encode(error_envelope(proven))});
                    send_hello(std::move(h));
                  });
        return rp;
      },
  };
}

class CafOwnerLink final : public OwnerLink {
 public:
  CafOwnerLink() = default;
  ~CafOwnerLink() override {
    if (session_) caf::anon_send_exit(session_, caf::exit_reason::user_shutdown);
    if (embedded_owner_) caf::anon_send_exit(embedded_owner_, caf::exit_reason::user_shutdown);
    if (embedded_master_) caf::anon_send_exit(embedded_master_, caf::exit_reason::user_shutdown);
    owner_ = caf::actor{};
    session_ = caf::actor{};
    embedded_owner_ = caf::actor{};
    embedded_master_ = caf::actor{};
    // An actor system whose peer died may take long to stop (CAF waits for its connection actors);
    // the caller of the call that replaced this link never waits for that: it stops on a thread
    // of its own. Embedded systems stop here (their owner's segment must be gone on return).
    if (info_.embedded) {
      sys_.reset();
    } else {
      // The system refers to its config: both go to the thread, system first.
      std::thread([sys = std::move(sys_), cfg = std::move(cfg_)]() mutable {
        sys.reset();
        cfg.reset();
      }).detach();
    }
  }

  Status open(const ClusterConfig& cfg, LinkCallbacks cb, AuthKeyPtr key) {
    cfg_ = std::make_unique<caf::actor_system_config>();
    configure(*cfg_, !cfg.embedded());
    sys_ = std::make_unique<caf::actor_system>(*cfg_);
    timeout_ms_ = cfg.client.rpc_timeout_ms;
    if (cfg.embedded()) {
      auto ocfg = cfg.owner(0);
      if (!ocfg.ok()) return ocfg.status();
      embedded_master_ = spawn_master(*sys_, cfg, false);
      std::string err;
      embedded_owner_ = spawn_owner(*sys_, cfg, *ocfg, embedded_master_, "", 0, false, &err);
      if (!embedded_owner_) return Status(Code::kInternal, "embedded owner: " + err);
      owner_ = embedded_owner_;
      info_.embedded = true;
    } else {
      const auto& addr = cfg.client.owner_address;
      auto colon = addr.rfind(':');
      if (colon == std::string::npos) return invalid_argument("owner_address: expected host:port, got '" + addr + "'");
      const std::string host = addr.substr(0, colon);
      int port = 0;
      try {
        port = std::stoi(addr.substr(colon + 1));
      } catch (...) {
      }
      if (port <= 0 || port > 65535) return invalid_argument("owner_address: bad port in '" + addr + "'");
      auto o = sys_->middleman().remote_actor(host, uint16_t(port));
      if (!o) return Status(Code::kClosed, "owner at " + addr + " is not reachable: " + sys_->render(o.error()));
      owner_ = *o;
    }
    session_ = sys_->spawn(session_actor, owner_, std::move(cb), !cfg.embedded(), std::move(key),
                           "the owner at " + cfg.client.owner_address);
    caf::scoped_actor self{*sys_};
    Result<std::unique_ptr<Envelope>> reply = Status(Code::kClosed, "no reply to hello");
    self->request(session_, caf::infinite, hello_atom::value, Blob{encode(make_envelope(wire::HelloT{{}, uint64_t(getpid())}))},
                  timeout_ms_)
        .receive([&](Blob& b) { reply = decode(b.bytes); },
                 [&](caf::error& e) { reply = Status(Code::kClosed, "hello: " + sys_->render(e)); });
    if (!reply.ok()) return reply.status();
    auto* h = (*reply)->body.AsHelloReply();
    if (!h) return envelope_status(**reply).is_ok() ? Status(Code::kInternal, "hello: unexpected reply")
                                                     : envelope_status(**reply);
    info_.node_id = h->node_id;
    info_.generation = h->generation;
    info_.session_id = h->session_id;
    info_.segment_name = h->segment_name;
    info_.segment_len = h->segment_len;
    info_.get_handle_ttl_ms = h->get_handle_ttl_ms;
    info_.grant_bytes = h->grant_bytes;
    return Status::ok();
  }

  const LinkInfo& info() const override { return info_; }

  Result<std::unique_ptr<Envelope>> call_raw(Bytes bytes, uint32_t timeout_ms) override {
    return request(owner_, std::move(bytes), timeout_ms);
  }

  Result<std::unique_ptr<Envelope>> call(const Envelope& req, uint32_t timeout_ms) override {
    return request(owner_, encode(req), timeout_ms);
  }

  Result<std::unique_ptr<Envelope>> call_master(const Envelope& req, uint32_t timeout_ms) override {
    if (!embedded_master_) return Status(Code::kInvalidArgument, "no master in this process (external client)");
    return request(embedded_master_, encode(req), timeout_ms);
  }

  void notify(const Envelope& note) override { caf::anon_send(session_, out_atom::value, Note{encode(note)}); }

 private:
  Result<std::unique_ptr<Envelope>> request(const caf::actor& dst, Bytes bytes, uint32_t timeout_ms) {
    Result<std::unique_ptr<Envelope>> reply = Status(Code::kClosed, "owner: no reply");
    caf::scoped_actor self{*sys_};
    const uint32_t ms = timeout_ms ? timeout_ms : timeout_ms_;
    // A remote owner's calls go through the session actor: the owner's death answers them at once.
    // (Its own timeout fires first: the session's request carries the caller's.)
    auto req = dst == owner_ && !info_.embedded && session_
                   ? self->request(session_, std::chrono::milliseconds(ms + 1000), call_atom::value,
                                   Blob{std::move(bytes)}, ms)
                   : self->request(dst, std::chrono::milliseconds(ms), Blob{std::move(bytes)});
    std::move(req).receive([&](Blob& b) { reply = decode(b.bytes); },
                 [&](caf::error& e) {
                   if (e == caf::sec::request_timeout)
                     reply = Status(Code::kTimeout, "owner did not answer within " + std::to_string(ms) + " ms");
                   else
                     reply = Status(Code::kClosed, "owner connection: " + sys_->render(e));
                 });
    return reply;
  }

  std::unique_ptr<caf::actor_system_config> cfg_;  // declared first: destroyed after sys_
  std::unique_ptr<caf::actor_system> sys_;
  caf::actor owner_, session_, embedded_owner_, embedded_master_;
  LinkInfo info_;
  uint32_t timeout_ms_ = 60000;
};

// A same-host owner: requests and acknowledgements over the shared-memory channel; the CAF link
// stays for the session itself (hello, notes, the owner's death) and for what does not fit a ring.
// The session actor tells the channel of the owner's death (its waits end at once), for as long as
// the channel lives.
struct DownHook {
  std::mutex m;
  channel::Client* ch = nullptr;
  void fire() {
    std::lock_guard<std::mutex> g(m);
    if (ch) ch->mark_down();
  }
  void set(channel::Client* c) {
    std::lock_guard<std::mutex> g(m);
    ch = c;
  }
};

class ChannelOwnerLink final : public OwnerLink {
 public:
  ChannelOwnerLink(std::unique_ptr<CafOwnerLink> caf, std::unique_ptr<channel::Client> ch,
                   std::shared_ptr<DownHook> hook)
      : caf_(std::move(caf)), ch_(std::move(ch)), hook_(std::move(hook)) {
    hook_->set(ch_.get());
  }
  ~ChannelOwnerLink() override {
    hook_->set(nullptr);
    ch_.reset();  // the owner sees the channel close before the session actor goes
    caf_.reset();
  }
  const LinkInfo& info() const override { return caf_->info(); }
  Result<std::unique_ptr<Envelope>> call(const Envelope& req, uint32_t timeout_ms) override {
    return call_raw(encode(req), timeout_ms);
  }
  Result<std::unique_ptr<Envelope>> call_raw(Bytes bytes, uint32_t timeout_ms) override {
    if (bytes.size() > ch_->max_request()) return caf_->call_raw(std::move(bytes), timeout_ms);
    auto r = ch_->call(bytes, timeout_ms);
    if (!r.ok()) return r.status();
    return decode(*r);
  }
  void notify(const Envelope& note) override {
    Bytes b = encode(note);
    if (b.size() > ch_->max_request() || !ch_->notify(b).is_ok()) caf_->notify(note);
  }
  Result<std::unique_ptr<Envelope>> call_master(const Envelope& req, uint32_t timeout_ms) override {
    return caf_->call_master(req, timeout_ms);
  }

 private:
  std::unique_ptr<CafOwnerLink> caf_;
  std::unique_ptr<channel::Client> ch_;
  std::shared_ptr<DownHook> hook_;
};

}  // namespace
}  // namespace fluxon::actors

namespace fluxon {

Result<std::unique_ptr<OwnerLink>> open_owner_link(const ClusterConfig& cfg, LinkCallbacks cb) {
  AuthKeyPtr key;
  if (cfg.auth.enabled() && !cfg.embedded()) {
    auto k = load_key_file(cfg.auth.key_file);
    if (!k.ok()) return k.status();
    key = *k;
  }
  auto link = std::make_unique<actors::CafOwnerLink>();
  auto hook = std::make_shared<actors::DownHook>();
  if (!cfg.embedded() && cfg.client.channel != "caf") {
    cb.on_down = [hook, next = std::move(cb.on_down)] {
      hook->fire();
      if (next) next();
    };
  }
  Status s = link->open(cfg, std::move(cb), key);
  if (!s.is_ok()) return s;
  if (cfg.embedded() || cfg.client.channel == "caf") return std::unique_ptr<OwnerLink>(std::move(link));
  const LinkInfo& info = link->info();
  auto ch = channel::Client::connect(channel::socket_name(cfg.cluster_name, info.node_id, info.generation),
                                     info.session_id, info.generation, cfg.client.channel_spin_us, key);
  if (!ch.ok()) {
    if (cfg.client.channel == "shm")
      return Status(ch.status().code(), "client.channel is shm: " + ch.status().message());
    return std::unique_ptr<OwnerLink>(std::move(link));  // another host: CAF it is
  }
  return std::unique_ptr<OwnerLink>(
      std::make_unique<actors::ChannelOwnerLink>(std::move(link), std::move(ch.value()), std::move(hook)));
}

}  // namespace fluxon
