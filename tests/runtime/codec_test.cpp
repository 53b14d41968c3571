#include <doctest/doctest.h>

#include <random>

#include "fluxon/messages/codec.hpp"

using namespace fluxon;

TEST_CASE("codec round trip keeps every field") {
  wire::PutStartReqT p;
  p.keys = {"a", "bb"};
  p.value_len = 4096;
  p.atomic_group_lens = {2};
  p.make_replica_task_mask = {true, true};
  auto bytes = encode(make_envelope(std::move(p), 7, 9));
  auto d = decode(bytes);
  REQUIRE(d.ok());
  CHECK((*d)->session_id == 7);
  CHECK((*d)->generation == 9);
  auto* q = (*d)->body.AsPutStartReq();
  REQUIRE(q);
  CHECK(q->keys == std::vector<std::string>{"a", "bb"});
  CHECK(q->value_len == 4096);
  CHECK(q->reject_if_exist_same_key);
  CHECK(q->atomic_group_lens == std::vector<uint32_t>{2});
}

TEST_CASE("status travels with its details") {
  Status s(Code::kKeyConflict, "x");
  s.indices = {1, 3};
  s.reasons = {ConflictReason::kExists, ConflictReason::kInflight};
  auto d = decode(encode(error_envelope(s)));
  REQUIRE(d.ok());
  Status t = envelope_status(**d);
  CHECK(t.code() == Code::kKeyConflict);
  CHECK(t.indices == std::vector<uint32_t>{1, 3});
  CHECK(t.reasons[1] == ConflictReason::kInflight);
}

TEST_CASE("malformed and truncated messages are errors, never crashes") {
  wire::GetStartReqT g;
  g.keys = {"k1", "k2", "k3"};
  auto good = encode(make_envelope(std::move(g)));
  for (size_t cut = 0; cut < good.size(); ++cut) {
    auto d = decode(good.data(), cut);
    if (d.ok()) continue;  // a prefix can only decode if it verifies
    CHECK(d.status().code() == Code::kMalformedMessage);
  }
  std::mt19937 rng(1234);
  int rejected = 0;
  for (int i = 0; i < 20000; ++i) {
    Bytes b = good;
    for (int k = 0; k < 4; ++k) b[rng() % b.size()] = uint8_t(rng());
    auto d = decode(b);
    if (!d.ok()) rejected++;
  }
  CHECK(rejected > 0);
  Bytes junk(100, 0xff);
  CHECK(decode(junk).status().code() == Code::kMalformedMessage);
  CHECK(decode(nullptr, 0).status().code() == Code::kMalformedMessage);
}
