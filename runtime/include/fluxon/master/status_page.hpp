// The master's status page: one HTML document that reads /api/status (status_board.hpp) once a
// second and draws it (docs/operations.md "The status page").
#pragma once

namespace fluxon {

const char* status_page_html();

}  // namespace fluxon
