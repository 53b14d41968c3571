// The master's components on their own (master_core.hpp lists them): each keeps its containers
// within their bounds and counts every drop in its own table, which the master's counters() unites.
#include <doctest/doctest.h>

#include <string>

#include "fluxon/master/get_leases.hpp"
#include "fluxon/master/master_core.hpp"
#include "fluxon/master/reclaim_registry.hpp"
#include "fluxon/master/replica_placement.hpp"
#include "fluxon/master/route_registry.hpp"

namespace fluxon {

namespace {
// A registry with a source owner (node 1) and a target-role owner (node 2), and `n` routes k0..k{n-1}
// of node 1's put 1.
RouteRegistry registry_with(int n) {
  RouteRegistry routes({"remote_cache"});
  routes.owner(1) = OwnerInfo{1, "gpu", 1 << 20, "", 0};
  routes.owner(2) = OwnerInfo{1, "remote_cache", 1 << 20, "", 0};
  for (int i = 0; i < n; ++i) {
    const std::string key = "k" + std::to_string(i);
    routes.prepare(1, [&](size_t) -> std::string_view { return key; });
    Route& r = routes.emplace_prepared(key, 0, Version{1, 1, 1}, 4096);
    routes.add_replica(key, r, Replica{1, uint32_t(i), 1, uint64_t(i) * 4096, 1, 4096});
  }
  return routes;
}

wire::ReplicaPollT poll_of(uint32_t node, uint64_t poll_id, uint32_t max) {
  wire::ReplicaPollT p;
  p.node_id = node;
  p.generation = 1;
  p.poll_id = poll_id;
  p.max = max;
  p.keep_depth = -1;
  return p;
}
}  // namespace

TEST_CASE("master components: the replica queue drops its oldest task at its bound, counted, and hands the newest") {
  RouteRegistry routes = registry_with(5);
  ReplicaPlacement placement(ReplicaPlacement::Bounds{3, 8, 8, 8});
  for (int i = 0; i < 5; ++i) placement.add_task({"k" + std::to_string(i), Version{1, 1, 1}, 1, "", -1, false});
  CHECK(placement.queued() == 3);
  CHECK(placement.table().dropped_replica_tasks_total == 2);
  CHECK(placement.table().replica_tasks_total == 5);
  Envelope rep = placement.poll(poll_of(2, 1, 10), routes);
  const auto* r = rep.body.AsReplicaPollReply();
  REQUIRE(r);
  CHECK(r->keys == std::vector<std::string>{"k2", "k3", "k4"});  // k0 and k1 were the oldest
  CHECK(placement.targets().at(2) == 3);
}

TEST_CASE("master components: write-back tasks past their bound drop the first to expire, counted, that key is queued again") {
  RouteRegistry routes = registry_with(3);
  ReplicaPlacement placement(ReplicaPlacement::Bounds{100, 2, 8, 8});
  for (int i = 0; i < 3; ++i) placement.queue_writeback("k" + std::to_string(i), Version{1, 1, 1}, 1, "", -1, i);
  CHECK(placement.table().dropped_writeback_tasks_total == 1);
  CHECK_FALSE(placement.writeback_pending("k0", Version{1, 1, 1}, 10));  // dropped: forgotten
  CHECK(placement.writeback_pending("k1", Version{1, 1, 1}, 10));
  placement.queue_writeback("k1", Version{1, 1, 1}, 1, "", -1, 10);  // remembered: not queued twice
  placement.queue_writeback("k0", Version{1, 1, 1}, 1, "", -1, 10);  // forgotten: queued again
  CHECK(placement.queued() == 4);
  CHECK(placement.table().writeback_tasks_total == 4);
}

TEST_CASE("master components: unbacked notices stop at their bound per node, counted, a reply carries at most its share") {
  RouteRegistry routes = registry_with(6);
  ReplicaPlacement placement(ReplicaPlacement::Bounds{100, 100, 4, 3});
  for (int i = 0; i < 6; ++i) placement.note_unbacked("k" + std::to_string(i), *routes.route("k" + std::to_string(i)), routes);
  CHECK(placement.table().unbacked_noted_total == 4);
  CHECK(placement.table().unbacked_dropped_total == 2);
  Envelope a = make_envelope(wire::TierPollReplyT{}), b = make_envelope(wire::TierPollReplyT{});
  placement.hand_unbacked(1, a);
  placement.hand_unbacked(1, b);
  CHECK(a.unbacked == std::vector<std::string>{"k0", "k1", "k2"});
  CHECK(b.unbacked == std::vector<std::string>{"k3"});
}

TEST_CASE("master components: tombstones past their bound drop the first to expire, counted, its copy is no longer refused") {
  RouteRegistry routes({"remote_cache"}, 2);
  for (int i = 0; i < 3; ++i) routes.entomb("k" + std::to_string(i), 1, Version{1, 1, uint64_t(i + 1)}, 1, i);
  CHECK(routes.tombstone_count() == 2);
  CHECK(routes.table().dropped_tombstones_total == 1);
  CHECK_FALSE(routes.entombed("k0", 1, 1, Version{1, 1, 1}));
  CHECK(routes.entombed("k1", 1, 1, Version{1, 1, 2}));
  CHECK(routes.entombed("k2", 1, 1, Version{1, 1, 3}));
}

TEST_CASE("master components: ended get ids past their bound drop the first to expire, counted, the prepared gets stop at theirs") {
  GetLeases gets(1000, 2);
  gets.set_bound(2);
  for (int i = 0; i < 3; ++i) gets.note_ended({"k" + std::to_string(i), 5}, 7, i);
  CHECK(gets.table().dropped_ended_gets_total == 1);
  CHECK_FALSE(gets.ended({"k0", 5}, 7));
  CHECK(gets.ended({"k1", 5}, 7));
  CHECK(gets.start({"a", 5}, {1, 1, 1, Version{1, 1, 1}, 1000}));
  CHECK(gets.start({"b", 5}, {1, 1, 1, Version{1, 1, 1}, 1000}));
  CHECK_FALSE(gets.start({"c", 5}, {1, 1, 1, Version{1, 1, 1}, 1000}));
  CHECK(gets.table().refused_gets_total == 1);
  CHECK(gets.reading("a", 1) == 1);
  CHECK(gets.derived_bounds_violation().empty());
  gets.forget_requester(5, 10);  // a restart: its gets and ended ids go
  CHECK(gets.size() == 0);
  CHECK(gets.reading("a", 1) == 0);
  CHECK_FALSE(gets.ended({"a", 5}, 1));
}

TEST_CASE("master components: ended reclaims past their bound drop the first to expire, counted, a restart lifts its fences") {
  ReclaimRegistry reclaims(1000, 2);
  for (uint64_t e = 1; e <= 3; ++e)
    reclaims.note_ended(1, e, wire::ReclaimResult::Completed, wire::ReclaimBusy::None, Millis(e));
  CHECK(reclaims.table().dropped_ended_reclaims_total == 1);
  CHECK_FALSE(reclaims.ended(1, 1));
  CHECK(reclaims.ended(1, 3));
  reclaims.fence(4, 9, ReclaimRegistry::Txn{1, {{"x", Version{4, 1, 1}, 1, 0, 4096, 0}}, false});
  CHECK(reclaims.fenced("x", 4));
  reclaims.forget_node(4, 10);
  CHECK_FALSE(reclaims.fenced("x", 4));
  CHECK(reclaims.size() == 0);
  CHECK_FALSE(reclaims.ended(4, 9));  // its new generation numbers its epochs afresh
}

TEST_CASE("master components: the master's counters are its components' tables, each figure from the component that counts it") {
  MasterCore m(1000);
  wire::RegisterOwnerT reg;
  reg.node_id = 1;
  reg.generation = 1;
  reg.role = "gpu";
  reg.segment_len = 1 << 20;
  m.handle(make_envelope(std::move(reg)));
  wire::PutDoneT pd;
  pd.node_id = 1;
  pd.generation = 1;
  pd.put_id = 1;
  auto item = std::make_unique<wire::RouteItemT>();
  item->key = "k";
  item->len = 4096;
  item->slot_size = 4096;
  pd.items.push_back(std::move(item));
  m.handle(make_envelope(std::move(pd)));
  wire::BatchGetStartT gs;
  gs.node_id = 2;
  gs.generation = 1;
  auto gi = std::make_unique<wire::GetItemT>();
  gi->key = "missing";
  gi->get_id = 1;
  gs.items.push_back(std::move(gi));
  m.handle(make_envelope(std::move(gs)));
  m.handle(make_envelope(wire::PongT{}));  // not a request: the router's
  const MasterCounters& c = m.counters();
  CHECK(c.owners_registered_total == 2);  // node 1, and node 2 by its first request
  CHECK(c.routes_published_total == 1);
  CHECK(c.get_start_total == 1);
  CHECK(c.get_miss_total == 1);
  CHECK(c.malformed_total == 1);
  CHECK(c.errors_total == 1);
}

}  // namespace fluxon
