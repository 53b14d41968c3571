// EtcdClient: the few calls of etcd's v3 API that election and discovery need, spoken through its
// JSON gateway (POST /v3/... over HTTP/1.1, one short connection per call). Why the gateway and not
// gRPC: it needs no gRPC or protobuf runtime in the build (Debian's etcd-server serves it by
// default), each call is one small request on loopback, and every answer is checked here field by
// field. Blocking, with a timeout per call: run it on a thread of its own (Campaign, LeaderWatch).
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "fluxon/runtime/status.hpp"

namespace fluxon {

struct EtcdKv {
  std::string key, value;
  int64_t create_revision = 0, mod_revision = 0, lease = 0;
};

class EtcdClient {
 public:
  // endpoints: "http://host:port" (https is not supported: say so at config time).
  explicit EtcdClient(std::vector<std::string> endpoints, int timeout_ms = 500);

  Result<int64_t> grant(int64_t ttl_seconds);
  // The lease's remaining TTL in seconds after the renewal; 0 when etcd no longer knows it.
  Result<int64_t> keepalive(int64_t lease);
  Status revoke(int64_t lease);
  // Creates key = value under lease unless the key exists (a transaction on its create revision).
  // won: this call created it; holder: the key as it is now (its create revision is the term).
  struct Created {
    bool won = false;
    EtcdKv holder;
  };
  Result<Created> create(const std::string& key, const std::string& value, int64_t lease);
  Result<std::optional<EtcdKv>> get(const std::string& key);
  // The key (if any) and the store's revision the answer was read at: a watch from revision + 1
  // misses nothing that happened after it.
  struct Range {
    std::optional<EtcdKv> kv;
    int64_t revision = 0;
  };
  Result<Range> range(const std::string& key);
  Status put(const std::string& key, const std::string& value, int64_t lease = 0);
  // Deletes key only while it is still the one created at create_revision (never a successor's).
  Status remove_if_created_at(const std::string& key, int64_t create_revision);

  const std::vector<std::string>& endpoints() const { return endpoints_; }
  // The endpoint that answered last ("" before any answer).
  const std::string& endpoint() const { return last_; }

 private:
  Result<std::string> call(const std::string& path, const std::string& body);
  std::vector<std::string> endpoints_;
  int timeout_ms_;
  std::string last_;
  size_t next_ = 0;
};

// One key's changes as etcd streams them (POST /v3/watch through the gateway: an HTTP/1.1 chunked
// answer of one JSON message per line). Opened from a revision, so a reader that read the key at
// revision R and watches from R + 1 misses no change. Blocking reads bounded by the caller's wait;
// one connection, closed with the object.
struct EtcdEvent {
  bool deleted = false;  // a delete (or the key's lease expired); else a put
  EtcdKv kv;             // the key as the put left it (a delete: its key and mod revision)
};
class EtcdWatch {
 public:
  // Opens the watch on the first endpoint that answers within timeout_ms.
  static Result<std::unique_ptr<EtcdWatch>> open(const std::vector<std::string>& endpoints, const std::string& key,
                                                 int64_t start_revision, int timeout_ms);
  ~EtcdWatch();
  EtcdWatch(const EtcdWatch&) = delete;
  EtcdWatch& operator=(const EtcdWatch&) = delete;
  // The events that arrived within wait_ms (none: nothing changed meanwhile). An error when the
  // stream ended, broke, or etcd cancelled the watch (a compacted revision): open a new one.
  Result<std::vector<EtcdEvent>> next(int wait_ms);
  // Bytes of a stream broken into chunks and lines as the network delivers them (tests).
  Result<std::vector<EtcdEvent>> feed(const std::string& bytes);
  // A watch with no connection, for feed() alone (tests).
  static std::unique_ptr<EtcdWatch> unconnected() { return std::unique_ptr<EtcdWatch>(new EtcdWatch(-1)); }
  bool created() const { return created_; }

 private:
  explicit EtcdWatch(int fd) : fd_(fd) {}
  int fd_ = -1;
  std::string raw_;   // received, not yet de-chunked
  std::string body_;  // de-chunked, not yet a whole line
  bool created_ = false;
  std::vector<EtcdEvent> early_;  // events that came with the head, for the first next()
};

// Helpers, exposed for their tests.
std::string base64_encode(const std::string& in);
Result<std::string> base64_decode(const std::string& in);
// "http://host:port" -> host, port; an error names what is wrong.
Result<std::pair<std::string, uint16_t>> parse_http_endpoint(const std::string& endpoint);

}  // namespace fluxon
