// KvEventLog: the master's bounded log of route changes for cache-aware routers (docs/events.md).
// Each stored/removed event gets the next sequence number; at its bound the oldest goes (counted). A
// reader names a cursor (epoch, seq: the last event it has) and gets what follows, filtered by key
// prefix; a cursor the log cannot continue (another epoch: a restarted or new master; or older than
// its first event) reads from the first event it has, with `lost` set. Plain state: no clock, no IO.
//
// Written as two rings, both in order (a publication's cost is two sequential writes, no
// allocation): the records, and their keys' bytes.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "fluxon/master/version.hpp"

namespace fluxon {

struct KvEvent {
  enum class Kind : uint8_t { kStored = 0, kRemoved = 1 };
  uint64_t seq = 0;
  Kind kind = Kind::kStored;
  std::string_view key;  // valid until the log's next append
  uint32_t node = 0;
  Version ver;             // the version of the copy (its origin: node, generation, put_id)
  const char* cause = "";  // removed: why (a static string); stored: ""
};

class KvEventLog {
 public:
  // Bounds: capacity events (the master's kv_event_log_capacity), and capacity * kKeyBytesPerEvent
  // bytes of their keys (longer keys leave fewer events); 0: no log, nothing recorded.
  explicit KvEventLog(size_t capacity = 0);
  static constexpr size_t kKeyBytesPerEvent = 128;
  // Bound on the events one read returns, and on those it looks at to find them (a prefix filter
  // skipping many others still answers in bounded time: next_seq says how far it looked).
  static constexpr uint32_t kMaxPerRead = 4096;
  static constexpr size_t kMaxScannedPerRead = size_t(1) << 16;

  // Names this log for its readers' cursors: never 0 (a cursor of epoch 0 has read nothing yet).
  void set_epoch(uint64_t epoch) { epoch_ = epoch == 0 ? 1 : epoch; }
  uint64_t epoch() const { return epoch_; }

  void stored(std::string_view key, uint32_t node, const Version& ver) {
    append(KvEvent::Kind::kStored, key, node, ver, "");
  }
  void removed(std::string_view key, uint32_t node, const Version& ver, const char* cause) {
    append(KvEvent::Kind::kRemoved, key, node, ver, cause);
  }

  struct Read {
    std::vector<KvEvent> events;  // their keys valid until the next append
    uint64_t next_seq = 0;        // the cursor to read on from
    uint64_t first_seq = 0;       // the oldest event the log holds (the next one's when empty)
    bool lost = false;            // events after the cursor were dropped or belong to another log
  };
  Read read(uint64_t epoch, uint64_t after_seq, std::string_view prefix, uint32_t max) const;

  uint64_t next_seq() const { return next_seq_; }
  size_t size() const { return size_t(next_seq_ - first_seq_); }
  size_t capacity() const { return capacity_; }
  uint64_t dropped() const { return dropped_; }  // events that left at a bound

 private:
  struct Rec {  // trivial: the rings are allocated, not written, until events come (RSS grows with use)
    uint64_t seq;
    uint64_t key_at;  // the key's position in the byte stream (keys_[key_at % key_bytes_])
    uint32_t key_len;
    uint32_t node;
    uint32_t origin_node;
    uint64_t origin_generation, put_id;
    const char* cause;
    KvEvent::Kind kind;
  };
  void append(KvEvent::Kind kind, std::string_view key, uint32_t node, const Version& ver, const char* cause);
  const Rec& rec(uint64_t seq) const { return recs_[size_t((seq - 1) % capacity_)]; }
  KvEvent view(const Rec& r) const;
  uint64_t epoch_ = 1;
  uint64_t next_seq_ = 1;   // seq 0: before the first event (a cursor that has read nothing)
  uint64_t first_seq_ = 1;  // the oldest held
  uint64_t dropped_ = 0;
  size_t capacity_ = 0, key_bytes_ = 0;
  std::unique_ptr<Rec[]> recs_;  // seq s at recs_[(s - 1) % capacity_]
  std::unique_ptr<char[]> keys_;  // the keys' bytes, a ring: a key never wraps (the tail it skips is unused)
  uint64_t key_end_ = 0;          // where the next key's bytes go, in the stream
};

}  // namespace fluxon
