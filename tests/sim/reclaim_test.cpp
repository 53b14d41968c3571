// Fenced source reclaim: one test per row of the design's constraint table ("Local-side 主动驱逐与
// 安全回收"), against the master alone (MasterCore driven by hand) and against an owner and a master
// wired by hand (Rig: every owner->master message can be held, dropped or delivered late).
#include <deque>
#include <set>

#include "helpers.hpp"

using namespace fluxon;
using namespace fluxon::test;

namespace {

using R = wire::ReclaimResult;

// ---- the master alone ---------------------------------------------------------------------------

struct Copy {
  std::string key;
  uint64_t put_id = 0, offset = 0, slot_size = 4096;
  uint32_t group = 0;
  uint64_t instance = 0;  // the copy's local identity (0: its put)
};

// PutDone of node's put `put_id`: the copies, with their groups and slots.
void publish(MasterCore& m, uint32_t node, uint64_t put_id, const std::vector<Copy>& copies) {
  m_ensure_registered(m, node);
  wire::PutDoneT pd;
  pd.node_id = node;
  pd.generation = 1;
  pd.put_id = put_id;
  for (const auto& c : copies) {
    auto it = std::make_unique<wire::RouteItemT>();
    it->key = c.key;
    it->offset = c.offset;
    it->len = 4096;
    it->group = c.group;
    it->slot_size = c.slot_size;
    pd.items.push_back(std::move(it));
  }
  auto r = m.handle(make_envelope(std::move(pd)));
  REQUIRE(r.body.AsPutDoneReply());
}

struct Answer {
  R result;
  wire::ReclaimBusy busy;
};

Answer reclaim(MasterCore& m, uint32_t node, uint64_t epoch, wire::ReclaimStep step, const std::vector<Copy>& copies,
               bool tp = false, uint64_t generation = 1) {
  std::vector<ReclaimCopy> rc;
  for (const auto& c : copies)
    rc.push_back({c.key, node, c.put_id, c.instance ? c.instance : c.put_id, c.offset, c.slot_size, c.group});
  const auto rep = m_reclaim(m, node, generation, epoch, step, false, tp, rc);
  return {rep.result, rep.busy};
}

Answer fence(MasterCore& m, uint32_t node, uint64_t epoch, const std::vector<Copy>& c, bool tp = false) {
  return reclaim(m, node, epoch, wire::ReclaimStep::Fence, c, tp);
}
Answer commit(MasterCore& m, uint32_t node, uint64_t epoch, const std::vector<Copy>& c) {
  return reclaim(m, node, epoch, wire::ReclaimStep::Commit, c);
}
Answer abort_(MasterCore& m, uint32_t node, uint64_t epoch, const std::vector<Copy>& c) {
  return reclaim(m, node, epoch, wire::ReclaimStep::Abort, c);
}

// A cohort of two on node 1: put 5, group 0, slots at 0 and 4096.
const std::vector<Copy> kPair = {{"a", 5, 0}, {"b", 5, 4096}};

MasterCore master_with_pair() {
  MasterCore m;
  publish(m, 1, 5, kPair);
  return m;
}

}  // namespace

TEST_CASE("reclaim linearisation: a fence waits for the get and replica leases on its members, and once installed no get takes the source and no put of the key publishes") {
  MasterCore m = master_with_pair();
  publish(m, 3, 9, {{"c", 9, 0}});
  // A remote get of node 2 reads a (a lease on node 1's copy): the whole cohort waits.
  REQUIRE(m_start(m, 2, "a", 1) == wire::GetStartStatus::Started);
  auto busy = fence(m, 1, 100, kPair);
  CHECK(busy.result == R::RetryableBusy);
  CHECK(busy.busy == wire::ReclaimBusy::Activity);
  CHECK(m.reclaim_fence_count() == 0);  // none of the two
  REQUIRE(m_done(m, 2, "a", 1, 8192) == wire::GetDoneStatus::Live);
  // A late duplicate of the refused attempt is refused again: it never installs a fence its owner,
  // gone on to another epoch, would not lift.
  CHECK(fence(m, 1, 100, kPair).result == R::RetryableBusy);
  CHECK(m.reclaim_fence_count() == 0);
  // Node 2's copy of a is a replica of its own: node 1's fence no longer waits for anyone.
  CHECK(fence(m, 1, 101, kPair).result == R::Fenced);
  CHECK(m.reclaim_fence_count() == 2);
  // Fenced: b's only copy is node 1's: no new lease (Busy, not routed to a slot being freed)...
  CHECK(m_start(m, 3, "b", 1) == wire::GetStartStatus::Busy);
  // ...while a is served by node 2's copy, never by the fenced one.
  wire::BatchGetStartT g;
  g.node_id = 3;
  g.generation = 1;
  g.items.push_back(std::make_unique<wire::GetItemT>(wire::GetItemT{{}, "a", 2}));
  auto started = m.handle(make_envelope(std::move(g)));
  REQUIRE(started.body.AsBatchGetStartReply()->items[0]->status == wire::GetStartStatus::Started);
  CHECK(started.body.AsBatchGetStartReply()->items[0]->source_node == 2);
  // A put of a fenced key from the fenced node takes no lease: the whole PutDone is refused, applied nowhere.
  wire::PutDoneT pd;
  pd.node_id = 1;
  pd.generation = 1;
  pd.put_id = 6;
  for (const char* k : {"z", "b"}) {
    pd.items.push_back(std::make_unique<wire::RouteItemT>());
    pd.items.back()->key = k;
    pd.items.back()->offset = 8192;
    pd.items.back()->len = 4096;
  }
  auto refused = m.handle(make_envelope(pd));
  CHECK(refused.body.AsError());
  CHECK(m.route_put_id("z") == 0);
  CHECK(m.counters().reclaim_refused_puts_total == 1);
  CHECK(m.counters().reclaim_refused_gets_total == 1);
  // Removal and demotion of a fenced copy wait too.
  bool removal_busy = false;
  CHECK_FALSE(m_remove(m, 1, "b", 1, 5, &removal_busy));
  CHECK(removal_busy);
  CHECK(commit(m, 1, 101, kPair).result == R::Completed);
  CHECK(m.reclaim_fence_count() == 0);
  CHECK(m.replica_nodes("a") == std::vector<uint32_t>{2});  // only the source went (S3)
  CHECK(m.route_put_id("b") == 0);                          // the last copy may go: a later miss
  CHECK(m.handle(make_envelope(pd)).body.AsPutDoneReply());  // the put publishes now
}

