// PageMapper: fills this process's page tables for the parts of an owner's segment it uses, so that
// copies into and out of slots run at memory speed instead of one page fault per 4 KiB — without
// making a call wait for more than it touches. A call's own ranges are mapped at once (one system
// call per range); the rest of their chunks and the next few chunks of their grant are mapped behind
// them by one thread, so the next slots carved from the grant are mapped before they are used. The
// work follows use: mapping a whole grant of 256 MiB inside the first call that touched it cost that
// call up to a second on a VM whose page tables are slow to fill, and mapping it all behind the call
// took a core from the calls that followed for as long.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

namespace fluxon {

class Segment;

class PageMapper {
 public:
  static constexpr uint64_t kChunk = 2ull << 20;
  static constexpr uint64_t kAhead = 4;  // chunks mapped ahead of the last one touched
  // grant_bytes: the owner's grant size (its slots are carved from grants in order); 0 maps nothing.
  PageMapper(std::shared_ptr<Segment> mapping, uint64_t grant_bytes);
  ~PageMapper();  // stops the thread (a chunk at most in flight)
  PageMapper(const PageMapper&) = delete;
  PageMapper& operator=(const PageMapper&) = delete;

  // [offset, offset+len) is about to be copied into or out of: the parts of it in chunks not yet
  // mapped are mapped now; those chunks and the kAhead after them in the grant are queued for the thread.
  // A call's ranges at once: one lock, and the thread is woken only when a chunk was newly queued
  // (a put of 128 slots in mapped chunks makes no system call at all).
  void touch(const std::vector<std::pair<uint64_t, uint64_t>>& ranges);
  void touch(uint64_t offset, uint64_t len) { touch({{offset, len}}); }

  struct Stats {
    uint64_t now_bytes = 0;         // mapped inside calls
    uint64_t behind_bytes = 0;      // mapped by the thread
    uint64_t chunks_mapped = 0;     // chunks whole
    uint64_t chunks_queued = 0;     // waiting for the thread
  };
  Stats stats() const;
  // Tests: waits until the thread has nothing queued.
  void drain();

 private:
  enum : uint8_t { kUnmapped = 0, kQueued = 1, kMapped = 2 };
  void run();
  bool queue(uint64_t chunk);  // locked; true: newly queued

  const std::shared_ptr<Segment> mapping_;
  const uint64_t grant_bytes_;
  mutable std::mutex m_;
  std::condition_variable cv_, idle_;
  std::vector<uint8_t> state_;  // per chunk
  std::deque<uint64_t> queue_;  // chunks
  bool busy_ = false, stop_ = false;
  Stats stats_;
  std::thread thread_;  // started on the first queued chunk
};

}  // namespace fluxon
