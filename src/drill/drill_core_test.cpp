// The drill's pure part: scenario parsing, history JSON, the checker's
// figures and gates on hand-built histories, and the report's documents.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <set>
#include <fstream>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "drill/checker.h"
#include "drill/history.h"
#include "drill/report.h"
#include "drill/scenario.h"

namespace spw::drill {
namespace {

using ::testing::HasSubstr;

// ------------------------------------------------------------------ scenario

const char* kGood = R"(
name = "t"
description = "a test"
seed = 9
drain_s = 5

[server]
model = "models/x.gguf"
device = "cpu"
device_memory = "1.5GiB"
args = ["--ctx", "128"]

[[class]]
name = "short"
prompt = "Hello"
prompt_repeat = 2
max_tokens = 8
stream = false
greedy = false
idempotency_share = 0.5
retry_share = 0.25

[[class]]
name = "long"
prompt = "World"

[[phase]]
name = "a"
duration_s = 4.5
cotenant_bytes = "64MiB"
undeclared_bytes = 1024
  [[phase.load]]
  class = "short"
  rate_per_s = 3
  concurrency = 4
  [[phase.load]]
  class = "long"
  [[phase.fault]]
  kind = "pressure"
  at_s = 1
  bytes = "512M"
  [[phase.fault]]
  kind = "device_lost"
  at_s = 2
  path = "offload"
  count = 2
  after_submits = 3
  [[phase.fault]]
  kind = "cancel_queued"
  at_s = 3

[[phase]]
name = "b"
duration_s = 2
  [[phase.fault]]
  kind = "kill"
  at_s = 0
  restart_after_s = 0.5
  [[phase.fault]]
  kind = "alloc_fail"
  at_s = 1.5
)";

TEST(Scenario, ParsesEveryKey) {
  auto r = parse_scenario(kGood, "good.toml");
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  const Scenario& s = *r;
  EXPECT_EQ(s.name, "t");
  EXPECT_EQ(s.description, "a test");
  EXPECT_EQ(s.seed, 9u);
  EXPECT_DOUBLE_EQ(s.drain_s, 5);
  EXPECT_EQ(s.server.model, "models/x.gguf");
  EXPECT_EQ(s.server.device, "cpu");
  EXPECT_EQ(s.server.device_memory, "1.5GiB");
  EXPECT_EQ(s.server.args, (std::vector<std::string>{"--ctx", "128"}));
  ASSERT_EQ(s.classes.size(), 2u);
  EXPECT_EQ(s.classes[0].prompt_repeat, 2);
  EXPECT_EQ(s.classes[0].max_tokens, 8);
  EXPECT_FALSE(s.classes[0].stream);
  EXPECT_FALSE(s.classes[0].greedy);
  EXPECT_DOUBLE_EQ(s.classes[0].idempotency_share, 0.5);
  EXPECT_DOUBLE_EQ(s.classes[0].retry_share, 0.25);
  // Defaults.
  EXPECT_EQ(s.classes[1].prompt_repeat, 1);
  EXPECT_EQ(s.classes[1].max_tokens, 16);
  EXPECT_TRUE(s.classes[1].stream);
  EXPECT_TRUE(s.classes[1].greedy);
  ASSERT_EQ(s.phases.size(), 2u);
  const Phase& a = s.phases[0];
  EXPECT_DOUBLE_EQ(a.duration_s, 4.5);
  EXPECT_EQ(a.cotenant_bytes, 64ull << 20);
  EXPECT_EQ(a.undeclared_bytes, 1024u);
  ASSERT_EQ(a.load.size(), 2u);
  EXPECT_EQ(a.load[0].cls, "short");
  EXPECT_DOUBLE_EQ(a.load[0].rate_per_s, 3);
  EXPECT_EQ(a.load[0].concurrency, 4);
  EXPECT_DOUBLE_EQ(a.load[1].rate_per_s, 1);
  EXPECT_EQ(a.load[1].concurrency, 2);
  ASSERT_EQ(a.faults.size(), 3u);
  EXPECT_EQ(a.faults[0].kind, FaultKind::kPressure);
  EXPECT_EQ(a.faults[0].bytes, 512ull << 20);
  EXPECT_EQ(a.faults[1].kind, FaultKind::kDeviceLost);
  EXPECT_EQ(a.faults[1].path, "offload");
  EXPECT_EQ(a.faults[1].count, 2);
  EXPECT_EQ(a.faults[1].after_submits, 3);
  EXPECT_EQ(a.faults[2].kind, FaultKind::kCancelQueued);
  EXPECT_EQ(a.faults[2].path, "cpu");
  const Phase& b = s.phases[1];
  EXPECT_EQ(b.cotenant_bytes, 0u);
  EXPECT_EQ(b.faults[0].kind, FaultKind::kKill);
  EXPECT_DOUBLE_EQ(b.faults[0].restart_after_s, 0.5);
  EXPECT_EQ(b.faults[1].kind, FaultKind::kAllocFail);
  EXPECT_EQ(b.faults[1].path, "gpu");
  EXPECT_DOUBLE_EQ(s.total_s(), 6.5);
  ASSERT_NE(s.find_class("long"), nullptr);
  EXPECT_EQ(s.find_class("nope"), nullptr);
}

TEST(Scenario, FaultKindNames) {
  for (FaultKind k : {FaultKind::kPressure, FaultKind::kAllocFail, FaultKind::kDeviceLost, FaultKind::kCancelQueued,
                      FaultKind::kKill}) {
    auto r = parse_fault_kind(fault_kind_name(k));
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(*r, k);
  }
  EXPECT_FALSE(parse_fault_kind("meteor").ok());
}

TEST(Scenario, Sizes) {
  EXPECT_EQ(parse_size("64MiB").value(), 64ull << 20);
  EXPECT_EQ(parse_size("1.5GiB").value(), 3ull << 29);
  EXPECT_EQ(parse_size("512M").value(), 512ull << 20);
  EXPECT_EQ(parse_size("2 KiB").value(), 2048u);
  EXPECT_EQ(parse_size("1048576").value(), 1048576u);
  EXPECT_EQ(parse_size("0").value(), 0u);
  EXPECT_EQ(parse_size("7b").value(), 7u);
  for (const char* bad : {"", "MiB", "-1MiB", "12 parsecs", "1e400", "1.5.2G", "GiB5"}) {
    EXPECT_FALSE(parse_size(bad).ok()) << bad;
  }
}

// A minimal valid file with `extra` spliced in at a point of the layout.
std::string with(const std::string& top, const std::string& cls, const std::string& phase,
                 const std::string& fault = "") {
  return "name = \"t\"\n" + top + "\n[[class]]\nname = \"c\"\nprompt = \"p\"\n" + cls +
         "\n[[phase]]\nname = \"ph\"\nduration_s = 5\n" + phase + "\n" +
         (fault.empty() ? "" : "[[phase.fault]]\n" + fault + "\n");
}

std::string zero_duration() {
  std::string s = with("", "", "");
  s.replace(s.find("duration_s = 5"), 14, "duration_s = 0");
  return s;
}

struct BadCase {
  std::string toml;
  std::string expect;  // substrings of the message, '|'-separated
};

TEST(Scenario, RefusesAndNamesTheKey) {
  const std::vector<BadCase> cases = {
      {with("colour = 1", "", ""), "colour|unknown key"},
      {with("[server]\nmodle = \"x\"", "", ""), "server.modle|unknown key"},
      {with("", "max_token = 3", ""), "class[1].max_token|unknown key"},
      {with("", "", "durration_s = 3"), "phase[1].durration_s"},
      {with("", "", "", "kind = \"alloc_fail\"\nat_s = 1\nbites = 3"), "phase[1].fault[1].bites"},
      {with("", "", "", "kind = \"kill\"\nat_s = 1\nbytes = 3"), "phase[1].fault[1].bytes|not a key of a kill fault"},
      {with("", "max_tokens = \"16\"", ""), "class[1].max_tokens|expected an integer"},
      {with("", "stream = 1", ""), "class[1].stream|true or false"},
      {with("", "max_tokens = 0", ""), "class[1].max_tokens|out of range"},
      {with("", "idempotency_share = 1.5", ""), "class[1].idempotency_share"},
      {zero_duration(), "phase[1].duration_s|greater than 0"},
      {with("drain_s = -1", "", ""), "drain_s|greater than 0"},
      {with("", "", "[[phase.load]]\nclass = \"c\"\nrate_per_s = -2"), "phase[1].load[1].rate_per_s"},
      {with("", "", "[[phase.load]]\nclass = \"nobody\""), "phase[1].load[1].class|nobody"},
      {with("", "", "[[phase.load]]\nclass = \"c\"\n[[phase.load]]\nclass = \"c\""), "phase[1].load[2].class"},
      {with("", "", "cotenant_bytes = \"12 parsecs\""), "phase[1].cotenant_bytes|12 parsecs"},
      {with("", "", "cotenant_bytes = -5"), "phase[1].cotenant_bytes|negative"},
      {with("[server]\ndevice_memory = \"0\"", "", ""), "server.device_memory|greater than 0"},
      {with("[server]\nargs = [\"a\", 3]", "", ""), "server.args[2]|expected a string"},
      {with("[server]\nmodels = [\"justname\"]", "", ""), "server.models|NAME=FILE"},
      {with("", "model = \"nope\"", ""), "class[1].model|not a name of server.models"},
      {with("", "", "", "kind = \"meteor\"\nat_s = 1"), "phase[1].fault[1].kind|meteor"},
      {with("", "", "", "kind = \"alloc_fail\"\nat_s = 5"), "phase[1].fault[1].at_s|outside its phase"},
      {with("", "", "", "kind = \"alloc_fail\""), "phase[1].fault[1].at_s|missing"},
      {with("", "", "", "kind = \"pressure\"\nat_s = 1"), "phase[1].fault[1].bytes|missing"},
      {with("", "", "", "kind = \"kill\"\nat_s = 1\nrestart_after_s = 0"), "restart_after_s"},
      {with("", "", "", "kind = \"device_lost\"\nat_s = 1\ncount = 0"), "phase[1].fault[1].count"},
      {"[[class]]\nname = \"c\"\nprompt = \"p\"\n[[phase]]\nname = \"ph\"\n", "name|missing"},
      {"name = \"t\"\n[[phase]]\nname = \"ph\"\n", "class|at least one"},
      {"name = \"t\"\n[[class]]\nname = \"c\"\nprompt = \"p\"\n", "phase|at least one"},
      {with("", "", "") + "[[class]]\nname = \"c\"\nprompt = \"q\"\n", "class[2].name|duplicate"},
      {with("", "", "") + "[[phase]]\nname = \"ph\"\n", "phase[2].name|duplicate"},
      {"name = \"t\"\nname = \"u\"\n", "bad.toml:2"},  // a TOML syntax error, with its line
      {with("phase = 3", "", ""), "phase"},
  };
  for (const auto& c : cases) {
    auto r = parse_scenario(c.toml, "bad.toml");
    ASSERT_FALSE(r.ok()) << "accepted:\n" << c.toml;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    std::stringstream parts(c.expect);
    std::string part;
    while (std::getline(parts, part, '|')) {
      EXPECT_THAT(r.status().message(), HasSubstr(part)) << c.toml;
    }
    EXPECT_THAT(r.status().message(), HasSubstr("bad.toml")) << c.toml;
  }
}

TEST(Scenario, ErrorsCarryTheLine) {
  auto r = parse_scenario(with("", "", "", "kind = \"alloc_fail\"\nat_s = 1\nbites = 3"), "f.toml");
  ASSERT_FALSE(r.ok());
  // The unknown key is on line 14 of the generated file.
  EXPECT_THAT(r.status().message(), HasSubstr("f.toml:14:"));
}

TEST(Scenario, LoadsTheShippedDrills) {
  for (const char* f : {"default.toml", "shrinking.toml", "gpu-home.toml"}) {
    auto r = load_scenario(std::string(SPILLWAY_SOURCE_DIR) + "/drills/" + f);
    ASSERT_TRUE(r.ok()) << f << ": " << r.status().to_string();
    EXPECT_FALSE(r->phases.empty());
  }
  auto d = load_scenario(std::string(SPILLWAY_SOURCE_DIR) + "/drills/default.toml");
  ASSERT_TRUE(d.ok());
  EXPECT_LE(d->total_s() + d->drain_s, 75);  // small enough for CI
  std::set<FaultKind> kinds;
  for (const auto& p : d->phases) {
    for (const auto& f : p.faults) kinds.insert(f.kind);
  }
  EXPECT_EQ(kinds.size(), 5u) << "default.toml exercises every fault kind";
  auto missing = load_scenario("/nonexistent/drill.toml");
  ASSERT_FALSE(missing.ok());
  EXPECT_THAT(missing.status().message(), HasSubstr("/nonexistent/drill.toml"));
}

// ------------------------------------------------------------------ history

// A history with every field away from its default.
History full_history() {
  History h;
  h.scenario = "s";
  h.mode = "simulation";
  h.seed = 18446744073709551615ull;
  h.duration_ms = 1234.5;
  h.first_path = "gpu";
  Op o;
  o.index = 3;
  o.op_id = 4;
  o.client = 2;
  o.type = OpType::kFail;
  o.t_ms = 10.25;
  o.f = "resume";
  o.continues = 1;
  o.phase = "warm";
  o.cls = "short";
  o.prompt_key = "short/greedy";
  o.stream = false;
  o.greedy = false;
  o.seed = 77;
  o.max_tokens = 16;
  o.idempotency_key = "k-1";
  o.http_status = 503;
  o.error_code = "resumable";
  o.error_message = "device \"lost\" <b>";
  o.request_id = 42;
  o.accepted = true;
  o.path = "cpu";
  o.placement = "cpu";
  o.model = "stories";
  o.decision = "redirect";
  o.reason = "pressure";
  o.degraded = true;
  o.degraded_shown = true;
  o.replayed = true;
  o.text = "héllo\n\"world\"";
  o.completion_tokens = 5;
  o.finish_reason = "length";
  o.ttft_ms = 1.5;
  o.latency_ms = 9.75;
  o.queue_ms = 0.5;
  o.failovers = 1;
  o.migrations = 2;
  h.ops.push_back(o);
  o.type = OpType::kInfo;
  h.ops.push_back(o);
  Sample s;
  s.t_ms = 100;
  s.up = false;
  s.paths.push_back({"gpu", 3, 2, 1.25, "half_open"});
  s.paths.push_back({"cpu", 0, 1, 0, ""});
  s.device_capacity = 1ull << 40;
  s.device_limit = 2;
  s.device_ours = 3;
  s.device_cotenants = 4;
  s.device_used = 5;
  s.host_budget = 6;
  s.host_reserved = 7;
  s.host_rss = 8;
  s.competing_bytes = 9;
  h.samples.push_back(s);
  h.events.push_back({50, "alloc_fail", "gpu x1"});
  FinalRecord f;
  f.request_id = 42;
  f.found = true;
  f.state = "done";
  f.error_code = "x";
  f.text = "héllo";
  f.placement = "cpu";
  f.admitted_under_reserve = false;
  f.runs = 3;
  h.finals[42] = f;
  f.request_id = 43;
  f.admitted_under_reserve = std::nullopt;
  h.finals[43] = f;
  f.request_id = 44;
  f.admitted_under_reserve = true;
  h.finals[44] = f;
  h.reference["short/greedy"] = "héllo world";
  return h;
}

TEST(History, JsonRoundTripsEveryField) {
  const History h = full_history();
  const std::string j = history_to_json(h);
  auto back = history_from_json(j);
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(history_to_json(*back), j);
  const History& b = *back;
  EXPECT_EQ(b.seed, h.seed);
  ASSERT_EQ(b.ops.size(), 2u);
  const Op& o = b.ops[0];
  EXPECT_EQ(o.type, OpType::kFail);
  EXPECT_EQ(b.ops[1].type, OpType::kInfo);
  EXPECT_EQ(o.op_id, 4);
  EXPECT_EQ(o.continues, 1);
  EXPECT_EQ(o.text, "héllo\n\"world\"");
  EXPECT_EQ(o.error_message, "device \"lost\" <b>");
  EXPECT_FALSE(o.stream);
  EXPECT_TRUE(o.replayed);
  EXPECT_DOUBLE_EQ(o.latency_ms, 9.75);
  EXPECT_EQ(o.migrations, 2);
  ASSERT_EQ(b.samples.size(), 1u);
  EXPECT_FALSE(b.samples[0].up);
  EXPECT_EQ(b.samples[0].paths[0].breaker, "half_open");
  EXPECT_DOUBLE_EQ(b.samples[0].paths[0].oldest_queued_s, 1.25);
  EXPECT_EQ(b.samples[0].device_capacity, 1ull << 40);
  EXPECT_EQ(b.samples[0].competing_bytes, 9u);
  ASSERT_EQ(b.events.size(), 1u);
  EXPECT_EQ(b.events[0].detail, "gpu x1");
  ASSERT_EQ(b.finals.size(), 3u);
  EXPECT_EQ(b.finals.at(42).admitted_under_reserve, std::optional<bool>(false));
  EXPECT_EQ(b.finals.at(43).admitted_under_reserve, std::nullopt);
  EXPECT_EQ(b.finals.at(44).admitted_under_reserve, std::optional<bool>(true));
  EXPECT_EQ(b.finals.at(42).runs, 3);
  EXPECT_EQ(b.reference.at("short/greedy"), "héllo world");
}

TEST(History, RefusesMalformedNamingTheField) {
  auto bad = [](const std::string& text, const std::string& expect) {
    auto r = history_from_json(text);
    ASSERT_FALSE(r.ok()) << text;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(r.status().message(), HasSubstr(expect)) << text;
  };
  bad("{not json", "not a JSON document");
  bad("[1,2]", "object");
  bad("{\"samples\":[]}", "ops");
  bad("{\"ops\":3}", "ops");
  bad("{\"ops\":[{\"t_ms\":\"x\"}]}", "ops[0].t_ms");
  bad("{\"ops\":[{}, {\"type\":\"maybe\"}]}", "ops[1].type");
  bad("{\"ops\":[{\"max_tokens\":9999999999}]}", "ops[0].max_tokens");
  bad("{\"ops\":[{\"seed\":-1}]}", "ops[0].seed");
  bad("{\"ops\":[], \"samples\":[{\"paths\":[{\"queue_depth\":\"3\"}]}]}", "samples[0].paths[0].queue_depth");
  bad("{\"ops\":[], \"events\":[{\"kind\":1}]}", "events[0].kind");
  bad("{\"ops\":[], \"finals\":[{\"admitted_under_reserve\":\"yes\"}]}", "finals[0].admitted_under_reserve");
  bad("{\"ops\":[], \"finals\":[{\"request_id\":1},{\"request_id\":1}]}", "finals[1].request_id");
  bad("{\"ops\":[], \"reference\":{\"k\":1}}", "reference.k");
  bad("{\"ops\":[], \"seed\":1.5}", "seed");
  EXPECT_TRUE(history_from_json("{\"ops\":[]}").ok());
}

TEST(History, RecorderAssignsIdsAndCopiesTheRequest) {
  HistoryRecorder rec;
  Op a;
  a.cls = "short";
  a.idempotency_key = "k";
  a.t_ms = 1;
  const Op inv = rec.invoke(a);
  EXPECT_EQ(inv.index, 0);
  EXPECT_EQ(inv.op_id, 1) << "op_id 0 is reserved for 'none' in continues";
  EXPECT_EQ(inv.type, OpType::kInvoke);
  Op res;
  res.type = OpType::kOk;
  res.t_ms = 5;
  res.text = "x";
  rec.complete(inv, res);

  // Several client threads at once: every op recorded, indexes in order.
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&rec, t] {
      for (int i = 0; i < 100; ++i) {
        Op o;
        o.client = t;
        const Op v = rec.invoke(o);
        Op r;
        r.type = OpType::kInfo;
        rec.complete(v, r);
      }
    });
  }
  for (auto& th : threads) th.join();
  History h = rec.take();
  ASSERT_EQ(h.ops.size(), 802u);
  EXPECT_EQ(h.ops[1].op_id, 1);
  EXPECT_EQ(h.ops[1].cls, "short");
  EXPECT_EQ(h.ops[1].idempotency_key, "k");
  EXPECT_EQ(h.ops[1].text, "x");
  std::set<int64_t> invoke_ids;
  for (size_t i = 0; i < h.ops.size(); ++i) {
    EXPECT_EQ(h.ops[i].index, static_cast<int64_t>(i));
    if (h.ops[i].type == OpType::kInvoke) invoke_ids.insert(h.ops[i].op_id);
  }
  EXPECT_EQ(invoke_ids.size(), 401u);
}

