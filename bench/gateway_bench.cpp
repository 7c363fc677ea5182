// gateway_bench: what the gateway costs on top of a direct engine call, and
// how far its quotes (predicted start delay / time to first token / total)
// are from what then happens. On the bundled models/stories260K.gguf, CPU.
//
// Part 1, overhead (--requests N, default 300, --max-tokens, default 16):
// one request at a time, greedy, prompt "Once upon a time", four variants
// interleaved A,B,C,D,A,B,C,D,... so that machine noise hits all of them alike:
//   A  direct engine: generate() on a Session of a CPU session group, as the
//      scheduler's SessionExecutor calls it (reserve_kv, the session keeps its
//      KV between requests); the prompt is tokenized outside the timed part.
//   B  in-process gateway: build_gateway() (device cpu, journal none, warm-up)
//      then Gateway::submit() and draining the ticket until kFinished:
//      tokenization, admission decision, queue handoff to the worker thread,
//      events back through the ticket's channel.
//   C  HTTP: the same gateway behind the real HttpServer on 127.0.0.1 (port
//      0), POST /v1/completions non-streaming from a keep-alive cpp-httplib
//      client: B plus HTTP parse, JSON in and out, loopback TCP.
//   D  C with the most stop strings the API takes (16 of 1 KiB: 16 KiB),
//      each opening with a piece the model writes all the time and never
//      completed: what a request at the stop limits costs (D/C; the
//      matcher is Aho-Corasick, so its cost per token does not grow with
//      the strings' length).
// Every iteration checks that A, B, C and D produced the same text (greedy, same
// tokens): a mismatch aborts the run, since the variants would then not be
// doing the same work. Reported per variant: p50, p99 and mean latency (ms);
// the overheads B-A and C-A as differences of those percentiles (ms) and as
// ratios, plus the median of the per-iteration paired differences (the most
// noise-robust figure, since each A,B,C triple ran back to back). B's time is
// also split into submit() (tokenize + decide + enqueue; wall time, and the
// calling thread's CPU time, which leaves out the time the thread was not
// running, e.g. preempted by the worker it just woke) and time queued before
// the worker picked it up; and the calling thread's context switches per
// request: about one voluntary switch per token when it sleeps between the
// worker's per-token events, about none when the worker preempted it (one
// free core: then it only runs again once the request is done).
//
// Part 2, quote error (--rounds K, default 5, --burst M, default 8): a fresh
// gateway (CPU, parallel 1, queue 256, no warm-up so that its first round
// really runs on the prior rates), and K rounds of M requests submitted back
// to back (max_tokens 8..64, prompts of 4..100 words of bench/prompt.txt
// starting at varying words, so no two share a KV prefix beyond BOS). Just
// before each submit, Gateway::quote() of the same request gives the chosen
// path's predicted timing; then the real TTFT (submit to the first kText
// event) and total (submit to kFinished) are measured. Each round waits until
// its burst has finished. Reported: actual / predicted for TTFT and total
// (p50, p90, min, max, share within 2x either way), separately for round 1
// quoted on the configured prior rates, round 1 quoted on rates measured
// mid-burst (when a short first request finishes before the next quote; the
// row is left out when there is none), and rounds 2..K (measured rates).
// Ratios > 1: slower than quoted; < 1: faster.
//
// Output: tables on stdout; --json FILE writes every figure, raw samples
// included. Only the bench build has it (SPILLWAY_BUILD_BENCH); no GPU needed.
#include <httplib.h>
#include <sys/resource.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <numeric>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "admission/controller.h"
#include "core/env.h"
#include "core/status.h"
#include "engine/device_session.h"
#include "engine/generate.h"
#include "gateway/builder.h"
#include "gateway/gateway.h"
#include "http/server.h"
#include "serve/scheduler.h"

