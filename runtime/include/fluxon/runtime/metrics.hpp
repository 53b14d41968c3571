// A daemon's metrics port: Prometheus exposition (prometheus-cpp's registry and text format) at
// `/metrics`, and pages the daemon publishes (the master's status page and `/api/status`), served
// by our HttpServer. A component publishes its counters by name. Port 0 keeps the registry
// (render() still works) without an HTTP endpoint.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace prometheus {
class Registry;
}  // namespace prometheus

namespace fluxon {

class HttpServer;

class Metrics {
 public:
  // A page besides /metrics: its path, content type and first body (set_page replaces the body).
  struct Page {
    std::string path, content_type, body;
  };
  // Throws std::runtime_error naming the address when the port cannot be served.
  Metrics(const std::string& host, uint16_t port, std::vector<Page> pages = {});
  ~Metrics();
  // Gauge: the current value. Counter: a monotonically growing total (the core's counter).
  void gauge(const std::string& name, const std::string& help, double value,
             const std::map<std::string, std::string>& labels = {});
  void counter(const std::string& name, const std::string& help, uint64_t total,
               const std::map<std::string, std::string>& labels = {});
  std::string render() const;
  bool serving() const { return http_ != nullptr; }
  uint16_t port() const;
  // Replaces a page's body (thread-safe: the HTTP thread serves the last one set). A path not
  // given at construction is ignored.
  void set_page(const std::string& path, std::string body);

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  mutable std::mutex pages_mu_;
  std::map<std::string, Page> pages_;
  std::unique_ptr<HttpServer> http_;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace fluxon