// ------------------------------------------------------------------ checker

// Builds histories by hand: each call appends an invoke and its completion.
class Builder {
 public:
  Builder() {
    h.scenario = "hand";
    h.mode = "test";
  }
  struct Spec {
    double t = 0;
    double latency = 100;
    OpType type = OpType::kOk;
    std::string f = "complete";
    int64_t continues = 0;
    std::string cls = "short";
    std::string key = "short/greedy";
    bool greedy = true;
    std::string idem = "";
    int64_t rid = 0;
    bool accepted = true;
    int http = 200;
    std::string path = "gpu";
    std::string text = "";
    bool degraded = false, shown = false, replayed = false;
    double ttft = 10;
    int failovers = 0;
  };
  // Returns the op_id.
  int64_t op(const Spec& s) {
    const int64_t id = next_++;
    Op inv;
    inv.index = static_cast<int64_t>(h.ops.size());
    inv.op_id = id;
    inv.type = OpType::kInvoke;
    inv.t_ms = s.t;
    inv.f = s.f;
    inv.continues = s.continues;
    inv.cls = s.cls;
    inv.prompt_key = s.key;
    inv.greedy = s.greedy;
    inv.idempotency_key = s.idem;
    h.ops.push_back(inv);
    Op done = inv;
    done.index = static_cast<int64_t>(h.ops.size());
    done.type = s.type;
    done.t_ms = s.t + s.latency;
    done.latency_ms = s.latency;
    done.request_id = s.rid;
    done.accepted = s.accepted;
    done.http_status = s.http;
    done.path = s.path;
    done.placement = s.path == "gpu" ? "vulkan" : s.path;
    done.text = s.text;
    done.degraded = s.degraded;
    done.degraded_shown = s.shown;
    done.replayed = s.replayed;
    done.ttft_ms = s.ttft;
    done.failovers = s.failovers;
    h.ops.push_back(done);
    return id;
  }
  void final_done(int64_t rid, const std::string& text, int runs = 1) {
    FinalRecord f;
    f.request_id = rid;
    f.found = true;
    f.state = "done";
    f.text = text;
    f.runs = runs;
    h.finals[rid] = f;
  }
  History h;

