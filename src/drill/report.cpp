// Report: report.json (nlohmann-json) and report.html (hand-written HTML with
// inline SVG; no script, no font, no image, no link to anything).
//
// Every chart is an <svg class="chart KIND" id="KIND-RUN"> (RUN = the run's
// name: planned, no_failover, ...); its data are <polyline class="series ...">
// and <circle class="mark ..."> elements, events <line class="event">, so a
// test (tests/browser) can find them. The runs of one figure share their
// axes, so the baselines compare with the main run by eye.
#include "drill/report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>

#include "core/size.h"

namespace spw::drill {

using nlohmann::json;

namespace {

// ------------------------------------------------------------------ JSON

json percentiles_json(const Percentiles& p) {
  return json{{"n", p.n}, {"p50", p.p50}, {"p95", p.p95}, {"p99", p.p99}, {"max", p.max}};
}

json pct_map_json(const std::map<std::string, Percentiles>& m) {
  json j = json::object();
  for (const auto& [k, p] : m) j[k] = percentiles_json(p);
  return j;
}

json result_json(const CheckResult& r) {
  const Figures& f = r.figures;
  json fig{
      {"operations", f.operations},
      {"accepted", f.accepted},
      {"succeeded", f.succeeded},
      {"success_rate", f.success_rate},
      {"refused", f.refused},
      {"lost", f.lost},
      {"duplicated", f.duplicated},
      {"equivalence_checked", f.equivalence_checked},
      {"equivalence_equal", f.equivalence_equal},
      {"degraded", f.degraded},
      {"degraded_shown", f.degraded_shown},
      {"cancelled", f.cancelled},
      {"resumed", f.resumed},
      {"replayed", f.replayed},
      {"latency_by_class", pct_map_json(f.latency_by_class)},
      {"latency_by_path", pct_map_json(f.latency_by_path)},
      {"ttft_by_path", pct_map_json(f.ttft_by_path)},
      {"max_queue_depth", f.max_queue_depth},
      {"max_queue_age_s", f.max_queue_age_s},
      {"device_peak", f.device_peak},
      {"device_limit", f.device_limit},
      {"device_capacity", f.device_capacity},
      {"host_peak", f.host_peak},
      {"host_budget", f.host_budget},
  };
  json rec = json::array();
  for (const auto& x : f.recoveries) {
    rec.push_back(json{{"fault", x.fault},
                       {"fault_ms", x.fault_ms},
                       {"breaker_open_ms", x.breaker_open_ms},
                       {"first_cpu_token_ms", x.first_cpu_token_ms},
                       {"restart_ms", x.restart_ms},
                       {"first_token_ms", x.first_token_ms}});
  }
  fig["recoveries"] = std::move(rec);
  json gates = json::array();
  for (const auto& g : r.gates) {
    gates.push_back(json{{"name", g.name}, {"passed", g.passed}, {"detail", g.detail}, {"request_ids", g.request_ids}});
  }
  return json{{"scenario", r.scenario}, {"mode", r.mode},         {"seed", r.seed},
              {"passed", r.passed},     {"failed_gates", r.failed_gates()}, {"figures", std::move(fig)},
              {"gates", std::move(gates)}};
}

json run_json(const RunReport& run) {
  json h = json::parse(history_to_json(run.history), nullptr, false);
  return json{{"name", run.name}, {"result", result_json(run.result)}, {"history", std::move(h)}};
}

// ------------------------------------------------------------------ HTML

std::string esc(std::string_view s) {
  std::string o;
  o.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&': o += "&amp;"; break;
      case '<': o += "&lt;"; break;
      case '>': o += "&gt;"; break;
      case '"': o += "&quot;"; break;
      case '\'': o += "&#39;"; break;
      default: o += c;
    }
  }
  return o;
}

std::string num(double v, int prec = 1) {
  if (!std::isfinite(v)) return "0";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", prec, v);
  return buf;
}

std::string bytes_text(double b) { return format_byte_size(b > 0 ? static_cast<uint64_t>(b) : 0); }

std::string ms_text(double ms) { return ms < 0 ? "&#8211;" : num(ms, 0) + " ms"; }

// Round tick positions (1, 2 or 5 times a power of ten) covering [0, hi].
std::vector<double> ticks(double hi, int want = 5) {
  std::vector<double> t;
  if (!(hi > 0)) return {0};
  const double raw = hi / want;
  const double p = std::pow(10.0, std::floor(std::log10(raw)));
  double step = p;
  for (double m : {1.0, 2.0, 5.0, 10.0}) {
    step = m * p;
    if (step >= raw) break;
  }
  for (double v = 0; v <= hi * (1 + 1e-9); v += step) t.push_back(v);
  return t;
}

// Byte axes tick in powers of 1024 so that labels read "16 MiB", not "16.8 MB".
std::vector<double> byte_ticks(double hi) {
  double unit = 1;
  while (hi / unit >= 1024) unit *= 1024;
  std::vector<double> t = ticks(hi / unit);
  for (double& v : t) v *= unit;
  return t;
}

