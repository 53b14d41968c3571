// The same-host control channel between a client session and its owner: one shared mapping per
// session holding a request ring (client -> owner) and a response ring (owner -> client), each a
// single-producer single-consumer byte ring of length-prefixed entries. A side that finds its ring
// empty spins for a bounded time, then sleeps; the other side wakes it only when it sleeps (a futex
// on the response ring; an eventfd the owner's poller waits on for the request ring).
//
// The client is another process: the owner checks every index and every length it reads from the
// mapping, keeps its own copy of the positions it owns, and refuses (and counts) a malformed or
// oversized entry by closing the channel; an entry's payload is then decoded like any request.
//
// Set up over a Unix socket in the abstract namespace (nothing on disk), named per cluster, node
// and owner generation: the owner sends a challenge (a nonce); the client sends its session,
// generation, pid and nonce (with the cluster key, an HMAC proof over both nonces, the session,
// the generation and its pid, which the owner takes from SO_PEERCRED: a recorded hello is worth
// nothing on another connection or in another process); the owner answers with its own proof,
// the mapping's memfd and the eventfd (SCM_RIGHTS). The socket stays open: its end is the client's
// death, and the owner releases that session's holdings.
#pragma once
#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "fluxon/runtime/auth.hpp"
#include "fluxon/runtime/status.hpp"

namespace fluxon {
using Bytes = std::vector<uint8_t>;  // as in fluxon/messages/codec.hpp
}

namespace fluxon::channel {

constexpr uint64_t kMagic = 0x314E4843584C46ull;  // "FLXCHN1"
constexpr uint32_t kVersion = 2;
constexpr uint32_t kEntryHeader = 16;  // u32 length, u32 kind, u64 id
constexpr uint32_t kMinRingBytes = 4096;
constexpr uint32_t kMaxRingBytes = 64u << 20;

enum class Kind : uint32_t { kCall = 1, kNote = 2, kReply = 3 };

struct Entry {
  Kind kind = Kind::kCall;
  uint64_t id = 0;
  Bytes payload;
};

// One ring's positions, each on a cache line of its own. Positions count bytes and never wrap.
struct RingCtl {
  alignas(64) std::atomic<uint64_t> head;  // consumed (written by the consumer)
  alignas(64) std::atomic<uint64_t> tail;  // published (written by the producer)
  alignas(64) std::atomic<uint32_t> seq;   // futex word: bumped when a sleeping consumer is woken
  std::atomic<uint32_t> waiting;           // the consumer sleeps (or is about to)
};

struct Header {
  uint64_t magic;
  uint32_t version;
  uint32_t ring_bytes;
  uint64_t session;
  uint64_t generation;
  uint32_t owner_pid;
  uint32_t client_pid;
  alignas(64) std::atomic<uint32_t> closed;  // either side: the channel is over
  RingCtl req, resp;
};

// Bytes of a mapping with two rings of ring_bytes each.
uint64_t mapping_bytes(uint32_t ring_bytes);
// The largest entry payload of a ring (half the ring: two always fit in turn).
inline uint32_t max_payload(uint32_t ring_bytes) { return ring_bytes / 2 - kEntryHeader; }
inline uint64_t entry_bytes(uint32_t payload) { return kEntryHeader + ((uint64_t(payload) + 7) & ~7ull); }

// The producing side of a ring. Keeps its own tail; reads the consumer's head and checks it.
class Producer {
 public:
  Producer() = default;
  Producer(RingCtl* ctl, uint8_t* data, uint32_t cap) : ctl_(ctl), data_(data), cap_(cap), tail_(ctl->tail.load()) {}
  enum class Push { kOk, kFull, kTooLarge, kCorrupt };
  // kOk: published; *wake says the consumer sleeps (the caller wakes it).
  Push push(Kind kind, uint64_t id, const uint8_t* p, uint32_t n, bool* wake);
  uint32_t capacity() const { return cap_; }