 private:
  int64_t next_ = 1;
};

const Gate& gate(const CheckResult& r, const std::string& name) {
  for (const auto& g : r.gates) {
    if (g.name == name) return g;
  }
  static Gate none;
  ADD_FAILURE() << "no gate " << name;
  return none;
}

// A clean run: every request ends ok with the journal's text.
Builder clean() {
  Builder b;
  b.h.reference["short/greedy"] = "abcdef";
  b.op({.t = 0, .rid = 1, .text = "abcdef"});
  b.final_done(1, "abcdef");
  b.op({.t = 50, .latency = 300, .cls = "long", .key = "long/greedy", .rid = 2, .path = "cpu", .text = "zz",
        .degraded = true, .shown = true});
  b.final_done(2, "zz");
  // Refused before acceptance: not accepted, not lost.
  b.op({.t = 60, .type = OpType::kFail, .accepted = false, .http = 429, .path = "", .ttft = -1});
  Sample s;
  s.t_ms = 10;
  s.paths = {{"gpu", 1, 1, 0.5, "closed"}, {"cpu", 3, 1, 2.0, ""}};
  s.device_capacity = 100;
  s.device_limit = 95;
  s.device_used = 60;
  s.host_budget = 1000;
  s.host_reserved = 400;
  s.host_rss = 500;
  b.h.samples.push_back(s);
  return b;
}