namespace {

using Clock = std::chrono::steady_clock;
using json = nlohmann::json;
using namespace spw;

// ---------------------------------------------------------------- helpers

[[noreturn]] void fail(const std::string& what) { throw std::runtime_error(what); }

template <typename T>
T must(Result<T> r, const std::string& what) {
  if (!r.ok()) fail(what + ": " + r.status().to_string());
  return std::move(r).value();
}

void must(const Status& s, const std::string& what) {
  if (!s.ok()) fail(what + ": " + s.to_string());
}

double ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

// CPU time of the calling thread, ms.
double thread_cpu_ms() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e3 + static_cast<double>(ts.tv_nsec) / 1e6;
}

// Context switches of the calling thread so far: {voluntary (it blocked),
// involuntary (it was preempted)}.
std::pair<long, long> thread_context_switches() {
  rusage ru{};
  getrusage(RUSAGE_THREAD, &ru);
  return {ru.ru_nvcsw, ru.ru_nivcsw};
}

std::string load_average() {
  std::ifstream f("/proc/loadavg");
  std::string one, five, fifteen;
  f >> one >> five >> fifteen;
  return one + " " + five + " " + fifteen;
}

// Nearest-rank percentile (q in [0, 1]) of unsorted values.
double percentile(std::vector<double> v, double q) {
  if (v.empty()) return std::nan("");
  std::sort(v.begin(), v.end());
  const auto rank = static_cast<size_t>(std::ceil(q * static_cast<double>(v.size())));
  return v[std::clamp<size_t>(rank, 1, v.size()) - 1];
}

double mean(const std::vector<double>& v) {
  return v.empty() ? std::nan("") : std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
}

struct Options {
  std::string model = std::string(SPILLWAY_SOURCE_DIR) + "/models/stories260K.gguf";
  std::string prompt_file = std::string(SPILLWAY_SOURCE_DIR) + "/bench/prompt.txt";
  int requests = 300;
  int32_t max_tokens = 16;
  // One engine thread: on a 2-core machine a second one would make every
  // token wait for the slower of two cores, burying the gateway in noise.
  int threads = 1;
  int warmup = 10;
  int rounds = 5;
  int burst = 8;
  std::string json_path;
};

serve::GenerationRequest greedy_request(const std::string& prompt, int32_t max_tokens) {
  serve::GenerationRequest g;
  g.prompt = prompt;
  g.sampler.temperature = 0;
  g.max_tokens = max_tokens;
  return g;
}

gateway::RouteRequest route(const serve::GenerationRequest& g) {
  gateway::RouteRequest r;
  r.generation = g;
  return r;
}

gateway::BuiltGateway build(const Options& o, int32_t queue, bool warmup) {
  gateway::GatewayOptions go;
  go.model = o.model;
  go.device = Placement::cpu();
  go.journal = "none";
  go.threads = o.threads;
  go.parallel = 1;
  go.queue = queue;
  go.warmup = warmup;
  return must(gateway::build_gateway(Env::default_env(), go), "build_gateway");
}

// ------------------------------------------------ draining a gateway ticket

struct Drained {
  std::string text;
  int text_events = 0;
  std::optional<Clock::time_point> first_text;
  Clock::time_point finished;
  serve::RequestEvent fin;
};

// Reads a ticket's events until kFinished; fails on a request that does not
// finish as kDone within a minute.
Drained drain(serve::Ticket& t) {
  Drained d;
  const auto until = Clock::now() + std::chrono::minutes(1);
  while (Clock::now() < until) {
    serve::RequestEvent ev;
    const serve::PopResult r = t.next_event(ev, std::chrono::milliseconds(100));
    if (r == serve::PopResult::kTimeout) continue;
    if (r == serve::PopResult::kClosed) fail("ticket closed without a finished event");
    if (ev.kind == serve::RequestEvent::Kind::kText) {
      if (!d.first_text) d.first_text = Clock::now();
      d.text += ev.text;
      ++d.text_events;
      continue;
    }
    d.finished = Clock::now();
    if (ev.state != serve::RequestState::kDone) fail("request did not finish: " + ev.status.to_string());
    d.fin = std::move(ev);
    return d;
  }
  fail("request " + std::to_string(t.id()) + " did not finish within a minute");
}

// ------------------------------------------------------- part 1: variants