TEST_CASE("reclaim version isolation: a fence or commit naming another version than the route's is Stale and removes nothing") {
  MasterCore m = master_with_pair();
  std::vector<Copy> old = kPair;
  for (auto& c : old) c.put_id = 4;  // an older put of the same keys
  CHECK(fence(m, 1, 100, old).result == R::Stale);
  CHECK(m.reclaim_fence_count() == 0);
  CHECK(commit(m, 1, 101, old).result == R::Completed);  // nothing of that version to remove
  CHECK(m.route_put_id("a") == 5);
  CHECK(m.route_put_id("b") == 5);
  // The same copy (its local identity, slot) named with another version: Stale all the same.
  std::vector<Copy> renamed = kPair;
  for (auto& c : renamed) c.put_id = 4, c.instance = 5;
  CHECK(fence(m, 1, 102, renamed).result == R::Stale);
  CHECK(m.reclaim_fence_count() == 0);
  CHECK(commit(m, 1, 103, renamed).result == R::Completed);
  CHECK(m.route_put_id("a") == 5);
  // The route moves on while a fence of the old version is pending: the Commit removes nothing new.
  MasterCore m2 = master_with_pair();
  REQUIRE(fence(m2, 1, 100, kPair).result == R::Fenced);
  std::vector<Copy> newer = kPair;
  for (auto& c : newer) c.put_id = 7;
  CHECK(commit(m2, 1, 101, newer).result == R::Completed);  // epoch 101 fenced nothing: no route of put 7
  CHECK(m2.route_put_id("a") == 5);
}

TEST_CASE("reclaim backing identity (no ABA): the same version on another slot - offset or size - is Stale, and a commit for it never frees the copy that lives there now") {
  for (int variant = 0; variant < 2; ++variant) {
    MasterCore m = master_with_pair();
    std::vector<Copy> other = kPair;
    if (variant == 0) other[1].offset = 12288;    // another slot
    if (variant == 1) other[1].slot_size = 8192;  // another slot class at that offset
    CHECK(fence(m, 1, 100, other).result == R::Stale);
    CHECK(m.reclaim_fence_count() == 0);
    CHECK(commit(m, 1, 101, other).result == R::Stale);  // a is exact and present: removed, said unfenced
    CHECK(m.route_put_id("a") == 0);
    CHECK(m.route_put_id("b") == 5);  // b's copy lives on another slot: untouched
  }
}

TEST_CASE("reclaim cohort transaction: the members must be the whole cohort and its TP siblings here, fenced all or none") {
  MasterCore m = master_with_pair();
  // Half a cohort is never a transaction.
  auto half = fence(m, 1, 100, {kPair[0]});
  CHECK(half.result == R::RetryableBusy);
  CHECK(half.busy == wire::ReclaimBusy::Closure);
  CHECK(m.reclaim_fence_count() == 0);
  // TP: the same group of rank 1 is on this node too: with tp_closure the request must name it.
  publish(m, 1, 8, {{"p_0_2", 8, 8192}});
  publish(m, 1, 9, {{"p_1_2", 9, 12288}});
  auto rank0 = fence(m, 1, 101, {{"p_0_2", 8, 8192}}, true);
  CHECK(rank0.result == R::RetryableBusy);
  CHECK(rank0.busy == wire::ReclaimBusy::Closure);
  CHECK(fence(m, 1, 102, {{"p_0_2", 8, 8192}, {"p_1_2", 9, 12288}}, true).result == R::Fenced);
  // All or none: one member leased -> no member fenced.
  REQUIRE(m_start(m, 2, "b", 1) == wire::GetStartStatus::Started);
  CHECK(fence(m, 1, 103, kPair).busy == wire::ReclaimBusy::Activity);
  CHECK_FALSE(m.reclaim_fenced("a", 1));
  CHECK(m.reclaim_fence_count() == 2);  // the TP pair's only
}

