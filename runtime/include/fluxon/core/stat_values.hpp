// A core's stats on the wire: its gauge table, then its counter table, as named values
// (wire::NamedValue); and back into a map on the client side. Nothing here names a figure.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "fluxon/core/counters.hpp"
#include "fluxon/messages/codec.hpp"

namespace fluxon {

template <class Gauges, class Counters>
std::vector<std::unique_ptr<wire::NamedValueT>> stat_values(const Gauges& g, const Counters& c) {
  std::vector<std::unique_ptr<wire::NamedValueT>> v;
  auto add = [&](std::string_view name, std::string_view, std::string_view, std::string_view, uint64_t value) {
    auto nv = std::make_unique<wire::NamedValueT>();
    nv->name = std::string(name);
    nv->value = value;
    v.push_back(std::move(nv));
  };
  for_each_gauge(g, add);
  for_each_counter(c, add);
  return v;
}

inline std::map<std::string, uint64_t> stat_map(const std::vector<std::unique_ptr<wire::NamedValueT>>& values) {
  std::map<std::string, uint64_t> m;
  for (const auto& nv : values)
    if (nv) m[nv->name] = nv->value;
  return m;
}

}  // namespace fluxon
