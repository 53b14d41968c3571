// Batch argument rules and atomic-group prefix math shared by put and get (design: "Put 与 Get
// 使用同一种 atomic_group_lens 分区语义"). Pure functions: validated once at the edge, then trusted.
#pragma once
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "fluxon/runtime/status.hpp"

namespace fluxon {

// Every key non-empty, at least one key, and (unless allow_repeats: a question that changes
// nothing) no key repeated in the batch.
Status validate_keys(const std::vector<std::string>& keys, bool allow_repeats = false);
Status validate_keys(std::span<const std::string_view> keys, bool allow_repeats = false);

// Groups: each > 0, sum == n. Empty optional = every key its own group.
Status validate_group_lens(const std::optional<std::vector<uint32_t>>& group_lens, size_t n);

// Mask: length == n and constant inside every group.
Status validate_replica_mask(const std::optional<std::vector<bool>>& mask,
                             const std::optional<std::vector<uint32_t>>& group_lens, size_t n);
// radix_parent_keys: one per key ("" for a root) when given; a key is never its own parent.
Status validate_parent_keys(const std::optional<std::vector<std::string>>& parents,
                            const std::vector<std::string>& keys);
// content_depths: per key, its depth in its prefix (pages from the root). One per key.
Status validate_content_depths(const std::optional<std::vector<uint32_t>>& depths, size_t n);
// kv_score_pressure_budget (ReplicaBudget): the owner keeps, of the groups the mask names, the
// best (`priorities`, one per group) that fit in `pages` x its eviction pressure; `group_ids`
// (one per group) name a group the same on every TP rank, and `shares` puts (the TP ranks behind
// the owner) share one decision.
struct ReplicaBudgetArgs {
  uint32_t pages = 0;
  std::vector<float> priorities;
  std::vector<uint64_t> group_ids;
  uint32_t shares = 1;
};
constexpr uint32_t kMaxReplicaShares = 64;
// pages > 0; a priority and an id per group (finite priorities); shares in 1..kMaxReplicaShares;
// only with make_replica_task (write_through asks for no replica).
Status validate_replica_budget(const std::optional<ReplicaBudgetArgs>& budget, bool make_replica_task,
                               bool write_through, const std::optional<std::vector<uint32_t>>& group_lens, size_t n);
// The prefix chain the depths imply inside the batch: key i's parent is the key of depth d-1 with
// the same rank among the keys of its depth (so a page's k and v values, or the TP ranks' copies,
// each continue their own), "" when the batch has none (its parent came before the batch).
std::vector<std::string> parents_from_depths(const std::vector<std::string>& keys, const std::vector<uint32_t>& depths);

struct PrefixResult {
  uint32_t raw_prefix_hit_len = 0;   // contiguous hits, not aligned to groups
  uint32_t transferable_len = 0;     // never cuts a group
  uint32_t prefix_hit_groups = 0;    // complete groups inside transferable_len
  std::optional<uint32_t> first_miss_index;
  std::optional<uint32_t> first_miss_group_index;
  bool all_hit = false;              // transferable_len == n
};

// A1: a group counts only when every member hits. With prefix_best_effort == false the batch is
// all-or-nothing: anything short of a full hit transfers nothing.
PrefixResult compute_prefix(const std::vector<bool>& hits,
                            const std::optional<std::vector<uint32_t>>& group_lens,
                            bool prefix_best_effort);

// consume_prefix_len must be > 0, <= transferable_len and on a group boundary.
Status validate_consume_prefix(uint32_t consume, uint32_t transferable_len,
                               const std::optional<std::vector<uint32_t>>& group_lens);

}  // namespace fluxon