// A: the engine alone, as SessionExecutor drives it.
class DirectEngine {
 public:
  DirectEngine(std::shared_ptr<const Model> model, int threads) {
    SessionGroupOptions so;
    so.n_sessions = 1;
    so.n_threads = threads;
    group_ = must(open_session_group(std::move(model), so), "open_session_group");
  }

  std::string generate(const std::vector<TokenId>& prompt, const serve::GenerationRequest& g) {
    GenerateOptions o;
    o.max_tokens = *g.max_tokens;
    o.sampler = g.sampler;
    o.stop = g.stop;
    o.reserve_kv = true;
    return must(spw::generate(*group_.sessions.front(), prompt, o), "generate").text;
  }

 private:
  SessionGroup group_;
};

struct GatewayTiming {
  std::string text;
  double total_ms = 0;
  double submit_ms = 0;                                   // Gateway::submit(): tokenize, decide, enqueue
  double submit_cpu_ms = 0;                               // the same, CPU time of the calling thread
  double queued_ms = 0;                                   // enqueued until the worker started it
  int text_events = 0;                                    // kText events the caller received
  long voluntary_switches = 0, involuntary_switches = 0;  // of the caller, submit to kFinished
};

// B: Gateway::submit() and the ticket's events.
GatewayTiming via_gateway(gateway::Gateway& gw, const gateway::RouteRequest& r) {
  GatewayTiming out;
  const auto switches0 = thread_context_switches();
  const auto t0 = Clock::now();
  const double cpu0 = thread_cpu_ms();
  gateway::Admitted a = must(gw.submit(r), "gateway submit");
  const double cpu1 = thread_cpu_ms();
  const auto t1 = Clock::now();
  Drained d = drain(*a.ticket);
  const auto switches1 = thread_context_switches();
  out.total_ms = ms_between(t0, d.finished);
  out.text_events = d.text_events;
  out.voluntary_switches = switches1.first - switches0.first;
  out.involuntary_switches = switches1.second - switches0.second;
  out.submit_ms = ms_between(t0, t1);
  out.submit_cpu_ms = cpu1 - cpu0;
  out.queued_ms = static_cast<double>(a.ticket->queue_ns()) / 1e6;
  out.text = std::move(d.text);
  return out;
}

// C: POST /v1/completions over one keep-alive loopback connection.
class CompletionClient {
 public:
  explicit CompletionClient(int port) : client_("127.0.0.1", port) {
    client_.set_keep_alive(true);
    client_.set_tcp_nodelay(true);
    client_.set_read_timeout(60, 0);
  }

  std::string complete(const serve::GenerationRequest& g, const std::vector<std::string>& stop = {}) {
    json body = {{"prompt", g.prompt}, {"max_tokens", *g.max_tokens}, {"temperature", 0}};
    if (!stop.empty()) body["stop"] = stop;
    httplib::Result r = client_.Post("/v1/completions", body.dump(), "application/json");
    if (!r) fail("POST /v1/completions: " + httplib::to_string(r.error()));
    if (r->status != 200) fail("POST /v1/completions: HTTP " + std::to_string(r->status) + ": " + r->body);
    const json j = json::parse(r->body);
    return j.at("choices").at(0).at("text").get<std::string>();
  }

 private:
  httplib::Client client_;
};

// D's stop strings: the most the API takes (16 strings, 16 KiB in all, 1 KiB
// each), each opening with a piece the model writes all the time (a space, a
// common letter, punctuation) and never completed, so the matcher holds text
// back and lets it go on nearly every token: its worst case, with the same
// output as C.
std::vector<std::string> stops_at_the_limit() {
  std::vector<std::string> out;
  for (const char* head : {" ", "e", "t", "a", "o", " the", ".", ",", "s", "n", "i", "h", "r", "d", "l", " a"}) {
    std::string s = head;
    s.resize(1024, 'Q');
    out.push_back(std::move(s));
  }
  return out;
}

struct OverheadSamples {
  std::vector<double> direct_ms, gateway_ms, http_ms, http_stops_ms;
  std::vector<double> submit_ms, submit_cpu_ms, queued_ms, tokenize_ms;
  std::vector<double> text_events, voluntary_switches, involuntary_switches;  // per B request
  std::string text;
};