TEST(Checker, CleanRunPassesEveryGate) {
  const CheckResult r = check(clean().h);
  EXPECT_TRUE(r.passed) << summary_text(r);
  EXPECT_EQ(r.gates.size(), 5u);
  EXPECT_TRUE(r.failed_gates().empty());
  const Figures& f = r.figures;
  EXPECT_EQ(f.operations, 3);
  EXPECT_EQ(f.accepted, 2);
  EXPECT_EQ(f.succeeded, 2);
  EXPECT_DOUBLE_EQ(f.success_rate, 1.0);
  EXPECT_EQ(f.refused, 1);
  EXPECT_EQ(f.lost, 0);
  EXPECT_EQ(f.duplicated, 0);
  EXPECT_EQ(f.equivalence_checked, 1);
  EXPECT_EQ(f.equivalence_equal, 1);
  EXPECT_EQ(f.degraded, 1);
  EXPECT_EQ(f.degraded_shown, 1);
  EXPECT_EQ(f.max_queue_depth.at("cpu"), 3);
  EXPECT_DOUBLE_EQ(f.max_queue_age_s.at("cpu"), 2.0);
  EXPECT_EQ(f.device_peak, 60u);
  EXPECT_EQ(f.device_limit, 95u);
  EXPECT_EQ(f.host_peak, 500u);
  EXPECT_EQ(f.host_budget, 1000u);
  EXPECT_EQ(f.latency_by_class.at("long").p50, 300);
  EXPECT_EQ(f.latency_by_path.at("gpu").n, 1);
  EXPECT_EQ(f.ttft_by_path.at("cpu").p99, 10);
}

