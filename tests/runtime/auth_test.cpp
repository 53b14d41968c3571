// The cluster key (runtime/auth.hpp): its file, proofs bound to both nonces, grants bound to the
// requester, the range, the source generation and an expiry.
#include <doctest/doctest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "fluxon/runtime/auth.hpp"

using namespace fluxon;

namespace {
std::string temp_path(const char* tag) {
  return (std::filesystem::temp_directory_path() / (std::string("fluxon-auth-") + tag + "-" + std::to_string(getpid())))
      .string();
}
struct Removed {
  std::string path;
  ~Removed() { std::filesystem::remove(path); }
};
}  // namespace

TEST_CASE("auth: keygen writes a 0600 key that loads, never overwrites one, and a readable or malformed file is refused by name") {
  Removed f{temp_path("key")};
  REQUIRE(write_key_file(f.path).is_ok());
  struct stat st {};
  REQUIRE(::stat(f.path.c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0600);
  auto k = load_key_file(f.path);
  REQUIRE(k.ok());
  CHECK((*k)->fingerprint().size() == 8);
  // Never over an existing key (it would lock every daemon of the cluster out).
  CHECK(write_key_file(f.path).code() == Code::kInvalidArgument);
  // Readable by the group: refused, the path and the fix named.
  ::chmod(f.path.c_str(), 0640);
  auto open = load_key_file(f.path);
  CHECK(open.status().code() == Code::kInvalidArgument);
  CHECK(open.status().message().find("auth.key_file: " + f.path) != std::string::npos);
  CHECK(open.status().message().find("chmod 600") != std::string::npos);
  ::chmod(f.path.c_str(), 0600);
  { std::ofstream(f.path) << "fluxon-key-v1 1234\n"; }
  CHECK(load_key_file(f.path).status().message().find("not a Fluxon key") != std::string::npos);
  CHECK(load_key_file(f.path + ".missing").status().message().find("fluxon keygen") != std::string::npos);
}

TEST_CASE("auth: two keys differ, and a proof is bound to both nonces, the channel and the identity") {
  Removed a{temp_path("a")}, b{temp_path("b")};
  REQUIRE(write_key_file(a.path).is_ok());
  REQUIRE(write_key_file(b.path).is_ok());
  auto ka = *load_key_file(a.path), kb = *load_key_file(b.path);
  CHECK(ka->fingerprint() != kb->fingerprint());
  const Nonce s = random_nonce(), c = random_nonce(), s2 = random_nonce();
  const Proof p = client_proof(*ka, "data", s, c, "id");
  CHECK(p == client_proof(*ka, "data", s, c, "id"));
  CHECK(p != client_proof(*kb, "data", s, c, "id"));    // another key
  CHECK(p != client_proof(*ka, "data", s2, c, "id"));   // another challenge: a replay fails
  CHECK(p != client_proof(*ka, "caf", s, c, "id"));     // another channel
  CHECK(p != client_proof(*ka, "data", s, c, "id2"));   // another identity
  CHECK(p != server_proof(*ka, "data", s, c, "id"));    // the server's answer is not the client's
  // Length-prefixed parts: moving a byte between two parts changes the input.
  CHECK(ka->mac("l", {"ab", "c"}) != ka->mac("l", {"a", "bc"}));
}

TEST_CASE("auth: a grant opens exactly its range for its requester until it expires") {
  Removed a{temp_path("g")};
  REQUIRE(write_key_file(a.path).is_ok());
  auto k = *load_key_file(a.path);
  const uint64_t now = wall_ms();
  const Grant g = make_grant(*k, 3, 77, 1000, 4096, 8192, now + 60000);
  CHECK(check_grant(*k, g.data(), 3, 77, 1000, 4096, 8192, now) == nullptr);
  CHECK(std::string(check_grant(*k, g.data(), 4, 77, 1000, 4096, 8192, now)) == "forged");   // another requester
  CHECK(std::string(check_grant(*k, g.data(), 3, 78, 1000, 4096, 8192, now)) == "forged");   // its next generation
  CHECK(std::string(check_grant(*k, g.data(), 3, 77, 1001, 4096, 8192, now)) == "forged");   // another segment
  CHECK(std::string(check_grant(*k, g.data(), 3, 77, 1000, 0, 8192, now)) == "forged");      // another offset
  CHECK(std::string(check_grant(*k, g.data(), 3, 77, 1000, 4096, 8193, now)) == "forged");   // one byte more
  CHECK(std::string(check_grant(*k, g.data(), 3, 77, 1000, 4096, 8192, now + 60001)) == "expired");
  Grant later = g;
  later[0] ^= 1;  // the expiry is under the HMAC: extending it forges the grant
  CHECK(std::string(check_grant(*k, later.data(), 3, 77, 1000, 4096, 8192, now)) == "forged");
}
