// fluxon::KvClient — the hostless API of SPEC.md §2 (the Python module mirrors it one to one).
// The shell around ClientDriver: the real ports (the owner link, the segment's mapping, the clock)
// and the acknowledgement flusher's thread. Thread-safe: calls may come from several threads; no
// lock is held across an owner round trip.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "fluxon/client/client_core.hpp"
#include "fluxon/client/client_driver.hpp"
#include "fluxon/runtime/batch.hpp"
#include "fluxon/runtime/config.hpp"
#include "fluxon/runtime/owner_link.hpp"
#include "fluxon/runtime/status.hpp"

namespace fluxon {

class KvClient {
 public:
  // `link` reaches the owner (the actor layer's fluxon::open_owner_link; fluxon/actors/client.hpp
  // has open_client(cfg) for it).
  static Result<std::unique_ptr<KvClient>> open(const ClusterConfig& cfg, OwnerLinkFactory link);
  ~KvClient();
  KvClient(const KvClient&) = delete;
  KvClient& operator=(const KvClient&) = delete;

  Result<std::vector<SegmentInfo>> wait_local_segments_ready();
  Result<uint64_t> local_fast_put_start(const std::vector<std::string>& keys, int64_t value_len,
                                        const PutOptionalArgs& opts = {});
  Result<KvFuture> local_fast_put_commit(uint64_t plan_ptr);
  Status put_abort(uint64_t plan_ptr);
  // Returns (handle id, result). The handle must be consumed by get_transfer or cancel_get_transfer.
  Result<std::pair<uint64_t, GetStartResult>> get_start(const std::vector<std::string>& keys,
                                                        bool prefix_best_effort = true,
                                                        const std::optional<std::vector<uint32_t>>& group_lens = {});
  Result<uint64_t> get_transfer(uint64_t handle, std::optional<int64_t> consume_prefix_len = {});
  Status cancel_get_transfer(uint64_t handle);
  Status release_views(uint64_t plan_ptr);
  // How many leading keys exist (local index, then the master's routes), aligned to the groups;
  // claims no slot, starts no fetch. expected_len > 0: a value of another length does not count.
  // key_prefix/key_suffix: every key is key_prefix + keys[i] + key_suffix (sent once; a batch of
  // SGLang page hashes shares its deployment's prefix and suffix).
  Result<ExistsResult> exists_prefix(const std::vector<std::string>& keys,
                                     const std::optional<std::vector<uint32_t>>& group_lens = {},
                                     uint64_t expected_len = 0, const std::string& key_prefix = {},
                                     const std::string& key_suffix = {});
  // Removes every value the attached owner holds whose key starts with prefix (routes first, each
  // slot once its last reader is gone); returns how many. Other owners' copies are not touched.
  Result<uint64_t> remove_prefix(const std::string& prefix);
  Result<std::map<std::string, uint64_t>> stats();
  // Waits until the attached owner's warm-up is done: the grants its expected capacity
  // (owner_local_reserve_expected_capacity) carved at start are all faulted in (at once in
  // dynamic mode). Returns the owner's stats then; Timeout after `timeout_ms`, naming the progress.
  Result<std::map<std::string, uint64_t>> wait_ready(uint64_t timeout_ms);
  // Round trip to the owner that touches no state: the transport's own cost (bench baseline).
  Status ping();
  // Tests: raw bytes to the owner, answered by an error when malformed.
  Status send_raw_for_test(const std::vector<uint8_t>& bytes);
  // Embedded mode: the master's route count (tests and demo).
  Result<uint64_t> master_route_count();
  // The master's figures (routes, replicas, inflight gets, replica tasks...): tools and reports.
  Result<std::map<std::string, uint64_t>> master_stats();
  // KV events (docs/events.md): the master's route changes after the cursor (epoch, seq; epoch 0:
  // from the oldest event it holds), keys starting with prefix, at most max (0: the master's bound).
  struct KvEventRecord {
    uint64_t seq = 0;
    bool stored = true;  // false: removed
    std::string key;
    uint32_t node = 0;
    uint32_t origin_node = 0;
    uint64_t origin_generation = 0, put_id = 0;
    std::string cause;  // removed: removed, reclaimed, demoted, replaced, owner_restarted
  };
  struct KvEventBatch {
    std::vector<KvEventRecord> events;
    uint64_t epoch = 0, next_seq = 0, first_seq = 0;  // (epoch, next_seq): the cursor to read on from
    bool lost = false;  // the cursor could not be continued: events after it are gone (re-sync)
  };
  Result<KvEventBatch> kv_events(const std::string& prefix, uint64_t epoch, uint64_t seq, uint32_t max);
  void close();

  struct Impl;

 private:
  explicit KvClient(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace fluxon
