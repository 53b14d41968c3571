// The cluster key and what is proven with it (docs/security.md). One secret per cluster, in a file
// of mode 0600 named by `auth: {key_file: PATH}`; `fluxon keygen PATH` writes one. The key never
// travels: every channel proves it by challenge-response with HMAC-SHA256 over nonces both sides
// drew for this connection (a recorded handshake is worth nothing on the next one), and the data
// plane serves only ranges the master granted to the requester (a capability: an HMAC over the
// requester, the source segment's generation, the range and an expiry).
#pragma once
#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "fluxon/runtime/status.hpp"

namespace fluxon {

constexpr size_t kAuthKeyBytes = 32;
constexpr size_t kNonceBytes = 16;
constexpr size_t kProofBytes = 32;
using Nonce = std::array<uint8_t, kNonceBytes>;
using Proof = std::array<uint8_t, kProofBytes>;

class AuthKey {
 public:
  explicit AuthKey(const std::array<uint8_t, kAuthKeyBytes>& k) : k_(k) {}
  // HMAC-SHA256 over `label` then each part, every part length-prefixed (no two different part
  // lists give the same input).
  Proof mac(std::string_view label, std::initializer_list<std::string_view> parts) const;
  // A short name of the key (the first bytes of an HMAC of a fixed label): logs say which key a
  // daemon runs with without showing it.
  std::string fingerprint() const;

 private:
  std::array<uint8_t, kAuthKeyBytes> k_;
};
using AuthKeyPtr = std::shared_ptr<const AuthKey>;

// Reads a key file: "fluxon-key-v1 " then 64 hex digits. Refused with the path named when it is
// missing, malformed, or readable by anyone but its owner (mode & 077 != 0).
Result<AuthKeyPtr> load_key_file(const std::string& path);
// Writes a new random key to `path` (mode 0600, never over an existing file).
Status write_key_file(const std::string& path);

Nonce random_nonce();
bool equal_ct(const uint8_t* a, const uint8_t* b, size_t n);  // constant time
inline std::string_view view(const uint8_t* p, size_t n) { return {reinterpret_cast<const char*>(p), n}; }
template <size_t N>
std::string_view view(const std::array<uint8_t, N>& a) {
  return view(a.data(), N);
}
std::string_view view_u64(const uint64_t& v);  // the 8 bytes of v, little endian (as in memory here)

// The challenge-response every channel runs: the server draws `server`, the client `client`; the
// client proves the key with client_proof (bound to both nonces, the channel and who it claims to
// be), the server answers with server_proof (the client knows it reached a key holder too).
Proof client_proof(const AuthKey& k, std::string_view channel, const Nonce& server, const Nonce& client,
                   std::string_view identity);
Proof server_proof(const AuthKey& k, std::string_view channel, const Nonce& server, const Nonce& client,
                   std::string_view identity);

// A data-plane capability: the master's grant to requester (node, generation) to read
// [offset, offset+len) of the segment of generation source_generation until expires_unix_ms.
constexpr size_t kGrantBytes = 24;  // expires_unix_ms u64, then the first 16 bytes of the HMAC
using Grant = std::array<uint8_t, kGrantBytes>;
Grant make_grant(const AuthKey& k, uint32_t requester_node, uint64_t requester_generation,
                 uint64_t source_generation, uint64_t offset, uint64_t len, uint64_t expires_unix_ms);
// ok, or why not: "expired", "forged" (the HMAC does not match these fields).
const char* check_grant(const AuthKey& k, const uint8_t* grant, uint32_t requester_node, uint64_t requester_generation,
                        uint64_t source_generation, uint64_t offset, uint64_t len, uint64_t now_unix_ms);
uint64_t wall_ms();  // the system clock, ms since the epoch: grants expire by it

}  // namespace fluxon
