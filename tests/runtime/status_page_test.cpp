// The status page's parts: the master's owner reports and the StatusBoard's /api/status document (tests/python/test_status_page.py reads it from a real
// cluster, and through a browser).
#include <doctest/doctest.h>

#include "fluxon/master/master_core.hpp"
#include "fluxon/master/status_board.hpp"
#include "fluxon/runtime/json.hpp"

using namespace fluxon;

namespace {

void register_owner(MasterCore& m, uint32_t node, uint64_t generation, const std::string& role = "sglang_owner") {
  wire::RegisterOwnerT reg;
  reg.node_id = node;
  reg.generation = generation;
  reg.role = role;
  reg.segment_len = 1 << 20;
  REQUIRE(m.handle(make_envelope(std::move(reg))).body.AsRegisterOwnerReply());
}

Envelope report(MasterCore& m, uint32_t node, uint64_t generation,
                std::vector<std::pair<std::string, uint64_t>> values, Millis now = 0) {
  wire::OwnerReportT r;
  r.node_id = node;
  r.generation = generation;
  for (auto& [n, v] : values) {
    auto nv = std::make_unique<wire::NamedValueT>();
    nv->name = n;
    nv->value = v;
    r.values.push_back(std::move(nv));
  }
  return m.handle(make_envelope(std::move(r)), now);
}

void publish(MasterCore& m, uint32_t node, uint64_t generation, uint64_t put_id, int keys) {
  wire::PutDoneT pd;
  pd.node_id = node;
  pd.generation = generation;
  pd.put_id = put_id;
  for (int i = 0; i < keys; ++i) {
    auto item = std::make_unique<wire::RouteItemT>();
    item->key = "k" + std::to_string(put_id) + ":" + std::to_string(i);
    item->len = 4096;
    item->slot_size = 4096;
    item->offset = uint64_t(i) * 4096;
    pd.items.push_back(std::move(item));
  }
  REQUIRE(m.handle(make_envelope(std::move(pd))).body.AsPutDoneReply());
}

bool has(const std::string& doc, const std::string& part) { return doc.find(part) != std::string::npos; }

}  // namespace

TEST_CASE("owner reports: taken from the registered generation only, bounded, and cleared by a new generation") {
  MasterCore m(1000);
  register_owner(m, 1, 5);
  // Unknown node, older generation: refused, nothing kept.
  CHECK(report(m, 2, 1, {{"slots_free", 1}}).body.AsError()->code == wire::ErrCode(Code::kGenerationMismatch));
  CHECK(report(m, 1, 4, {{"slots_free", 1}}).body.AsError()->code == wire::ErrCode(Code::kGenerationMismatch));
  CHECK(m.owners().at(1).report.empty());
  // Too many values, or a name too long: refused naming the field.
  std::vector<std::pair<std::string, uint64_t>> many;
  for (size_t i = 0; i <= OwnerInfo::kMaxReportValues; ++i) many.emplace_back("v" + std::to_string(i), i);
  auto e = report(m, 1, 5, many);
  REQUIRE(e.body.AsError());
  CHECK(has(e.body.AsError()->message, "OwnerReport.values"));
  e = report(m, 1, 5, {{std::string(OwnerInfo::kMaxReportName + 1, 'n'), 1}});
  REQUIRE(e.body.AsError());
  CHECK(has(e.body.AsError()->message, "OwnerReport.values.name"));
  CHECK(m.owners().at(1).report.empty());
  // The registered generation's report is kept whole, with when it came.
  CHECK(report(m, 1, 5, {{"slots_free", 7}, {"errors_total", 0}}, 1234).body.AsOwnerReportReply());
  CHECK(report_value(m.owners().at(1), "slots_free") == 7);
  CHECK(m.owners().at(1).report_at == 1234);
  CHECK(m.counters().owner_reports_total == 1);
  // A restart registers a new generation: the old one's report goes with it.
  register_owner(m, 1, 6);
  CHECK(m.owners().at(1).report.empty());
  CHECK(m.owners().at(1).report_at == 0);
}