TEST_CASE("reclaim partial and replay: all gone is Completed, the same epoch again AlreadyInProgress, a partial cohort RetryableBusy, no transaction Stale") {
  MasterCore m = master_with_pair();
  CHECK(abort_(m, 1, 100, kPair).result == R::Stale);  // nothing to abort
  REQUIRE(fence(m, 1, 100, kPair).result == R::Fenced);
  CHECK(fence(m, 1, 100, kPair).result == R::AlreadyInProgress);  // an uncertain RPC replays the identity
  CHECK(m.reclaim_count() == 1);
  CHECK(commit(m, 1, 100, kPair).result == R::Completed);
  CHECK(commit(m, 1, 100, kPair).result == R::Completed);  // the reply was lost: the same answer
  CHECK(fence(m, 1, 100, kPair).result == R::Completed);   // a late duplicate of an ended epoch: its answer,
  CHECK(m.reclaim_fence_count() == 0);                     // and no fence nobody would lift
  CHECK(fence(m, 1, 104, kPair).result == R::Completed);   // every source is gone
  MasterCore ma = master_with_pair();
  REQUIRE(fence(ma, 1, 300, kPair).result == R::Fenced);
  REQUIRE(abort_(ma, 1, 300, kPair).result == R::Aborted);
  CHECK(fence(ma, 1, 300, kPair).result == R::Aborted);  // a duplicate of the aborted attempt: fences nothing
  CHECK(ma.reclaim_fence_count() == 0);
  CHECK(m.reclaim_count() == 0);
  // Partial: one member's copy went another way (here a removal) and no transaction knows the pair.
  MasterCore m2 = master_with_pair();
  bool busy = false;
  REQUIRE(m_remove(m2, 1, "a", 1, 5, &busy));
  auto partial = fence(m2, 1, 100, kPair);
  CHECK(partial.result == R::RetryableBusy);
  CHECK(partial.busy == wire::ReclaimBusy::Partial);
  CHECK(m2.reclaim_fence_count() == 0);
  // A Commit of no transaction whose copies are present removes them (a released backing never
  // rolls back) and says it was not fenced.
  MasterCore m3 = master_with_pair();
  CHECK(commit(m3, 1, 200, kPair).result == R::Stale);
  CHECK(m3.route_count() == 0);
  CHECK(m3.counters().reclaim_commit_unfenced_total == 1);
}

TEST_CASE("reclaim idempotence and failure closure: a fence nobody lifts blocks its keys, an old generation is Stale, a newer one lifts its fences") {
  MasterCore m = master_with_pair();
  REQUIRE(fence(m, 1, 100, kPair).result == R::Fenced);
  for (Millis t = 0; t < 200000; t += 10000) m.tick(t);  // no TTL lifts a fence: the key stays blocked
  CHECK(m.reclaim_fenced("b", 1));
  CHECK(m_start(m, 2, "b", 1, 200000) == wire::GetStartStatus::Busy);
  CHECK(reclaim(m, 1, 101, wire::ReclaimStep::Fence, kPair, false, 0).result == R::Stale);  // an old generation
  // The owner restarted: its memory, copies and fences are gone together.
  wire::RegisterOwnerT reg;
  reg.node_id = 1;
  reg.generation = 2;
  REQUIRE(m.handle(make_envelope(reg)).body.AsRegisterOwnerReply());
  CHECK(m.reclaim_count() == 0);
  CHECK(m.reclaim_fence_count() == 0);
  CHECK(m.route_count() == 0);
}

TEST_CASE("reclaim tombstones: a re-publication that crossed a committed reclaim is refused even while another node's copy keeps the route") {
  MasterCore m = master_with_pair();
  REQUIRE(m_start(m, 2, "a", 1) == wire::GetStartStatus::Started);
  REQUIRE(m_done(m, 2, "a", 1, 8192) == wire::GetDoneStatus::Live);
  REQUIRE(fence(m, 1, 100, kPair).result == R::Fenced);
  REQUIRE(commit(m, 1, 100, kPair).result == R::Completed);
  REQUIRE(m.replica_nodes("a") == std::vector<uint32_t>{2});
  // Node 1's PutDone of put 5 again (a duplicate, or a resync sent before the commit): refused.
  wire::PutDoneT pd = m_put_done(1, 5, "a", 0);
  auto r = m.handle(make_envelope(pd));
  REQUIRE(r.body.AsPutDoneReply());
  CHECK(r.body.AsPutDoneReply()->results[0] == wire::PutItemResult::Exists);
  CHECK(m.replica_nodes("a") == std::vector<uint32_t>{2});
  // The same for a fence answered Completed (the owner frees on that answer): the re-publication
  // still on its way (a resync after a master restart) is refused when it arrives.
  MasterCore m2;
  CHECK(fence(m2, 1, 7, {{"x", 1, 0}}).result == R::Completed);
  pd.put_id = 1;
  pd.items[0]->key = "x";
  auto late = m2.handle(make_envelope(pd));
  REQUIRE(late.body.AsPutDoneReply());
  CHECK(late.body.AsPutDoneReply()->results[0] == wire::PutItemResult::Exists);
  CHECK(m2.route_count() == 0);
}

// ---- an owner and the master, wired by hand ------------------------------------------------------

namespace {

// One owner (node 1: a 1 MiB segment, four 256 KiB slots) and the master; every owner->master
// request passes through `pump`, which holds the ones `hold` names until released.
struct Rig {
  static OwnerCoreConfig config() {
    OwnerCoreConfig c;
    c.node_id = 1;
    c.grant_bytes = 1 << 20;
    c.publish_retry_ms = 50;
    c.hard_timeout_ms = 60000;
    c.eviction_free_watermark = 0;  // eviction only for a waiting claim: the tests decide when
    return c;
  }
  static constexpr uint64_t kLen = 256 << 10;

