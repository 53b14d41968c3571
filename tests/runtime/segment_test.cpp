#include <doctest/doctest.h>
#include <sys/stat.h>
#include <unistd.h>

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
