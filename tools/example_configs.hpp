// The example configs (configs/*.yaml), compiled into the CLI: `fluxon config example [NAME]`.
#pragma once
#include <string>
#include <utility>
#include <vector>

namespace fluxon::tools {

// (name without .yaml, the file's text), in file-name order.
const std::vector<std::pair<std::string, std::string>>& example_configs();

}  // namespace fluxon::tools