void check_same_text(const std::string& want, const std::string& got, const char* variant, int iteration) {
  if (got == want) return;
  fail(std::string("variant ") + variant + " produced different text at iteration " + std::to_string(iteration) +
       ":\n  direct: " + json(want).dump() + "\n  " + variant + ": " + json(got).dump());
}

OverheadSamples measure_overhead(const Options& o) {
  gateway::BuiltGateway built = build(o, 64, /*warmup=*/true);
  http::HttpServerOptions ho;
  ho.host = "127.0.0.1";
  ho.port = 0;
  ho.model_name = built.model_name;
  ho.journal = built.journal;
  std::unique_ptr<http::HttpServer> server =
      must(http::HttpServer::create(Env::default_env(), *built.gateway, ho), "HttpServer::create");
  must(server->start(), "HttpServer::start");

  DirectEngine direct(built.model, o.threads > 0 ? o.threads : static_cast<int>(std::thread::hardware_concurrency()));
  CompletionClient client(server->port());
  const serve::GenerationRequest g = greedy_request("Once upon a time", o.max_tokens);
  const gateway::RouteRequest r = route(g);
  const std::vector<std::string> stops = stops_at_the_limit();

  OverheadSamples s;
  for (int i = -o.warmup; i < o.requests; ++i) {
    const bool keep = i >= 0;
    const auto k0 = Clock::now();
    const std::vector<TokenId> tokens = must(serve::encode_prompt(built.model->tokenizer(), g), "tokenize");
    const auto a0 = Clock::now();
    const std::string a_text = direct.generate(tokens, g);
    const auto a1 = Clock::now();
    GatewayTiming b = via_gateway(*built.gateway, r);
    const auto c0 = Clock::now();
    const std::string c_text = client.complete(g);
    const auto c1 = Clock::now();
    const std::string d_text = client.complete(g, stops);
    const auto d1 = Clock::now();

    if (a_text.empty()) fail("the direct engine produced no text");
    check_same_text(a_text, b.text, "B (gateway)", i);
    check_same_text(a_text, c_text, "C (HTTP)", i);
    check_same_text(a_text, d_text, "D (HTTP, stop strings at the limit)", i);
    if (!keep) continue;
    s.text = a_text;
    s.tokenize_ms.push_back(ms_between(k0, a0));
    s.direct_ms.push_back(ms_between(a0, a1));
    s.gateway_ms.push_back(b.total_ms);
    s.submit_ms.push_back(b.submit_ms);
    s.submit_cpu_ms.push_back(b.submit_cpu_ms);
    s.text_events.push_back(b.text_events);
    s.voluntary_switches.push_back(static_cast<double>(b.voluntary_switches));
    s.involuntary_switches.push_back(static_cast<double>(b.involuntary_switches));
    s.queued_ms.push_back(b.queued_ms);
    s.http_ms.push_back(ms_between(c0, c1));
    s.http_stops_ms.push_back(ms_between(c1, d1));
  }
  server->stop();
  built.gateway->shutdown(std::chrono::milliseconds(0));
  return s;
}

json latency_summary(const std::vector<double>& v) {
  return {{"p50_ms", percentile(v, 0.50)}, {"p99_ms", percentile(v, 0.99)}, {"mean_ms", mean(v)}, {"n", v.size()}};
}

std::vector<double> paired_difference(const std::vector<double>& x, const std::vector<double>& base) {
  std::vector<double> d(x.size());
  for (size_t i = 0; i < x.size(); ++i) d[i] = x[i] - base[i];
  return d;
}

json overhead_vs_direct(const std::vector<double>& v, const std::vector<double>& direct) {
  const double p50 = percentile(v, 0.50), p99 = percentile(v, 0.99);
  const double a50 = percentile(direct, 0.50), a99 = percentile(direct, 0.99);
  return {{"p50_ms", p50 - a50},
          {"p50_ratio", p50 / a50},
          {"p99_ms", p99 - a99},
          {"p99_ratio", p99 / a99},
          {"paired_median_ms", percentile(paired_difference(v, direct), 0.50)}};
}

