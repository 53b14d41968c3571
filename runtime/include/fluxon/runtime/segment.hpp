// The owner's shared memory segment: POSIX shm, mode 0600, named per cluster, node and
// generation, removed when the owner stops. Clients map it by name.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "fluxon/runtime/status.hpp"

namespace fluxon {

std::string segment_name(const std::string& cluster, uint32_t node_id, uint64_t generation);

class Segment {
 public:
  // Owner side: create (O_EXCL, 0600), size, map, and hold the liveness lock (an OFD lock) for the
  // owner's life; a guardian process removes the name if the owner is killed.
  static Result<std::unique_ptr<Segment>> create(const std::string& cluster, uint32_t node_id,
                                                 uint64_t generation, uint64_t bytes);
  // Client side: map an existing segment read/write.
  static Result<std::unique_ptr<Segment>> open(const std::string& name, uint64_t bytes);
  ~Segment();
  Segment(const Segment&) = delete;
  Segment& operator=(const Segment&) = delete;

  uint8_t* base() const { return base_; }
  // Fault [offset, offset+len) in, writable, in one system call (MADV_POPULATE_WRITE; a page-touch
  // loop where the kernel lacks it): first writes then run at memory speed, not page-fault speed.
  void populate(uint64_t offset, uint64_t len) const;
  // Gives the pages of [offset, offset+len) back to the system (shared memory: the backing is freed,
  // every mapping reads zeros there until written again). Whole pages only.
  void release(uint64_t offset, uint64_t len) const;
  uint64_t size() const { return size_; }
  const std::string& name() const { return name_; }

 private:
  Segment(std::string name, uint8_t* base, uint64_t size, int owner_fd)
      : name_(std::move(name)), base_(base), size_(size), owner_fd_(owner_fd) {}
  std::string name_;
  uint8_t* base_;
  uint64_t size_;
  int owner_fd_;  // owner: holds the liveness lock; client: -1
  int guardian_fd_ = -1;  // owner: the pipe its guardian waits on (unlinks the name if the owner is killed)
};

// The segments of one cluster in /dev/shm, by whether their owner lives: a segment whose liveness
// lock is free has lost its owner (killed together with its guardian, or a host that never ran the
// guardian). `remove`: unlink the dead ones (the sweep of an owner's start, `fluxon cluster down`
// and `fluxon cluster cleanup`). Never touches a live owner's segment or another cluster's.
struct SegmentFile {
  std::string name;  // "/fluxon.<cluster>.<node>.<generation>"
  uint64_t bytes = 0;
};
struct SegmentSweep {
  std::vector<SegmentFile> dead;  // removed when `remove`
  std::vector<SegmentFile> live;
};
SegmentSweep sweep_dead_segments(const std::string& cluster, bool remove);

// A fresh owner generation: grows across restarts of the same node (and within one process).
uint64_t new_generation();

// What backs a mapping of this process (from /proc/self/smaps): its page size, how much of it is
// mapped with huge pages now (THP: ShmemPmdMapped / AnonHugePages / FilePmdMapped), and the
// system's shmem THP mode (/sys/kernel/mm/transparent_hugepage/shmem_enabled, the bracketed word;
// "" where the kernel has none). Segments are mapped with MADV_HUGEPAGE: they get huge pages
// where that mode is advise, within_size or always, 4 KiB pages otherwise.
struct MappingPages {
  uint64_t page_bytes = 0;
  uint64_t huge_bytes = 0;
  std::string shmem_thp;
  // The page size most of the mapping has: 2 MiB once huge pages back it, else page_bytes.
  uint64_t effective_page_bytes(uint64_t mapping_len) const {
    return huge_bytes * 2 >= mapping_len && huge_bytes > 0 ? 2ull << 20 : page_bytes;
  }
};
MappingPages mapping_pages(const void* addr);

}  // namespace fluxon
