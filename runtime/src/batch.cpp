#include "fluxon/runtime/batch.hpp"

#include <cmath>
#include <map>

#include <algorithm>
#include <functional>

namespace fluxon {

namespace {
template <class Keys>
Status validate_keys_of(const Keys& keys, bool allow_repeats) {
  if (keys.empty()) return invalid_argument("keys: empty batch");
  for (size_t i = 0; i < keys.size(); ++i)
    if (keys[i].empty()) return invalid_argument("keys[" + std::to_string(i) + "]: empty key");
  if (allow_repeats || keys.size() < 2) return Status::ok();
  // Repeats by sorting (hash, index) pairs in a buffer the thread keeps: no allocation per key on
  // the hot path (a node set here was 4% of a 128-key get_start, most of it malloc).
  thread_local std::vector<std::pair<uint64_t, uint32_t>> order;
  order.clear();
  for (size_t i = 0; i < keys.size(); ++i) order.emplace_back(std::hash<std::string_view>{}(keys[i]), uint32_t(i));
  std::sort(order.begin(), order.end());
  // The first index at which a key repeats one before it (as a scan in order would report it).
  size_t repeat = keys.size();
  for (size_t a = 0; a < order.size();) {
    size_t b = a + 1;
    while (b < order.size() && order[b].first == order[a].first) ++b;
    for (size_t i = a; i < b; ++i)      // within one hash run, pairs of equal keys (runs are tiny)
      for (size_t j = i + 1; j < b; ++j)
        if (keys[order[i].second] == keys[order[j].second])
          repeat = std::min<size_t>(repeat, std::max(order[i].second, order[j].second));
    a = b;
  }
  if (repeat < keys.size())
    return invalid_argument("keys[" + std::to_string(repeat) + "]: key '" + std::string(keys[repeat]) +
                            "' repeated in one batch");
  return Status::ok();
}
}  // namespace

Status validate_keys(const std::vector<std::string>& keys, bool allow_repeats) {
  return validate_keys_of(keys, allow_repeats);
}
Status validate_keys(std::span<const std::string_view> keys, bool allow_repeats) {
  return validate_keys_of(keys, allow_repeats);
}

Status validate_group_lens(const std::optional<std::vector<uint32_t>>& group_lens, size_t n) {
  if (!group_lens) return Status::ok();
  if (group_lens->empty()) return invalid_argument("atomic_group_lens: empty list");
  uint64_t sum = 0;
  for (size_t i = 0; i < group_lens->size(); ++i) {
    if ((*group_lens)[i] == 0)
      return invalid_argument("atomic_group_lens[" + std::to_string(i) + "]: must be > 0");
    sum += (*group_lens)[i];
  }
  if (sum != n)
    return invalid_argument("atomic_group_lens: sum " + std::to_string(sum) +
                            " != number of keys " + std::to_string(n));
  return Status::ok();
}

Status validate_replica_mask(const std::optional<std::vector<bool>>& mask,
                             const std::optional<std::vector<uint32_t>>& group_lens, size_t n) {
  if (!mask) return Status::ok();
  if (mask->size() != n)
    return invalid_argument("make_replica_task_mask: length " + std::to_string(mask->size()) +
                            " != number of keys " + std::to_string(n));
  if (!group_lens) return Status::ok();
  size_t start = 0;
  for (size_t g = 0; g < group_lens->size(); ++g) {
    size_t end = start + (*group_lens)[g];
    for (size_t i = start + 1; i < end; ++i)
      if ((*mask)[i] != (*mask)[start])
        return invalid_argument("make_replica_task_mask: mixed values inside atomic group " +
                                std::to_string(g));
    start = end;
  }
  return Status::ok();
}

Status validate_parent_keys(const std::optional<std::vector<std::string>>& parents,
                            const std::vector<std::string>& keys) {
  if (!parents) return Status::ok();
  if (parents->size() != keys.size())
    return invalid_argument("radix_parent_keys: length " + std::to_string(parents->size()) + " != number of keys " +
                            std::to_string(keys.size()));
  for (size_t i = 0; i < keys.size(); ++i)
    if ((*parents)[i] == keys[i]) return invalid_argument("radix_parent_keys[" + std::to_string(i) + "]: the key itself");
  return Status::ok();
}

Status validate_content_depths(const std::optional<std::vector<uint32_t>>& depths, size_t n) {
  if (depths && depths->size() != n)
    return invalid_argument("content_depths: length " + std::to_string(depths->size()) + " != number of keys " +
                            std::to_string(n));
  return Status::ok();
}

Status validate_replica_budget(const std::optional<ReplicaBudgetArgs>& budget, bool make_replica_task,
                               bool write_through, const std::optional<std::vector<uint32_t>>& group_lens, size_t n) {
  if (!budget) return Status::ok();
  const std::string what = "replica budget (kv_score_pressure_budget): ";
  if (!make_replica_task || write_through)
    return invalid_argument(what + "needs make_replica_task and no write_through (it cuts replica tasks)");
  if (budget->pages == 0) return invalid_argument(what + "replica_budget_pages: must be > 0");
  const size_t groups = group_lens ? group_lens->size() : n;
  if (budget->priorities.size() != groups)
    return invalid_argument(what + "replica_group_priorities: length " + std::to_string(budget->priorities.size()) +
                            " != number of groups " + std::to_string(groups));
  if (budget->group_ids.size() != groups)
    return invalid_argument(what + "replica_group_ids: length " + std::to_string(budget->group_ids.size()) +
                            " != number of groups " + std::to_string(groups));
  for (size_t g = 0; g < groups; ++g)
    if (!std::isfinite(budget->priorities[g]))
      return invalid_argument(what + "replica_group_priorities[" + std::to_string(g) + "]: not a finite number");
  if (budget->shares == 0 || budget->shares > kMaxReplicaShares)
    return invalid_argument(what + "replica_decision_shares: must be in 1.." + std::to_string(kMaxReplicaShares) +
                            ", got " + std::to_string(budget->shares));
  return Status::ok();
}

std::vector<std::string> parents_from_depths(const std::vector<std::string>& keys, const std::vector<uint32_t>& depths) {
  std::map<uint32_t, std::vector<size_t>> at_depth;  // depth -> the keys of that depth, in order
  std::vector<std::string> parents(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    auto& same = at_depth[depths[i]];
    const size_t rank = same.size();
    same.push_back(i);
    if (depths[i] == 0) continue;
    auto up = at_depth.find(depths[i] - 1);
    if (up != at_depth.end() && rank < up->second.size()) parents[i] = keys[up->second[rank]];
  }
  return parents;
}

PrefixResult compute_prefix(const std::vector<bool>& hits,
                            const std::optional<std::vector<uint32_t>>& group_lens,
                            bool prefix_best_effort) {
  PrefixResult r;
  const uint32_t n = static_cast<uint32_t>(hits.size());
  while (r.raw_prefix_hit_len < n && hits[r.raw_prefix_hit_len]) ++r.raw_prefix_hit_len;
  if (r.raw_prefix_hit_len < n) r.first_miss_index = r.raw_prefix_hit_len;
  // Walk the groups: a group is hit when it ends inside the raw prefix.
  uint32_t start = 0, g = 0;
  const size_t groups = group_lens ? group_lens->size() : n;
  for (; g < groups; ++g) {
    uint32_t len = group_lens ? (*group_lens)[g] : 1;
    if (start + len > r.raw_prefix_hit_len) break;
    start += len;
  }
  r.prefix_hit_groups = g;
  r.transferable_len = start;
  if (r.first_miss_index) r.first_miss_group_index = g;
  if (!prefix_best_effort && r.transferable_len != n) {
    r.transferable_len = 0;
    r.prefix_hit_groups = 0;
  }
  r.all_hit = r.transferable_len == n;
  return r;
}

Status validate_consume_prefix(uint32_t consume, uint32_t transferable_len,
                               const std::optional<std::vector<uint32_t>>& group_lens) {
  if (consume == 0) return invalid_argument("consume_prefix_len: must be > 0");
  if (consume > transferable_len)
    return invalid_argument("consume_prefix_len: " + std::to_string(consume) +
                            " > transferable_len " + std::to_string(transferable_len));
  if (!group_lens) return Status::ok();
  uint32_t edge = 0;
  for (uint32_t len : *group_lens) {
    edge += len;
    if (edge == consume) return Status::ok();
    if (edge > consume) break;
  }
  return invalid_argument("consume_prefix_len: " + std::to_string(consume) +
                          " is not on an atomic-group boundary");
}

}  // namespace fluxon
