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

// Registers every counter of a counter table (fluxon/core/counters.hpp) with Prometheus.
template <class Counters>
void register_counters(Metrics& m, const Counters& counters) {
  for_each_counter(counters, [&](std::string_view name, std::string_view label, std::string_view help,
                                 uint64_t value) {
    std::map<std::string, std::string> labels;
    if (auto eq = label.find('='); eq != std::string_view::npos)
      labels.emplace(std::string(label.substr(0, eq)), std::string(label.substr(eq + 1)));
    m.counter(std::string(name), std::string(help), value, labels);
  });
}

}  // namespace fluxon::actors