TEST(Checker, LostRequest) {
  Builder b = clean();
  // Accepted (an id), the connection broke, and the journal never finished it.
  b.op({.t = 100, .type = OpType::kInfo, .rid = 7, .http = 0, .text = "ab"});
  FinalRecord running;
  running.request_id = 7;
  running.found = true;
  running.state = "running";
  b.h.finals[7] = running;
  // Accepted, broke, no record at all.
  b.op({.t = 110, .type = OpType::kInfo, .rid = 8, .http = 0});
  CheckResult r = check(b.h);
  EXPECT_FALSE(gate(r, "no_lost").passed);
  EXPECT_EQ(gate(r, "no_lost").request_ids, (std::vector<int64_t>{7, 8}));
  EXPECT_EQ(r.figures.lost, 2);
  EXPECT_EQ(r.figures.accepted, 4);
  EXPECT_DOUBLE_EQ(r.figures.success_rate, 0.5);
  EXPECT_EQ(r.failed_gates(), std::vector<std::string>{"no_lost"});

  // A terminal record (failed, the client can read it) is not lost; nor is a
  // request whose resume ended ok.
  b.h.finals[7].state = "failed";
  const int64_t broke = b.op({.t = 120, .type = OpType::kInfo, .rid = 0, .accepted = true, .http = 0});
  b.op({.t = 200, .f = "resume", .continues = broke, .rid = 0, .text = "x"});
  b.h.finals[8] = b.h.finals[7];
  b.h.finals[8].request_id = 8;
  r = check(b.h);
  EXPECT_TRUE(gate(r, "no_lost").passed) << gate(r, "no_lost").detail;
}

TEST(Checker, ResumeAcrossAChainIsOneCopy) {
  Builder b = clean();
  const int64_t first = b.op({.t = 100, .type = OpType::kInfo, .rid = 5, .http = 200, .text = "abc"});
  b.op({.t = 300, .f = "resume", .continues = first, .rid = 5, .text = "def"});
  b.final_done(5, "abcdef", 2);
  CheckResult r = check(b.h);
  EXPECT_TRUE(gate(r, "no_duplicates").passed) << gate(r, "no_duplicates").detail;
  EXPECT_TRUE(gate(r, "no_lost").passed);
  EXPECT_EQ(r.figures.resumed, 1);
  EXPECT_EQ(r.figures.accepted, 3) << "the chain is one request";
  EXPECT_EQ(r.figures.equivalence_checked, 2);
  EXPECT_EQ(r.figures.equivalence_equal, 2);
}

