// ClientCore: the client's protocol state as a plain state machine, sans-IO like the owner's and
// the master's cores. It validates calls and builds their requests, reads the owner's replies into
// plan blobs and handles, keeps the registries of plans, handles and put futures, batches the
// one-way acknowledgements, and gates every call on the owner generation the caller has mapped.
// No locks, threads, sockets or clocks: KvClient drives it under its lock over a real link, and
// the whole-cluster simulation drives it over the simulated one (tests/sim/client_core_test.cpp).
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "fluxon/messages/codec.hpp"
#include "fluxon/runtime/batch.hpp"
#include "fluxon/runtime/status.hpp"

namespace fluxon {

using Millis = int64_t;

constexpr uint64_t kPlanMagic = 0x4658504C414E5631ull;  // "FXPLANV1" (the original Fluxon kernels check it)

struct PutOptionalArgs {
  bool reject_if_inflight_same_key = true;
  bool reject_if_exist_same_key = true;
  bool write_through = false;
  bool make_replica_task = false;
  std::optional<std::vector<bool>> make_replica_task_mask;
  std::optional<std::vector<uint32_t>> atomic_group_lens;
  std::optional<uint64_t> lease_id;
  // Per key, the page before it in its prefix ("" for a root): the owner evicts leaves first.
  std::optional<std::vector<std::string>> radix_parent_keys;
  // Per key, its depth in its prefix (pages from the root). Without radix_parent_keys the batch's
  // own chain follows from it (parents_from_depths): the owner's eviction takes leaves first.
  std::optional<std::vector<uint32_t>> content_depths;
  // kv_score_pressure_budget: the owner keeps the best of the masked groups that fit its
  // eviction pressure's share of `replica_budget->pages` (ReplicaBudgetArgs, batch.hpp).
  std::optional<ReplicaBudgetArgs> replica_budget;
};

// exists_prefix: the existing prefix (group-aligned); local_len of it on the attached owner; false
// master_answered: the master was not asked (every key local, or one owner in the cluster) or did
// not answer within max_wait_ms, so the remote part counts as missing.
struct ExistsResult {
  uint32_t prefix_len = 0;
  uint32_t local_len = 0;
  bool master_answered = false;
};

// The prefix math of PrefixResult, plus where keys[:transferable_len] come from (P2): pinned local
// copies, joins of another batch's fetch, and fetches this call leads from remote owners (L3).
struct GetStartResult : PrefixResult {
  uint32_t local_keys = 0, joined_keys = 0, leader_keys = 0;
  bool owner_rpc = false;  // part of the prefix is fetched from a remote owner
  std::vector<uint8_t> sources;  // per key of the prefix: 0 local, 1 joined, 2 leader
  uint32_t remote_keys() const { return joined_keys + leader_keys; }
};

class ClientCore {
 public:
  // One connection of the shell (its own id), the session it opened and the owner generation:
  // what a plan, a handle or an acknowledgement belongs to.
  struct Link {
    uint64_t id = 0, session = 0, generation = 0;
  };
  // The owner a connection reached and where this process mapped its segment.
  struct OwnerView {
    uint64_t link = 0;  // the shell's connection id
    uint64_t generation = 0, session = 0;
    uint32_t node_id = 0, handle_ttl_ms = 0;
    uint8_t* base = nullptr;
    uint64_t size = 0;
  };
  // A get_transfer in two steps: begin (the handle leaves the registry; for remote keys, the
  // request to send), then finish with the owner's reply (or none: every item was local).
  struct Transfer {
    uint64_t owner_handle = 0;
    Link at;
    uint32_t consume = 0, transferable_len = 0;
    bool owner_rpc = false;
    std::vector<uint64_t> offsets, lens, holdings;
    Millis deadline = 0;
    std::optional<Envelope> request;
  };
  // A batch of acknowledgements to send over the connection it belongs to (at.id).
  struct Acks {
    Link at;
    Envelope note;
  };
  static constexpr size_t kAckBatch = 256;  // acknowledgements per note (a full batch goes at once)

  explicit ClientCore(uint32_t max_wait_ms) : max_wait_ms_(max_wait_ms) {}

  // ---- the owner and its generation
  void attach(const OwnerView& o) { owner_ = o; }
  const OwnerView& owner() const { return owner_; }
  // The caller maps the attached generation now (wait_local_segments_ready).
  void acknowledge() { acked_generation_ = owner_.generation; }
  // Every call that touches the segment: refused until the caller acknowledged a new generation.
  Status gate() const;
  // A request to the attached owner, addressed: its session and generation.
  Envelope addressed(Envelope req) const;

