// One error type for all of Fluxon: a stable code, a message naming the field/key/stage, and the
// structured details some codes carry (KeyConflict indices, LocalReserveTimeout stage).
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

namespace fluxon {

// The one list of status codes: (name, wire value, what it means). Code, code_name(), the wire
// enum's check (messages/src/codec.cpp) and the Python exception classes (fluxon.errors, through
// fluxon._fluxon.ERROR_CODES) are all made from it.
#define FLUXON_STATUS_CODES(X)                                                                          \
  X(Ok, 0, "Success.")                                                                                  \
  X(InvalidArgument, 1, "An argument broke a rule; nothing was reserved or sent.")                      \
  X(KeyConflict, 2,                                                                                     \
    "Keys exist or are being written. ``indices[i]`` conflicts because ``reasons[i]`` is ``\"exists\"`` " \
    "or ``\"inflight\"``.")                                                                             \
  X(NoSpace, 3, "The value can never fit: larger than a grant, or no capacity configured.")             \
  X(LocalReserveTimeout, 4, "No slot became free in time; ``stage`` is ``\"claim_turn\"`` or ``\"refill\"``.") \
  X(KeyNotFound, 5, "Nothing to transfer, or a remote fetch failed (the message names the key and why).") \
  X(GenerationMismatch, 6, "The owner restarted: plans, handles and mappings of the old generation are void.") \
  X(Closed, 7, "The client or the owner connection is closed.")                                        \
  X(Timeout, 8, "No answer in time, or a handle outlived its TTL.")                                     \
  X(MalformedMessage, 9, "A message failed verification and was rejected.")                            \
  X(Internal, 10, "A broken internal expectation (a bug): the message says which.")                    \
  X(PermissionDenied, 11,                                                                               \
    "The cluster's key was not proven (auth.key_file): the message names what was refused; nothing was read or written.")

enum class Code : uint8_t {
#define FLUXON_CODE_ENUM(name, value, doc) k##name = value,
  FLUXON_STATUS_CODES(FLUXON_CODE_ENUM)
#undef FLUXON_CODE_ENUM
};

std::string_view code_name(Code c);

enum class ConflictReason : uint8_t { kExists = 0, kInflight = 1 };

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(Code code, std::string message) : code_(code), message_(std::move(message)) {}
  static Status ok() { return {}; }

  bool is_ok() const { return code_ == Code::kOk; }
  explicit operator bool() const { return is_ok(); }
  Code code() const { return code_; }
  const std::string& message() const { return message_; }
  std::string to_string() const;

  // KeyConflict: which batch indices conflict and why.
  std::vector<uint32_t> indices;
  std::vector<ConflictReason> reasons;
  // LocalReserveTimeout: "claim_turn" or "refill".
  std::string stage;

 private:
  Code code_ = Code::kOk;
  std::string message_;
};

inline Status invalid_argument(std::string m) { return {Code::kInvalidArgument, std::move(m)}; }

template <class T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}
  Result(Status status) : v_(std::move(status)) {}
  bool ok() const { return v_.index() == 0; }
  T& value() { return std::get<0>(v_); }
  const T& value() const { return std::get<0>(v_); }
  T* operator->() { return &value(); }
  T& operator*() { return value(); }
  const Status& status() const { return std::get<1>(v_); }
  Status take_status() { return std::move(std::get<1>(v_)); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace fluxon