TEST(Checker, DuplicatedTextAcrossAResume) {
  Builder b = clean();
  const int64_t first = b.op({.t = 100, .type = OpType::kInfo, .rid = 5, .http = 200, .text = "abc"});
  // The resume streamed "c" again.
  b.op({.t = 300, .f = "resume", .continues = first, .rid = 5, .text = "cdef"});
  b.final_done(5, "abcdef", 2);
  CheckResult r = check(b.h);
  EXPECT_FALSE(gate(r, "no_duplicates").passed);
  EXPECT_EQ(gate(r, "no_duplicates").request_ids, std::vector<int64_t>{5});
  EXPECT_EQ(r.figures.duplicated, 1);
  EXPECT_EQ(r.figures.equivalence_equal, 1) << "the client's text abccdef is not the reference";
}

TEST(Checker, UnfinishedTextMustBeAPrefix) {
  Builder b = clean();
  // Never finished (failed, terminal): what arrived must be a prefix of the
  // reference; "abab" is "ab" twice.
  b.op({.t = 100, .type = OpType::kInfo, .rid = 6, .http = 200, .text = "abab"});
  FinalRecord f;
  f.request_id = 6;
  f.found = true;
  f.state = "failed";
  b.h.finals[6] = f;
  CheckResult r = check(b.h);
  EXPECT_FALSE(gate(r, "no_duplicates").passed);
  EXPECT_TRUE(gate(r, "no_lost").passed);
  b.h.ops.back().text = "abc";
  EXPECT_TRUE(check(b.h).passed) << summary_text(check(b.h));
}

TEST(Checker, IdempotentRetryMustReplay) {
  Builder b = clean();
  b.op({.t = 100, .idem = "k1", .rid = 9, .text = "abcdef"});
  b.final_done(9, "abcdef");
  // The client's retry after the first ended ok: replayed, the same id.
  b.op({.t = 400, .f = "retry", .idem = "k1", .rid = 9, .text = "abcdef", .replayed = true});
  CheckResult r = check(b.h);
  EXPECT_TRUE(gate(r, "no_duplicates").passed) << gate(r, "no_duplicates").detail;
  EXPECT_EQ(r.figures.replayed, 1);

  // The same retry ran again instead (not replayed).
  b.h.ops.back().replayed = false;
  r = check(b.h);
  EXPECT_FALSE(gate(r, "no_duplicates").passed);
  EXPECT_EQ(gate(r, "no_duplicates").request_ids, std::vector<int64_t>{9});
}

// A retry that found the server down received nothing: what the client
// holds is still the first attempt's whole text (simulation seed 64).
TEST(Checker, ARetryWithNoAnswerLeavesTheTextTheClientHas) {
  Builder b = clean();
  const int64_t first = b.op({.t = 100, .idem = "k1", .rid = 9, .text = "abcdef"});
  b.final_done(9, "abcdef");
  const int64_t down = b.op({.t = 400, .type = OpType::kInfo, .f = "retry", .continues = first, .idem = "k1",
                             .rid = 0, .accepted = false, .http = 0, .text = ""});
  CheckResult r = check(b.h);
  EXPECT_TRUE(gate(r, "no_duplicates").passed) << gate(r, "no_duplicates").detail;
  EXPECT_TRUE(r.passed) << summary_text(r);
  // And when it answers later, a replay.
  b.op({.t = 900, .f = "retry", .continues = down, .idem = "k1", .rid = 9, .text = "abcdef", .replayed = true});
  r = check(b.h);
  EXPECT_TRUE(r.passed) << summary_text(r);
}

TEST(Checker, IdempotencyKeyWithTwoRequestIds) {
  Builder b = clean();
  b.op({.t = 100, .type = OpType::kInfo, .idem = "k2", .rid = 10, .http = 0});
  b.op({.t = 200, .f = "retry", .idem = "k2", .rid = 11, .text = "abcdef"});
  b.final_done(10, "abcdef");
  b.final_done(11, "abcdef");
  CheckResult r = check(b.h);
  EXPECT_FALSE(gate(r, "no_duplicates").passed);
  EXPECT_EQ(gate(r, "no_duplicates").request_ids, (std::vector<int64_t>{10, 11}));
}

TEST(Checker, JournalRunsTwiceAfterSuccess) {
  Builder b = clean();
  b.op({.t = 100, .rid = 12, .text = "abcdef"});
  b.final_done(12, "abcdef", 2);
  EXPECT_FALSE(gate(check(b.h), "no_duplicates").passed);
  // A failover before the first token accounts for the second run.
  b.h.ops.back().failovers = 1;
  EXPECT_TRUE(gate(check(b.h), "no_duplicates").passed);
}

TEST(Checker, HostOverBudget) {
  Builder b = clean();
  Sample s = b.h.samples[0];
  s.t_ms = 2000;
  s.host_rss = 1500;
  b.h.samples.push_back(s);
  CheckResult r = check(b.h);
  EXPECT_FALSE(gate(r, "host_budget").passed);
  EXPECT_THAT(gate(r, "host_budget").detail, HasSubstr("2.0 s"));
  EXPECT_EQ(r.figures.host_peak, 1500u);

  // No budget sampled: nothing to hold to.
  for (auto& x : b.h.samples) x.host_budget = 0;
  r = check(b.h);
  EXPECT_TRUE(gate(r, "host_budget").passed);
  EXPECT_THAT(gate(r, "host_budget").detail, HasSubstr("no host budget"));
}

TEST(Checker, AdmissionOverTheReserveLine) {
  Builder b = clean();
  b.h.finals[1].admitted_under_reserve = true;
  b.h.finals[2].admitted_under_reserve = false;
  CheckResult r = check(b.h);
  EXPECT_FALSE(gate(r, "reserve_line").passed);
  EXPECT_EQ(gate(r, "reserve_line").request_ids, std::vector<int64_t>{2});
  EXPECT_THAT(gate(r, "reserve_line").detail, HasSubstr("1 of 2"));
}

