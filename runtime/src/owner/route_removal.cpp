#include "fluxon/owner/route_removal.hpp"

namespace fluxon {

void RouteRemoval::queue(Removals items, Millis now, Outbox& out) {
  const uint64_t id = next_job_++;
  auto [it, _] = jobs_.emplace(id, Job{std::move(items), 0});
  send(id, it->second, now, out);
}

void RouteRemoval::send(uint64_t id, Job& job, Millis now, Outbox& out) {
  wire::RemoveRoutesT rr;
  for (const Removal& r : job.items) {
    auto item = std::make_unique<wire::RemoveRouteT>();
    item->key = r.key;
    item->node_id = s_.cfg.node_id;
    item->generation = s_.generation;
    item->put_id = r.ver.put_id;
    item->origin_node = r.ver.origin_node;
    item->origin_generation = r.ver.origin_generation;
    item->instance = r.instance;
    rr.items.push_back(std::move(item));
  }
  const uint64_t tok = s_.new_token(JobKind::kRemove);
  jobs_.attempt(id, tok);
  jobs_.schedule(id, now + s_.cfg.publish_retry_ms);
  s_.to_master(tok, make_envelope(std::move(rr)), out);
}

// RemoveRoutes' answer: removed (or absent) items free their slots' routes; busy ones ask again.
std::vector<SlotRef> RouteRemoval::on_reply(uint64_t token, Envelope& reply, Millis now) {
  std::vector<SlotRef> unrouted;
  auto id = jobs_.id_of(token);
  if (!id) return unrouted;
  auto j = jobs_.find(*id);
  auto* rr = reply.body.AsRemoveRoutesReply();
  if (j == jobs_.end() || !rr || rr->removed.size() != j->second.items.size()) return unrouted;
  Job& job = j->second;
  jobs_.forget(*id);  // answered: a later reply to an earlier attempt finds nothing
  Removals busy;
  for (size_t i = 0; i < job.items.size(); ++i) {
    if (i < rr->busy.size() && rr->busy[i]) {
      // A remote get reads this copy now (activity fence): keep the slot, ask again later.
      s_.counters.remove_busy_total++;
      busy.push_back(std::move(job.items[i]));
      continue;
    }
    // Removed or already absent: either way no master route references the slot now.
    s_.pool.route_dropped(job.items[i].slot);
    unrouted.push_back(job.items[i].slot);
    s_.live_routes--;
    s_.counters.route_remove_total++;
  }
  if (busy.empty()) {
    jobs_.erase(j);
  } else {
    job.items = std::move(busy);  // the timer's key (next_send) stays valid until schedule() moves it
    jobs_.schedule(*id, now + s_.cfg.publish_retry_ms);
  }
  return unrouted;
}

void RouteRemoval::retry_due(Millis now, Outbox& out) {
  for (uint64_t id : jobs_.due(now)) send(id, jobs_.at(id), now, out);
}

void RouteRemoval::resend_all(Millis now, Outbox& out) {
  for (auto& [id, job] : jobs_) send(id, job, now, out);
}

}  // namespace fluxon
