#include "fluxon/runtime/metrics.hpp"

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include <sstream>
#include <stdexcept>

#include "fluxon/runtime/http_server.hpp"

namespace fluxon {

struct Metrics::Impl {
  std::map<std::string, prometheus::Family<prometheus::Gauge>*> gauges;
  std::map<std::string, prometheus::Family<prometheus::Counter>*> counters;
};

Metrics::Metrics(const std::string& host, uint16_t port, std::vector<Page> pages)
    : registry_(std::make_shared<prometheus::Registry>()), impl_(std::make_unique<Impl>()) {
  for (auto& p : pages) pages_[p.path] = std::move(p);
  if (port == 0) return;
  std::map<std::string, HttpServer::Handler> routes;
  routes["/metrics"] = [this] {
    return HttpResponse{200, "text/plain; version=0.0.4; charset=utf-8", render()};
  };
  for (const auto& [path, page] : pages_)
    routes[path] = [this, path = path] {
      std::lock_guard<std::mutex> g(pages_mu_);
      const Page& p = pages_.at(path);
      return HttpResponse{200, p.content_type, p.body};
    };
  auto s = HttpServer::start(host, port, std::move(routes));
  if (!s.ok()) throw std::runtime_error(s.status().message());
  http_ = std::move(s.value());
}

// The server stops (its thread joined) before the pages and the registry it reads go.
Metrics::~Metrics() { http_.reset(); }

uint16_t Metrics::port() const { return http_ ? http_->port() : 0; }

void Metrics::set_page(const std::string& path, std::string body) {
  std::lock_guard<std::mutex> g(pages_mu_);
  auto it = pages_.find(path);
  if (it != pages_.end()) it->second.body = std::move(body);
}

void Metrics::gauge(const std::string& name, const std::string& help, double value,
                    const std::map<std::string, std::string>& labels) {
  auto& fam = impl_->gauges[name];
  if (!fam) fam = &prometheus::BuildGauge().Name(name).Help(help).Register(*registry_);
  fam->Add(labels).Set(value);
}

void Metrics::counter(const std::string& name, const std::string& help, uint64_t total,
                      const std::map<std::string, std::string>& labels) {
  auto& fam = impl_->counters[name];
  if (!fam) fam = &prometheus::BuildCounter().Name(name).Help(help).Register(*registry_);
  auto& c = fam->Add(labels);
  const double delta = double(total) - c.Value();
  if (delta > 0) c.Increment(delta);
}

std::string Metrics::render() const {
  prometheus::TextSerializer s;
  std::ostringstream os;
  s.Serialize(os, registry_->Collect());
  return os.str();
}

}  // namespace fluxon