  MasterCore m;
  OwnerCore o;
  Millis now = 0;
  uint64_t session = 0, next_token = 1;
  std::map<uint64_t, Envelope> replies;
  std::deque<std::pair<uint64_t, Envelope>> held;
  std::function<bool(const Envelope&)> hold = [](const Envelope&) { return false; };

  // t2: the master's replica_cache_capacity_ratio (T2 victims handed on its replies), 0: none.
  explicit Rig(const OwnerCoreConfig& cfg = config(), double t2 = 0) : o(cfg, 1, "seg", 1 << 20) {
    if (t2 > 0) m.set_tiers(t2, 0);
    Outbox out;
    o.start(now, out);
    absorb(out);
    session = call(make_envelope(wire::HelloT{})).body.AsHelloReply()->session_id;
  }
  // Requests the master handles whose answers are lost (an uncertain RPC).
  std::function<bool(const Envelope&)> lose_reply = [](const Envelope&) { return false; };
  void deliver(uint64_t token, const Envelope& req) {
    Envelope copy = decode_copy(req);
    Envelope rep = m.handle(copy, now);
    if (lose_reply(copy)) return;
    Outbox out;
    o.on_master_reply(token, rep, now, out);
    absorb(out);
  }
  static Envelope decode_copy(const Envelope& e) {
    auto bytes = encode(e);
    auto d = decode(bytes.data(), bytes.size());
    REQUIRE(d.ok());
    return std::move(*d.value());
  }
  void absorb(Outbox& out) {
    for (auto& x : out) {
      if (x.kind == OwnerOut::Kind::kReply) replies[x.token] = std::move(x.env);
      if (x.kind != OwnerOut::Kind::kMaster) continue;
      if (hold(x.env)) held.emplace_back(x.token, std::move(x.env));
      else deliver(x.token, x.env);
    }
  }
  void release_held() {
    auto h = std::exchange(held, {});
    for (auto& [tok, env] : h) deliver(tok, env);
  }
  void tick(Millis ms) {
    for (Millis i = 0; i < ms; ++i) {
      now++;
      m.tick(now);
      Outbox out;
      o.tick(now, out);
      absorb(out);
    }
  }
  uint64_t send(Envelope req) {
    const uint64_t tok = next_token++;
    req.session_id = session;
    Outbox out;
    o.on_client_request(tok, req, now, out);
    absorb(out);
    return tok;
  }
  Envelope call(Envelope req) {
    const uint64_t tok = send(std::move(req));
    REQUIRE(replies.count(tok));
    return std::move(replies[tok]);
  }
  // A put batch committed; its routes live when nothing holds the PutDone.
  void put(const std::vector<std::string>& keys, std::vector<uint32_t> groups, std::vector<std::string> parents = {}) {
    wire::PutStartReqT p;
    p.keys = keys;
    p.value_len = kLen;
    p.atomic_group_lens = std::move(groups);
    p.radix_parent_keys = std::move(parents);
    auto r = call(make_envelope(std::move(p)));
    REQUIRE_MESSAGE(r.body.AsPutStartReply(), envelope_status(r).to_string());
    REQUIRE(call(make_envelope(wire::PutCommitReqT{{}, r.body.AsPutStartReply()->put_id})).body.AsPutCommitReply());
  }
  // A put_start of keys sent (its answer, if any, in replies[token]): a claim that may wait for room.
  uint64_t claim(const std::vector<std::string>& keys) {
    wire::PutStartReqT p;
    p.keys = keys;
    p.value_len = kLen;
    return send(make_envelope(std::move(p)));
  }
  // A local read: its holdings stay until released.
  struct Read {
    uint64_t handle_id = 0;
    std::vector<uint64_t> holding_ids;
  };
  Read read(const std::vector<std::string>& keys) {
    wire::GetStartReqT g;
    g.keys = keys;
    g.prefix_best_effort = true;
    auto r = call(make_envelope(std::move(g)));
    REQUIRE(r.body.AsGetStartReply());
    REQUIRE(r.body.AsGetStartReply()->transferable_len == keys.size());
    return {r.body.AsGetStartReply()->handle_id, r.body.AsGetStartReply()->holding_ids};
  }
  void release(const Read& g) {
    wire::AckBatchT ack;
    auto hd = std::make_unique<wire::HandleDoneT>();
    hd->handle_id = g.handle_id;
    hd->release_holding_ids = g.holding_ids;
    ack.handles.push_back(std::move(hd));
    Envelope note = make_envelope(std::move(ack));
    note.session_id = session;
    Outbox out;
    o.on_client_note(note, now, out);
    absorb(out);
  }
  // A full segment: cohort A = {a0, a1} (cold) and B = {b0, b1} (read, warm); `before` runs; then
  // one more put waits for a slot: the next pressure round selects A.
  uint64_t fill_and_claim(const std::function<void()>& before = [] {}) {
    put({"a0", "a1"}, {2});
    put({"b0", "b1"}, {2});
    for (int i = 0; i < 6; ++i) release(read({"b0", "b1"}));
    before();
    const uint64_t tok = claim({"c0"});
    REQUIRE_FALSE(replies.count(tok));  // waits for room
    return tok;
  }
  const OwnerCounters& ctr() const { return o.counters(); }
  bool visible(const std::string& k) const { return o.local_state(k) == 2; }
};

bool is_step(const Envelope& e, wire::ReclaimStep step) {
  return e.body.AsReclaim() && e.body.AsReclaim()->step == step;
}

}  // namespace

