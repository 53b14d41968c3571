#include "fluxon/runtime/log.hpp"

#include <atomic>
#include <chrono>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <mutex>

#include "fluxon/runtime/json.hpp"

namespace fluxon::logging {

namespace {

std::mutex g_mu;
RateLimit g_limit;
std::atomic<int> g_format{-1};  // -1: not decided yet (FLUXON_LOG_FORMAT at the first line)

const char* level_word(Level l, bool upper) {
  switch (l) {
    case Level::kDebug: return upper ? "DEBUG" : "debug";
    case Level::kInfo: return upper ? "INFO " : "info";
    case Level::kWarn: return upper ? "WARN " : "warn";
    default: return upper ? "ERROR" : "error";
  }
}

std::string timestamp(uint64_t wall_ms) {
  const std::time_t secs = std::time_t(wall_ms / 1000);
  std::tm tm{};
  gmtime_r(&secs, &tm);
  char buf[40];
  std::snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%03uZ", tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday,
                tm.tm_hour, tm.tm_min, tm.tm_sec, unsigned(wall_ms % 1000));
  return buf;
}

// A field's value as text: bare when it has no space, quote or '=', else quoted as JSON quotes.
std::string text_value(const std::string& v) {
  if (!v.empty() && v.find_first_of(" \"=\t\n") == std::string::npos) return v;
  return json_quote(v);
}

}  // namespace

Result<Format> parse_format(std::string_view s) {
  if (s == "text") return Format::kText;
  if (s == "json") return Format::kJson;
  return invalid_argument("log format: '" + std::string(s) + "' is neither text nor json");
}

void set_format(Format f) { g_format.store(int(f)); }

Format format() {
  int f = g_format.load();
  if (f < 0) {
    const char* env = std::getenv("FLUXON_LOG_FORMAT");
    auto p = parse_format(env ? env : "text");
    f = int(p.ok() ? *p : Format::kText);
    g_format.store(f);
  }
  return Format(f);
}

bool RateLimit::admit(const void* site, int64_t now_ms, uint64_t& suppressed) {
  suppressed = 0;
  auto it = sites_.find(site);
  if (it == sites_.end()) {
    if (sites_.size() >= kSites) sites_.erase(sites_.begin());
    it = sites_.emplace(site, Window{now_ms, 0, 0}).first;
  }
  Window& w = it->second;
  if (now_ms - w.start >= kWindowMs) {
    w.start = now_ms;
    w.written = 0;
  }
  if (w.written >= kBurst) {
    w.dropped++;
    return false;
  }
  w.written++;
  suppressed = w.dropped;
  w.dropped = 0;
  return true;
}

std::string render(Format f, uint64_t wall_ms, Level level, std::string_view component, std::string_view message,
                   const std::vector<Field>& fields, uint64_t suppressed) {
  std::string out;
  if (f == Format::kJson) {
    out = "{\"ts\":\"" + timestamp(wall_ms) + "\",\"level\":\"" + level_word(level, false) +
          "\",\"component\":" + json_quote(component) + ",\"msg\":" + json_quote(message);
    for (const auto& x : fields) out += "," + json_quote(x.key) + ":" + json_quote(x.value);
    if (suppressed) out += ",\"suppressed_repeats\":" + std::to_string(suppressed);
    out += "}";
    return out;
  }
  out = timestamp(wall_ms) + " " + level_word(level, true) + " fluxon " + std::string(component) + ": " +
        std::string(message);
  for (const auto& x : fields) out += " " + x.key + "=" + text_value(x.value);
  if (suppressed) out += " (" + std::to_string(suppressed) + " repeats of this line suppressed before it)";
  return out;
}

void emit(Level level, std::string_view component, std::string_view message, const std::vector<Field>& fields,
          const void* site) {
  const auto now = std::chrono::system_clock::now().time_since_epoch();
  const uint64_t wall = uint64_t(std::chrono::duration_cast<std::chrono::milliseconds>(now).count());
  const Format f = format();
  std::lock_guard<std::mutex> g(g_mu);
  uint64_t suppressed = 0;
  if (site && !g_limit.admit(site, int64_t(wall), suppressed)) return;
  const std::string line = render(f, wall, level, component, message, fields, suppressed) + "\n";
  std::fwrite(line.data(), 1, line.size(), stderr);
  std::fflush(stderr);
}

void logf(Level level, const char* component, const char* fmt, ...) {
  char buf[2048];
  va_list ap;
  va_start(ap, fmt);
  const int n = std::vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  std::string msg(buf, n < 0 ? 0 : std::min<size_t>(size_t(n), sizeof buf - 1));
  while (!msg.empty() && msg.back() == '\n') msg.pop_back();
  emit(level, component, msg, {}, fmt);
}

}  // namespace fluxon::logging