json overhead_json(const OverheadSamples& s) {
  json j;
  j["text"] = s.text;
  j["variants"] = {{"A_direct", latency_summary(s.direct_ms)},
                   {"B_gateway", latency_summary(s.gateway_ms)},
                   {"C_http", latency_summary(s.http_ms)},
                   {"D_http_stops", latency_summary(s.http_stops_ms)}};
  j["overhead"] = {{"B_minus_A", overhead_vs_direct(s.gateway_ms, s.direct_ms)},
                   {"C_minus_A", overhead_vs_direct(s.http_ms, s.direct_ms)},
                   {"D_minus_C", overhead_vs_direct(s.http_stops_ms, s.http_ms)}};
  j["breakdown"] = {{"tokenize", latency_summary(s.tokenize_ms)},
                    {"B_submit_call", latency_summary(s.submit_ms)},
                    {"B_submit_call_cpu", latency_summary(s.submit_cpu_ms)},
                    {"B_queued", latency_summary(s.queued_ms)}};
  j["B_caller_per_request"] = {{"text_events_p50", percentile(s.text_events, 0.5)},
                               {"voluntary_context_switches_p50", percentile(s.voluntary_switches, 0.5)},
                               {"voluntary_context_switches_mean", mean(s.voluntary_switches)},
                               {"involuntary_context_switches_mean", mean(s.involuntary_switches)}};
  j["samples_ms"] = {{"A_direct", s.direct_ms},
                     {"B_gateway", s.gateway_ms},
                     {"C_http", s.http_ms},
                     {"D_http_stops", s.http_stops_ms},
                     {"tokenize", s.tokenize_ms},
                     {"B_submit_call", s.submit_ms},
                     {"B_submit_call_cpu", s.submit_cpu_ms},
                     {"B_queued", s.queued_ms}};
  return j;
}

void print_overhead(const json& j, const Options& o) {
  std::printf(
      "\n== Gateway overhead over a direct engine call (%d requests each, interleaved, max_tokens %d, "
      "greedy, threads %d)\n",
      o.requests, o.max_tokens, o.threads);
  std::printf("text: %s\n\n", j["text"].dump().c_str());
  std::printf("| variant | p50 ms | p99 ms | mean ms |\n|---|---|---|---|\n");
  const std::pair<const char*, const char*> rows[] = {{"A_direct", "A direct engine (generate)"},
                                                      {"B_gateway", "B in-process gateway"},
                                                      {"C_http", "C HTTP /v1/completions"},
                                                      {"D_http_stops", "D C + 16 stop strings, 16 KiB (the limit)"}};
  for (const auto& [key, label] : rows) {
    const json& v = j["variants"][key];
    std::printf("| %s | %.3f | %.3f | %.3f |\n", label, v["p50_ms"].get<double>(), v["p99_ms"].get<double>(),
                v["mean_ms"].get<double>());
  }
  std::printf(
      "\n| overhead | p50 ms | p50 ratio | p99 ms | p99 ratio | median of paired diffs ms |\n"
      "|---|---|---|---|---|---|\n");
  for (const char* key : {"B_minus_A", "C_minus_A", "D_minus_C"}) {
    const json& v = j["overhead"][key];
    std::printf("| %s | %+.3f | %.2fx | %+.3f | %.2fx | %+.3f |\n", key, v["p50_ms"].get<double>(),
                v["p50_ratio"].get<double>(), v["p99_ms"].get<double>(), v["p99_ratio"].get<double>(),
                v["paired_median_ms"].get<double>());
  }
  std::printf("\n| part of B | p50 ms | p99 ms |\n|---|---|---|\n");
  const std::pair<const char*, const char*> parts[] = {{"tokenize", "tokenize alone (measured in A's loop)"},
                                                       {"B_submit_call", "Gateway::submit() call, wall"},
                                                       {"B_submit_call_cpu", "Gateway::submit() call, thread CPU"},
                                                       {"B_queued", "queued until the worker started it"}};
  for (const auto& [key, label] : parts) {
    const json& v = j["breakdown"][key];
    std::printf("| %s | %.4f | %.4f |\n", label, v["p50_ms"].get<double>(), v["p99_ms"].get<double>());
  }
  const json& c = j["B_caller_per_request"];
  std::printf(
      "\nB's calling thread per request: %.0f text events (p50); context switches: %.1f voluntary "
      "(p50 %.0f), %.2f involuntary (means)\n",
      c["text_events_p50"].get<double>(), c["voluntary_context_switches_mean"].get<double>(),
      c["voluntary_context_switches_p50"].get<double>(), c["involuntary_context_switches_mean"].get<double>());
}

