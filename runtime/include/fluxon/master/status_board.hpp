// StatusBoard: the cluster at a glance, as the master sees it - the status page's `/api/status`
// (docs/operations.md "The status page"). Sans-IO: the master's actor samples it once a tick and
// renders the JSON the HTTP thread serves; tests drive it with a MasterCore and a clock.
//
// What it keeps: one sample a second of the counters its charts follow, at most kHistory of them
// (the oldest goes first). Everything else is read from the core when rendering.
#pragma once
#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "fluxon/master/master_core.hpp"

namespace fluxon {

class StatusBoard {
 public:
  static constexpr size_t kHistory = 120;  // samples kept (two minutes at the master's 1 s tick)
  // An owner whose last report is older than this is shown stale (in red), as is one never heard.
  static constexpr Millis kStaleMs = 3500;

  // What the master knows of itself beyond its core.
  struct Header {
    std::string cluster;
    std::string version;
    std::string address;        // this master's control address (host:port)
    bool leading = true;        // false: a standby (its core is empty; the page says so)
    uint64_t term = 0;          // 0 with one master
    uint64_t started_ms = 0;    // wall clock at start (the page shows the uptime)
  };

  // One sample of the charted counters at `now` (the master's tick).
  void sample(Millis now, const MasterCore& core);
  // The JSON document of /api/status at `now` (wall clock `wall_ms`, for the page's "updated at").
  std::string json(Millis now, uint64_t wall_ms, const MasterCore& core, const Header& h) const;
  size_t samples() const { return samples_.size(); }

  // The charted rates, in this order (the JSON's history.series keys).
  static const std::vector<std::string>& series_names();

 private:
  struct Sample {
    Millis at = 0;
    std::vector<uint64_t> totals;  // one per series, a monotonic total (rates are their differences)
  };
  static std::vector<uint64_t> totals_of(const MasterCore& core);
  std::deque<Sample> samples_;
};

// A value of an owner's report by name (0 when it did not say).
uint64_t report_value(const OwnerInfo& o, std::string_view name);

}  // namespace fluxon
