#include <doctest/doctest.h>

#include "fluxon/runtime/batch.hpp"

using namespace fluxon;

using Keys = std::vector<std::string>;

TEST_CASE("validate_keys rejects empty batch, empty key, repeated key") {
  CHECK(validate_keys(Keys{}).code() == Code::kInvalidArgument);
  CHECK(validate_keys(Keys{"a", ""}).code() == Code::kInvalidArgument);
  auto s = validate_keys(Keys{"a", "b", "a"});
  CHECK(s.code() == Code::kInvalidArgument);
  CHECK(s.message().find("keys[2]") != std::string::npos);
  CHECK(validate_keys(Keys{"a", "b"}).is_ok());
}

TEST_CASE("validate_keys names the first index that repeats a key before it, in any batch") {
  // The reference: a scan in order, remembering what it saw.
  auto first_repeat = [](const std::vector<std::string>& keys) -> int {
    for (size_t i = 0; i < keys.size(); ++i)
      for (size_t j = 0; j < i; ++j)
        if (keys[j] == keys[i]) return int(i);
    return -1;
  };
  uint64_t rng = 12345;
  auto next = [&] { return rng = rng * 6364136223846793005ull + 1442695040888963407ull, rng >> 33; };
  for (int round = 0; round < 300; ++round) {
    const size_t n = 1 + next() % 300;
    const uint64_t distinct = 1 + next() % (n * 2);  // from mostly repeats to mostly unique
    std::vector<std::string> keys;
    for (size_t i = 0; i < n; ++i) keys.push_back("sglang:page:" + std::to_string(next() % distinct) + "_0_2");
    const int want = first_repeat(keys);
    // Both forms: the owned keys (the client) and the keys read in place (the owner's get_start).
    const std::vector<std::string_view> views(keys.begin(), keys.end());
    for (const Status& s : {validate_keys(keys), validate_keys(std::span<const std::string_view>(views))}) {
      if (want < 0) {
        CHECK(s.is_ok());
      } else {
        REQUIRE(s.code() == Code::kInvalidArgument);
        CHECK(s.message().rfind("keys[" + std::to_string(want) + "]:", 0) == 0);
      }
    }
    CHECK(validate_keys(keys, /*allow_repeats=*/true).is_ok());
  }
}

TEST_CASE("validate_group_lens: each > 0, sum == n") {
  CHECK(validate_group_lens(std::nullopt, 3).is_ok());
  CHECK(validate_group_lens(std::vector<uint32_t>{1, 2}, 3).is_ok());
  CHECK(validate_group_lens(std::vector<uint32_t>{1, 0, 2}, 3).code() == Code::kInvalidArgument);
  CHECK(validate_group_lens(std::vector<uint32_t>{1, 1}, 3).code() == Code::kInvalidArgument);
  CHECK(validate_group_lens(std::vector<uint32_t>{}, 3).code() == Code::kInvalidArgument);
}

TEST_CASE("validate_replica_mask: length and no mixed group") {
  std::vector<uint32_t> g{2, 2};
  CHECK(validate_replica_mask(std::vector<bool>{true, true, false, false}, g, 4).is_ok());
  CHECK(validate_replica_mask(std::vector<bool>{true, false, false, false}, g, 4).code() == Code::kInvalidArgument);
  CHECK(validate_replica_mask(std::vector<bool>{true, true, false}, g, 4).code() == Code::kInvalidArgument);
  CHECK(validate_replica_mask(std::vector<bool>{true, false, true}, std::nullopt, 3).is_ok());
}

TEST_CASE("A1: compute_prefix never cuts a group") {
  std::vector<uint32_t> g{2, 3, 1};
  auto r = compute_prefix({true, true, true, true, false, true}, g, true);
  CHECK(r.raw_prefix_hit_len == 4);
  CHECK(r.transferable_len == 2);
  CHECK(r.prefix_hit_groups == 1);
  CHECK(r.first_miss_index == 4u);
  CHECK(r.first_miss_group_index == 1u);
  CHECK_FALSE(r.all_hit);

  auto all = compute_prefix({true, true, true, true, true, true}, g, true);
  CHECK(all.all_hit);
  CHECK(all.transferable_len == 6);
  CHECK(all.prefix_hit_groups == 3);
  CHECK_FALSE(all.first_miss_index.has_value());
  CHECK_FALSE(all.first_miss_group_index.has_value());

  auto none = compute_prefix({false, true}, std::nullopt, true);
  CHECK(none.transferable_len == 0);
  CHECK(none.first_miss_index == 0u);
  CHECK(none.first_miss_group_index == 0u);

  auto single = compute_prefix({true, true, false}, std::nullopt, true);
  CHECK(single.transferable_len == 2);
  CHECK(single.prefix_hit_groups == 2);
  CHECK(single.first_miss_group_index == 2u);
}

TEST_CASE("compute_prefix without best effort is all-or-nothing") {
  auto r = compute_prefix({true, true, false}, std::nullopt, false);
  CHECK(r.raw_prefix_hit_len == 2);
  CHECK(r.transferable_len == 0);
  CHECK(r.prefix_hit_groups == 0);
  CHECK(compute_prefix({true, true}, std::nullopt, false).all_hit);
}

TEST_CASE("validate_consume_prefix: > 0, <= transferable, on a group boundary") {
  std::vector<uint32_t> g{2, 3};
  CHECK(validate_consume_prefix(0, 5, g).code() == Code::kInvalidArgument);
  CHECK(validate_consume_prefix(6, 5, g).code() == Code::kInvalidArgument);
  CHECK(validate_consume_prefix(3, 5, g).code() == Code::kInvalidArgument);
  CHECK(validate_consume_prefix(2, 5, g).is_ok());
  CHECK(validate_consume_prefix(5, 5, g).is_ok());
  CHECK(validate_consume_prefix(3, 5, std::nullopt).is_ok());
}

TEST_CASE("content_depths: one per key, and the chain they imply inside a batch - each page continues the one of the depth before, value by value") {
  CHECK(validate_content_depths(std::nullopt, 3).is_ok());
  const auto bad = validate_content_depths(std::vector<uint32_t>{0, 1}, 3);
  CHECK(bad.code() == Code::kInvalidArgument);
  CHECK(bad.message().find("content_depths: length 2 != number of keys 3") != std::string::npos);
  // A page's k and v values (two keys per depth): each continues its own of the page before.
  const std::vector<std::string> keys{"a_k", "a_v", "b_k", "b_v", "c_k", "c_v"};
  CHECK(parents_from_depths(keys, {0, 0, 1, 1, 2, 2}) == std::vector<std::string>{"", "", "a_k", "a_v", "b_k", "b_v"});
  // A batch deep in a prefix: its first page's parent came before it.
  CHECK(parents_from_depths({"x", "y", "z"}, {7, 8, 9}) == std::vector<std::string>{"", "x", "y"});
  // Two chains side by side (depths restart): no link across them.
  CHECK(parents_from_depths({"p", "q", "r", "s"}, {0, 1, 0, 1}) == std::vector<std::string>{"", "p", "", "r"});
}
