#include "fluxon/owner/local_index.hpp"

#include <algorithm>
#include <cctype>
#include <string_view>

namespace fluxon {

namespace {
LocalIndex::Tier::Options tier_options(uint64_t capacity, bool enforce, uint64_t segment_len) {
  LocalIndex::Tier::Options o;
  o.max_capacity = capacity;
  o.enforce_capacity = enforce;
  o.shards = 4;
  o.estimated_entries = std::max<uint64_t>(1024, segment_len / (256 << 10));
  return o;
}
}  // namespace

LocalIndex::LocalIndex(uint64_t segment_len, double hot_ratio, bool tp_cohorts,
                       std::optional<uint64_t> depth_stale_bytes)
    : resident_(tier_options(segment_len, false, segment_len)), tp_cohorts_(tp_cohorts) {
  // With the depth order the hot tier only holds what is not written back yet: its bound is kept
  // by WriteBack, which takes victims in the depth order instead of the tier's Size evictions.
  if (hot_ratio > 0)
    hot_ = std::make_unique<Tier>(
        tier_options(uint64_t(double(segment_len) * hot_ratio), !depth_stale_bytes, segment_len));
  if (depth_stale_bytes) order_.emplace(*depth_stale_bytes);
}

bool LocalIndex::cohort_busy(CohortId id, const ReservePool& pool) const {
  for (const auto& c : exact_cohort(id))
    if (const auto* keys = cohort(c))
      for (const auto& key : *keys) {
        auto m = find(key);
        if (m == end()) continue;
        if (m->second.live && pool.slot(m->second.slot).holder_refs > 0) return true;  // a reader holds it
        if (!m->second.live && m->second.put_id == c.first) return true;  // its route is on its way
      }
  return false;
}

void LocalIndex::insert(const std::string& key, Entry e, const std::string* parent, uint32_t depth) {
  cohorts_[{e.put_id, e.group}].push_back(key);
  if (const Node* old = entries_.find(key)) by_slot_.erase(old->second.slot.packed());
  const Node* entry = entries_.insert_or_assign(key, e).first;
  *by_slot_.try_emplace(e.slot.packed(), entry).first = entry;
  if (parent && !parent->empty()) {
    chains_.link(key, *parent);
    if (depth == kNoDepth)
      if (auto d = depths_.find(*parent); d != depths_.end()) depth = d->second + 1;
  }
  if (depth != kNoDepth) depths_[key] = depth;
  else depths_.erase(key);
}

void LocalIndex::erase(Node* it) {
  const std::string& key = it->first;
  const Entry& e = it->second;
  const uint64_t put_id = e.put_id;
  resident_.remove_if(key, [put_id](const ResidentRef& r) { return r.put_id == put_id; });
  if (hot_) hot_->remove_if(key, [put_id](const ResidentRef& r) { return r.put_id == put_id; });
  auto c = cohorts_.find({e.put_id, e.group});
  if (c != cohorts_.end()) {
    std::erase(c->second, key);
    if (c->second.empty()) {
      remote_complete_.erase(c->first);
      cohorts_.erase(c);
    }
  }
  chains_.unlink(key);
  depths_.erase(key);
  if (auto* s = by_slot_.find(e.slot.packed()); s && *s == it) by_slot_.erase(e.slot.packed());
  if (order_) order_->erase(key);
  entries_.erase(it);  // key and e die here
}

bool LocalIndex::erase_if_copy(const std::string& key, uint64_t put_id) {
  Node* it = entries_.find(key);
  if (!it || it->second.put_id != put_id) return false;
  erase(it);
  return true;
}

const std::vector<std::string>* LocalIndex::cohort(CohortId id) const {
  auto c = cohorts_.find(id);
  return c == cohorts_.end() ? nullptr : &c->second;
}

std::vector<LocalIndex::CohortId> LocalIndex::exact_cohort(CohortId id) const {
  std::vector<CohortId> remaining{id};
  if (!tp_cohorts_) return remaining;
  if (const auto* keys = cohort(id))
    for (const auto& key : *keys)
      for (const auto& sib : tp_siblings(key)) {
        const Node* it = entries_.find(sib);
        if (!it) continue;
        CohortId other{it->second.put_id, it->second.group};
        if (std::find(remaining.begin(), remaining.end(), other) == remaining.end()) remaining.push_back(other);
      }
  return remaining;
}

bool LocalIndex::cohort_is_leaf(CohortId id, const Going& going) const {
  // Each member's held children, less those inside the exact cohort itself.
  std::vector<const std::string*> members;
  for (const auto& c : exact_cohort(id))
    if (const auto* keys = cohort(c))
      for (const auto& k : *keys) members.push_back(&k);
  std::unordered_map<std::string_view, uint32_t> inside;  // page -> members continuing it
  for (const auto* m : members)
    if (const auto* p = chains_.parent(*m)) inside[*p]++;
  for (const auto* k : members) {
    auto in = inside.find(*k);
    auto g = going.find(*k);
    const uint32_t elsewhere = (in == inside.end() ? 0 : in->second) + (g == going.end() ? 0 : g->second);
    if (chains_.children(*k) > elsewhere) return false;
  }
  return true;
}

std::vector<std::string> tp_siblings(const std::string& key) {
  auto digits_end = [&](size_t i) {
    while (i < key.size() && isdigit(static_cast<unsigned char>(key[i]))) ++i;
    return i;
  };
  for (size_t p = key.rfind('_'); p != std::string::npos; p = p == 0 ? std::string::npos : key.rfind('_', p - 1)) {
    const size_t rank_end = digits_end(p + 1);
    if (rank_end == p + 1 || rank_end - p - 1 > 4 || rank_end >= key.size() || key[rank_end] != '_') continue;
    const size_t size_end = digits_end(rank_end + 1);
    if (size_end == rank_end + 1 || size_end - rank_end - 1 > 4) continue;
    if (size_end != key.size() && key[size_end] != '_' && key[size_end] != '.') continue;
    const unsigned long rank = std::stoul(key.substr(p + 1, rank_end - p - 1));
    const unsigned long size = std::stoul(key.substr(rank_end + 1, size_end - rank_end - 1));
    if (size < 2 || size > 1024 || rank >= size) continue;
    std::vector<std::string> out;
    for (unsigned long r = 0; r < size; ++r)
      if (r != rank) out.push_back(key.substr(0, p + 1) + std::to_string(r) + key.substr(rank_end));
    return out;
  }
  return {};
}

}  // namespace fluxon
