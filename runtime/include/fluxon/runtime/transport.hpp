// The cross-host data plane (SPEC §6): an owner serves reads of its own segment to peers; a peer
// reads batches of byte ranges straight into its own segment. TCP always; RDMA is detected at run
// time (rdma_probe) and reported — the verbs data path waits for hardware to test it on.
//
// Wire (little endian, one request and one reply at a time per connection):
//   request  = magic u32 'FXDP', version u32 = 1, generation u64, count u32, flags u32 (kDataFlag*),
//              count x (offset u64, len u64)
//   reply    = magic u32, status u32 (DataStatus), total u64, then `total` bytes: the ranges in order
// A reply with status != ok carries no bytes.
//
// With the cluster key (auth.key_file), a connection starts with a handshake and every range
// carries the master's grant for it (runtime/auth.hpp):
//   server   -> challenge = magic u32 'FXDA', version u32 = 1, nonce[16]
//   client   -> hello     = magic u32, node u32, generation u64 (who reads), nonce[16], proof[32]
//   server   -> verdict   = magic u32, status u32 (kOk or kPermissionDenied), proof[32]
// then requests as above, each followed by `count` grants of kGrantBytes (in range order). A range
// without a valid grant for this requester refuses the whole request (kPermissionDenied, counted);
// a failed handshake closes the connection (counted). Bulk bytes go from the server's mapped segment to the
// socket and from the socket into the reader's destination: no intermediate buffer on either side.
#pragma once
#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "fluxon/runtime/auth.hpp"
#include "fluxon/runtime/status.hpp"

namespace fluxon {

constexpr uint32_t kDataMagic = 0x50445846;  // "FXDP"
constexpr uint32_t kDataVersion = 1;
constexpr uint32_t kDataMaxRanges = 1u << 16;
// The ranges serve a reader (a get), not a copy (a replica or write-back): the serving owner counts
// them as reads of its copies (its eviction order follows them).
constexpr uint32_t kDataFlagRead = 1;
constexpr uint32_t kDataAuthMagic = 0x41445846;  // "FXDA"

enum class DataStatus : uint32_t {
  kOk = 0,
  kGenerationMismatch = 1,
  kOutOfRange = 2,
  kBadRequest = 3,
  kPermissionDenied = 4
};

// The server's checks of a request, as it applies them (the fuzzer calls them too): the 24-byte
// header (magic, version, 1..kDataMaxRanges ranges; *count set), then its `count` ranges of 16 bytes
// against the generation and the segment's length (*total: the bytes a kOk request reads).
bool data_header_ok(const uint8_t* header, uint32_t* count);
DataStatus data_ranges_status(const uint8_t* ranges, uint32_t count, bool generation_ok, uint64_t segment_len,
                              uint64_t* total);

struct ReadRange {
  uint64_t src_offset = 0;
  uint64_t len = 0;
  uint8_t* dst = nullptr;
  const uint8_t* grant = nullptr;  // kGrantBytes: the master's grant for this range (with the key)
};

// Who reads, on a keyed data plane: the fetching owner's node and generation, proven with the key.
struct DataIdentity {
  AuthKeyPtr key;  // null: no handshake, no grants (a cluster without auth)
  uint32_t node = 0;
  uint64_t generation = 0;
};

// Serves [base, base+len) of one owner generation to peers. One thread accepts; one thread per
// connection (bounded) serves its requests.
class DataServer {
 public:
  // key: requests must be granted (see above); null serves any range of this generation.
  static Result<std::unique_ptr<DataServer>> start(const std::string& host, uint16_t port, const uint8_t* base,
                                                   uint64_t len, uint64_t generation, uint32_t max_connections = 64,
                                                   AuthKeyPtr key = nullptr);
  ~DataServer();
  DataServer(const DataServer&) = delete;
  DataServer& operator=(const DataServer&) = delete;

  uint16_t port() const { return port_; }
  uint64_t bytes_served() const { return bytes_served_.load(); }
  uint64_t requests_served() const { return requests_served_.load(); }
  uint64_t requests_refused() const { return requests_refused_.load(); }
  // With the key: handshakes that failed (no key, a wrong one, a replayed proof), and requests
  // refused for a range without a valid grant.
  uint64_t handshakes_refused() const { return handshakes_refused_.load(); }
  uint64_t requests_denied() const { return requests_denied_.load(); }
  // The offsets of the ranges served with kDataFlagRead since the last call (at most kReadLog
  // kept between two calls; past it they are dropped, counted).
  static constexpr size_t kReadLog = 1 << 16;
  std::vector<uint64_t> take_reads();
  uint64_t reads_dropped() const { return reads_dropped_.load(); }

 private:
  DataServer(int fd, uint16_t port, const uint8_t* base, uint64_t len, uint64_t generation, uint32_t max_conns,
             AuthKeyPtr key);
  void accept_loop();
  void serve(int fd);
  // The keyed handshake: the requester's identity, or false (the connection is to be closed).
  bool handshake(int fd, uint32_t* node, uint64_t* generation);

  int listen_fd_;
  uint16_t port_;
  const uint8_t* base_;
  uint64_t len_;
  uint64_t generation_;
  uint32_t max_conns_;
  AuthKeyPtr key_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> bytes_served_{0}, requests_served_{0}, requests_refused_{0}, reads_dropped_{0};
  std::atomic<uint64_t> handshakes_refused_{0}, requests_denied_{0};
  std::mutex reads_m_;
  std::vector<uint64_t> reads_;
  std::mutex m_;
  std::map<int, std::thread> conns_;   // fd -> its thread
  std::vector<std::thread> finished_;  // threads whose connection ended, joined later
  std::thread acceptor_;
};

// Reads ranges from peers, keeping idle connections per peer for reuse. Thread-safe: each call
// takes its own connection.
class TcpFetcher {
 public:
  explicit TcpFetcher(uint32_t timeout_ms = 10000, DataIdentity id = {}) : timeout_ms_(timeout_ms), id_(std::move(id)) {}
  ~TcpFetcher();
  // All ranges or an error; after an error the destinations may hold partial bytes. With a key
  // (DataIdentity), every range must carry its grant.
  Status read(const std::string& host, uint16_t port, uint64_t generation, const std::vector<ReadRange>& ranges,
              uint32_t flags = 0);
  uint64_t connects() const { return connects_.load(); }

 private:
  Result<int> take(const std::string& host, uint16_t port);
  Status handshake(int fd, const std::string& peer);
  void give_back(const std::string& host, uint16_t port, int fd);

  uint32_t timeout_ms_;
  DataIdentity id_;
  std::mutex m_;
  std::map<std::pair<std::string, uint16_t>, std::vector<int>> idle_;
  std::atomic<uint64_t> connects_{0};
};

// What RDMA hardware this machine has (libibverbs), in words for the operator.
struct RdmaProbe {
  bool compiled = false;    // built against libibverbs
  bool available = false;   // at least one device that opens
  std::vector<std::string> devices;
  std::string detail;
};
RdmaProbe rdma_probe();

}  // namespace fluxon
