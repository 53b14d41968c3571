#include <doctest/doctest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>

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

TEST_CASE("segment sweep: a dead owner's segment is removed, a live one (even of this process) and other clusters' are kept") {
  const std::string cluster = "seg-sweep-" + std::to_string(getpid());
  auto plant = [](const std::string& n) {
    const std::string path = "/dev/shm/" + n;
    FILE* f = std::fopen(path.c_str(), "wb");
    REQUIRE(f);
    std::fclose(f);
    return path;
  };
  auto exists = [](const std::string& path) {
    struct stat st {};
    return stat(path.c_str(), &st) == 0;
  };
  auto live = Segment::create(cluster, 1, 77, 1 << 20);  // held by this very process
  REQUIRE(live.ok());
  const std::string dead = plant("fluxon." + cluster + ".2.5");  // no lock: its owner is gone
  const std::string other = plant("fluxon." + cluster + ".b.2.5");  // cluster "<cluster>.b"
  const std::string prefixed = plant("fluxon." + cluster + "x.2.5");  // cluster "<cluster>x"
  const std::string odd = plant("fluxon." + cluster + ".2.5.tmp");  // not a segment's name

  const SegmentSweep look = sweep_dead_segments(cluster, false);  // only looks
  REQUIRE(look.dead.size() == 1);
  CHECK(look.dead[0].name == "/fluxon." + cluster + ".2.5");
  REQUIRE(look.live.size() == 1);
  CHECK(look.live[0].name == (*live)->name());
  CHECK(look.live[0].bytes == 1 << 20);
  CHECK(exists(dead));

  const SegmentSweep s = sweep_dead_segments(cluster, true);
  CHECK(s.dead.size() == 1);
  CHECK(s.live.size() == 1);
  CHECK(!exists(dead));
  CHECK(exists("/dev/shm" + (*live)->name()));
  CHECK(exists(other));
  CHECK(exists(prefixed));
  CHECK(exists(odd));
  std::memcpy((*live)->base(), "still", 5);  // the live mapping is untouched
  auto again = Segment::open((*live)->name(), 1 << 20);
  REQUIRE(again.ok());
  CHECK(std::memcmp((*again)->base(), "still", 5) == 0);
  for (const auto& p : {dead, other, prefixed, odd}) unlink(p.c_str());  // whatever the outcome
}
