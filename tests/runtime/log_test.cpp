// The daemons' log format and its rate limit (log.hpp).
#include <doctest/doctest.h>

#include "fluxon/runtime/log.hpp"

using namespace fluxon;
using namespace fluxon::logging;

TEST_CASE("log: a text line is time, level, component, message and key=value fields") {
  const uint64_t t = 1796685000123;  // 2026-12-07T23:10:00.123Z
  const std::string line = render(Format::kText, t, Level::kWarn, "owner", "the leader is 127.0.0.1:7600",
                                  {{"term", "42"}, {"why", "lease lost"}}, 0);
  CHECK(line == "2026-12-07T23:10:00.123Z WARN  fluxon owner: the leader is 127.0.0.1:7600 term=42 why=\"lease lost\"");
  CHECK(render(Format::kText, t, Level::kInfo, "master", "m", {}, 3) ==
        "2026-12-07T23:10:00.123Z INFO  fluxon master: m (3 repeats of this line suppressed before it)");
}

TEST_CASE("log: a json line is one object with ts, level, component, msg and the fields, escaped") {
  const std::string line = render(Format::kJson, 1796685000123, Level::kError, "owner", "bad \"key\"\n",
                                  {{"node", "1"}}, 2);
  CHECK(line == R"({"ts":"2026-12-07T23:10:00.123Z","level":"error","component":"owner","msg":"bad \"key\"\n",)"
                R"("node":"1","suppressed_repeats":2})");
  CHECK(parse_format("json").ok());
  CHECK(parse_format("xml").status().message() == "log format: 'xml' is neither text nor json");
}

TEST_CASE("log: a call site writes kBurst lines a window, then counts what it drops and says so in its next line") {
  RateLimit r;
  int site = 0, other = 0;
  uint64_t sup = 0;
  for (uint32_t i = 0; i < RateLimit::kBurst; ++i) {
    CHECK(r.admit(&site, 1000 + i, sup));
    CHECK(sup == 0);
  }
  CHECK_FALSE(r.admit(&site, 2000, sup));
  CHECK_FALSE(r.admit(&site, 3000, sup));
  CHECK(r.admit(&other, 3000, sup));  // another site is not limited by this one
  CHECK(r.admit(&site, 1000 + RateLimit::kWindowMs, sup));  // a new window
  CHECK(sup == 2);
  CHECK(r.admit(&site, 1001 + RateLimit::kWindowMs, sup));
  CHECK(sup == 0);
}

TEST_CASE("log: the rate limit remembers at most kSites call sites") {
  RateLimit r;
  std::vector<int> sites(RateLimit::kSites + 10);
  uint64_t sup = 0;
  for (auto& s : sites)
    for (uint32_t i = 0; i <= RateLimit::kBurst; ++i) (void)r.admit(&s, 0, sup);
  // The first site was forgotten: it starts a fresh window (admitted), the last one is still full.
  CHECK(r.admit(&sites.front(), 1, sup));
  CHECK_FALSE(r.admit(&sites.back(), 1, sup));
}
