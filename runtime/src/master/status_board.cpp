#include "fluxon/master/status_board.hpp"

#include <algorithm>

#include "fluxon/runtime/json.hpp"

namespace fluxon {

namespace {

// The owner counters summed into the cluster's series, in series order after the master's.
constexpr const char* kOwnerSeries[] = {"put_keys_total", "get_keys_total", "get_hit_keys_total",
                                        "evicted_keys_total", "data_served_bytes_total"};

std::string u64(uint64_t v) { return std::to_string(v); }

// `"key": value` pairs of an object, comma-separated as they are added.
class Obj {
 public:
  Obj& raw(std::string_view key, const std::string& json) {
    out_ += first_ ? "" : ",";
    first_ = false;
    out_ += json_quote(key);
    out_ += ':';
    out_ += json;
    return *this;
  }
  Obj& num(std::string_view key, uint64_t v) { return raw(key, u64(v)); }
  Obj& str(std::string_view key, std::string_view v) { return raw(key, json_quote(v)); }
  Obj& flag(std::string_view key, bool v) { return raw(key, v ? "true" : "false"); }
  std::string done() const { return "{" + out_ + "}"; }

 private:
  std::string out_;
  bool first_ = true;
};

}  // namespace

uint64_t report_value(const OwnerInfo& o, std::string_view name) {
  for (const auto& [n, v] : o.report)
    if (n == name) return v;
  return 0;
}

const std::vector<std::string>& StatusBoard::series_names() {
  static const std::vector<std::string> names{
      "routes_published_per_s", "remote_gets_per_s", "lookup_keys_per_s", "errors_per_s",
      "put_keys_per_s",         "get_keys_per_s",    "get_hit_keys_per_s", "evicted_keys_per_s",
      "data_served_bytes_per_s"};
  return names;
}

std::vector<uint64_t> StatusBoard::totals_of(const MasterCore& core) {
  const MasterCounters& c = core.counters();
  uint64_t owner_errors = 0;
  std::vector<uint64_t> owner_sums(std::size(kOwnerSeries), 0);
  for (const auto& [node, o] : core.owners()) {
    owner_errors += report_value(o, "errors_total");
    for (size_t i = 0; i < std::size(kOwnerSeries); ++i) owner_sums[i] += report_value(o, kOwnerSeries[i]);
  }
  std::vector<uint64_t> t{c.routes_published_total, c.get_started_total, c.lookup_keys_total,
                          c.errors_total + owner_errors};
  t.insert(t.end(), owner_sums.begin(), owner_sums.end());
  return t;
}

void StatusBoard::sample(Millis now, const MasterCore& core) {
  if (!samples_.empty() && now <= samples_.back().at) return;  // one sample per instant
  samples_.push_back(Sample{now, totals_of(core)});
  while (samples_.size() > kHistory) samples_.pop_front();
}

std::string StatusBoard::json(Millis now, uint64_t wall_ms, const MasterCore& core, const Header& h) const {
  std::vector<std::string> alerts;
  // Owners.
  std::string owners = "[";
  bool first = true;
  for (const auto& [node, o] : core.owners()) {
    if (o.generation == 0) continue;  // named by a request, never registered
    Obj row;
    // The generation as a string: it is above 2^53, where a JavaScript number loses digits.
    row.num("node", node).str("role", o.role).str("generation", u64(o.generation)).num("segment_bytes", o.segment_len);
    row.str("data_address", o.data_host.empty() ? "" : o.data_host + ":" + std::to_string(o.data_port));
    const bool heard = o.report_at != 0;
    const Millis age = heard ? std::max<Millis>(0, now - o.report_at) : 0;
    const bool stale = !heard || age > kStaleMs;
    row.raw("report_age_ms", heard ? std::to_string(age) : "null").flag("stale", stale);
    if (stale)
      alerts.push_back("owner " + std::to_string(node) +
                       (heard ? ": no report for " + std::to_string(age / 1000) + " s" : ": no report yet"));
    Obj report;
    for (const auto& [name, v] : o.report) report.num(name, v);
    row.raw("report", report.done());
    owners += (first ? "" : ",") + row.done();
    first = false;
  }
  owners += "]";

  // The master.
  const MasterStats st = core.stats();
  Obj master;
  master.num("routes", st.routes).num("replicas", st.replicas).num("owners", st.owners);
  master.num("inflight_gets", st.inflight_gets).num("replica_tasks_queued", st.replica_tasks_queued);
  master.num("reclaims", st.reclaims).num("reclaim_fences", st.reclaim_fences).num("tombstones", core.tombstone_count());
  master.num("kv_events", st.kv_events);
  const MasterCounters& c = core.counters();
  master.num("errors_total", c.errors_total).num("malformed_total", c.malformed_total);
  master.num("routes_published_total", c.routes_published_total).num("get_started_total", c.get_started_total);

  // History: per-second rates between consecutive samples.
  const auto& names = series_names();
  Obj series;
  std::vector<std::string> rows(names.size());
  std::string at = "[";
  for (size_t i = 1; i < samples_.size(); ++i) {
    const Sample& a = samples_[i - 1];
    const Sample& b = samples_[i];
    const double secs = double(b.at - a.at) / 1000.0;
    at += (i > 1 ? "," : "") + std::to_string(b.at - now);
    for (size_t s = 0; s < names.size(); ++s) {
      // A total that went down (an owner restarted: its counters began again) counts as no change.
      const uint64_t d = b.totals[s] >= a.totals[s] ? b.totals[s] - a.totals[s] : 0;
      rows[s] += (i > 1 ? "," : "") + json_number(secs > 0 ? double(d) / secs : 0.0);
    }
  }
  at += "]";
  for (size_t s = 0; s < names.size(); ++s) series.raw(names[s], "[" + rows[s] + "]");
  Obj history;
  history.raw("at_ms", at).raw("series", series.done());
  // Errors in the last ten seconds of samples.
  if (samples_.size() >= 2) {
    const size_t err = 3;  // errors_per_s's index
    const Sample& last = samples_.back();
    size_t from = samples_.size() - 1;
    while (from > 0 && last.at - samples_[from - 1].at <= 10000) --from;
    const Sample& early = samples_[from];
    if (last.totals[err] > early.totals[err])
      alerts.push_back(std::to_string(last.totals[err] - early.totals[err]) +
                       " requests answered with an error in the last " +
                       std::to_string(std::max<Millis>(1, (last.at - early.at) / 1000)) + " s");
  }
  if (!h.leading) alerts.push_back("this master is a standby: the leader serves the cluster");

  std::string alert_list = "[";
  for (size_t i = 0; i < alerts.size(); ++i) alert_list += (i ? "," : "") + json_quote(alerts[i]);
  alert_list += "]";

  Obj doc;
  doc.str("cluster", h.cluster).str("version", h.version).str("master_address", h.address);
  doc.flag("leading", h.leading).num("term", h.term);
  doc.num("now_ms", wall_ms).num("uptime_s", wall_ms > h.started_ms ? (wall_ms - h.started_ms) / 1000 : 0);
  doc.raw("master", master.done()).raw("owners", owners).raw("history", history.done()).raw("alerts", alert_list);
  return doc.done();
}

}  // namespace fluxon
