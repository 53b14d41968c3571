// PageMapper against a real shared-memory segment: what a call maps, what is mapped behind it (the
// process's own page tables, read back from /proc/self/smaps). Also run under ThreadSanitizer.
#include <doctest/doctest.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>

#include "fluxon/runtime/page_mapper.hpp"
#include "fluxon/runtime/segment.hpp"

using namespace fluxon;

namespace {
// Resident bytes of the mapping that starts at addr, as this process's page tables have them.
uint64_t mapped_rss(const void* addr) {
  FILE* f = std::fopen("/proc/self/smaps", "r");
  REQUIRE(f != nullptr);
  char line[512];
  bool in = false;
  uint64_t rss = 0;
  while (std::fgets(line, sizeof line, f)) {
    unsigned long long lo = 0, hi = 0;
    if (std::sscanf(line, "%llx-%llx ", &lo, &hi) == 2 && std::strchr(line, '-') < std::strchr(line, ' ')) {
      in = lo == reinterpret_cast<uintptr_t>(addr);
      continue;
    }
    unsigned long long kb = 0;
    if (in && std::sscanf(line, "Rss: %llu kB", &kb) == 1) rss = kb << 10;
  }
  std::fclose(f);
  return rss;
}
}  // namespace

TEST_CASE("page mapper: a call maps only what it touches, the chunks ahead of it in its grant are mapped behind it, a mapped chunk costs nothing") {
  const std::string cluster = "seg-map-" + std::to_string(getpid());
  const uint64_t size = 64ull << 20, grant = 16ull << 20;
  auto owner = Segment::create(cluster, 2, 9, size);
  REQUIRE(owner.ok());
  std::memset((*owner)->base(), 7, size);  // the owner's pages exist; the client's page tables are empty
  auto client = Segment::open((*owner)->name(), size);
  REQUIRE(client.ok());
  std::shared_ptr<Segment> mapping = std::move(client.value());
  CHECK(mapped_rss(mapping->base()) == 0);
  {
    PageMapper pm(mapping, grant);
    const uint64_t at = grant + (5ull << 20) + 100;  // one slot in the second grant, across a page boundary
    pm.touch(at, 4096);
    auto s = pm.stats();
    CHECK(s.now_bytes == 4096);  // not the grant
    pm.drain();
    s = pm.stats();
    const uint64_t chunk = at / PageMapper::kChunk;
    CHECK(s.chunks_mapped == 1 + PageMapper::kAhead);  // its chunk and the ones after it
    CHECK(s.behind_bytes == (1 + PageMapper::kAhead) * PageMapper::kChunk);
    CHECK(s.chunks_queued == 0);
    CHECK(mapped_rss(mapping->base()) == s.behind_bytes);  // that much, nothing else
    pm.touch(chunk * PageMapper::kChunk, 4 << 20);  // inside mapped chunks: nothing now, two more ahead
    pm.drain();
    CHECK(pm.stats().now_bytes == 4096);
    CHECK(pm.stats().chunks_mapped == 1 + PageMapper::kAhead + 1);  // the grant ends after chunk + 5
    pm.touch(size - 4096, 4096);  // the last grant's last page: its chunk, nothing past the grant
    pm.drain();
    CHECK(pm.stats().chunks_mapped == 1 + PageMapper::kAhead + 2);
    CHECK(pm.stats().now_bytes == 2 * 4096);
    CHECK(mapped_rss(mapping->base()) == (1 + PageMapper::kAhead + 2) * PageMapper::kChunk);
    pm.touch(size, 4096);  // outside: ignored
    CHECK(pm.stats().now_bytes == 2 * 4096);
  }
  {
    // Stopped with a grant queued: the thread ends after its chunk in flight.
    PageMapper pm(mapping, size);
    pm.touch(0, 4096);
  }
}