TEST_CASE("reclaim rig: a waiting claim's pressure round reclaims the coldest exact cohort through Fence and Commit, and the claim proceeds") {
  Rig r;
  const uint64_t claim = r.fill_and_claim();
  r.tick(1);
  REQUIRE(r.replies.count(claim));
  CHECK(r.replies[claim].body.AsPutStartReply());
  CHECK_FALSE(r.visible("a0"));
  CHECK_FALSE(r.visible("a1"));
  CHECK(r.visible("b0"));
  CHECK(r.m.route_put_id("a0") == 0);
  CHECK(r.m.route_put_id("a1") == 0);
  CHECK(r.ctr().reclaim_started_total == 1);
  CHECK(r.ctr().reclaim_committed_keys_total == 2);
  CHECK(r.ctr().evicted_bytes_total == r.ctr().reclaim_committed_bytes_total);
  CHECK(r.o.eviction_debt_bytes() == 0);
  CHECK(r.m.reclaim_fence_count() == 0);
}

TEST_CASE("reclaim readers drain: a reader holding a member makes Prepare Busy - the cohort stays visible and routed, its fences go, no second selection overlaps it, and it is reclaimed once the reader is done") {
  Rig r;
  r.hold = [](const Envelope& e) { return is_step(e, wire::ReclaimStep::Fence); };
  const uint64_t claim = r.fill_and_claim();
  r.tick(1);
  REQUIRE(r.held.size() == 1);  // A selected, unheld; a reader takes a1 while the fence is on its way
  const Rig::Read reader = r.read({"a1"});
  r.hold = [](const Envelope&) { return false; };
  r.release_held();  // Fenced -> Prepare: a1 is held -> Abort
  CHECK_FALSE(r.replies.count(claim));
  CHECK(r.visible("a0"));
  CHECK(r.visible("a1"));
  CHECK(r.m.route_put_id("a0") != 0);
  CHECK(r.m.route_put_id("a1") != 0);
  CHECK(r.m.reclaim_fence_count() == 0);
  CHECK(r.ctr().reclaim_owner_holder_total == 1);
  CHECK(r.o.eviction_debt_bytes() == 2 * Rig::kLen);  // still the transaction's
  r.tick(20);                                         // back-off (25 ms): pressure rounds select nothing more
  CHECK(r.ctr().reclaim_started_total == 1);
  r.release(reader);
  r.tick(300);
  REQUIRE(r.replies.count(claim));
  CHECK(r.replies[claim].body.AsPutStartReply());
  CHECK_FALSE(r.visible("a0"));
  CHECK(r.ctr().reclaim_retry_completed_total == 1);
  CHECK(r.ctr().reclaim_committed_keys_total == 2);
  CHECK(r.o.eviction_debt_bytes() == 0);
}

TEST_CASE("reclaim write conflicts: a member whose route is being re-published after a master restart is not released until the re-publication settled") {
  Rig r;
  r.put({"a0", "a1"}, {2});
  r.put({"b0", "b1"}, {2});
  for (int i = 0; i < 6; ++i) r.release(r.read({"b0", "b1"}));
  r.m = MasterCore{};  // the master restarts with no state
  r.hold = [](const Envelope& e) { return e.body.AsPutDone() != nullptr; };
  Outbox out;
  r.o.on_master_reconnected(r.now, out);
  r.absorb(out);
  REQUIRE(r.held.size() == 2);  // both batches' re-publications
  const uint64_t claim = r.claim({"c0"});
  r.tick(1);  // Fence: the master knows no copy (Completed) -> Prepare: the resync is on its way -> Busy
  CHECK(r.ctr().reclaim_owner_write_total >= 1);
  CHECK_FALSE(r.replies.count(claim));
  CHECK(r.o.pool().counts().free == 0);  // nothing released under the re-publication
  CHECK(r.visible("a0"));
  r.hold = [](const Envelope&) { return false; };
  r.release_held();
  r.tick(300);
  REQUIRE(r.replies.count(claim));
  CHECK(r.replies[claim].body.AsPutStartReply());
  CHECK(r.m.route_put_id("a0") == 0);  // removed through the transaction, not left behind
  CHECK(r.m.route_put_id("b0") != 0);
  CHECK(r.o.eviction_debt_bytes() == 0);
}

TEST_CASE("reclaim exact physical release: Commit frees each member's slot once, in one pool update, and the counts agree") {
  // The pool alone: Committed(route live, no holder) -> Free in one call.
  ReservePool pool(1 << 20, 1 << 20, std::nullopt);
  auto c = pool.try_claim(4096, 1);
  REQUIRE((c.ok() && c.value()));
  const SlotRef s = (*c.value())[0];
  pool.commit_local(s);
  pool.route_live(s);
  const auto before = pool.counts();
  pool.reclaim(s);
  const auto after = pool.counts();
  CHECK(after.committed == before.committed - 1);
  CHECK(after.free == before.free + 1);
  CHECK(pool.slot(s).state == SlotState::kFree);
  CHECK_FALSE(pool.slot(s).route_live);
  CHECK(pool.take_freed());
  // Through the owner: exactly the cohort's two slots, once each.
  Rig r;
  const uint64_t claim = r.fill_and_claim();
  r.tick(1);
  REQUIRE(r.replies.count(claim));
  const auto counts = r.o.pool().counts();
  CHECK(counts.free == 1);      // two freed, one claimed by the waiting put
  CHECK(counts.prepared == 1);  // that put's slot
  CHECK(counts.committed == 2);  // B
  CHECK(r.ctr().reclaim_released_keys_total == 2);
  CHECK(r.o.stats().routes == 2);
}