// ------------------------------------------------------ part 2: quote error

struct QuoteSample {
  int round = 0, index = 0;
  int32_t prompt_tokens = 0, max_tokens = 0, completion_tokens = 0;
  std::string decision;
  bool rates_measured = false;
  double prefill_tps = 0, decode_tps = 0;  // the rates the quote used
  admission::Timing predicted;
  double delay_s = 0;            // queued until a worker started it
  std::optional<double> ttft_s;  // none when the request produced no text
  double total_s = 0;
};

std::vector<std::string> words_of(const std::string& path) {
  std::ifstream f(path);
  if (!f) fail("cannot read " + path);
  std::vector<std::string> words;
  for (std::string w; f >> w;) words.push_back(w);
  if (words.empty()) fail(path + " has no words");
  return words;
}

// Request `i` of round `r`: a mix of lengths that shifts from round to round.
serve::GenerationRequest burst_request(const std::vector<std::string>& words, int round, int i) {
  static constexpr int32_t kMaxTokens[] = {8, 64, 16, 48, 24, 32, 12, 56};
  static constexpr size_t kPromptWords[] = {4, 40, 12, 80, 24, 60, 8, 100};
  const auto ri = static_cast<size_t>(round), ii = static_cast<size_t>(i);
  const int32_t max_tokens = kMaxTokens[(ii + 3 * ri) % 8];
  const size_t n_words = std::min(kPromptWords[(5 * ii + ri) % 8], words.size());
  const size_t start = (37 * ii + 53 * ri) % words.size();  // varying first word: no shared KV prefix
  std::string prompt;
  for (size_t k = 0; k < n_words; ++k) prompt += (k ? " " : "") + words[(start + k) % words.size()];
  return greedy_request(prompt, max_tokens);
}

// One burst: quote then submit each request at once, the next right after;
// one thread per ticket timestamps its events.
std::vector<QuoteSample> run_burst(gateway::Gateway& gw, const std::vector<std::string>& words, int round, int m) {
  std::vector<QuoteSample> samples(static_cast<size_t>(m));
  std::vector<std::string> errors(static_cast<size_t>(m));
  std::vector<std::jthread> readers;  // joined on the way out, also when a submit fails
  for (int i = 0; i < m; ++i) {
    const gateway::RouteRequest r = route(burst_request(words, round, i));
    const gateway::Quote q = must(gw.quote(r), "quote");
    if (q.decision.path_index < 0) fail("quote refused the request: " + q.decision.reason);
    QuoteSample& s = samples[static_cast<size_t>(i)];
    s.round = round;
    s.index = i;
    s.prompt_tokens = q.decision.prompt_tokens;
    s.max_tokens = q.decision.max_tokens;
    s.decision = std::string(admission::decision_kind_name(q.decision.kind));
    const gateway::PathQuote& chosen = q.paths.at(static_cast<size_t>(q.decision.path_index));
    s.rates_measured = chosen.rates_measured;
    s.prefill_tps = chosen.prefill_tps;
    s.decode_tps = chosen.decode_tps;
    s.predicted = q.decision.timing;
    const auto t0 = Clock::now();
    std::shared_ptr<serve::Ticket> ticket = must(gw.submit(r), "submit").ticket;
    readers.emplace_back([&s, &error = errors[static_cast<size_t>(i)], ticket, t0] {
      try {
        const Drained d = drain(*ticket);
        if (d.first_text) s.ttft_s = ms_between(t0, *d.first_text) / 1e3;
        s.total_s = ms_between(t0, d.finished) / 1e3;
        s.delay_s = static_cast<double>(ticket->queue_ns()) / 1e9;
        s.completion_tokens = d.fin.completion_tokens;
      } catch (const std::exception& e) {
        error = e.what();
      }
    });
  }
  readers.clear();  // joins
  for (const std::string& e : errors)
    if (!e.empty()) fail(e);
  return samples;
}

