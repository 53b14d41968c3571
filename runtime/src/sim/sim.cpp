#include "fluxon/sim/sim.hpp"

#include <algorithm>
#include <cstdio>

namespace fluxon::sim {

Cluster::Cluster(uint64_t seed, const OwnerConfig& owner_cfg, int owners, std::vector<std::string> roles)
    : seed_(seed), rng_(seed) {
  std::printf("sim: seed=%llu\n", static_cast<unsigned long long>(seed));
  plan_.master_request = plan_.master_reply = plan_.fetch = kQuietLink;
  for (int i = 0; i < owners; ++i) {
    OwnerConfig c = owner_cfg;
    c.node_id = uint32_t(i + 1);
    if (size_t(i) < roles.size()) c.role = roles[size_t(i)];
    c.alone_in_cluster = owners == 1;
    owners_.emplace_back();
    owners_.back().cfg = c;
    start_owner(i, /*generation=*/1000 + uint64_t(i));
  }
}

void Cluster::start_owner(int i, uint64_t generation) {
  OwnerNode& n = owners_[size_t(i)];
  n.driver.reset();  // the driver refers to the core and the ports: it goes first
  n.core = std::make_unique<OwnerCore>(n.cfg, generation, "sim", n.cfg.dram_bytes);
  n.ports = std::make_unique<Ports>(*this, i);
  n.driver = std::make_unique<OwnerDriver>(*n.core, *n.ports, &plan_, &rng_);
  n.notes.clear();
  n.mem.clear();  // a new process: its segment is new memory
  n.incarnation++;
  // Registration goes through the faulty network like every other master message.
  n.driver->master_up(now_, /*reconnected=*/false);
}

void Cluster::restart_owner(int i) { start_owner(i, owners_[size_t(i)].core->generation() + 1); }

void Cluster::schedule(Millis delay, std::function<void()> fn) {
  events_.push(Event{now_ + delay, seq_++, std::move(fn)});
}

uint64_t Cluster::fired(FaultPoints::Point p, FaultPoints::Fault f) const {
  uint64_t n = 0;
  for (const auto& o : owners_) n += o.driver->faults().fired(p, f);
  return n;
}

void Cluster::Ports::reply(uint64_t token, Envelope& env) {
  c_.replies_.emplace(c_.client_token(owner_, token), std::move(env));
}

void Cluster::Ports::note(uint64_t session, Envelope& env) {
  if (auto* live = env.body.AsPutLive()) c_.owners_[owner_].notes[session].push_back(std::move(*live));
}

void Cluster::Ports::to_master(uint64_t token, SharedBytes bytes, Millis delay) {
  const uint64_t epoch = c_.master_epoch_, life = c_.owners_[owner_].incarnation;
  Cluster& c = c_;
  const int owner = owner_;
  // The master answers through the gate the daemon runs (MasterGate: leadership, terms).
  auto answer = [&c, owner, token, bytes, life](MasterCore& core, MasterGate& gate, bool leads) {
    auto req = decode(*bytes);
    Envelope rep = req.ok() ? gate.serve(core, **req, c.now_, leads, "") : error_envelope(req.status());
    if (life != c.owners_[owner].incarnation) return;  // the sender died: its connection with it
    c.owners_[owner].driver->master_replied(token, std::make_shared<const Bytes>(encode(rep)));
  };
  c.schedule(delay, [&c, answer, epoch] {
    if (epoch == c.master_epoch_) return answer(c.master_, c.gate_, true);
    // Sent to a leader that is paused now: it waits in its queue until the process runs again.
    if (c.paused_ && epoch == c.paused_->epoch) c.paused_->queue.push_back(answer);
    // else: sent to a master that has since died
  });
}

void Cluster::Ports::master_reply_later(uint64_t token, SharedBytes bytes, Millis delay) {
  const uint64_t epoch = c_.master_epoch_, life = c_.owners_[owner_].incarnation;
  Cluster& c = c_;
  const int owner = owner_;
  c.schedule(delay, [&c, owner, token, bytes, epoch, life] {
    if (epoch != c.master_epoch_ || life != c.owners_[owner].incarnation) return;  // the connection died
    c.owners_[owner].driver->on_master_reply(token, *bytes, c.now_);
  });
}

void Cluster::Ports::fetch(TransferBatch transfer, bool fail, Millis delay) {
  // The fetch reads the source's bytes when it ends (like a real transfer, it sees what the source
  // holds then); a failed one writes nothing.
  auto batch = std::make_shared<TransferBatch>(std::move(transfer));
  Cluster& c = c_;
  const int owner = owner_;
  const uint64_t life = c_.owners_[owner_].incarnation;
  c.schedule(delay, [&c, owner, batch, fail, life] {
    if (life != c.owners_[owner].incarnation) return;  // the requester died: nobody waits for it
    Status st = Status::ok();
    const int src = int(batch->source_node) - 1;
    if (c.partitions_.count({std::min(owner, src), std::max(owner, src)})) {
      c.fetches_partitioned_++;
      st = Status(Code::kTimeout, "sim: no route between the two owners' data planes");
    } else if (fail) st = Status(Code::kTimeout, "sim: data link failed");
    else if (src < 0 || src >= int(c.owners_.size()) || c.owners_[src].core->generation() != batch->source_generation)
      st = Status(Code::kGenerationMismatch, "sim: no such owner generation");
    if (st.is_ok()) {
      for (const auto& it : batch->items) {
        auto m = c.owners_[src].mem.find(it.src_offset);
        std::vector<uint8_t> bytes = m == c.owners_[src].mem.end() ? std::vector<uint8_t>() : m->second;
        bytes.resize(it.len);
        c.owners_[owner].mem[it.dst_offset] = std::move(bytes);
      }
      c.transfers_done_++;
      if (batch->read) {  // the source's data plane logs a reader's ranges, as the daemon's does
        std::vector<uint64_t> offsets;
        for (const auto& it : batch->items) offsets.push_back(it.src_offset);
        c.owners_[src].driver->on_peer_reads(offsets);
      }
    } else {
      c.transfers_failed_++;
    }
    c.owners_[owner].driver->on_transfer_done(batch->id, st, c.now_);
  });
}

// Like the actor's flush message: it runs after the events already due now (requests sent in the
// same instant join the same BatchGetStart, G9).
void Cluster::Ports::populate(uint64_t, uint64_t len) {
  // The simulated segment is plain memory: a range is faulted in at once.
  c_.owners_[size_t(owner_)].driver->on_populated(len);
}

void Cluster::Ports::flush_soon() {
  Cluster& c = c_;
  const int owner = owner_;
  c.schedule(0, [&c, owner] { c.owners_[owner].driver->flush(c.now_); });
}

std::vector<uint8_t> Cluster::read(int owner, uint64_t offset) const {
  auto it = owners_[owner].mem.find(offset);
  return it == owners_[owner].mem.end() ? std::vector<uint8_t>() : it->second;
}

void Cluster::restart_master() {
  master_ = MasterCore{};
  master_.set_tiers(tiers_.first, tiers_.second);
  master_epoch_++;
  for (auto& o : owners_) o.driver->master_up(now_, /*reconnected=*/true);
}

void Cluster::failover_master() {
  paused_.emplace(Paused{std::move(master_), gate_, master_epoch_, {}});
  master_ = MasterCore{};
  master_.set_tiers(tiers_.first, tiers_.second);
  gate_.term++;  // the standby's election: a newer term (E2)
  master_epoch_++;
  for (auto& o : owners_) o.driver->master_up(now_, /*reconnected=*/true);  // found through etcd: resync
}

void Cluster::resume_old_master() {
  if (!paused_) return;
  Paused old = std::move(*paused_);
  paused_.reset();
  // Its lease ran out while it was stopped: ElectionCore::serving() is false before it looks at
  // any request (E1), so what waited in its queue is answered "not the leader" (term 0).
  for (auto& answer : old.queue) answer(old.core, old.gate, false);
}

void Cluster::step_to(Millis t) {
  while (!events_.empty() && events_.top().at <= t) {
    Event e = events_.top();
    events_.pop();
    now_ = std::max(now_, e.at);  // after a clock jump, overdue events run at the new time
    e.fn();
  }
  now_ = std::max(now_, t);
}

void Cluster::partition_owners(int a, int b, bool cut) {
  const std::pair<int, int> k{std::min(a, b), std::max(a, b)};
  if (cut) partitions_.insert(k);
  else partitions_.erase(k);
}

void Cluster::jump_clock(Millis ms) {
  now_ += std::max<Millis>(ms, 1) - 1;  // the leap; the step delivers what fell due meanwhile, then ticks
  run_for(1);
}

void Cluster::run_for(Millis ms) {
  const Millis end = now_ + ms;
  while (now_ < end) {
    step_to(now_ + 1);
    master_.tick(now_);
    for (auto& o : owners_) o.driver->tick(now_);
  }
}

bool Cluster::run_until(const std::function<bool()>& pred, Millis limit) {
  const Millis end = now_ + limit;
  while (!pred()) {
    if (now_ >= end) return false;
    run_for(1);
  }
  return true;
}

uint64_t Cluster::open_session(int owner) {
  Envelope r = call(owner, 0, make_envelope(wire::HelloT{}));
  return r.body.AsHelloReply()->session_id;
}

Envelope Cluster::call(int owner, uint64_t session, Envelope req, Millis limit) {
  return wait(send(owner, session, std::move(req)), limit);
}

void Cluster::remove_key(int owner, const std::string& key) { owners_[owner].driver->remove_key(key, now_); }

void Cluster::close_session(int owner, uint64_t session) { owners_[owner].driver->close_session(session, now_); }

uint64_t Cluster::send(int owner, uint64_t session, Envelope req) {
  OwnerDriver& d = *owners_[owner].driver;
  req.session_id = session;
  // The client channel is same-host: it is not faulty, but it does go through the codec and the
  // daemon's entry (on_client_bytes: a get_start read in place).
  const Bytes bytes = encode(req);
  uint64_t token = 0;
  const Status st = d.on_client_bytes(bytes.data(), bytes.size(), now_, [&](uint64_t t) { token = t; });
  if (!st.is_ok()) throw std::logic_error("sim: a request the codec refused: " + st.to_string());
  return client_token(owner, token);
}

Envelope Cluster::wait(uint64_t token, Millis limit) {
  auto rep = try_wait(token, limit);
  return rep ? std::move(*rep) : error_envelope(Status(Code::kTimeout, "sim: no reply within limit"));
}

std::optional<Envelope> Cluster::try_wait(uint64_t token, Millis limit) {
  if (!run_until([&] { return replies_.count(token) > 0; }, limit)) return std::nullopt;
  Envelope rep = std::move(replies_.at(token));
  replies_.erase(token);
  return rep;
}

void Cluster::note(int owner, uint64_t session, Envelope n) {
  n.session_id = session;
  auto dec = decode(encode(n));
  owners_[owner].driver->on_client_note(**dec, now_);
}

std::vector<wire::PutLiveT> Cluster::take_put_live(int owner, uint64_t session) {
  auto it = owners_[owner].notes.find(session);
  if (it == owners_[owner].notes.end()) return {};
  return std::exchange(it->second, {});
}

}  // namespace fluxon::sim