TEST(Checker, DegradedNotShown) {
  Builder b = clean();
  b.op({.t = 100, .rid = 13, .path = "cpu", .text = "abcdef", .degraded = true, .shown = false});
  b.final_done(13, "abcdef");
  // A refusal that was degraded (queued elsewhere then refused) counts too.
  b.op({.t = 120, .type = OpType::kFail, .accepted = false, .http = 503, .path = "cpu", .degraded = true,
        .shown = true});
  CheckResult r = check(b.h);
  EXPECT_FALSE(gate(r, "degraded_visible").passed);
  EXPECT_EQ(gate(r, "degraded_visible").request_ids, std::vector<int64_t>{13});
  EXPECT_EQ(r.figures.degraded, 3);
  EXPECT_EQ(r.figures.degraded_shown, 2);
}

TEST(Checker, PercentilesNearestRank) {
  std::vector<double> v;
  for (int i = 100; i >= 1; --i) v.push_back(i);
  Percentiles p = percentiles(v);
  EXPECT_EQ(p.n, 100);
  EXPECT_EQ(p.p50, 50);
  EXPECT_EQ(p.p95, 95);
  EXPECT_EQ(p.p99, 99);
  EXPECT_EQ(p.max, 100);
  p = percentiles({7});
  EXPECT_EQ(p.p50, 7);
  EXPECT_EQ(p.p99, 7);
  p = percentiles({1, 2, 3, 4});
  EXPECT_EQ(p.p50, 2);
  EXPECT_EQ(p.p95, 4);
  p = percentiles({});
  EXPECT_EQ(p.n, 0);
  EXPECT_EQ(p.p99, 0);
}

TEST(Checker, RecoveryTimes) {
  Builder b;
  b.h.events.push_back({1000, "alloc_fail", "gpu"});
  b.h.events.push_back({5000, "kill", ""});
  b.h.events.push_back({6000, "restart", ""});
  Sample closed;
  closed.t_ms = 900;
  closed.paths = {{"gpu", 0, 0, 0, "closed"}};
  Sample open = closed;
  open.t_ms = 1250;
  open.paths[0].breaker = "open";
  b.h.samples = {closed, open};
  // A GPU token after the fault, then a CPU one: first CPU token 1100 + 300.
  b.op({.t = 1000, .rid = 1, .path = "gpu", .text = "a", .ttft = 50});
  b.op({.t = 1100, .rid = 2, .path = "cpu", .text = "a", .ttft = 300});
  b.op({.t = 900, .rid = 3, .path = "cpu", .text = "a", .ttft = 50});  // before the fault
  // After the restart: first token 6100 + 400.
  b.op({.t = 5500, .type = OpType::kInfo, .rid = 4, .http = 0, .path = "gpu", .ttft = -1});
  b.op({.t = 6100, .rid = 5, .path = "gpu", .text = "a", .ttft = 400});
  CheckResult r = check(b.h);
  ASSERT_EQ(r.figures.recoveries.size(), 2u);
  const Recovery& a = r.figures.recoveries[0];
  EXPECT_EQ(a.fault, "alloc_fail");
  EXPECT_DOUBLE_EQ(a.fault_ms, 1000);
  EXPECT_DOUBLE_EQ(a.breaker_open_ms, 250);
  EXPECT_DOUBLE_EQ(a.first_cpu_token_ms, 400);
  EXPECT_DOUBLE_EQ(a.first_token_ms, 50);
  const Recovery& k = r.figures.recoveries[1];
  EXPECT_EQ(k.fault, "kill");
  EXPECT_DOUBLE_EQ(k.restart_ms, 1000);
  EXPECT_DOUBLE_EQ(k.first_token_ms, 1500);
  EXPECT_DOUBLE_EQ(k.breaker_open_ms, -1);

  // An event saying the breaker opened counts when it comes before the samples.
  b.h.events.push_back({1100, "breaker_open", "gpu"});
  EXPECT_DOUBLE_EQ(check(b.h).figures.recoveries[0].breaker_open_ms, 100);
  // No CPU token after the fault: -1.
  b.h.ops[3].path = "gpu";
  b.h.ops[3].placement = "vulkan";
  EXPECT_DOUBLE_EQ(check(b.h).figures.recoveries[0].first_cpu_token_ms, -1);

  // Armed at 1000, fired (as polled) at 1200: the times run from the firing,
  // or from the breaker's opening when it was seen before the poll.
  b.h.events = {{1000, "alloc_fail", "gpu"}, {1200, "fault_fired", "alloc_fail on gpu (fault 1)"}};
  Recovery fired = check(b.h).figures.recoveries[0];
  EXPECT_DOUBLE_EQ(fired.fault_ms, 1200);
  EXPECT_DOUBLE_EQ(fired.breaker_open_ms, 50) << "the sample at 1250";
  b.h.events.push_back({1150, "breaker_open", "gpu"});
  fired = check(b.h).figures.recoveries[0];
  EXPECT_DOUBLE_EQ(fired.fault_ms, 1150);
  EXPECT_DOUBLE_EQ(fired.breaker_open_ms, 0);
  // Another kind's firing does not count.
  b.h.events = {{1000, "alloc_fail", "gpu"}, {1200, "fault_fired", "device_lost on gpu (fault 2)"}};
  EXPECT_DOUBLE_EQ(check(b.h).figures.recoveries[0].fault_ms, 1000);
}

TEST(Checker, CancelledRequestIsNotLost) {
  Builder b = clean();
  const int64_t waiting = b.op({.t = 100, .type = OpType::kFail, .rid = 20, .http = 200, .path = "cpu",
                                .ttft = -1});
  b.op({.t = 150, .f = "cancel", .continues = waiting, .rid = 20, .path = ""});
  FinalRecord f;
  f.request_id = 20;
  f.found = true;
  f.state = "cancelled";
  b.h.finals[20] = f;
  CheckResult r = check(b.h);
  EXPECT_TRUE(r.passed) << summary_text(r);
  EXPECT_EQ(r.figures.cancelled, 1);
  EXPECT_EQ(r.figures.succeeded, 2) << "an ok cancel is not a success of the request";
}

