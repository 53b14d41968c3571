#include <doctest/doctest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <memory>

#include "fluxon/runtime/page_mapper.hpp"
#include "fluxon/runtime/segment.hpp"

using namespace fluxon;

TEST_CASE("segment: mode 0600, shared bytes, removed when the owner stops") {
  const std::string cluster = "seg-test-" + std::to_string(getpid());
  std::string name;
  {
    auto owner = Segment::create(cluster, 3, 42, 1 << 20);
    REQUIRE(owner.ok());
    name = (*owner)->name();
    struct stat st {};
    REQUIRE(stat(("/dev/shm" + name).c_str(), &st) == 0);
    CHECK((st.st_mode & 0777) == 0600);
    auto client = Segment::open(name, 1 << 20);
    REQUIRE(client.ok());
    std::memcpy((*client)->base() + 4096, "fluxon", 6);
    CHECK(std::memcmp((*owner)->base() + 4096, "fluxon", 6) == 0);
    CHECK(Segment::open(name, 2 << 20).status().code() == Code::kGenerationMismatch);
  }
  struct stat st {};
  CHECK(stat(("/dev/shm" + name).c_str(), &st) != 0);
  CHECK(Segment::open(name, 1 << 20).status().code() == Code::kGenerationMismatch);
}

TEST_CASE("segment: generations grow") {
  const uint64_t a = new_generation(), b = new_generation();
  CHECK(a != 0);
  CHECK(b > a);
}

TEST_CASE("segment: a killed owner's segment is unlinked by its guardian, and the mapping's pages are reported") {
  const std::string cluster = "seg-kill-" + std::to_string(getpid());
  int p[2];
  REQUIRE(pipe(p) == 0);
  const pid_t child = fork();
  if (child == 0) {
    auto seg = Segment::create(cluster, 1, 7, 1 << 20);
    if (!seg.ok()) _exit(1);
    const MappingPages pg = mapping_pages((*seg)->base());
    char buf[256];
    const int n = std::snprintf(buf, sizeof buf, "%s %llu", (*seg)->name().c_str(), (unsigned long long)pg.page_bytes);
    (void)!write(p[1], buf, size_t(n));
    close(p[1]);
    pause();  // killed here: no destructor runs
    _exit(0);
  }
  close(p[1]);
  char buf[256] = {};
  REQUIRE(read(p[0], buf, sizeof buf - 1) > 0);
  close(p[0]);
  char name[200] = {};
  unsigned long long page = 0;
  REQUIRE(std::sscanf(buf, "%199s %llu", name, &page) == 2);
  CHECK(page >= 4096);  // the segment's pages, read from the owner's own smaps
  struct stat st {};
  REQUIRE(stat((std::string("/dev/shm") + name).c_str(), &st) == 0);
  kill(child, SIGKILL);
  int status = 0;
  waitpid(child, &status, 0);
  bool gone = false;
  for (int i = 0; i < 500 && !gone; ++i) {
    gone = stat((std::string("/dev/shm") + name).c_str(), &st) != 0;
    if (!gone) usleep(10000);
  }
  CHECK(gone);
}

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
