// Report: a drill's results as a page a person reads and a JSON document a
// program reads.
//
// write_report(dir, input) writes dir/report.json and dir/report.html (the
// directory is created). The page is self-contained: inline SVG charts and
// CSS, no script or font or image fetched from anywhere. It shows, for the
// main run: the gate table (pass/fail, the figures, the request ids of a
// failure), the memory timeline (device used, Spillway's share, the
// competing workload, against the reserve line and the capacity; host memory
// against the host budget), the placement timeline (each request as a mark
// at its invoke time on its path's row, coloured by outcome), queue depth
// and age per path, latency percentiles by path and class, recovery time per
// fault, and the nemesis events on every time axis; then each baseline (the
// same scenario with failover disabled, with a naive free-memory check) in
// the same figures, side by side with the main run. The JSON holds the same
// figures, the gates and the histories (history_to_json), so a report can be
// checked again later.
// summary_text() is the terminal version: one line per gate and the key
// figures, with the failed gates and their request ids last.
// Failure: IOError naming the file when it cannot be written.
// Thread safety: pure apart from the files written.
#pragma once

#include <string>
#include <vector>

#include "core/status.h"
#include "drill/checker.h"
#include "drill/history.h"

namespace spw::drill {

struct RunReport {
  std::string name;      // "planned" (the main run), "no_failover", "naive_free_memory"
  History history;
  CheckResult result;
};

struct ReportInput {
  std::string scenario_name, scenario_description;
  std::string machine;   // one line: CPU, device, date (the live drill fills it)
  RunReport main;
  std::vector<RunReport> baselines;
};

std::string report_json(const ReportInput& in);
std::string report_html(const ReportInput& in);
Status write_report(const std::string& dir, const ReportInput& in);
std::string summary_text(const CheckResult& r);

}  // namespace spw::drill
