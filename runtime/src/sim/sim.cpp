#include "fluxon/sim/sim.hpp"

#include <cstdio>

namespace fluxon::sim {

Cluster::Cluster(uint64_t seed, const OwnerConfig& owner_cfg, int owners, std::vector<std::string> roles)
    : seed_(seed), rng_(seed) {
  std::printf("sim: seed=%llu\n", static_cast<unsigned long long>(seed));
  for (int i = 0; i < owners; ++i) {
    OwnerConfig c = owner_cfg;
    c.node_id = uint32_t(i + 1);
    if (size_t(i) < roles.size()) c.role = roles[size_t(i)];
    c.alone_in_cluster = owners == 1;
    OwnerNode n;
    n.core = std::make_unique<OwnerCore>(c, /*generation=*/1000 + i, "sim", c.dram_bytes);
    owners_.push_back(std::move(n));
    // Registration goes through the faulty network like every other master message.
    Outbox out;
    owners_.back().core->start(now_, out);
    flush(i, out);
  }
}

void Cluster::schedule(Millis delay, std::function<void()> fn) {
  events_.push(Event{now_ + delay, seq_++, std::move(fn)});
}

void Cluster::send_over(const LinkFaults& f, std::function<void()> deliver) {
  std::uniform_real_distribution<double> u(0, 1);
  std::uniform_int_distribution<Millis> d(f.min_delay, std::max(f.min_delay, f.max_delay));
  if (u(rng_) < f.drop) {
    dropped_++;
    return;
  }
  schedule(d(rng_), deliver);
  if (u(rng_) < f.duplicate) {
    duplicated_++;
    schedule(d(rng_), deliver);
  }
}

void Cluster::flush(int owner, Outbox& out) {
  for (auto& o : out) {
    switch (o.kind) {
      case OwnerOut::Kind::kReply:
        replies_.emplace(o.token, std::move(o.env));
        break;
      case OwnerOut::Kind::kNote:
        if (auto* live = o.env.body.AsPutLive()) owners_[owner].notes[o.session].push_back(std::move(*live));
        break;
      case OwnerOut::Kind::kMaster: {
        // Encode once: the simulated wire carries bytes, like the real one.
        auto bytes = std::make_shared<Bytes>(encode(o.env));
        const uint64_t token = o.token;
        const uint64_t epoch = master_epoch_;
        send_over(to_master, [this, owner, token, bytes, epoch] {
          if (epoch != master_epoch_) return;  // sent to a master that has since died
          auto req = decode(*bytes);
          Envelope rep = req.ok() ? master_.handle(**req, now_) : error_envelope(req.status());
          auto rbytes = std::make_shared<Bytes>(encode(rep));
          send_over(from_master, [this, owner, token, rbytes, epoch] {
            if (epoch != master_epoch_) return;  // the connection died with that master
            auto r = decode(*rbytes);
            if (!r.ok() || token == 0) return;
            Outbox out2;
            owners_[owner].core->on_master_reply(token, **r, now_, out2);
            flush(owner, out2);
          });
        });
        break;
      }
      case OwnerOut::Kind::kTransfer: {
        // The fetch reads the source's bytes when it ends (like a real transfer, it sees what the
        // source holds then); a failed one writes nothing.
        auto batch = std::make_shared<TransferBatch>(std::move(o.transfer));
        std::uniform_real_distribution<double> u(0, 1);
        std::uniform_int_distribution<Millis> d(data.min_delay, std::max(data.min_delay, data.max_delay));
        const bool fail = u(rng_) < data.drop;
        schedule(d(rng_), [this, owner, batch, fail] {
          Status st = Status::ok();
          const int src = int(batch->source_node) - 1;
          if (fail) st = Status(Code::kTimeout, "sim: data link failed");
          else if (src < 0 || src >= int(owners_.size()) || owners_[src].core->generation() != batch->source_generation)
            st = Status(Code::kGenerationMismatch, "sim: no such owner generation");
          if (st.is_ok()) {
            for (const auto& it : batch->items) {
              auto m = owners_[src].mem.find(it.src_offset);
              std::vector<uint8_t> bytes = m == owners_[src].mem.end() ? std::vector<uint8_t>() : m->second;
              bytes.resize(it.len);
              owners_[owner].mem[it.dst_offset] = std::move(bytes);
            }
            transfers_done_++;
          } else {
            transfers_failed_++;
          }
          Outbox out2;
          owners_[owner].core->on_transfer_done(batch->id, st, now_, out2);
          flush(owner, out2);
        });
        break;
      }
    }
  }
  out.clear();
}

std::vector<uint8_t> Cluster::read(int owner, uint64_t offset) const {
  auto it = owners_[owner].mem.find(offset);
  return it == owners_[owner].mem.end() ? std::vector<uint8_t>() : it->second;
}

void Cluster::restart_master() {
  master_ = MasterCore{};
  master_epoch_++;
  for (size_t i = 0; i < owners_.size(); ++i) {
    Outbox out;
    owners_[i].core->on_master_reconnected(now_, out);
    flush(int(i), out);
  }
}

void Cluster::step_to(Millis t) {
  while (!events_.empty() && events_.top().at <= t) {
    Event e = events_.top();
    events_.pop();
    now_ = e.at;
    e.fn();
  }
  now_ = t;
}

void Cluster::run_for(Millis ms) {
  const Millis end = now_ + ms;
  while (now_ < end) {
    step_to(now_ + 1);
    master_.tick(now_);
    for (size_t i = 0; i < owners_.size(); ++i) {
      Outbox out;
      owners_[i].core->tick(now_, out);
      flush(int(i), out);
    }
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

void Cluster::remove_key(int owner, const std::string& key) {
  Outbox out;
  owners_[owner].core->remove_key(key, now_, out);
  flush(owner, out);
}

void Cluster::close_session(int owner, uint64_t session) {
  Outbox out;
  owners_[owner].core->close_session(session, out);
  flush(owner, out);
}

uint64_t Cluster::send(int owner, uint64_t session, Envelope req) {
  const uint64_t token = next_token_++;
  req.session_id = session;
  // The client channel is same-host: it is not faulty, but it does go through the codec.
  auto dec = decode(encode(req));
  Outbox out;
  owners_[owner].core->on_client_request(token, **dec, now_, out);
  flush(owner, out);
  return token;
}

Envelope Cluster::wait(uint64_t token, Millis limit) {
  if (!run_until([&] { return replies_.count(token) > 0; }, limit))
    return error_envelope(Status(Code::kTimeout, "sim: no reply within limit"));
  Envelope rep = std::move(replies_.at(token));
  replies_.erase(token);
  return rep;
}

void Cluster::note(int owner, uint64_t session, Envelope n) {
  n.session_id = session;
  auto dec = decode(encode(n));
  Outbox out;
  owners_[owner].core->on_client_note(**dec, now_, out);
  flush(owner, out);
}

std::vector<wire::PutLiveT> Cluster::take_put_live(uint64_t session) {
  std::vector<wire::PutLiveT> r;
  for (auto& o : owners_) {
    auto it = o.notes.find(session);
    if (it == o.notes.end()) continue;
    for (auto& n : it->second) r.push_back(std::move(n));
    it->second.clear();
  }
  return r;
}

}  // namespace fluxon::sim
