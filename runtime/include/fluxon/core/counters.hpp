// Counter tables: a component's counters are one X-macro list of (field, Prometheus family, label
// "key=value" or "", help). FLUXON_COUNTER_STRUCT makes the struct of fields and a for_each_counter()
// visitor from it; the daemons register every entry with Prometheus through that visitor
// (actors/src/daemon_util.hpp), so a counter is declared in exactly one place.
#pragma once
#include <cstdint>
#include <string_view>

#define FLUXON_COUNTER_FIELD_(field, metric, label, help) uint64_t field = 0;
#define FLUXON_COUNTER_VISIT_(field, metric, label, help) \
  fn(std::string_view(#field), std::string_view(metric), std::string_view(label), std::string_view(help), c.field);
#define FLUXON_COUNTER_STRUCT(Struct, LIST)                    \
  struct Struct {                                              \
    LIST(FLUXON_COUNTER_FIELD_)                                \
  };                                                           \
  /* fn(name, metric, label, help, value) for every counter, in declaration order. */ \
  template <class Fn>                                          \
  void for_each_counter(const Struct& c, Fn&& fn) {            \
    LIST(FLUXON_COUNTER_VISIT_)                                \
  }

// Gauge tables: what a component holds now, one X-macro list of (field, stats name, Prometheus
// family, label "key=value" or "", help). FLUXON_GAUGE_STRUCT makes the struct of fields and a
// for_each_gauge() visitor; the stats replies, the Prometheus gauges and the clients' stats maps
// are all made from it.
#define FLUXON_GAUGE_FIELD_(field, name, metric, label, help) uint64_t field = 0;
#define FLUXON_GAUGE_VISIT_(field, name, metric, label, help) \
  fn(std::string_view(name), std::string_view(metric), std::string_view(label), std::string_view(help), g.field);
#define FLUXON_GAUGE_STRUCT(Struct, LIST)                      \
  struct Struct {                                              \
    LIST(FLUXON_GAUGE_FIELD_)                                  \
  };                                                           \
  /* fn(name, metric, label, help, value) for every gauge, in declaration order. */ \
  template <class Fn>                                          \
  void for_each_gauge(const Struct& g, Fn&& fn) {              \
    LIST(FLUXON_GAUGE_VISIT_)                                  \
  }
