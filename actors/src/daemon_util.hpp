#pragma once
#include <csignal>
#include <map>
#include <string>
#include <string_view>

#include "fluxon/runtime/metrics.hpp"

namespace fluxon::actors {

// Block SIGINT/SIGTERM in every thread (call before any thread starts), then wait for one.
inline void block_stop_signals() {
  sigset_t s;
  sigemptyset(&s);
  sigaddset(&s, SIGINT);
  sigaddset(&s, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &s, nullptr);
}

inline int wait_stop_signal() {
  sigset_t s;
  sigemptyset(&s);
  sigaddset(&s, SIGINT);
  sigaddset(&s, SIGTERM);
  int sig = 0;
  sigwait(&s, &sig);
  return sig;
}

// Registers a table's figures with Prometheus: every counter of a counter table and every gauge of
// a gauge table (fluxon/core/counters.hpp), under their declared families and labels.
inline std::map<std::string, std::string> metric_labels(std::string_view label) {
  std::map<std::string, std::string> labels;
  if (auto eq = label.find('='); eq != std::string_view::npos)
    labels.emplace(std::string(label.substr(0, eq)), std::string(label.substr(eq + 1)));
  return labels;
}

template <class Counters>
void register_counters(Metrics& m, const Counters& counters) {
  for_each_counter(counters, [&](std::string_view, std::string_view metric, std::string_view label,
                                 std::string_view help, uint64_t value) {
    m.counter(std::string(metric), std::string(help), value, metric_labels(label));
  });
}

template <class Gauges>
void register_gauges(Metrics& m, const Gauges& gauges) {
  // A stats value in thousandths (name *_permille: integers for the stats maps) is a ratio in
  // Prometheus's base unit, [0, 1] (its family *_ratio).
  for_each_gauge(gauges, [&](std::string_view name, std::string_view metric, std::string_view label,
                             std::string_view help, uint64_t value) {
    const bool permille = name.size() > 9 && name.substr(name.size() - 9) == "_permille";
    m.gauge(std::string(metric), std::string(help), permille ? double(value) / 1000.0 : double(value),
            metric_labels(label));
  });
}

}  // namespace fluxon::actors