TEST(Checker, SurvivesAJsonRoundTrip) {
  Builder b = clean();
  b.op({.t = 100, .type = OpType::kInfo, .rid = 7, .http = 0});
  auto back = history_from_json(history_to_json(b.h));
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(summary_text(check(*back)), summary_text(check(b.h)));
}

// ------------------------------------------------------------------ report

ReportInput report_input() {
  Builder b = clean();
  b.op({.t = 100, .type = OpType::kInfo, .cls = "<script>alert(1)</script>", .rid = 7, .http = 0});
  b.h.events.push_back({30, "alloc_fail", "<img src=x onerror=alert(2)>"});
  Sample s = b.h.samples[0];
  s.t_ms = 500;
  s.device_used = 80;
  b.h.samples.push_back(s);
  ReportInput in;
  in.scenario_name = "hand & <made>";
  in.scenario_description = "desc";
  in.machine = "test machine";
  in.main.name = "planned";
  in.main.history = b.h;
  in.main.result = check(b.h);
  RunReport base;
  base.name = "no_failover";
  base.history = clean().h;
  base.history.mode = "no_failover";
  base.result = check(base.history);
  in.baselines.push_back(base);
  return in;
}

TEST(Report, JsonHoldsFiguresGatesAndHistories) {
  const ReportInput in = report_input();
  auto j = nlohmann::json::parse(report_json(in));
  EXPECT_EQ(j["scenario"], "hand & <made>");
  EXPECT_FALSE(j["passed"].get<bool>());
  EXPECT_EQ(j["main"]["result"]["failed_gates"][0], "no_lost");
  EXPECT_EQ(j["main"]["result"]["figures"]["lost"], 1);
  EXPECT_EQ(j["main"]["result"]["gates"].size(), 5u);
  ASSERT_EQ(j["baselines"].size(), 1u);
  EXPECT_EQ(j["baselines"][0]["name"], "no_failover");
  // The embedded history checks again to the same result.
  auto h = history_from_json(j["main"]["history"].dump());
  ASSERT_TRUE(h.ok()) << h.status().to_string();
  EXPECT_EQ(summary_text(check(*h)), summary_text(in.main.result));
}

TEST(Report, HtmlIsSelfContainedAndEscaped) {
  const std::string html = report_html(report_input());
  for (const char* id : {"id=\"gates\"", "id=\"memory-planned\"", "id=\"memory-no_failover\"", "id=\"host-planned\"",
                         "id=\"placement-planned\"", "id=\"queue-planned\"", "id=\"queue-age-planned\"",
                         "id=\"latency\"", "id=\"recovery\""}) {
    EXPECT_THAT(html, HasSubstr(id));
  }
  EXPECT_THAT(html, HasSubstr("class=\"series used\""));
  EXPECT_THAT(html, HasSubstr("class=\"reserve\""));
  EXPECT_THAT(html, HasSubstr("stroke-dasharray"));
  EXPECT_THAT(html, HasSubstr("class=\"event\""));
  EXPECT_THAT(html, HasSubstr("class=\"mark ok"));
  EXPECT_THAT(html, HasSubstr("class=\"mark info"));
  EXPECT_THAT(html, HasSubstr("class=\"mark refused"));
  EXPECT_THAT(html, HasSubstr("td class=\"fail\""));
  EXPECT_THAT(html, HasSubstr("td class=\"pass\""));
  // Nothing from the history reaches the page unescaped, and nothing is fetched.
  EXPECT_EQ(html.find("<script"), std::string::npos);
  EXPECT_EQ(html.find("<img"), std::string::npos);
  EXPECT_THAT(html, HasSubstr("&lt;script&gt;alert(1)&lt;/script&gt;"));
  EXPECT_THAT(html, HasSubstr("hand &amp; &lt;made&gt;"));
  EXPECT_EQ(html.find("http://"), std::string::npos);
  EXPECT_EQ(html.find("https://"), std::string::npos);
  EXPECT_EQ(html.find("src=\""), std::string::npos);
  EXPECT_EQ(html.find("href=\""), std::string::npos);
  EXPECT_THAT(html, HasSubstr("&lt;img src=x onerror=alert(2)&gt;"));
}

TEST(Report, EmptyHistoryStillRenders) {
  ReportInput in;
  in.scenario_name = "empty";
  in.main.name = "planned";
  in.main.result = check(in.main.history);
  const std::string html = report_html(in);
  EXPECT_THAT(html, HasSubstr("id=\"memory-planned\""));
  EXPECT_THAT(html, HasSubstr("no device fault"));
  EXPECT_TRUE(nlohmann::json::accept(report_json(in)));
}

TEST(Report, SummaryListsFailedGatesLast) {
  const ReportInput in = report_input();
  const std::string s = summary_text(in.main.result);
  EXPECT_THAT(s, HasSubstr("FAIL"));
  const auto last = s.rfind("FAILED no_lost: requests 7");
  ASSERT_NE(last, std::string::npos) << s;
  EXPECT_EQ(s.find('\n', last), s.size() - 1);
}

TEST(Report, WritesBothFiles) {
  const auto dir = std::filesystem::temp_directory_path() / ("spw_drill_report_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  ASSERT_TRUE(write_report((dir / "sub").string(), report_input()).ok());
  EXPECT_TRUE(std::filesystem::exists(dir / "sub" / "report.json"));
  EXPECT_TRUE(std::filesystem::exists(dir / "sub" / "report.html"));
  // A directory that cannot be made: IOError naming it.
  std::ofstream(dir / "file") << "x";
  Status st = write_report((dir / "file" / "r").string(), report_input());
  EXPECT_EQ(st.code(), StatusCode::kIOError);
  EXPECT_THAT(st.message(), HasSubstr("file"));
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace spw::drill