  // ---- puts
  Result<Envelope> put_start(const std::vector<std::string>& keys, int64_t value_len, const PutOptionalArgs& opts) const;
  // The plan for the reply (registered; its id is the blob's address). `touched`: the segment
  // ranges the caller will write (the shell faults them in).
  Result<uint64_t> put_started(const Envelope& reply, size_t n, uint64_t value_len,
                               std::vector<std::pair<uint64_t, uint64_t>>* touched);
  // A plan leaves the registry (commit, abort, release_views consume it).
  struct Plan {
    bool is_put = false;
    std::unique_ptr<uint64_t[]> blob;
    uint64_t put_id = 0;
    Link at;
    std::vector<uint64_t> holdings;
  };
  Result<Plan> take_plan(uint64_t plan_ptr, bool want_put, const char* op);
  // The commit request; the put's future (`future`, the shell's id) completes with its PutLive note.
  Result<Envelope> put_commit(const Plan& p, uint64_t future);
  void commit_failed(const Plan& p);  // the commit was not answered: the note will never come
  Result<Envelope> put_abort(const Plan& p) const;

  // ---- gets
  Result<Envelope> get_start(const std::vector<std::string>& keys, bool prefix_best_effort,
                             const std::optional<std::vector<uint32_t>>& groups) const;
  // `sent`: when the request left (the handle's TTL is half the owner's, counted from then).
  Result<std::pair<uint64_t, GetStartResult>> get_started(const Envelope& reply, size_t n,
                                                          const std::optional<std::vector<uint32_t>>& groups,
                                                          Millis sent);
  // Step 1: the handle leaves the registry (a bad length leaves it usable).
  Result<Transfer> take_handle(uint64_t handle, std::optional<int64_t> consume);
  // Step 2, against the attached owner: TTL and generation checked; the request when remote keys
  // are in the prefix (t.request).
  Status begin_transfer(Transfer& t, Millis now);
  // Step 3: the read plan (registered); tail holdings are acknowledged (G5).
  Result<uint64_t> finish_transfer(Transfer& t, const Envelope* reply,
                                   std::vector<std::pair<uint64_t, uint64_t>>* touched);
  Status cancel(uint64_t handle);
  void release_views(Plan&& p);

  // ---- questions
  Result<Envelope> exists(const std::vector<std::string>& keys, const std::optional<std::vector<uint32_t>>& groups,
                          uint64_t expected_len, const std::string& key_prefix, const std::string& key_suffix) const;
  static Result<ExistsResult> exists_answer(const Envelope& reply, size_t n);

  // ---- notes, acknowledgements, losses
  // A note that came over connection `link`: the futures it completes (shell id, outcome).
  std::vector<std::pair<uint64_t, Status>> on_note(uint64_t link, const Envelope& note);
  // Connection `link` is gone (or its session given up): its futures fail with `why`.
  std::vector<std::pair<uint64_t, Status>> lose(uint64_t link, const Status& why);
  // Batches ready to send (a full one, or everything with flush).
  std::vector<Acks> take_acks(bool flush);
  bool acks_waiting() const { return !acks_.handles.empty() || !acks_.release.empty() || !ready_.empty(); }

  // ---- the registries
  size_t put_plans() const;
  size_t read_plans() const { return plans_.size() - put_plans(); }
  size_t handles() const { return handles_.size(); }
  // Plans or handles of connection `link` remain (its mapping must stay).
  bool references(uint64_t link) const;
  void clear();  // close(): the registries go (the owner releases the session's holdings)

 private:
  struct Handle {
    uint64_t owner_handle = 0;
    Link at;
    GetStartResult result;
    std::vector<uint64_t> offsets, lens, holdings;
    std::optional<std::vector<uint32_t>> groups;
    Millis deadline = 0;
  };
  uint64_t register_plan(Plan p);
  Link here() const { return Link{owner_.link, owner_.session, owner_.generation}; }
  void queue_ack(const Link& at, uint64_t handle, std::vector<uint64_t> release, bool handle_done);
  void seal_acks();

  uint32_t max_wait_ms_;
  OwnerView owner_;
  uint64_t acked_generation_ = 0;
  std::unordered_map<uint64_t, Plan> plans_;  // plan_ptr -> plan
  std::unordered_map<uint64_t, Handle> handles_;
  uint64_t next_handle_ = 1;
  std::map<std::pair<uint64_t, uint64_t>, uint64_t> futures_;  // (link, put_id) -> shell future
  wire::AckBatchT acks_;       // the batch being filled
  Link acks_at_;               // where the batch being filled goes
  std::vector<Acks> ready_;    // sealed batches
};

}  // namespace fluxon
