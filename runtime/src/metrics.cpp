#include "fluxon/runtime/metrics.hpp"

#include <prometheus/counter.h>
#include <prometheus/exposer.h>
#include <prometheus/gauge.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include <sstream>

namespace fluxon {

struct Metrics::Impl {
  std::map<std::string, prometheus::Family<prometheus::Gauge>*> gauges;
  std::map<std::string, prometheus::Family<prometheus::Counter>*> counters;
};

Metrics::Metrics(const std::string& host, uint16_t port)
    : registry_(std::make_shared<prometheus::Registry>()), impl_(std::make_unique<Impl>()) {
  if (port != 0) {
    exposer_ = std::make_unique<prometheus::Exposer>(host + ":" + std::to_string(port));
    exposer_->RegisterCollectable(registry_);
  }
}

Metrics::~Metrics() = default;

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