std::vector<QuoteSample> measure_quotes(const Options& o) {
  gateway::BuiltGateway built = build(o, 256, /*warmup=*/false);
  const std::vector<std::string> words = words_of(o.prompt_file);
  std::vector<QuoteSample> all;
  for (int round = 0; round < o.rounds; ++round) {
    std::vector<QuoteSample> s = run_burst(*built.gateway, words, round, o.burst);
    all.insert(all.end(), s.begin(), s.end());
  }
  built.gateway->shutdown(std::chrono::milliseconds(0));
  return all;
}

json ratio_summary(const std::vector<double>& ratios) {
  const auto within = std::count_if(ratios.begin(), ratios.end(), [](double x) { return x >= 0.5 && x <= 2.0; });
  return {
      {"n", ratios.size()},
      {"p50", percentile(ratios, 0.50)},
      {"p90", percentile(ratios, 0.90)},
      {"min", ratios.empty() ? std::nan("") : *std::min_element(ratios.begin(), ratios.end())},
      {"max", ratios.empty() ? std::nan("") : *std::max_element(ratios.begin(), ratios.end())},
      {"within_2x", ratios.empty() ? std::nan("") : static_cast<double>(within) / static_cast<double>(ratios.size())}};
}

// actual / predicted for TTFT and total over the samples `pick` selects.
template <typename Pick>
json quote_group(const std::vector<QuoteSample>& all, Pick pick) {
  std::vector<double> ttft, total;
  int measured = 0, n = 0;
  for (const QuoteSample& s : all) {
    if (!pick(s)) continue;
    ++n;
    measured += s.rates_measured ? 1 : 0;
    if (s.ttft_s && s.predicted.ttft_s > 0) ttft.push_back(*s.ttft_s / s.predicted.ttft_s);
    if (s.predicted.total_s > 0) total.push_back(s.total_s / s.predicted.total_s);
  }
  return {{"requests", n},
          {"quoted_with_measured_rates", measured},
          {"ttft", ratio_summary(ttft)},
          {"total", ratio_summary(total)}};
}

json quote_json(const std::vector<QuoteSample>& all) {
  json samples = json::array();
  for (const QuoteSample& s : all) {
    samples.push_back({{"round", s.round + 1},
                       {"index", s.index},
                       {"prompt_tokens", s.prompt_tokens},
                       {"max_tokens", s.max_tokens},
                       {"completion_tokens", s.completion_tokens},
                       {"decision", s.decision},
                       {"rates_measured", s.rates_measured},
                       {"quoted_prefill_tps", s.prefill_tps},
                       {"quoted_decode_tps", s.decode_tps},
                       {"predicted_delay_s", s.predicted.delay_s},
                       {"predicted_ttft_s", s.predicted.ttft_s},
                       {"predicted_total_s", s.predicted.total_s},
                       {"delay_s", s.delay_s},
                       {"ttft_s", s.ttft_s ? json(*s.ttft_s) : json(nullptr)},
                       {"total_s", s.total_s}});
  }
  return {
      {"first_round_prior", quote_group(all, [](const QuoteSample& s) { return s.round == 0 && !s.rates_measured; })},
      {"first_round_measured", quote_group(all, [](const QuoteSample& s) { return s.round == 0 && s.rates_measured; })},
      {"later_rounds", quote_group(all, [](const QuoteSample& s) { return s.round > 0; })},
      {"samples", samples}};
}

