// What the owner's components share, and the words they speak to the router.
//
// OwnerShared holds the owner's identity and config slice, the slot pool, the local index, the
// sessions, the counters, and the two number sources (master request tokens, local batch ids).
// Components read and change these; they never call one another. What one component's step means
// for another (a route to remove, entries for the hot tier, room to make) comes back as a value,
// and the router (OwnerCore) hands it on, in order.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "fluxon/owner/local_index.hpp"
#include "fluxon/owner/owner_config.hpp"
#include "fluxon/owner/owner_counters.hpp"
#include "fluxon/owner/sessions.hpp"
#include "fluxon/messages/codec.hpp"
#include "fluxon/runtime/reserve_pool.hpp"

namespace fluxon {

// One data-plane fetch: byte ranges of one peer's segment, read into this owner's segment. The
// control plane is batched per leader batch (G8); the payload is batched per peer too.
struct TransferItem {
  uint64_t src_offset = 0, len = 0, dst_offset = 0;
  std::string grant;  // the master's grant for this range (with the cluster key; empty without)
};
struct TransferBatch {
  uint64_t id = 0;
  uint32_t source_node = 0;
  uint64_t source_generation = 0;
  std::string host;
  uint16_t port = 0;
  std::vector<TransferItem> items;
  bool read = false;  // for readers (gets), not copies: the source counts it as reads (kDataFlagRead)
};

struct OwnerOut {
  enum class Kind : uint8_t {
    kReply,     // reply to client request `token` of `session`
    kNote,      // one-way note to `session`
    kMaster,    // request `token` to the master
    kTransfer,  // fetch `transfer` over the data plane, then call on_transfer_done(transfer.id)
  };
  Kind kind;
  uint64_t session = 0;
  uint64_t token = 0;
  Envelope env;
  TransferBatch transfer;
};
using Outbox = std::vector<OwnerOut>;

// A master request's token says which component's job it belongs to (its low 4 bits); the router
// hands the reply to that component, which finds the job by the token in its own table (T1).
enum class JobKind : uint8_t { kPublish, kRemove, kGet, kReplicaPoll, kRegister, kProxy, kWriteBackBatch, kExists, kReclaim, kTierPoll };

// A route to remove before its slot goes (S2): the key, the version the route carries, the slot,
// and the copy's local identity (LocalIndex::Entry::put_id).
struct Removal {
  std::string key;
  Version ver;
  SlotRef slot;
  uint64_t instance = 0;
};
using Removals = std::vector<Removal>;  // one RemoveRoutes job

// An entry that went live: it enters the resident tier and (write-back on) the hot tier.
struct LiveEntry {
  std::string key;
  LocalIndex::ResidentRef ref;
  uint64_t weight = 0;
};

// Room a claim needs: bytes of slots of one class.
struct RoomNeeded {
  uint64_t slot_size = 0, bytes = 0;
};

struct OwnerShared {
  OwnerShared(const OwnerCoreConfig& c, uint64_t gen, uint64_t segment_len)
      : cfg(c),
        generation(gen),
        pool(segment_len, c.grant_bytes, c.expected_capacity),
        local(segment_len, c.hot_writeback_ratio, c.eviction_tp_cohorts,
              c.eviction_prefix_depth
                  ? std::optional<uint64_t>(c.eviction_stale_turnover == 0
                                                ? DepthOrder::kAdaptive
                                                : uint64_t(c.eviction_stale_turnover * double(segment_len)))
                  : std::nullopt) {}

  const OwnerCoreConfig cfg;
  const uint64_t generation;
  ReservePool pool;
  LocalIndex local;   // entries, cohorts, resident and hot tiers
  Sessions sessions;  // clients, their plans, handles and holdings
  OwnerCounters counters;
  uint64_t live_routes = 0;     // master routes to this owner's slots
  bool replica_target = false;  // the master hands this owner replica tasks (learned at registration)
  uint64_t master_term = 0;     // the newest master term seen (from etcd or a reply): older ones are fenced

  uint64_t new_token(JobKind k) { return (next_number_++ << 4) | uint64_t(k); }
  static JobKind kind_of(uint64_t token) { return JobKind(token & 0xF); }
  uint64_t new_unique() { return next_number_++; }          // any number no token or id repeats
  uint64_t new_local_id() { return next_local_id_++; }      // a put's or a fetched batch's identity
  Version version_of(uint64_t put_id) const { return Version{cfg.node_id, generation, put_id}; }
  // The only owner of its cluster (known from the cluster config, never stale): a key missing here
  // is missing everywhere.
  bool alone() const { return cfg.alone_in_cluster; }

  void reply(uint64_t session, uint64_t token, Envelope env, Outbox& out) {
    out.push_back(OwnerOut{OwnerOut::Kind::kReply, session, token, std::move(env)});
  }
  void note(uint64_t session, Envelope env, Outbox& out) {
    out.push_back(OwnerOut{OwnerOut::Kind::kNote, session, 0, std::move(env)});
  }
  void to_master(uint64_t token, Envelope env, Outbox& out) {
    env.term = master_term;
    out.push_back(OwnerOut{OwnerOut::Kind::kMaster, 0, token, std::move(env)});
  }
  void reply_error(uint64_t session, uint64_t token, const Status& s, Outbox& out) {
    counters.errors_total++;
    if (s.code() == Code::kMalformedMessage) counters.malformed_total++;
    if (s.code() == Code::kGenerationMismatch) counters.generation_mismatch_total++;
    reply(session, token, error_envelope(s), out);
  }

 private:
  uint64_t next_number_ = 1, next_local_id_ = 1;
};

}  // namespace fluxon
