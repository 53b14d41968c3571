#include "fluxon/runtime/recorder.hpp"

#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "fluxon/messages/codec.hpp"
#include "fluxon/runtime/log.hpp"

namespace fluxon {

std::unique_ptr<TrafficRecorder> TrafficRecorder::from_env(const std::string& target, uint32_t per_kind) {
  const char* dir = std::getenv("FLUXON_RECORD");
  if (!dir || !*dir) return nullptr;
  const std::string d = std::string(dir) + "/" + target;
  std::error_code ec;
  std::filesystem::create_directories(d, ec);
  if (ec) {
    logging::logf(logging::Level::kWarn, "recorder", "FLUXON_RECORD: cannot create %s: %s (nothing recorded)\n", d.c_str(),
                 ec.message().c_str());
    return nullptr;
  }
  logging::logf(logging::Level::kInfo, "recorder", "recording received %s messages into %s (FLUXON_RECORD)\n", target.c_str(), d.c_str());
  return std::unique_ptr<TrafficRecorder>(new TrafficRecorder(d, per_kind));
}

void TrafficRecorder::record(const uint8_t* p, size_t n) {
  auto env = decode(p, n);
  if (!env.ok()) return;
  const int kind = int((*env)->body.type);
  std::lock_guard<std::mutex> g(m_);
  if (kinds_[kind] >= per_kind_) return;
  uint64_t h = 1469598103934665603ull;  // FNV-1a: a stable name per distinct message
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  char name[32];
  std::snprintf(name, sizeof(name), "/%016llx", (unsigned long long)h);
  const std::string path = dir_ + name;
  if (std::filesystem::exists(path)) return;
  if (FILE* f = std::fopen(path.c_str(), "wb")) {
    const bool ok = std::fwrite(p, 1, n, f) == n;
    std::fclose(f);
    if (ok) {
      kinds_[kind]++;
      written_++;
    }
  }
}

}  // namespace fluxon