TEST_CASE("reclaim route update order: between the owner's release and the master's Commit the fence refuses every new lease, so no one is routed to the freed (even reused) slot") {
  Rig r;
  r.hold = [](const Envelope& e) { return is_step(e, wire::ReclaimStep::Commit); };
  const uint64_t claim = r.fill_and_claim();
  r.tick(1);
  REQUIRE(r.held.size() == 1);
  REQUIRE(r.replies.count(claim));  // A's slot is Free and claimed again already
  CHECK(r.m.route_put_id("a0") != 0);  // the old route still names it...
  CHECK(r.m.reclaim_fenced("a0", 1));  // ...behind the fence
  CHECK(m_start(r.m, 2, "a0", 1, r.now) == wire::GetStartStatus::Busy);
  r.hold = [](const Envelope&) { return false; };
  r.release_held();
  CHECK(r.m.route_put_id("a0") == 0);
  CHECK(r.m.reclaim_fence_count() == 0);
  CHECK(m_start(r.m, 2, "a1", 2, r.now) == wire::GetStartStatus::Miss);
}

TEST_CASE("reclaim idempotence: a Fence or Commit whose answer is lost is sent again with the same epoch and applied once") {
  Rig r;
  int lost = 0;
  std::set<wire::ReclaimStep> lost_steps;
  r.lose_reply = [&](const Envelope& e) {
    if (!e.body.AsReclaim() || !lost_steps.insert(e.body.AsReclaim()->step).second) return false;
    lost++;  // the first Fence's answer, then the first Commit's
    return true;
  };
  const uint64_t claim = r.fill_and_claim();
  r.tick(200);
  REQUIRE(r.replies.count(claim));
  CHECK(lost == 2);
  CHECK(r.ctr().reclaim_resent_total == 2);
  CHECK(r.m.counters().reclaim_in_progress_total == 1);  // the Fence again: AlreadyInProgress
  CHECK(r.m.counters().reclaim_fenced_total == 1);
  CHECK(r.ctr().reclaim_released_keys_total == 2);  // released once
  CHECK(r.ctr().reclaim_committed_keys_total == 2);
  CHECK(r.o.pool().counts().free == 1);
  CHECK(r.m.reclaim_count() == 0);
}

TEST_CASE("reclaim failing candidates converge: Busy backs off a bounded number of times then restores the cohort, and a changed member ends obsolete") {
  Rig r;
  r.hold = [](const Envelope& e) { return is_step(e, wire::ReclaimStep::Fence); };
  const uint64_t claim = r.fill_and_claim();
  r.tick(1);
  REQUIRE(r.held.size() == 1);  // A selected (unheld then)...
  const Rig::Read reader = r.read({"a0"});  // ...and read before its fence is answered
  r.hold = [](const Envelope&) { return false; };
  r.release_held();
  r.tick(3000);  // A is held throughout: 8 attempts, then A goes back to the resident tier
  CHECK(r.ctr().reclaim_restored_total == 1);
  CHECK(r.ctr().reclaim_restored_keys_total == 2);
  CHECK(r.ctr().reclaim_retry_queued_total == Reclaim::kMaxAttempts - 1);
  CHECK(r.visible("a0"));
  // The debt ended, so the next round took B (unheld) for the claim.
  REQUIRE(r.replies.count(claim));
  CHECK_FALSE(r.visible("b0"));
  CHECK(r.o.eviction_debt_bytes() == 0);
  r.release(reader);
  // A member replaced while its fence is on its way: the cohort's reclaim goes on without it.
  Rig q;
  q.hold = [](const Envelope& e) { return is_step(e, wire::ReclaimStep::Fence); };
  const uint64_t claim2 = q.fill_and_claim();
  q.tick(1);
  REQUIRE(q.held.size() == 1);
  Outbox out;
  q.o.remove_key("a0", q.now, out);  // removed by hand: its route goes first, at once
  q.absorb(out);
  CHECK(q.m.route_put_id("a0") == 0);
  q.hold = [](const Envelope&) { return false; };
  q.release_held();  // the Fence finds half the cohort: RetryableBusy (partial)
  CHECK(q.ctr().reclaim_master_partial_total == 1);
  q.tick(300);  // tried again without a0: a1 alone is its cohort now
  CHECK(q.ctr().reclaim_obsolete_keys_total == 1);
  CHECK(q.ctr().reclaim_committed_keys_total == 1);
  CHECK(q.m.route_put_id("a1") == 0);
  CHECK(q.replies.count(claim2));
  CHECK(q.o.eviction_debt_bytes() == 0);
  CHECK(q.ctr().evicted_bytes_total == q.ctr().reclaim_committed_bytes_total + q.ctr().reclaim_obsolete_bytes_total);
}

TEST_CASE("reclaim partial and replay, owner side: a fence answered Completed (the master holds none of the copies) releases the cohort without a Commit") {
  Rig r;
  const uint64_t claim = r.fill_and_claim([&] { r.m = MasterCore{}; });  // the owner has not noticed yet
  r.tick(1);
  REQUIRE(r.replies.count(claim));
  CHECK(r.m.counters().reclaim_requests_total == 1);  // the Fence only
  CHECK(r.m.counters().reclaim_completed_total == 1);
  CHECK(r.ctr().reclaim_committed_keys_total == 2);
  CHECK(r.ctr().reclaim_released_keys_total == 2);
  CHECK(r.o.eviction_debt_bytes() == 0);
  CHECK(r.o.reclaims_in_flight() == 0);
}

