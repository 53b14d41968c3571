#include <doctest/doctest.h>

#include "fluxon/runtime/metrics.hpp"

using namespace fluxon;

TEST_CASE("metrics render counters and gauges in Prometheus text") {
  Metrics m("127.0.0.1", 0);
  CHECK_FALSE(m.serving());
  m.gauge("fluxon_owner_slots", "Slots by state", 5, {{"state", "free"}});
  m.counter("fluxon_owner_put_start_total", "put_start calls", 3);
  m.counter("fluxon_owner_put_start_total", "put_start calls", 7);
  auto text = m.render();
  CHECK(text.find("fluxon_owner_slots{state=\"free\"} 5") != std::string::npos);
  CHECK(text.find("fluxon_owner_put_start_total 7") != std::string::npos);
}
