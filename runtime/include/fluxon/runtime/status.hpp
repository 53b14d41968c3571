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

enum class Code : uint8_t {
  kOk = 0,
  kInvalidArgument = 1,
  kKeyConflict = 2,
  kNoSpace = 3,
  kLocalReserveTimeout = 4,
  kKeyNotFound = 5,
  kGenerationMismatch = 6,
  kClosed = 7,
  kTimeout = 8,
  kMalformedMessage = 9,
  kInternal = 10,
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
