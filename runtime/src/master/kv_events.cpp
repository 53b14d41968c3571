#include "fluxon/master/kv_events.hpp"

#include <algorithm>
#include <cstring>

namespace fluxon {

KvEventLog::KvEventLog(size_t capacity)
    : capacity_(capacity),
      key_bytes_(capacity * kKeyBytesPerEvent),
      recs_(std::make_unique_for_overwrite<Rec[]>(capacity)),
      keys_(std::make_unique_for_overwrite<char[]>(key_bytes_)) {}

void KvEventLog::append(KvEvent::Kind kind, std::string_view key, uint32_t node, const Version& ver,
                        const char* cause) {
  if (capacity_ == 0) return;
  const uint64_t ring = key_bytes_;
  if (key.size() > ring) key = key.substr(0, ring);  // (a key longer than the whole ring: never in practice)
  uint64_t at = key_end_;
  if (at % ring + key.size() > ring) at += ring - at % ring;  // no wrap inside a key: skip the tail
  const uint64_t end = at + key.size();
  // The oldest go while their records' place or their keys' bytes are needed.
  while (first_seq_ < next_seq_ && (next_seq_ - first_seq_ >= capacity_ || rec(first_seq_).key_at + ring < end)) {
    first_seq_++;
    dropped_++;
  }
  if (!key.empty()) std::memcpy(keys_.get() + at % ring, key.data(), key.size());
  key_end_ = end;
  // (The slot first, then the record: in `a[i(n)] = f(n++)` C++17 evaluates the right side first.)
  Rec& slot = recs_[size_t((next_seq_ - 1) % capacity_)];
  slot = Rec{next_seq_, at, uint32_t(key.size()), node, ver.origin_node, ver.origin_generation, ver.put_id, cause, kind};
  next_seq_++;
}

KvEvent KvEventLog::view(const Rec& r) const {
  return KvEvent{r.seq, r.kind, std::string_view(keys_.get() + r.key_at % key_bytes_, r.key_len), r.node,
                 Version{r.origin_node, r.origin_generation, r.put_id}, r.cause};
}

KvEventLog::Read KvEventLog::read(uint64_t epoch, uint64_t after_seq, std::string_view prefix, uint32_t max) const {
  Read r;
  r.first_seq = first_seq_;
  max = std::min(max == 0 ? kMaxPerRead : max, kMaxPerRead);
  // Epoch 0: no cursor yet, from the oldest event held. Else a cursor this log can continue: its
  // epoch, at most its head, and nothing after it dropped; any other reads from the oldest, lost.
  uint64_t from = after_seq + 1;
  if (epoch == 0) {
    from = r.first_seq;
  } else if (epoch != epoch_ || after_seq >= next_seq_ || from < r.first_seq) {
    r.lost = true;
    from = r.first_seq;
  }
  r.next_seq = from - 1;
  size_t scanned = 0;
  for (uint64_t seq = from; seq < next_seq_ && r.events.size() < max && scanned < kMaxScannedPerRead;
       ++seq, ++scanned) {
    const Rec& e = rec(seq);
    r.next_seq = seq;
    if (e.key_len >= prefix.size() && std::string_view(keys_.get() + e.key_at % key_bytes_, prefix.size()) == prefix)
      r.events.push_back(view(e));
  }
  return r;
}

}  // namespace fluxon