 private:
  RingCtl* ctl_ = nullptr;
  uint8_t* data_ = nullptr;
  uint32_t cap_ = 0;
  uint64_t tail_ = 0;
};

// The consuming side. Keeps its own head; checks the producer's tail and every entry header.
class Consumer {
 public:
  Consumer() = default;
  Consumer(RingCtl* ctl, uint8_t* data, uint32_t cap) : ctl_(ctl), data_(data), cap_(cap), head_(ctl->head.load()) {}
  enum class Pop { kEmpty, kEntry, kCorrupt };
  // kCorrupt: *why says what was wrong; the ring is not to be read again.
  Pop pop(Entry& out, std::string* why);
  bool empty() const { return ctl_->tail.load(std::memory_order_acquire) == head_; }
  // Going to sleep: announce it, then look once more (a push after this wakes the sleeper).
  // Returns the futex word to wait on (when still empty) in *seq.
  bool prepare_sleep(uint32_t* seq);
  void awake() { ctl_->waiting.store(0, std::memory_order_relaxed); }
  RingCtl* ctl() const { return ctl_; }

 private:
  RingCtl* ctl_ = nullptr;
  uint8_t* data_ = nullptr;
  uint32_t cap_ = 0;
  uint64_t head_ = 0;
};

// The owner's side of a request ring, shared by the owner's poller and the simulation: up to `max`
// entries, each well-formed call or note handed to `on_entry`; a malformed entry, or a reply from a
// client, stops the drain and names why in `refused` (the caller ends that client's session).
struct Drained {
  size_t entries = 0;
  std::optional<std::string> refused;
};
Drained drain_requests(Consumer& ring, size_t max, const std::function<void(Entry&&)>& on_entry);

// The abstract socket name of an owner generation's channel listener.
std::string socket_name(const std::string& cluster, uint32_t node_id, uint64_t generation);

// ---- owner side ---------------------------------------------------------------------------------

struct ServerOptions {
  uint32_t ring_bytes = 1u << 20;
  uint32_t max_channels = 256;
  uint32_t spin_us = 20;  // the poller spins this long after an entry before it sleeps
  AuthKeyPtr key;         // the cluster key: hellos must prove it (null: no auth)
};

struct ServerStats {
  uint64_t opened = 0, closed = 0, open = 0, refused_channels = 0;
  uint64_t refused_auth = 0;  // of refused_channels: hellos without a valid proof of the key
  uint64_t calls = 0, notes = 0, replies = 0, refused_entries = 0, dropped_replies = 0, wakeups_sent = 0;
};

class Server {
 public:
  struct Callbacks {
    // An entry from channel `channel` of session `session` (on the poller thread).
    std::function<void(uint64_t channel, uint64_t session, Entry&&)> on_entry;
    // The channel ended: the client's socket closed (it died or closed) or a malformed entry.
    std::function<void(uint64_t channel, uint64_t session, const std::string& why)> on_closed;
  };
  static Result<std::unique_ptr<Server>> start(const std::string& name, uint64_t generation, ServerOptions opt,
                                               Callbacks cb);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;
  // A reply to call `id` of `channel` (any thread). false: the channel is gone or its ring refused it.
  bool reply(uint64_t channel, uint64_t id, const Bytes& payload);
  ServerStats stats() const;
  const std::string& name() const { return name_; }

  struct Impl;

 private:
  explicit Server(std::string name);
  std::string name_;
  std::unique_ptr<Impl> impl_;
};

// ---- client side --------------------------------------------------------------------------------

class Client {
 public:
  // Connects to the owner generation's listener; Closed when nobody listens there (another host,
  // another network namespace, an owner without the channel).
  static Result<std::unique_ptr<Client>> connect(const std::string& name, uint64_t session, uint64_t generation,
                                                 uint32_t spin_us, AuthKeyPtr key = nullptr);
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;
  // A request and its reply. Thread-safe: concurrent calls share the rings.
  Result<Bytes> call(const Bytes& req, uint32_t timeout_ms);
  Status notify(const Bytes& note);
  // The owner went away (the caller learnt it elsewhere): every waiting call ends with Closed.
  void mark_down();
  // Requests up to this size go over the channel (replies may be larger than requests).
  uint32_t max_request() const { return max_payload(ring_bytes_) / 4; }
  bool down() const;
  // Tests: publishes an entry with this header (any kind, any length field) and payload as is.
  void inject_for_test(uint32_t kind, uint32_t len_field, const Bytes& payload);

  struct Impl;

 private:
  Client();
  uint32_t ring_bytes_ = 0;
  std::unique_ptr<Impl> impl_;
};

// Baseline for benches: the round trip of a futex ping-pong between two processes, p50 in µs.
double futex_ping_pong_p50_us(int iters);

}  // namespace fluxon::channel