TEST_CASE("master T1: a PutDone item refused while another version held the key stays refused for that identity once the other version is gone") {
  MasterCore m;
  publish(m, 3, 9, {{"k", 9, 0}});  // node 3's version holds k
  wire::PutDoneT pd = m_put_done(1, 4, "k", 4096);
  auto first = m.handle(make_envelope(pd));
  REQUIRE(first.body.AsPutDoneReply()->results[0] == wire::PutItemResult::Exists);  // the owner frees its slot
  // Node 3 goes (a restart): k has no route. The same PutDone again (a duplicate, a re-send):
  wire::RegisterOwnerT reg;
  reg.node_id = 3;
  reg.generation = 2;
  REQUIRE(m.handle(make_envelope(reg)).body.AsRegisterOwnerReply());
  REQUIRE(m.route_count() == 0);
  auto again = m.handle(make_envelope(pd));
  CHECK(again.body.AsPutDoneReply()->results[0] == wire::PutItemResult::Exists);
  CHECK(m.route_count() == 0);  // never a route to the slot freed on the first answer
  pd.put_id = 5;                // a newer put of the key is welcome
  CHECK(m.handle(make_envelope(pd)).body.AsPutDoneReply()->results[0] == wire::PutItemResult::Live);
}

TEST_CASE("master T2 victims, owner side: a victim whose TP sibling is committed here with its route on its way is busy - no reclaim the master would refuse as Closure, once the sibling is live the cohort goes whole") {
  Rig r(Rig::config(), 0.5);  // T2: half of node 1's four slots
  // Rank 0's copy of group x is live; rank 1's is committed, and the master lists it, but its
  // PutDone answer is lost: here its route is still on its way (re-sent after publish_retry_ms).
  r.put({"x_0_2"}, {1});
  r.lose_reply = [](const Envelope& e) {
    const auto* pd = e.body.AsPutDone();
    return pd && !pd->items.empty() && pd->items[0]->key == "x_1_2";
  };
  r.put({"x_1_2"}, {1});
  CHECK(r.m.route_put_id("x_1_2") != 0);
  CHECK_FALSE(r.visible("x_1_2"));
  // A third route puts T2 over its two slots: the master hands its coldest, x_0_2.
  r.put({"y_0_1"}, {1});
  CHECK(r.ctr().tier_victims_total >= 1);
  CHECK(r.ctr().tier_victims_busy_total >= 1);
  CHECK(r.ctr().reclaim_started_total == 0);
  CHECK(r.ctr().reclaim_master_closure_total == 0);
  CHECK(r.visible("x_0_2"));
  // The answer comes (the PutDone sent again): the sibling is live; the victim, handed again,
  // goes with it in one transaction.
  r.lose_reply = [](const Envelope&) { return false; };
  r.tick(MasterCore::kTierHandMs + 100);
  CHECK_FALSE(r.visible("x_1_2"));
  CHECK_FALSE(r.visible("x_0_2"));
  CHECK(r.ctr().reclaim_master_closure_total == 0);
  CHECK(r.m.route_put_id("x_0_2") == 0);
  CHECK(r.m.route_put_id("x_1_2") == 0);
}

