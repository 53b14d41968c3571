// Prometheus exposition for a daemon (prometheus-cpp). A component publishes its counters by
// name; `/metrics` serves them as text. Port 0 keeps the registry (render() still works) without
// an HTTP endpoint.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>

namespace prometheus {
class Registry;
class Exposer;
}  // namespace prometheus

namespace fluxon {

class Metrics {
 public:
  Metrics(const std::string& host, uint16_t port);
  ~Metrics();
  // Gauge: the current value. Counter: a monotonically growing total (the core's counter).
  void gauge(const std::string& name, const std::string& help, double value,
             const std::map<std::string, std::string>& labels = {});
  void counter(const std::string& name, const std::string& help, uint64_t total,
               const std::map<std::string, std::string>& labels = {});
  std::string render() const;
  bool serving() const { return exposer_ != nullptr; }

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<prometheus::Exposer> exposer_;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace fluxon