TEST_CASE("status board: owners with their reports, a stale one named in the alerts, rates from the samples") {
  MasterCore m(1000);
  StatusBoard board;
  StatusBoard::Header h{"c1", "9.9.9", "127.0.0.1:1", true, 0, 0};
  register_owner(m, 1, 11);
  register_owner(m, 2, 12, "remote_cache");
  board.sample(1000, m);
  publish(m, 1, 11, 1, 50);
  CHECK(report(m, 1, 11, {{"put_keys_total", 50}, {"slots_committed", 50}}, 2000).body.AsOwnerReportReply());
  board.sample(2000, m);
  publish(m, 1, 11, 2, 20);
  CHECK(report(m, 1, 11, {{"put_keys_total", 70}, {"slots_committed", 70}}, 4000).body.AsOwnerReportReply());
  board.sample(4000, m);  // two seconds later: 20 routes in 2 s
  const std::string doc = board.json(4000, 99, m, h);
  CHECK(has(doc, R"("cluster":"c1")"));
  CHECK(has(doc, R"("node":1,"role":"sglang_owner","generation":"11")"));
  CHECK(has(doc, R"("report":{"put_keys_total":70,"slots_committed":70})"));
  CHECK(has(doc, R"("routes":70)"));
  CHECK(has(doc, R"("routes_published_per_s":[50,10])"));
  CHECK(has(doc, R"("put_keys_per_s":[50,10])"));
  CHECK(has(doc, R"("at_ms":[-2000,0])"));
  // Owner 2 never reported: stale, and named; owner 1's report is fresh.
  CHECK(has(doc, R"("node":2,"role":"remote_cache","generation":"12","segment_bytes":1048576,"data_address":"","report_age_ms":null,"stale":true)"));
  CHECK(has(doc, R"("report_age_ms":0,"stale":false)"));
  CHECK(has(doc, R"("alerts":["owner 2: no report yet"])"));
  // Later, owner 1 silent past kStaleMs: named too, with how long.
  const std::string later = board.json(4000 + StatusBoard::kStaleMs + 2000, 99, m, h);
  CHECK(has(later, "owner 1: no report for 5 s"));
}

TEST_CASE("status board: a restarted owner's counters starting again chart no negative rate, errors are alerted, history bounded") {
  MasterCore m(1000);
  StatusBoard board;
  StatusBoard::Header h;
  h.leading = false;
  register_owner(m, 1, 1);
  CHECK(report(m, 1, 1, {{"put_keys_total", 100}}, 1000).body.AsOwnerReportReply());
  board.sample(1000, m);
  register_owner(m, 1, 2);  // restarted: its totals begin again
  CHECK(report(m, 1, 2, {{"put_keys_total", 5}, {"errors_total", 3}}, 2000).body.AsOwnerReportReply());
  board.sample(2000, m);
  const std::string doc = board.json(2000, 0, m, h);
  CHECK(has(doc, R"("put_keys_per_s":[0])"));
  CHECK(has(doc, R"("errors_per_s":[3])"));
  CHECK(has(doc, "3 requests answered with an error in the last 1 s"));
  CHECK(has(doc, "this master is a standby"));
  for (Millis t = 3000; t < 3000 + 1000 * Millis(StatusBoard::kHistory + 10); t += 1000) board.sample(t, m);
  CHECK(board.samples() == StatusBoard::kHistory);
  board.sample(3000, m);  // not after the last: ignored
  CHECK(board.samples() == StatusBoard::kHistory);
}

TEST_CASE("json: strings escaped, numbers exact, non-finite as null") {
  CHECK(json_quote("a\"b\\c\n\x01") == R"("a\"b\\c\n\u0001")");
  CHECK(json_number(10) == "10");
  CHECK(json_number(0.5) == "0.5");
  CHECK(json_number(1.0 / 0.0) == "null");
}
