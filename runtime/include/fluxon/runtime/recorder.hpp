// Real traffic for the fuzzers' seed corpus: with FLUXON_RECORD=DIR in its environment, a daemon
// writes the requests it receives to DIR/<target>/ (one file per distinct message, named by its
// hash; at most `per_kind` of each envelope body kind, so one run covers every kind it saw without
// flooding the disk). tools/record-corpus.sh runs a workload with it and keeps the result in
// tests/fuzz/corpus/, which tools/fuzz.sh feeds to each target.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>

namespace fluxon {

class TrafficRecorder {
 public:
  // Null without FLUXON_RECORD (the normal case: nothing is recorded, nothing costs).
  static std::unique_ptr<TrafficRecorder> from_env(const std::string& target, uint32_t per_kind = 16);
  // Thread-safe. Bytes that do not decode are not recorded (the fuzzers make their own garbage).
  void record(const uint8_t* p, size_t n);
  uint64_t written() const { return written_; }

 private:
  TrafficRecorder(std::string dir, uint32_t per_kind) : dir_(std::move(dir)), per_kind_(per_kind) {}
  std::string dir_;
  uint32_t per_kind_;
  std::mutex m_;
  std::map<int, uint32_t> kinds_;
  uint64_t written_ = 0;
};

}  // namespace fluxon
