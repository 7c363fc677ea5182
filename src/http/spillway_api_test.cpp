// Spillway's own JSON (spillway_api.h): its bodies are parsed as strictly as
// the OpenAI ones (one parser: json_fields.h), and the admission decision and
// request records render as documented.
#include "http/spillway_api.h"

#include <gtest/gtest.h>

#include <limits>
#include <nlohmann/json.hpp>

namespace spw::http {
namespace {

using nlohmann::json;

// ---- Strict parsing: one JSON value, nothing after it ----

TEST(SpillwayApiStrict, TrailingBytesAfterTheValueAre400) {
  using namespace std::string_literals;
  // The same for resume, reservation and fault bodies as for the OpenAI ones
  // (one parser).
  ResumeBody rb;
  EXPECT_EQ(parse_resume_request("{}\0{\"stream\":true}"s, rb).value_or(ApiError{}).code, "invalid_json");
  ReservationRequest rr;
  EXPECT_EQ(parse_reservation_request(R"({"name":"a","bytes":1} 7)", rr).value_or(ApiError{}).code, "invalid_json");
  FaultRequest fr;
  EXPECT_EQ(parse_fault_request("{\"kind\":\"hang\"}\0"s, fr).value_or(ApiError{}).code, "invalid_json");
}

// ---- Errors quote only a short excerpt of the input ----

TEST(SpillwayApiStrict, HugeBodiesGetSmallErrors) {
  const std::string big(5 * 1024 * 1024, 'a');
  FaultRequest fr;
  auto fe = parse_fault_request("{\"kind\":\"" + big + "\"}", fr);
  ASSERT_TRUE(fe.has_value());
  EXPECT_LT(render_error(*fe).size(), 2048u);
  ReservationRequest rr;
  auto re = parse_reservation_request("{\"name\":\"a\",\"bytes\":\"" + big + "\"}", rr);
  ASSERT_TRUE(re.has_value());
  EXPECT_EQ(re->param, "bytes");
  EXPECT_LT(render_error(*re).size(), 2048u);
}

// ---- Unknown fields are refused, never ignored ----

TEST(SpillwayApiStrict, UnknownFieldsAreRefused) {
  ResumeBody rb;
  auto re = parse_resume_request(R"({"received_text":"x","max_tokens":3})", rb);
  ASSERT_TRUE(re.has_value());
  EXPECT_EQ(re->code, "unknown_parameter");
  EXPECT_EQ(re->param, "max_tokens");
  ReservationRequest rr;
  auto rs = parse_reservation_request(R"({"name":"a","bytes":1,"ttl":5})", rr);
  ASSERT_TRUE(rs.has_value());
  EXPECT_EQ(rs->code, "unknown_parameter");
  EXPECT_EQ(rs->param, "ttl");
  FaultRequest fr;
  auto fe = parse_fault_request(R"({"kind":"hang","times":2})", fr);
  ASSERT_TRUE(fe.has_value());
  EXPECT_EQ(fe->code, "unknown_parameter");
  EXPECT_EQ(fe->param, "times");
}

admission::Decision shrink_decision() {
  admission::Decision d;
  d.kind = admission::DecisionKind::kShrink;
  d.path_index = 0;
  d.path = "gpu";
  d.reason = "shrunk to 64 tokens: 12 KV blocks free on gpu";
  d.http_status = 200;
  d.n_ctx = 512;
  d.prompt_tokens = 9;
  d.max_tokens = 64;
  d.max_tokens_requested = 400;
  d.shrunk = true;
  d.kv_blocks = 5;
  d.queue_position = 2;
  d.timing = {0.25, 0.5, std::numeric_limits<double>::infinity()};
  d.pressure = 0.75;
  d.verdicts = {{"gpu", true, "fits", {}}, {"cpu", false, "queue full (4 of 4)", {}}};
  return d;
}

TEST(SpillwayApiRender, DecisionCarriesItsReasonAndFigures) {
  const json j = json::parse(render_decision(shrink_decision()));
  EXPECT_EQ(j["kind"], "shrink");
  EXPECT_EQ(j["path"], "gpu");
  EXPECT_EQ(j["reason"], "shrunk to 64 tokens: 12 KV blocks free on gpu");
  EXPECT_TRUE(j["failure"].is_null());
  EXPECT_EQ(j["http_status"], 200);
  EXPECT_FALSE(j.contains("retry_after_s")) << "admitted: nothing to retry";
  EXPECT_EQ(j["limits"]["n_ctx"], 512);
  EXPECT_EQ(j["limits"]["prompt_tokens"], 9);
  EXPECT_EQ(j["limits"]["max_tokens"], 64);
  EXPECT_EQ(j["limits"]["max_tokens_requested"], 400);
  EXPECT_EQ(j["limits"]["shrunk"], true);
  EXPECT_EQ(j["limits"]["kv_blocks"], 5);
  EXPECT_EQ(j["queue_position"], 2);
  EXPECT_DOUBLE_EQ(j["estimated_delay_ms"].get<double>(), 250.0);
  EXPECT_DOUBLE_EQ(j["predicted_ttft_ms"].get<double>(), 500.0);
  EXPECT_TRUE(j["predicted_total_ms"].is_null()) << "unknown, not infinite";
  EXPECT_DOUBLE_EQ(j["pressure"].get<double>(), 0.75);
  ASSERT_EQ(j["verdicts"].size(), 2u);
  EXPECT_EQ(j["verdicts"][1], json({{"path", "cpu"}, {"eligible", false}, {"reason", "queue full (4 of 4)"}}));

  admission::Decision reject;  // kReject by default
  reject.reason = "every path's queue is full";
  reject.failure = FailureReason::kQueueFull;
  reject.http_status = 429;
  reject.retry_after_s = 3.5;
  const json r = json::parse(render_decision(reject));
  EXPECT_EQ(r["kind"], "reject");
  EXPECT_TRUE(r["path"].is_null());
  EXPECT_EQ(r["failure"], "queue_full");
  EXPECT_EQ(r["http_status"], 429);
  EXPECT_DOUBLE_EQ(r["retry_after_s"].get<double>(), 3.5);
  reject.failure = FailureReason::kNoPath;
  reject.http_status = 503;
  EXPECT_TRUE(json::parse(render_decision(reject))["retry_after_s"].is_null()) << "only a full queue has an ETA";
}

TEST(SpillwayApiRender, RequestRecordShowsTheStoredAdmission) {
  journal::Record r;
  r.id = 3;
  r.state = journal::RequestState::kDone;
  const json none = json::parse(render_request_record(r));
  ASSERT_TRUE(none.contains("admission"));
  EXPECT_TRUE(none["admission"].is_null());
  r.admission = render_decision(shrink_decision());
  const json with = json::parse(render_request_record(r));
  EXPECT_EQ(with["admission"], json::parse(r.admission)) << "an object, not a string holding one";
  r.admission = "{truncated";
  EXPECT_TRUE(json::parse(render_request_record(r))["admission"].is_null());
}

}  // namespace
}  // namespace spw::http