void print_quotes(const json& j, const Options& o) {
  std::printf("\n== Quote error: actual / predicted (%d rounds of %d back-to-back requests, CPU, parallel 1)\n\n",
              o.rounds, o.burst);
  std::printf(
      "| rounds | requests (quoted on measured rates) | metric | p50 | p90 | min | max | within 2x |\n"
      "|---|---|---|---|---|---|---|---|\n");
  const std::pair<const char*, const char*> groups[] = {{"first_round_prior", "1, prior rates"},
                                                        {"first_round_measured", "1, rates measured mid-burst"},
                                                        {"later_rounds", "2.."}};
  for (const auto& [key, label] : groups) {
    const json& g = j[key];
    if (g["requests"].get<int>() == 0) continue;
    for (const char* metric : {"ttft", "total"}) {
      const json& m = g[metric];
      std::printf("| %s | %d (%d) | %s | %.3g | %.3g | %.3g | %.3g | %.0f%% |\n", label, g["requests"].get<int>(),
                  g["quoted_with_measured_rates"].get<int>(), metric, m["p50"].get<double>(), m["p90"].get<double>(),
                  m["min"].get<double>(), m["max"].get<double>(), 100.0 * m["within_2x"].get<double>());
    }
  }
  std::printf(
      "\n| round | # | prompt tok | max tok | gen tok | quoted prefill / decode tok/s | pred delay ms | delay ms "
      "| pred TTFT ms | TTFT ms | pred total ms | total ms |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (const json& s : j["samples"]) {
    const double ttft = s["ttft_s"].is_null() ? std::nan("") : s["ttft_s"].get<double>();
    std::printf("| %d | %d | %d | %d | %d | %.0f / %.0f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f |\n",
                s["round"].get<int>(), s["index"].get<int>(), s["prompt_tokens"].get<int>(), s["max_tokens"].get<int>(),
                s["completion_tokens"].get<int>(), s["quoted_prefill_tps"].get<double>(),
                s["quoted_decode_tps"].get<double>(), 1e3 * s["predicted_delay_s"].get<double>(),
                1e3 * s["delay_s"].get<double>(), 1e3 * s["predicted_ttft_s"].get<double>(), 1e3 * ttft,
                1e3 * s["predicted_total_s"].get<double>(), 1e3 * s["total_s"].get<double>());
  }
}

void write_json(const std::string& path, const json& j) {
  std::ofstream f(path);
  f << j.dump(2) << '\n';
  if (!f) fail("cannot write " + path);
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"Gateway overhead over a direct engine call, and quote error (see the file's header)"};
  app.add_option("--model", o.model, "GGUF model")->capture_default_str();
  app.add_option("--prompt-file", o.prompt_file, "Words for part 2's prompts")->capture_default_str();
  app.add_option("--requests", o.requests, "Part 1: timed requests per variant")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--max-tokens", o.max_tokens, "Part 1: max_tokens")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--threads", o.threads, "CPU threads of the engine (0: all)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--warmup", o.warmup, "Part 1: untimed iterations first")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--rounds", o.rounds, "Part 2: bursts")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--burst", o.burst, "Part 2: requests per burst")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--json", o.json_path, "Write every figure to this file");
  CLI11_PARSE(app, argc, argv);

  try {
    json out;
    out["options"] = {{"model", o.model},     {"requests", o.requests}, {"max_tokens", o.max_tokens},
                      {"threads", o.threads}, {"warmup", o.warmup},     {"rounds", o.rounds},
                      {"burst", o.burst}};
    out["machine"] = {{"hardware_concurrency", std::thread::hardware_concurrency()},
                      {"load_average_start", load_average()}};
    const auto t0 = Clock::now();
    out["overhead"] = overhead_json(measure_overhead(o));
    print_overhead(out["overhead"], o);
    out["quote_error"] = quote_json(measure_quotes(o));
    print_quotes(out["quote_error"], o);
    out["machine"]["load_average_end"] = load_average();
    out["wall_s"] = ms_between(t0, Clock::now()) / 1e3;
    std::printf("\nload average (1/5/15 min): %s at start, %s at end; %.1f s\n",
                out["machine"]["load_average_start"].get<std::string>().c_str(),
                out["machine"]["load_average_end"].get<std::string>().c_str(), out["wall_s"].get<double>());
    if (!o.json_path.empty()) write_json(o.json_path, out);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gateway_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
