// The cluster key: its file, HMAC-SHA256 (OpenSSL's libcrypto), nonces, proofs and grants.
#include "fluxon/runtime/auth.hpp"

#include <fcntl.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <cstdio>

namespace fluxon {

namespace {

constexpr std::string_view kKeyHeader = "fluxon-key-v1 ";

void fill_random(uint8_t* p, size_t n) {
  while (n > 0) {
    const ssize_t got = ::getrandom(p, n, 0);
    if (got < 0) {
      if (errno == EINTR) continue;
      throw std::runtime_error(std::string("getrandom: ") + std::strerror(errno));
    }
    p += got;
    n -= size_t(got);
  }
}

std::string hex(const uint8_t* p, size_t n) {
  static const char* d = "0123456789abcdef";
  std::string s;
  for (size_t i = 0; i < n; ++i) {
    s += d[p[i] >> 4];
    s += d[p[i] & 15];
  }
  return s;
}

int unhex(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

Proof AuthKey::mac(std::string_view label, std::initializer_list<std::string_view> parts) const {
  std::string in;
  in.reserve(64);
  auto put = [&](std::string_view s) {
    const uint32_t n = uint32_t(s.size());
    in.append(reinterpret_cast<const char*>(&n), 4);
    in.append(s);
  };
  put(label);
  for (auto p : parts) put(p);
  Proof out{};
  unsigned int len = 0;
  HMAC(EVP_sha256(), k_.data(), int(k_.size()), reinterpret_cast<const unsigned char*>(in.data()), in.size(),
       out.data(), &len);
  return out;
}

std::string AuthKey::fingerprint() const {
  const Proof p = mac("fluxon-key-fingerprint", {});
  return hex(p.data(), 4);
}

Result<AuthKeyPtr> load_key_file(const std::string& path) {
  const std::string where = "auth.key_file: " + path;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return Status(Code::kInvalidArgument, where + ": " + std::strerror(errno) + " (write one with `fluxon keygen " +
                                              path + "`)");
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return Status(Code::kInvalidArgument, where + ": not a regular file");
  }
  if ((st.st_mode & 077) != 0) {
    ::close(fd);
    char mode[8];
    std::snprintf(mode, sizeof(mode), "%04o", unsigned(st.st_mode & 07777));
    return Status(Code::kInvalidArgument, where + ": mode " + mode +
                                              " lets other users read the cluster key; `chmod 600 " + path + "`");
  }
  char buf[256];
  const ssize_t n = ::read(fd, buf, sizeof(buf));
  ::close(fd);
  std::string text(buf, n > 0 ? size_t(n) : 0);
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r' || text.back() == ' ')) text.pop_back();
  if (text.compare(0, kKeyHeader.size(), kKeyHeader) != 0 || text.size() != kKeyHeader.size() + 2 * kAuthKeyBytes)
    return Status(Code::kInvalidArgument,
                  where + ": not a Fluxon key (expected 'fluxon-key-v1 ' and 64 hex digits: `fluxon keygen`)");
  std::array<uint8_t, kAuthKeyBytes> k{};
  for (size_t i = 0; i < kAuthKeyBytes; ++i) {
    const int hi = unhex(text[kKeyHeader.size() + 2 * i]), lo = unhex(text[kKeyHeader.size() + 2 * i + 1]);
    if (hi < 0 || lo < 0) return Status(Code::kInvalidArgument, where + ": not a Fluxon key (a non-hex digit)");
    k[i] = uint8_t(hi << 4 | lo);
  }
  return AuthKeyPtr(std::make_shared<AuthKey>(k));
}

Status write_key_file(const std::string& path) {
  std::array<uint8_t, kAuthKeyBytes> k{};
  fill_random(k.data(), k.size());
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0)
    return Status(Code::kInvalidArgument,
                  path + ": " + std::strerror(errno) + (errno == EEXIST ? " (a key is never overwritten)" : ""));
  const std::string text = std::string(kKeyHeader) + hex(k.data(), k.size()) + "\n";
  const bool ok = ::fchmod(fd, 0600) == 0 && ::write(fd, text.data(), text.size()) == ssize_t(text.size());
  ::close(fd);
  if (!ok) {
    ::unlink(path.c_str());
    return Status(Code::kInternal, path + ": could not write the key");
  }
  return Status::ok();
}

Nonce random_nonce() {
  Nonce n{};
  fill_random(n.data(), n.size());
  return n;
}

bool equal_ct(const uint8_t* a, const uint8_t* b, size_t n) { return CRYPTO_memcmp(a, b, n) == 0; }

std::string_view view_u64(const uint64_t& v) { return {reinterpret_cast<const char*>(&v), 8}; }

Proof client_proof(const AuthKey& k, std::string_view channel, const Nonce& server, const Nonce& client,
                   std::string_view identity) {
  return k.mac("fluxon-auth-v1 client", {channel, view(server), view(client), identity});
}

Proof server_proof(const AuthKey& k, std::string_view channel, const Nonce& server, const Nonce& client,
                   std::string_view identity) {
  return k.mac("fluxon-auth-v1 server", {channel, view(server), view(client), identity});
}

namespace {
Proof grant_mac(const AuthKey& k, uint32_t requester_node, uint64_t requester_generation, uint64_t source_generation,
                uint64_t offset, uint64_t len, uint64_t expires) {
  const uint64_t node = requester_node;
  return k.mac("fluxon-grant-v1", {view_u64(node), view_u64(requester_generation), view_u64(source_generation),
                                   view_u64(offset), view_u64(len), view_u64(expires)});
}
}  // namespace

Grant make_grant(const AuthKey& k, uint32_t requester_node, uint64_t requester_generation, uint64_t source_generation,
                 uint64_t offset, uint64_t len, uint64_t expires_unix_ms) {
  Grant g{};
  std::memcpy(g.data(), &expires_unix_ms, 8);
  const Proof m = grant_mac(k, requester_node, requester_generation, source_generation, offset, len, expires_unix_ms);
  std::memcpy(g.data() + 8, m.data(), kGrantBytes - 8);
  return g;
}

const char* check_grant(const AuthKey& k, const uint8_t* grant, uint32_t requester_node, uint64_t requester_generation,
                        uint64_t source_generation, uint64_t offset, uint64_t len, uint64_t now_unix_ms) {
  uint64_t expires = 0;
  std::memcpy(&expires, grant, 8);
  const Proof m = grant_mac(k, requester_node, requester_generation, source_generation, offset, len, expires);
  if (!equal_ct(m.data(), grant + 8, kGrantBytes - 8)) return "forged";
  if (expires < now_unix_ms) return "expired";
  return nullptr;
}

uint64_t wall_ms() {
  return uint64_t(
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
          .count());
}

}  // namespace fluxon
