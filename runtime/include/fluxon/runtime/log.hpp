// The daemons' log: one line per event on stderr, in one format - time (UTC, ms), level, component,
// message, then key=value fields - or as one JSON object per line for collectors
// (`--log-format json`, or FLUXON_LOG_FORMAT=json). A call site that repeats is rate-limited: at
// most RateLimit::kBurst lines per RateLimit::kWindowMs, the next line it writes says how many
// were suppressed (docs/operations.md "Logs").
//
//   text: 2026-12-07T23:15:00.123Z INFO  fluxon owner: the leader is 127.0.0.1:7600 term=42
//   json: {"ts":"2026-12-07T23:15:00.123Z","level":"info","component":"owner","msg":"the leader is 127.0.0.1:7600","term":"42"}
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "fluxon/runtime/status.hpp"

namespace fluxon::logging {

enum class Level : uint8_t { kDebug, kInfo, kWarn, kError };
enum class Format : uint8_t { kText, kJson };

struct Field {
  std::string key, value;
};

// "text" or "json"; an error names the value.
Result<Format> parse_format(std::string_view s);
// The process's format: set_format's, else FLUXON_LOG_FORMAT's at the first line, else text.
void set_format(Format f);
Format format();

// One line (under a lock: lines of threads never interleave). `site` identifies the call site for
// the rate limit (the format string of logf; nullptr: never limited).
void emit(Level level, std::string_view component, std::string_view message, const std::vector<Field>& fields = {},
          const void* site = nullptr);
void logf(Level level, const char* component, const char* fmt, ...) __attribute__((format(printf, 3, 4)));
inline void info(const char* component, std::string_view message, const std::vector<Field>& fields = {}) {
  emit(Level::kInfo, component, message, fields, nullptr);
}

// The line as written (without its newline), at wall clock `wall_ms`; `suppressed` repeats said.
std::string render(Format f, uint64_t wall_ms, Level level, std::string_view component, std::string_view message,
                   const std::vector<Field>& fields, uint64_t suppressed);

// Per call site: at most kBurst lines in a window of kWindowMs; at most kSites sites remembered
// (past that the oldest window is forgotten: its site starts a fresh window).
class RateLimit {
 public:
  static constexpr uint32_t kBurst = 5;
  static constexpr int64_t kWindowMs = 10000;
  static constexpr size_t kSites = 1024;
  // Whether the site writes a line now; when it does, `suppressed` says how many of its lines
  // were dropped since its last written one.
  bool admit(const void* site, int64_t now_ms, uint64_t& suppressed);

 private:
  struct Window {
    int64_t start = 0;
    uint32_t written = 0;
    uint64_t dropped = 0;
  };
  std::map<const void*, Window> sites_;
};

}  // namespace fluxon::logging
