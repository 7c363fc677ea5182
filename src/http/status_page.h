// The status page `spillway serve` answers at / (src/http/status_page.html,
// compiled in): one self-contained HTML document (no external file, font or
// script) that polls /v1/status and /v1/requests every second and shows the
// memory ledgers against capacity and the safe limit, each path (queue,
// workers, rates, breaker, batching), the requests in flight with their
// path, model, decision, queue position, estimated delay and a cancel
// button, and the recent decisions with their reasons. With API keys it
// asks for one (kept in the tab's sessionStorage) and sends it as a bearer
// token; the page itself holds no data and needs none.
#pragma once

#include <string_view>

namespace spw::http {

std::string_view status_page_html();

}  // namespace spw::http