const char* kPalette[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf"};

struct Frame {
  double x_max = 1, y_max = 1;  // data ranges: [0, x_max] seconds, [0, y_max]
  int w = 720, h = 230;
  int left = 70, right = 14, top = 40, bottom = 34;
  double sx(double x) const { return left + (w - left - right) * std::clamp(x / x_max, 0.0, 1.0); }
  double sy(double y) const { return h - bottom - (h - top - bottom) * std::clamp(y / y_max, 0.0, 1.0); }
  double plot_top() const { return top; }
  double plot_bottom() const { return h - bottom; }
};

std::string svg_open(const std::string& kind, const std::string& run, const Frame& f, const std::string& label) {
  return "<svg class=\"chart " + kind + "\" id=\"" + kind + "-" + esc(run) + "\" data-run=\"" + esc(run) +
         "\" viewBox=\"0 0 " + std::to_string(f.w) + " " + std::to_string(f.h) + "\" width=\"" + std::to_string(f.w) +
         "\" height=\"" + std::to_string(f.h) + "\" role=\"img\" aria-label=\"" + esc(label) + "\">\n";
}

// Grid, tick labels and axis titles. y_fmt formats a y tick.
template <typename YFmt>
std::string axes(const Frame& f, const std::vector<double>& yt, YFmt y_fmt, const std::string& y_title) {
  std::string o = "<g class=\"axes\">\n";
  for (double y : yt) {
    const double py = f.sy(y);
    o += "<line class=\"grid\" x1=\"" + num(f.sx(0)) + "\" y1=\"" + num(py) + "\" x2=\"" + num(f.sx(f.x_max)) +
         "\" y2=\"" + num(py) + "\"/>";
    o += "<text class=\"tick\" x=\"" + num(f.left - 4) + "\" y=\"" + num(py + 3) + "\" text-anchor=\"end\">" +
         y_fmt(y) + "</text>\n";
  }
  for (double x : ticks(f.x_max, 8)) {
    const double px = f.sx(x);
    o += "<line class=\"grid\" x1=\"" + num(px) + "\" y1=\"" + num(f.plot_top()) + "\" x2=\"" + num(px) +
         "\" y2=\"" + num(f.plot_bottom()) + "\"/>";
    o += "<text class=\"tick\" x=\"" + num(px) + "\" y=\"" + num(f.plot_bottom() + 12) + "\" text-anchor=\"middle\">" +
         num(x, x < 10 && f.x_max < 20 ? 1 : 0) + "</text>\n";
  }
  o += "<line class=\"axis\" x1=\"" + num(f.sx(0)) + "\" y1=\"" + num(f.plot_bottom()) + "\" x2=\"" +
       num(f.sx(f.x_max)) + "\" y2=\"" + num(f.plot_bottom()) + "\"/>";
  o += "<line class=\"axis\" x1=\"" + num(f.sx(0)) + "\" y1=\"" + num(f.plot_top()) + "\" x2=\"" + num(f.sx(0)) +
       "\" y2=\"" + num(f.plot_bottom()) + "\"/>\n";
  o += "<text class=\"axis-title\" x=\"" + num(f.sx(f.x_max)) + "\" y=\"" + num(f.h - 4) +
       "\" text-anchor=\"end\">time (s)</text>";
  o += "<text class=\"axis-title\" x=\"4\" y=\"12\">" + esc(y_title) + "</text>\n</g>\n";
  return o;
}

// Events drawn on the time axes: the phases, the nemesis's faults and what
// they did to the breaker. The rest (co-tenant steps, status polls that went
// unanswered, ...) is in the events table, where it does not crowd the charts.
bool on_time_axis(const std::string& kind) {
  static const char* kinds[] = {"phase",         "pressure", "alloc_fail",   "device_lost", "cancel_queued",
                                "kill",          "restart",  "breaker_open", "breaker_closed", "fault_fired"};
  return std::any_of(std::begin(kinds), std::end(kinds), [&](const char* k) { return kind == k; });
}

// The nemesis on the time axis: a vertical line per event with its kind as
// label (staggered so that close events stay readable; a firing is a line
// without a label, beside its arming's) and the detail as a tooltip. Phase
// starts are drawn lighter.
std::string event_marks(const Frame& f, const History& h) {
  std::string o = "<g class=\"events\">\n";
  int i = 0;
  for (const Event& e : h.events) {
    if (!on_time_axis(e.kind)) continue;
    const double x = f.sx(e.t_ms / 1000.0);
    const bool phase = e.kind == "phase";
    o += "<g class=\"event-mark\"><title>" + esc(e.kind) + " at " + num(e.t_ms / 1000.0, 2) + " s" +
         (e.detail.empty() ? "" : ": " + esc(e.detail)) + "</title>";
    o += "<line class=\"event" + std::string(phase ? " phase" : "") + "\" data-kind=\"" + esc(e.kind) + "\" x1=\"" +
         num(x) + "\" y1=\"" + num(f.plot_top()) + "\" x2=\"" + num(x) + "\" y2=\"" + num(f.plot_bottom()) + "\"/>";
    if (e.kind != "fault_fired") {
      // A phase event's detail starts with its name ("warm (10 s; ...)").
      const std::string label = phase ? e.detail.substr(0, e.detail.find(' ')) : e.kind;
      o += "<text class=\"event-label\" x=\"" + num(x + 2) + "\" y=\"" + num(f.plot_top() - 2 + 9 * (i % 4)) +
           "\">" + esc(label) + "</text>";
      ++i;
    }
    o += "</g>\n";
  }
  return o + "</g>\n";
}

// Grey bands where the server did not answer its status (a kill, or every
// HTTP thread busy with streams).
std::string down_bands(const Frame& f, const History& h) {
  std::string o;
  for (size_t i = 0; i < h.samples.size(); ++i) {
    if (h.samples[i].up) continue;
    const double t0 = h.samples[i].t_ms / 1000.0;
    size_t j = i;
    while (j + 1 < h.samples.size() && !h.samples[j + 1].up) ++j;
    const double t1 = j + 1 < h.samples.size() ? h.samples[j + 1].t_ms / 1000.0 : h.samples[j].t_ms / 1000.0;
    o += "<rect class=\"down\" x=\"" + num(f.sx(t0)) + "\" y=\"" + num(f.plot_top()) + "\" width=\"" +
         num(std::max(1.0, f.sx(t1) - f.sx(t0))) + "\" height=\"" + num(f.plot_bottom() - f.plot_top()) +
         "\"><title>no answer to GET /v1/status (server down or its HTTP threads all busy)</title></rect>\n";
    i = j;
  }
  return o;
}

// A polyline over the samples that answered; `value` picks the y.
template <typename V>
std::string sample_line(const Frame& f, const History& h, V value, const std::string& cls, const std::string& color,
                        const std::string& title, bool dashed = false) {
  std::string pts;
  for (const Sample& s : h.samples) {
    if (!s.up) continue;
    auto y = value(s);
    if (!y) continue;
    pts += num(f.sx(s.t_ms / 1000.0)) + "," + num(f.sy(static_cast<double>(*y))) + " ";
  }
  if (pts.empty()) return {};
  pts.pop_back();
  return "<polyline class=\"series " + cls + "\" fill=\"none\" stroke=\"" + color + "\" stroke-width=\"" +
         (dashed ? "1.5\" stroke-dasharray=\"6 4" : "1.8") + "\" points=\"" + pts + "\"><title>" + esc(title) +
         "</title></polyline>\n";
}

// A limit that is one value throughout is a horizontal line; one that moves is
// drawn as a dashed series.
template <typename V>
std::string limit_line(const Frame& f, const History& h, V value, const std::string& cls, const std::string& color,
                       const std::string& title, bool label_left = false) {
  std::set<uint64_t> vals;
  for (const Sample& s : h.samples) {
    if (s.up && value(s) > 0) vals.insert(value(s));
  }
  if (vals.empty()) return {};
  if (vals.size() == 1) {
    const double y = f.sy(static_cast<double>(*vals.begin()));
    return "<line class=\"" + cls + "\" stroke=\"" + color + "\" stroke-dasharray=\"6 4\" x1=\"" + num(f.sx(0)) +
           "\" y1=\"" + num(y) + "\" x2=\"" + num(f.sx(f.x_max)) + "\" y2=\"" + num(y) + "\"><title>" + esc(title) +
           " " + bytes_text(static_cast<double>(*vals.begin())) + "</title></line>\n" + "<text class=\"line-label\" x=\"" +
           num(label_left ? f.sx(0) + 3 : f.sx(f.x_max) - 2) + "\" y=\"" + num(y - 3) + "\" text-anchor=\"" +
           (label_left ? "start" : "end") + "\" fill=\"" + color + "\">" + esc(title) + "</text>\n";
  }
  return sample_line(
      f, h, [&](const Sample& s) { return value(s) > 0 ? std::optional<uint64_t>(value(s)) : std::nullopt; },
      cls + " limit", color, title, true);
}

std::string legend(const std::vector<std::pair<std::string, std::string>>& items, bool dashed_last = false) {
  std::string o = "<div class=\"legend\">";
  for (size_t i = 0; i < items.size(); ++i) {
    o += "<span><i style=\"border-top:3px " +
         std::string(dashed_last && i + 1 == items.size() ? "dashed " : "solid ") + items[i].second +
         "\"></i>" + esc(items[i].first) + "</span>";
  }
  return o + "</div>";
}

double run_end_s(const History& h) {
  double t = h.duration_ms;
  for (const auto& s : h.samples) t = std::max(t, s.t_ms);
  for (const auto& o : h.ops) t = std::max(t, o.t_ms);
  for (const auto& e : h.events) t = std::max(t, e.t_ms);
  return t / 1000.0;
}

struct Ctx {
  std::vector<const RunReport*> runs;
  double x_max = 1;
  std::vector<std::string> paths;  // every path named anywhere, first-seen order
  std::string path_color(const std::string& p) const {
    auto it = std::find(paths.begin(), paths.end(), p);
    const size_t i = it == paths.end() ? 0 : static_cast<size_t>(it - paths.begin());
    return kPalette[i % (sizeof kPalette / sizeof kPalette[0])];
  }
};

void add_path(Ctx& c, const std::string& p) {
  if (!p.empty() && std::find(c.paths.begin(), c.paths.end(), p) == c.paths.end()) c.paths.push_back(p);
}

std::string op_path(const Op& o) { return !o.path.empty() ? o.path : o.placement; }

// One figure: a panel per run, side by side, with the same axes.
template <typename Draw>
std::string figure(const Ctx& c, const std::string& id, const std::string& title, const std::string& note, Draw draw) {
  std::string o = "<section class=\"figure\" id=\"fig-" + id + "\"><h2>" + esc(title) + "</h2>";
  if (!note.empty()) o += "<p class=\"note\">" + note + "</p>";
  o += "<div class=\"row\">";
  for (const RunReport* r : c.runs) {
    o += "<div class=\"panel\"><h3>" + esc(r->name) + (r->result.passed ? "" : " <span class=\"bad\">(gates failed)</span>") +
         "</h3>" + draw(*r) + "</div>";
  }
  return o + "</div></section>\n";
}

std::string memory_chart(const Ctx& c, const RunReport& r) {
  const History& h = r.history;
  Frame f;
  f.x_max = c.x_max;
  double y = 0;
  for (const RunReport* rr : c.runs) {
    for (const Sample& s : rr->history.samples) {
      y = std::max({y, static_cast<double>(s.device_capacity), static_cast<double>(s.device_used),
                    static_cast<double>(s.device_limit), static_cast<double>(s.competing_bytes),
                    static_cast<double>(s.device_ours + s.device_cotenants)});
    }
  }
  f.y_max = std::max(y * 1.08, 1024.0 * 1024.0);
  auto yt = byte_ticks(f.y_max);
  std::string o = svg_open("memory", r.name, f, "device memory of run " + r.name);
  o += axes(f, yt, [](double v) { return bytes_text(v); }, "device memory");
  o += down_bands(f, h);
  o += limit_line(f, h, [](const Sample& s) { return s.device_capacity; }, "capacity", "#555", "capacity");
  o += limit_line(f, h, [](const Sample& s) { return s.device_limit; }, "reserve", "#ff7f0e", "reserve line",
                  /*label_left=*/true);
  auto opt = [](uint64_t v) { return std::optional<uint64_t>(v); };
  o += sample_line(f, h, [&](const Sample& s) { return opt(s.device_used); }, "used", "#1f77b4", "device used");
  o += sample_line(f, h, [&](const Sample& s) { return opt(s.device_ours); }, "ours", "#2ca02c", "Spillway's share");
  o += sample_line(f, h, [&](const Sample& s) { return opt(s.device_cotenants); }, "cotenants", "#9467bd",
                   "declared co-tenants");
  o += sample_line(f, h, [&](const Sample& s) { return opt(s.competing_bytes); }, "competing", "#d62728",
                   "competing workload");
  o += event_marks(f, h);
  o += "</svg>";
  o += legend({{"device used", "#1f77b4"},
               {"Spillway", "#2ca02c"},
               {"declared co-tenants", "#9467bd"},
               {"competing workload", "#d62728"},
               {"capacity", "#555"},
               {"reserve line", "#ff7f0e"}},
              true);
  return o;
}

std::string host_chart(const Ctx& c, const RunReport& r) {
  const History& h = r.history;
  Frame f;
  f.x_max = c.x_max;
  double y = 0;
  for (const RunReport* rr : c.runs) {
    for (const Sample& s : rr->history.samples) {
      y = std::max({y, static_cast<double>(s.host_budget), static_cast<double>(s.host_rss),
                    static_cast<double>(s.host_reserved)});
    }
  }
  f.y_max = std::max(y * 1.08, 1024.0 * 1024.0);
  std::string o = svg_open("host", r.name, f, "host memory of run " + r.name);
  o += axes(f, byte_ticks(f.y_max), [](double v) { return bytes_text(v); }, "host memory");
  o += down_bands(f, h);
  o += limit_line(f, h, [](const Sample& s) { return s.host_budget; }, "budget", "#ff7f0e", "host budget");
  auto nz = [](uint64_t v) { return v > 0 ? std::optional<uint64_t>(v) : std::nullopt; };
  o += sample_line(f, h, [&](const Sample& s) { return nz(s.host_rss); }, "rss", "#1f77b4", "server RSS");
  o += sample_line(f, h, [&](const Sample& s) { return nz(s.host_reserved); }, "reserved", "#2ca02c",
                   "host ledger reserved");
  o += event_marks(f, h);
  o += "</svg>";
  o += legend({{"server RSS", "#1f77b4"}, {"host ledger reserved", "#2ca02c"}, {"host budget", "#ff7f0e"}}, true);
  return o;
}

// Each operation as a mark at its invoke time on its path's row; refusals and
// operations that never reached a path sit on the last row.
std::string placement_chart(const Ctx& c, const RunReport& r) {
  const History& h = r.history;
  std::vector<std::string> rows = c.paths;
  rows.push_back("(none)");
  Frame f;
  f.x_max = c.x_max;
  f.h = std::max(120, 40 + 26 * static_cast<int>(rows.size()) + 20);
  f.y_max = static_cast<double>(rows.size());
  std::string o = svg_open("placement", r.name, f, "placement timeline of run " + r.name);
  // Axes by hand: rows are categories, not a scale.
  o += "<g class=\"axes\">";
  for (size_t i = 0; i < rows.size(); ++i) {
    const double y = f.sy(static_cast<double>(rows.size() - i) - 0.5);
    o += "<line class=\"grid\" x1=\"" + num(f.sx(0)) + "\" y1=\"" + num(y) + "\" x2=\"" + num(f.sx(f.x_max)) +
         "\" y2=\"" + num(y) + "\"/><text class=\"tick\" x=\"" + num(f.left - 4) + "\" y=\"" + num(y + 3) +
         "\" text-anchor=\"end\">" + esc(rows[i]) + "</text>\n";
  }
  for (double x : ticks(f.x_max, 8)) {
    o += "<text class=\"tick\" x=\"" + num(f.sx(x)) + "\" y=\"" + num(f.plot_bottom() + 12) +
         "\" text-anchor=\"middle\">" + num(x, x < 10 && f.x_max < 20 ? 1 : 0) + "</text>";
  }
  o += "<line class=\"axis\" x1=\"" + num(f.sx(0)) + "\" y1=\"" + num(f.plot_bottom()) + "\" x2=\"" +
       num(f.sx(f.x_max)) + "\" y2=\"" + num(f.plot_bottom()) + "\"/><text class=\"axis-title\" x=\"" +
       num(f.sx(f.x_max)) + "\" y=\"" + num(f.h - 4) + "\" text-anchor=\"end\">time (s)</text></g>\n";
  o += down_bands(f, h);
  o += "<g class=\"marks\">\n";
  // Completions by op_id, for the outcome of each invoke.
  std::map<int64_t, const Op*> done;
  std::map<int64_t, const Op*> invoked;
  for (const Op& op : h.ops) {
    if (op.type == OpType::kInvoke) {
      invoked.emplace(op.op_id, &op);
    } else {
      done.emplace(op.op_id, &op);
    }
  }
  auto draw = [&](const Op* inv, const Op* out) {
    const Op& req = inv != nullptr ? *inv : *out;
    if (req.f == "read") return;
    const double t = inv != nullptr ? inv->t_ms : (out->latency_ms >= 0 ? out->t_ms - out->latency_ms : out->t_ms);
    std::string outcome = "pending";
    std::string path;
    if (out != nullptr) {
      path = op_path(*out);
      switch (out->type) {
        case OpType::kOk: outcome = "ok"; break;
        case OpType::kFail: outcome = out->accepted || out->request_id != 0 ? "fail" : "refused"; break;
        default: outcome = "info"; break;
      }
    }
    auto it = std::find(rows.begin(), rows.end(), path);
    const size_t row = path.empty() || it == rows.end() ? rows.size() - 1 : static_cast<size_t>(it - rows.begin());
    const double y = f.sy(static_cast<double>(rows.size() - row) - 0.5);
    const bool degraded = out != nullptr && out->degraded;
    std::string tip = "op " + std::to_string(req.op_id) + " " + req.f + " " + req.cls;
    if (out != nullptr) {
      if (out->request_id != 0) tip += " request " + std::to_string(out->request_id);
      tip += ": " + outcome;
      if (out->http_status != 0) tip += " " + std::to_string(out->http_status);
      if (!out->error_code.empty()) tip += " " + out->error_code;
      if (!out->decision.empty()) tip += ", " + out->decision;
      if (degraded) tip += ", degraded" + std::string(out->degraded_shown ? "" : " NOT SHOWN");
      if (out->latency_ms >= 0) tip += ", " + num(out->latency_ms, 0) + " ms";
    }
    o += "<circle class=\"mark " + outcome + (degraded ? " degraded" : "") + (req.f == "cancel" ? " cancel" : "") +
         "\" cx=\"" + num(f.sx(t / 1000.0)) + "\" cy=\"" + num(y) + "\" r=\"3.2\"><title>" + esc(tip) +
         "</title></circle>\n";
  };
  for (const auto& [id, inv] : invoked) {
    auto d = done.find(id);
    draw(inv, d == done.end() ? nullptr : d->second);
  }
  for (const auto& [id, out] : done) {
    if (invoked.count(id) == 0) draw(nullptr, out);
  }
  o += "</g>\n" + event_marks(f, h) + "</svg>";
  o += "<div class=\"legend\"><span><b class=\"dot ok\"></b>ok</span><span><b class=\"dot fail\"></b>failed after "
       "acceptance</span><span><b class=\"dot refused\"></b>refused</span><span><b class=\"dot info\"></b>outcome "
       "unknown</span><span><b class=\"dot pending\"></b>no completion</span><span><b class=\"dot ok "
       "degraded\"></b>degraded (ringed)</span></div>";
  return o;
}

// Queue depth (age = false) or the oldest queued request's age (age = true), a
// line per path.
std::string queue_chart(const Ctx& c, const RunReport& r, bool age) {
  const History& h = r.history;
  const std::string kind = age ? "queue-age" : "queue";
  Frame f;
  f.x_max = c.x_max;
  double y = 0;
  for (const RunReport* rr : c.runs) {
    for (const Sample& s : rr->history.samples) {
      for (const PathSample& p : s.paths) y = std::max(y, age ? p.oldest_queued_s : static_cast<double>(p.queue_depth));
    }
  }
  f.y_max = std::max(age ? 1.0 : 2.0, y * 1.1);
  std::string o = svg_open(kind, r.name, f, (age ? "queue age of run " : "queue depth of run ") + r.name);
  o += axes(f, ticks(f.y_max, 4), [&](double v) { return num(v, age && f.y_max < 5 ? 1 : 0); },
            age ? "oldest queued (s)" : "queued requests");
  o += down_bands(f, h);
  std::vector<std::pair<std::string, std::string>> items;
  for (const std::string& p : c.paths) {
    std::string pts;
    for (const Sample& s : h.samples) {
      if (!s.up) continue;
      for (const PathSample& ps : s.paths) {
        if (ps.name != p) continue;
        const double v = age ? ps.oldest_queued_s : static_cast<double>(ps.queue_depth);
        pts += num(f.sx(s.t_ms / 1000.0)) + "," + num(f.sy(v)) + " ";
      }
    }
    if (pts.empty()) continue;
    pts.pop_back();
    o += "<polyline class=\"series " + kind + "\" data-path=\"" + esc(p) + "\" fill=\"none\" stroke=\"" +
         c.path_color(p) + "\" stroke-width=\"1.8\" points=\"" + pts + "\"><title>" + esc(p) + "</title></polyline>\n";
    items.emplace_back(p, c.path_color(p));
  }
  o += event_marks(f, h) + "</svg>" + legend(items);
  return o;
}

std::string gate_table(const Ctx& c) {
  std::string o = "<table class=\"gates\" id=\"gates\"><thead><tr><th>gate</th>";
  for (const RunReport* r : c.runs) o += "<th>" + esc(r->name) + "</th>";
  o += "</tr></thead><tbody>\n";
  std::vector<std::string> names;
  for (const RunReport* r : c.runs) {
    for (const Gate& g : r->result.gates) {
      if (std::find(names.begin(), names.end(), g.name) == names.end()) names.push_back(g.name);
    }
  }
  for (const std::string& n : names) {
    o += "<tr class=\"gate\" data-gate=\"" + esc(n) + "\"><th>" + esc(n) + "</th>";
    for (const RunReport* r : c.runs) {
      const Gate* g = nullptr;
      for (const Gate& x : r->result.gates) {
        if (x.name == n) g = &x;
      }
      if (g == nullptr) {
        o += "<td>&#8211;</td>";
        continue;
      }
      o += std::string("<td class=\"") + (g->passed ? "pass" : "fail") + "\"><b>" + (g->passed ? "PASS" : "FAIL") +
           "</b> " + esc(g->detail);
      if (!g->request_ids.empty()) {
        o += "<div class=\"ids\">requests: ";
        for (size_t i = 0; i < g->request_ids.size() && i < 50; ++i) {
          o += (i ? ", " : "") + std::to_string(g->request_ids[i]);
        }
        if (g->request_ids.size() > 50) o += ", &#8230; (" + std::to_string(g->request_ids.size()) + ")";
        o += "</div>";
      }
      o += "</td>";
    }
    o += "</tr>\n";
  }
  return o + "</tbody></table>\n";
}

std::string figures_table(const Ctx& c) {
  std::string o = "<table class=\"figures\" id=\"figures\"><thead><tr><th>figure</th>";
  for (const RunReport* r : c.runs) o += "<th>" + esc(r->name) + "</th>";
  o += "</tr></thead><tbody>\n";
  auto row = [&](const std::string& name, auto cell) {
    o += "<tr><th>" + name + "</th>";
    for (const RunReport* r : c.runs) o += "<td>" + cell(r->result.figures) + "</td>";
    o += "</tr>\n";
  };
  auto i = [](int64_t v) { return std::to_string(v); };
  row("operations", [&](const Figures& f) { return i(f.operations); });
  row("accepted requests", [&](const Figures& f) { return i(f.accepted); });
  row("success rate", [&](const Figures& f) {
    return num(100 * f.success_rate, 1) + "% (" + i(f.succeeded) + " of " + i(f.accepted) + ")";
  });
  row("refused before acceptance", [&](const Figures& f) { return i(f.refused); });
  row("lost", [&](const Figures& f) { return i(f.lost); });
  row("duplicated side effects", [&](const Figures& f) { return i(f.duplicated); });
  row("token equivalence (greedy and seeded)", [&](const Figures& f) {
    return i(f.equivalence_equal) + " of " + i(f.equivalence_checked) + " equal the clean run";
  });
  row("degraded shown", [&](const Figures& f) { return i(f.degraded_shown) + " of " + i(f.degraded); });
  row("cancelled / resumed / replayed",
      [&](const Figures& f) { return i(f.cancelled) + " / " + i(f.resumed) + " / " + i(f.replayed); });
  row("peak device (reserve line, capacity)", [&](const Figures& f) {
    return bytes_text(static_cast<double>(f.device_peak)) + " (" + bytes_text(static_cast<double>(f.device_limit)) +
           ", " + bytes_text(static_cast<double>(f.device_capacity)) + ")";
  });
  row("peak host (budget)", [&](const Figures& f) {
    return bytes_text(static_cast<double>(f.host_peak)) + " (" +
           (f.host_budget ? bytes_text(static_cast<double>(f.host_budget)) : std::string("none sampled")) + ")";
  });
  row("max queue depth / age by path", [&](const Figures& f) {
    std::string s;
    for (const auto& [p, d] : f.max_queue_depth) {
      auto a = f.max_queue_age_s.find(p);
      s += (s.empty() ? "" : "; ") + esc(p) + ": " + std::to_string(d) + " / " +
           num(a == f.max_queue_age_s.end() ? 0 : a->second, 1) + " s";
    }
    return s.empty() ? std::string("&#8211;") : s;
  });
  return o + "</tbody></table>\n";
}

std::string latency_table(const Ctx& c) {
  std::string o =
      "<table class=\"latency\" id=\"latency\"><thead><tr><th>run</th><th>measure</th><th>by</th><th>n</th>"
      "<th>p50</th><th>p95</th><th>p99</th><th>max</th></tr></thead><tbody>\n";
  for (const RunReport* r : c.runs) {
    auto rows = [&](const char* what, const char* by, const std::map<std::string, Percentiles>& m) {
      for (const auto& [k, p] : m) {
        o += "<tr><td>" + esc(r->name) + "</td><td>" + what + "</td><td>" + by + " " + esc(k) + "</td><td>" +
             std::to_string(p.n) + "</td><td>" + ms_text(p.p50) + "</td><td>" + ms_text(p.p95) + "</td><td>" +
             ms_text(p.p99) + "</td><td>" + ms_text(p.max) + "</td></tr>\n";
      }
    };
    rows("latency", "path", r->result.figures.latency_by_path);
    rows("latency", "class", r->result.figures.latency_by_class);
    rows("time to first token", "path", r->result.figures.ttft_by_path);
  }
  return o + "</tbody></table>\n";
}

std::string recovery_table(const Ctx& c) {
  std::string o =
      "<table class=\"recovery\" id=\"recovery\"><thead><tr><th>run</th><th>fault</th><th>at</th>"
      "<th>breaker open after</th><th>first CPU token after</th><th>restart after</th><th>first token after</th>"
      "</tr></thead><tbody>\n";
  bool any = false;
  for (const RunReport* r : c.runs) {
    for (const Recovery& x : r->result.figures.recoveries) {
      any = true;
      o += "<tr><td>" + esc(r->name) + "</td><td>" + esc(x.fault) + "</td><td>" + num(x.fault_ms / 1000.0, 2) +
           " s</td><td>" + ms_text(x.breaker_open_ms) + "</td><td>" + ms_text(x.first_cpu_token_ms) + "</td><td>" +
           ms_text(x.restart_ms) + "</td><td>" + ms_text(x.first_token_ms) + "</td></tr>\n";
    }
  }
  if (!any) o += "<tr><td colspan=\"7\">no device fault or kill in this drill</td></tr>\n";
  return o + "</tbody></table>\n";
}

// Every event of every run, in time order: what the nemesis did and what the
// drill saw happen (the charts show only the headline ones).
std::string events_table(const Ctx& c) {
  std::string o = "<table class=\"events\" id=\"events\"><thead><tr><th>run</th><th>at</th><th>event</th>"
                  "<th>detail</th></tr></thead><tbody>\n";
  for (const RunReport* r : c.runs) {
    for (const Event& e : r->history.events) {
      o += "<tr><td>" + esc(r->name) + "</td><td>" + num(e.t_ms / 1000.0, 2) + " s</td><td>" + esc(e.kind) +
           "</td><td>" + esc(e.detail) + "</td></tr>\n";
    }
  }
  return o + "</tbody></table>\n";
}

const char* kCss = R"(
body{font:14px/1.4 system-ui,sans-serif;margin:20px;color:#222;background:#fff}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:22px 0 6px}h3{font-size:14px;margin:4px 0}
.verdict{display:inline-block;padding:2px 10px;border-radius:4px;font-weight:bold;color:#fff}
.verdict.pass{background:#1a7f37}.verdict.fail{background:#c62828}
.meta{color:#555}.note{color:#555;margin:2px 0 6px}.bad{color:#c62828}
table{border-collapse:collapse;margin:6px 0}th,td{border:1px solid #ccc;padding:3px 8px;text-align:left;vertical-align:top}
thead th{background:#f2f2f2}td.pass{background:#dcf5dc}td.fail{background:#fbd5d5}.ids{font-size:12px;color:#555}
.row{display:flex;flex-wrap:wrap;gap:16px}.panel{border:1px solid #ddd;padding:6px;border-radius:4px}
svg.chart{display:block;background:#fff}
svg .grid{stroke:#eee;stroke-width:1}svg .axis{stroke:#888;stroke-width:1}
svg .tick,svg .axis-title{font-size:10px;fill:#555}
svg .event{stroke:#333;stroke-width:1;stroke-dasharray:2 2}svg .event.phase{stroke:#bbb;stroke-dasharray:none}
svg .event-label{font-size:9px;fill:#333}svg .line-label{font-size:9px}
svg .down{fill:#000;fill-opacity:.08}
svg .capacity{stroke-width:1}svg .reserve,svg .budget{stroke-width:1.5}
svg .mark{stroke:none;fill-opacity:.85}svg .mark.degraded{stroke:#000;stroke-width:1}
.mark.ok,.dot.ok{fill:#2e7d32;background:#2e7d32}.mark.fail,.dot.fail{fill:#c62828;background:#c62828}
.mark.refused,.dot.refused{fill:#9e9e9e;background:#9e9e9e}.mark.info,.dot.info{fill:#ef6c00;background:#ef6c00}
.mark.pending,.dot.pending{fill:#fff;stroke:#333;stroke-width:1;background:#fff}
.legend{font-size:12px;color:#444;margin:2px 0 0;max-width:560px}.legend span{margin-right:12px;white-space:nowrap}
.legend i{display:inline-block;width:18px;height:0;vertical-align:middle;margin-right:4px}
.dot{display:inline-block;width:9px;height:9px;border-radius:50%;margin-right:4px;border:1px solid #666}
.dot.degraded{border:2px solid #000}
)";

}  // namespace

std::string report_json(const ReportInput& in) {
  json j;
  j["scenario"] = in.scenario_name;
  j["description"] = in.scenario_description;
  j["machine"] = in.machine;
  j["passed"] = in.main.result.passed;
  j["main"] = run_json(in.main);
  json b = json::array();
  for (const auto& r : in.baselines) b.push_back(run_json(r));
  j["baselines"] = std::move(b);
  return j.dump(2, ' ', false, json::error_handler_t::replace);
}

std::string report_html(const ReportInput& in) {
  Ctx c;
  c.runs.push_back(&in.main);
  for (const auto& b : in.baselines) c.runs.push_back(&b);
  for (const RunReport* r : c.runs) {
    c.x_max = std::max(c.x_max, run_end_s(r->history));
    add_path(c, r->history.first_path);
    for (const Sample& s : r->history.samples) {
      for (const PathSample& p : s.paths) add_path(c, p.name);
    }
    for (const Op& o : r->history.ops) {
      if (o.type != OpType::kInvoke) add_path(c, op_path(o));
    }
  }
  c.x_max = std::max(1.0, c.x_max);

  const bool passed = in.main.result.passed;
  std::string o;
  o.reserve(1 << 16);
  o += "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n<title>Spillway drill: " +
       esc(in.scenario_name) + "</title>\n<style>" + kCss + "</style></head>\n<body>\n";
  o += "<h1>Drill <q>" + esc(in.scenario_name) + "</q> <span class=\"verdict " + (passed ? "pass" : "fail") +
       "\" id=\"verdict\">" + (passed ? "PASS" : "FAIL") + "</span></h1>\n";
  if (!in.scenario_description.empty()) o += "<p>" + esc(in.scenario_description) + "</p>\n";
  o += "<p class=\"meta\">mode " + esc(in.main.history.mode) + ", seed " + std::to_string(in.main.history.seed) +
       ", " + num(run_end_s(in.main.history), 1) + " s";
  if (!in.machine.empty()) o += "; " + esc(in.machine);
  o += "</p>\n";
  if (!passed) {
    o += "<p class=\"bad\" id=\"failed-gates\">failed gates:";
    for (const auto& g : in.main.result.failed_gates()) o += " " + esc(g);
    o += "</p>\n";
  }

  o += "<section id=\"sec-gates\"><h2>Gates</h2>" + gate_table(c) + "</section>\n";
  o += "<section id=\"sec-figures\"><h2>Figures</h2>" + figures_table(c) + "</section>\n";
  o += figure(c, "memory", "Device memory",
              "Device used, Spillway's share and the competing workload against the reserve line (dashed) and the "
              "capacity; vertical lines are the nemesis's events, grey bands where the server did not answer its "
              "status (killed, or every HTTP thread busy).",
              [&](const RunReport& r) { return memory_chart(c, r); });
  o += figure(c, "host", "Host memory", "The server's RSS and the host ledger against the host budget (dashed).",
              [&](const RunReport& r) { return host_chart(c, r); });
  o += figure(c, "placement", "Placement",
              "Each operation at its invoke time on the row of the path that answered it, coloured by outcome.",
              [&](const RunReport& r) { return placement_chart(c, r); });
  o += figure(c, "queue", "Queue depth", "Requests waiting in each path's queue.",
              [&](const RunReport& r) { return queue_chart(c, r, false); });
  o += figure(c, "queue-age", "Queue age", "How long the oldest queued request of each path had waited.",
              [&](const RunReport& r) { return queue_chart(c, r, true); });
  o += "<section id=\"sec-latency\"><h2>Latency</h2>" + latency_table(c) + "</section>\n";
  o += "<section id=\"sec-recovery\"><h2>Recovery</h2>" + recovery_table(c) + "</section>\n";
  o += "<section id=\"sec-events\"><h2>Events</h2>" + events_table(c) + "</section>\n";
  o += "</body></html>\n";
  return o;
}

Status write_report(const std::string& dir, const ReportInput& in) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return Status::io_error("report directory '" + dir + "': " + ec.message());
  auto write = [](const std::string& path, const std::string& text) -> Status {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    if (!out) return Status::io_error("cannot open '" + path + "' for writing");
    out << text;
    out.close();
    if (!out) return Status::io_error("cannot write '" + path + "'");
    return Status::ok_status();
  };
  SPW_RETURN_IF_ERROR(write((std::filesystem::path(dir) / "report.json").string(), report_json(in)));
  SPW_RETURN_IF_ERROR(write((std::filesystem::path(dir) / "report.html").string(), report_html(in)));
  return Status::ok_status();
}

std::string summary_text(const CheckResult& r) {
  const Figures& f = r.figures;
  std::ostringstream o;
  o << "drill " << r.scenario << " (" << r.mode << ", seed " << r.seed << "): " << (r.passed ? "PASS" : "FAIL") << "\n";
  for (const Gate& g : r.gates) o << "  " << (g.passed ? "pass " : "FAIL ") << g.name << ": " << g.detail << "\n";
  o << "  success " << num(100 * f.success_rate, 1) << "% (" << f.succeeded << " of " << f.accepted
    << " accepted; " << f.refused << " refused), lost " << f.lost << ", duplicated " << f.duplicated << "\n";
  o << "  equivalence " << f.equivalence_equal << " of " << f.equivalence_checked << ", degraded shown "
    << f.degraded_shown << " of " << f.degraded << ", cancelled " << f.cancelled << ", resumed " << f.resumed
    << ", replayed " << f.replayed << "\n";
  o << "  device peak " << bytes_text(static_cast<double>(f.device_peak)) << " (reserve line "
    << bytes_text(static_cast<double>(f.device_limit)) << "), host peak " << bytes_text(static_cast<double>(f.host_peak))
    << " (budget " << (f.host_budget ? bytes_text(static_cast<double>(f.host_budget)) : std::string("none")) << ")\n";
  for (const auto& [p, q] : f.latency_by_path) {
    o << "  latency " << p << ": n " << q.n << ", p50 " << num(q.p50, 0) << " ms, p95 " << num(q.p95, 0)
      << " ms, p99 " << num(q.p99, 0) << " ms\n";
  }
  for (const Recovery& x : f.recoveries) {
    o << "  recovery " << x.fault << " at " << num(x.fault_ms / 1000.0, 2) << " s: ";
    if (x.fault == "kill") {
      o << "restart " << (x.restart_ms < 0 ? std::string("-") : num(x.restart_ms, 0) + " ms") << ", first token "
        << (x.first_token_ms < 0 ? std::string("-") : num(x.first_token_ms, 0) + " ms") << "\n";
    } else {
      o << "breaker open " << (x.breaker_open_ms < 0 ? std::string("-") : num(x.breaker_open_ms, 0) + " ms")
        << ", first CPU token " << (x.first_cpu_token_ms < 0 ? std::string("-") : num(x.first_cpu_token_ms, 0) + " ms")
        << "\n";
    }
  }
  for (const Gate& g : r.gates) {
    if (g.passed) continue;
    o << "FAILED " << g.name;
    if (!g.request_ids.empty()) {
      o << ": requests";
      for (size_t i = 0; i < g.request_ids.size() && i < 20; ++i) o << " " << g.request_ids[i];
      if (g.request_ids.size() > 20) o << " ... (" << g.request_ids.size() << ")";
    }
    o << "\n";
  }
  return o.str();
}

}  // namespace spw::drill