TEST_CASE("reclaim demotion, owner side: a cohort backed on the target goes through Fence(demote) and Commit, and a Fence answered Kept - the target copy went - keeps it here, resident, counted") {
  OwnerCoreConfig cfg = Rig::config();
  cfg.hot_writeback_ratio = 0.5;  // 2 of the 4 slots stay hot
  Rig r(cfg);
  wire::RegisterOwnerT target;
  target.node_id = 2;
  target.generation = 1;
  target.role = "remote_cache";
  target.segment_len = 1 << 20;
  REQUIRE(r.m.handle(make_envelope(wire::RegisterOwnerT(target))).body.AsRegisterOwnerReply());
  r.hold = [](const Envelope& e) { return is_step(e, wire::ReclaimStep::Fence) && e.body.AsReclaim()->demote; };
  r.put({"a0", "a1"}, {2});
  r.put({"b0", "b1"}, {2});  // the hot tier holds less than both cohorts: A is written back
  CHECK(r.ctr().writeback_cohorts_total >= 1);
  // The target's copies (node 2 fetched them: one get batch, its own cohort).
  for (const char* k : {"a0", "a1"}) {
    REQUIRE(m_start(r.m, 2, k, k[1] == '0' ? 1 : 2) == wire::GetStartStatus::Started);
    wire::BatchGetDoneT d;
    d.node_id = 2;
    d.generation = 1;
    d.items.push_back(std::make_unique<wire::GetDoneItemT>(
        wire::GetDoneItemT{{}, k, uint64_t(k[1] == '0' ? 1 : 2), 0, 9, 0, Rig::kLen}));
    REQUIRE(r.m.handle(make_envelope(std::move(d))).body.AsBatchGetDoneReply()->results[0] == wire::GetDoneStatus::Live);
  }
  r.tick(100);  // the WriteBack again: A is Backed; the demotion's Fence is held (and re-sent)
  REQUIRE_FALSE(r.held.empty());
  for (const auto& [tok, env] : r.held) CHECK(env.body.AsReclaim()->epoch == r.held.front().second.body.AsReclaim()->epoch);
  CHECK(r.ctr().demote_started_keys_total == 2);  // B has no target copy: not backed
  CHECK(r.o.reclaims_in_flight() == 1);
  CHECK(r.visible("a0"));  // fencing: still readable here
  SUBCASE("the target copy stays: demoted") {
    r.release_held();
    CHECK_FALSE(r.visible("a0"));
    CHECK_FALSE(r.visible("a1"));
    CHECK(r.m.replica_nodes("a0") == std::vector<uint32_t>{2});
    CHECK(r.ctr().demoted_keys_total == 2);
    CHECK(r.ctr().demoted_cohorts_total == 1);
    CHECK(r.m.counters().demoted_keys_total == 2);
    CHECK(r.o.pool().counts().free == 2);
  }
  SUBCASE("the target restarted meanwhile: Kept") {
    target.generation = 2;  // its memory, and the copies, are gone
    REQUIRE(r.m.handle(make_envelope(wire::RegisterOwnerT(target))).body.AsRegisterOwnerReply());
    r.release_held();
    CHECK(r.visible("a0"));
    CHECK(r.visible("a1"));
    CHECK(r.m.replica_nodes("a0") == std::vector<uint32_t>{1});
    CHECK(r.ctr().demoted_keys_total == 0);
    CHECK(r.ctr().demote_kept_keys_total == 2);
    CHECK(r.ctr().demote_kept_total == 1);
    // Back in the resident tier: capacity eviction can take it (a claim that needs a slot).
    r.hold = [](const Envelope&) { return false; };
    const uint64_t tok = r.claim({"c0", "c1", "c2"});
    r.tick(300);
    CHECK(r.replies.count(tok));
    CHECK(r.ctr().reclaim_committed_keys_total >= 2);
  }
  CHECK(r.o.reclaims_in_flight() == 0);
  CHECK(r.m.reclaim_fence_count() == 0);
  CHECK(r.ctr().demote_started_keys_total ==
        r.ctr().demoted_keys_total + r.ctr().demote_kept_keys_total + r.ctr().demote_obsolete_keys_total);
}

TEST_CASE("prefix-aware eviction: with radix_parent_keys the least recently used leaf goes first - a chain is eaten from its tail, never orphaned at its root") {
  // Four slots: a chain a0 <- b0 <- c0 put first (a0 the coldest), then x0 on its own, read last.
  for (const bool chained : {true, false}) {
    CAPTURE(chained);
    Rig r;
    r.put({"a0"}, {1});
    r.put({"b0"}, {1}, chained ? std::vector<std::string>{"a0"} : std::vector<std::string>{});
    r.put({"c0"}, {1}, chained ? std::vector<std::string>{"b0"} : std::vector<std::string>{});
    r.put({"x0"}, {1});
    r.release(r.read({"x0"}));
    const uint64_t tok = r.claim({"y0"});
    REQUIRE_FALSE(r.replies.count(tok));  // waits for a slot
    r.tick(50);
    REQUIRE(r.replies.count(tok));
    CHECK(r.ctr().reclaim_committed_keys_total == 1);
    CHECK(r.visible("x0"));
    if (chained) {  // the leaves are c0 and x0; c0 was used least recently
      CHECK_FALSE(r.visible("c0"));
      CHECK(r.visible("a0"));
      CHECK(r.visible("b0"));
    } else {  // no chains: the coldest entry
      CHECK_FALSE(r.visible("a0"));
      CHECK(r.visible("c0"));
    }
  }
}

TEST_CASE("prefix-aware eviction: a parent goes in the same round as the children selected before it - one round takes a cold chain whole, tail first") {
  // x0 put first but read last; then a0 <- b0 <- c0. A round that needs three slots: c0, then b0
  // and a0 as each becomes a leaf - not x0, the other leaf (newer than all of the chain).
  Rig r;
  r.put({"x0"}, {1});
  r.put({"a0"}, {1});
  r.put({"b0"}, {1}, {"a0"});
  r.put({"c0"}, {1}, {"b0"});
  r.release(r.read({"x0"}));
  const uint64_t tok = r.claim({"n0", "n1", "n2"});
  REQUIRE_FALSE(r.replies.count(tok));
  r.tick(50);
  REQUIRE(r.replies.count(tok));
  CHECK(r.ctr().reclaim_committed_keys_total == 3);
  CHECK_FALSE(r.visible("a0"));
  CHECK_FALSE(r.visible("b0"));
  CHECK_FALSE(r.visible("c0"));
  CHECK(r.visible("x0"));
}

TEST_CASE("prefix-aware eviction: radix_parent_keys of another length, or naming the key itself, is refused with the field named") {
  Rig r;
  wire::PutStartReqT p;
  p.keys = {"k0", "k1"};
  p.value_len = Rig::kLen;
  p.radix_parent_keys = {""};
  auto e = r.call(make_envelope(wire::PutStartReqT(p)));
  CHECK(envelope_status(e).to_string().find("radix_parent_keys: length 1 != number of keys 2") != std::string::npos);
  p.radix_parent_keys = {"", "k1"};
  e = r.call(make_envelope(std::move(p)));
  CHECK(envelope_status(e).to_string().find("radix_parent_keys[1]: the key itself") != std::string::npos);
}
