// Generation loop, stop/cancel/length, checkpoints and resume equivalence.
#include "engine/generate.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <set>

#include "core/hash.h"
#include "engine/checkpoint.h"
#include "engine/engine_test_util.h"
#include "grammar/json_matcher.h"

namespace spw {
namespace {

using testing::make_pool;
using testing::make_session;

struct Fixture {
  std::shared_ptr<const Model> model = testing::stories();
  std::shared_ptr<CpuBackend> cpu = std::make_shared<CpuBackend>(1);
  KvType kv_type = KvType::kF32;
  std::unique_ptr<Session> session() { return make_session(model, cpu, make_pool(*model, 16, 32, kv_type)); }
  std::vector<TokenId> prompt(const std::string& text = "Once upon a time") {
    return model->tokenizer().encode(text, /*add_bos=*/true);
  }
};

GenerateOptions greedy(int max_tokens) {
  GenerateOptions o;
  o.max_tokens = max_tokens;
  o.sampler.temperature = 0.0f;
  return o;
}

GenerateOptions seeded(int max_tokens, uint64_t seed) {
  GenerateOptions o;
  o.max_tokens = max_tokens;
  o.sampler.temperature = 1.0f;
  o.sampler.top_k = 0;
  o.sampler.top_p = 1.0f;
  o.sampler.min_p = 0.0f;
  o.sampler.repeat_penalty = 1.1f;
  o.sampler.seed = seed;
  return o;
}

TEST(Generate, GreedyStories260KTellsTheStoryOfLily) {
  Fixture f;
  ASSERT_NE(f.model, nullptr);
  auto s = f.session();
  std::string streamed;
  int calls = 0;
  auto r = generate(*s, f.prompt(), greedy(60), [&](std::string_view t, TokenId, std::span<const TokenLogprobs>) {
    streamed += t;
    ++calls;
    return true;
  });
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  std::printf("[story] %s\n", r->text.c_str());
  EXPECT_NE(r->text.find("Lily"), std::string::npos) << r->text;
  EXPECT_EQ(streamed, r->text);
  EXPECT_GE(calls, static_cast<int>(r->tokens.size()));
  EXPECT_EQ(r->prompt_tokens, f.prompt());
  EXPECT_TRUE(r->finish_reason == FinishReason::kLength || r->finish_reason == FinishReason::kStop) << finish_reason_name(r->finish_reason);
  if (r->finish_reason == FinishReason::kLength) {
    EXPECT_EQ(r->tokens.size(), 60u);
  }
  EXPECT_GT(r->prefill_ns, 0);
  EXPECT_GT(r->decode_ns, 0);
  // The text is the detokenised tokens.
  EXPECT_EQ(r->text, f.model->tokenizer().decode(r->tokens, false));
}

TEST(Generate, StopStringIsNotEmittedAndEndsGeneration) {
  Fixture f;
  auto full = generate(*f.session(), f.prompt(), greedy(60));
  ASSERT_TRUE(full.ok());
  const size_t at = full->text.find("Lily");
  ASSERT_NE(at, std::string::npos);
  auto o = greedy(60);
  o.stop = {"Lily"};
  auto r = generate(*f.session(), f.prompt(), o);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->finish_reason, FinishReason::kStop);
  EXPECT_EQ(r->text, full->text.substr(0, at));
  EXPECT_LT(r->tokens.size(), full->tokens.size());
}

TEST(Generate, CancelByCallbackAndByFlag) {
  Fixture f;
  int n = 0;
  auto r = generate(*f.session(), f.prompt(), greedy(50),
                    [&](std::string_view, TokenId, std::span<const TokenLogprobs>) { return ++n < 5; });
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->finish_reason, FinishReason::kCancelled);
  EXPECT_EQ(r->tokens.size(), 5u);

  std::atomic<bool> flag{true};
  auto r2 = generate(*f.session(), f.prompt(), greedy(50), {}, &flag);
  ASSERT_TRUE(r2.ok());
  EXPECT_EQ(r2->finish_reason, FinishReason::kCancelled);
  EXPECT_TRUE(r2->tokens.empty());
}

TEST(Generate, SessionPrefixIsReused) {
  Fixture f;
  auto s = f.session();
  auto a = generate(*s, f.prompt(), greedy(10));
  ASSERT_TRUE(a.ok());
  // Same prompt again in the same session: truncates back and gives the same run.
  auto b = generate(*s, f.prompt(), greedy(10));
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(a->tokens, b->tokens);
  EXPECT_EQ(a->text, b->text);
}

void check_resume_equivalence(const GenerateOptions& opts, KvType kv_type = KvType::kF32) {
  Fixture f;
  f.kv_type = kv_type;
  ASSERT_NE(f.model, nullptr);
  auto ref = generate(*f.session(), f.prompt(), opts);
  ASSERT_TRUE(ref.ok()) << ref.status().to_string();
  ASSERT_GT(ref->tokens.size(), 10u);
  for (int cut : {0, 1, 3, 7, 20}) {
    if (cut > static_cast<int>(ref->tokens.size())) continue;
    auto s = f.session();
    auto g = Generator::start(*s, f.prompt(), opts);
    ASSERT_TRUE(g.ok());
    std::string streamed;
    auto collect = [&](std::string_view t, TokenId, std::span<const TokenLogprobs>) {
      streamed += t;
      return true;
    };
    for (int i = 0; i < cut && !(*g)->finished(); ++i) ASSERT_TRUE((*g)->step(collect).ok());
    Checkpoint cp = (*g)->checkpoint();
    std::string bytes = serialize_checkpoint(cp);
    auto parsed = parse_checkpoint(bytes);
    ASSERT_TRUE(parsed.ok()) << parsed.status().to_string();
    EXPECT_TRUE(*parsed == cp);
    g->reset();
    // A fresh session on a different backend (2 threads) continues the run.
    auto s2 = make_session(f.model, std::make_shared<CpuBackend>(2), make_pool(*f.model, 8, 64, kv_type));
    EXPECT_EQ(parsed->kv_type, cut == 0 ? "" : std::string(kv_type_name(kv_type))) << "cut " << cut;
    auto r = resume(*s2, *parsed, collect);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    EXPECT_EQ(r->tokens, ref->tokens) << "cut " << cut;
    EXPECT_EQ(r->text, ref->text) << "cut " << cut;
    EXPECT_EQ(r->finish_reason, ref->finish_reason);
    EXPECT_EQ(streamed, ref->text) << "cut " << cut;  // nothing emitted twice or lost
  }
}

TEST(Checkpoint, ResumeEqualsUninterruptedGreedy) { check_resume_equivalence(greedy(40)); }

// The KV type the tokens were chosen with travels in the checkpoint; resumed
// on that type (another block size and thread count), the run is the same.
TEST(Checkpoint, ResumeEqualsUninterruptedWithF16Kv) {
  check_resume_equivalence(greedy(40), KvType::kF16);
  auto o = seeded(40, 99);
  o.stop = {"zzz-never"};
  check_resume_equivalence(o, KvType::kF16);
}

// A checkpoint of tokens chosen on an F16 KV is refused by an F32 session
// (the continuation would be another run), naming both types; a start
// checkpoint (nothing generated) resumes on any type.
TEST(Checkpoint, ResumeRefusesAnotherKvType) {
  Fixture f;
  f.kv_type = KvType::kF16;
  auto s = f.session();
  auto g = Generator::start(*s, f.prompt(), greedy(10));
  ASSERT_TRUE(g.ok());
  const Checkpoint at_start = (*g)->checkpoint();
  ASSERT_TRUE((*g)->step().ok());
  const Checkpoint cp = (*g)->checkpoint();
  EXPECT_EQ(cp.kv_type, "f16");
  EXPECT_EQ(at_start.kv_type, "");
  auto s32 = make_session(f.model, f.cpu, make_pool(*f.model, 16, 32, KvType::kF32));
  auto r = Generator::resume(*s32, cp);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(r.status().message().find("f16"), std::string::npos) << r.status().to_string();
  EXPECT_NE(r.status().message().find("f32"), std::string::npos) << r.status().to_string();
  EXPECT_TRUE(Generator::resume(*s32, at_start).ok());
  EXPECT_TRUE(Generator::resume(*f.session(), cp).ok());
}

// `bytes` (the current version) re-framed as `version`, its payload's last
// `drop` bytes (the fields that version did not have yet) cut off.
std::string as_older_version(const std::string& bytes, uint32_t version, size_t drop) {
  // magic(8) | version(4) | size(8) | payload | checksum(8)
  const std::string payload = bytes.substr(20, bytes.size() - 28 - drop);
  std::string out(bytes.substr(0, 8));
  auto put = [&](uint64_t v, int n) {
    for (int i = 0; i < n; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  };
  put(version, 4);
  put(payload.size(), 8);
  out += payload;
  put(fnv1a64(payload), 8);
  return out;
}

// Older checkpoints still parse: version 1 (before kv_type) with kv_type "",
// version 2 (before the OpenAI/vLLM options) and version 3 (before
// response_format) with those at their defaults.
TEST(Checkpoint, OlderVersionsParseWithDefaults) {
  Fixture f;
  Checkpoint cp = start_checkpoint(f.model->fingerprint(), f.prompt(), greedy(5));
  const std::string v4 = serialize_checkpoint(cp);
  // Version 4's field at its default: the constraint's u8 kind 0 and its
  // schema's u32 length 0.
  const size_t v4_fields = 1 + 4;
  auto v3_parsed = parse_checkpoint(as_older_version(v4, 3, v4_fields));
  ASSERT_TRUE(v3_parsed.ok()) << v3_parsed.status().to_string();
  EXPECT_TRUE(*v3_parsed == cp);
  const std::string v3 = v4;
  // Version 3's fields, at their defaults: two f32 penalties, logit_bias's
  // u32 count 0, min_tokens' i32, stop_token_ids' u32 count 0.
  const size_t v3_fields = 4 + 4 + 4 + 4 + 4 + v4_fields;
  auto v2 = parse_checkpoint(as_older_version(v3, 2, v3_fields));
  ASSERT_TRUE(v2.ok()) << v2.status().to_string();
  EXPECT_TRUE(*v2 == cp);
  // kv_type's u32 length 0 goes too.
  auto v1 = parse_checkpoint(as_older_version(v3, 1, v3_fields + 4));
  ASSERT_TRUE(v1.ok()) << v1.status().to_string();
  EXPECT_TRUE(*v1 == cp);
  EXPECT_EQ(v1->kv_type, "");
}

// A finished checkpoint keeps its typed finish reason through the bytes (which
// spell it as text); every reason's name parses back, other text does not.
TEST(Checkpoint, FinishReasonTravelsByName) {
  for (FinishReason r : {FinishReason::kNone, FinishReason::kStop, FinishReason::kLength, FinishReason::kCancelled}) {
    EXPECT_EQ(parse_finish_reason(finish_reason_name(r)), r) << finish_reason_name(r);
  }
  EXPECT_EQ(parse_finish_reason("done"), std::nullopt);
  Fixture f;
  Checkpoint cp = start_checkpoint(f.model->fingerprint(), f.prompt(), greedy(5));
  cp.finish_reason = FinishReason::kLength;
  auto parsed = parse_checkpoint(serialize_checkpoint(cp));
  ASSERT_TRUE(parsed.ok()) << parsed.status().to_string();
  EXPECT_EQ(parsed->finish_reason, FinishReason::kLength);
  const Status st = check_safe_point(*parsed, SafePointRules{});
  EXPECT_EQ(st.reason(), FailureReason::kNotSafePoint);
  EXPECT_NE(st.message().find("(length)"), std::string::npos) << st.to_string();
}

// The OpenAI and vLLM options travel in the bytes, and a checkpoint that
// lost them would not compare equal.
TEST(Checkpoint, PenaltiesBiasAndEndRulesRoundTrip) {
  Fixture f;
  GenerateOptions o = seeded(20, 3);
  o.sampler.frequency_penalty = 0.75f;
  o.sampler.presence_penalty = -0.5f;
  o.sampler.logit_bias = {{7, -100.0f}, {12, 2.5f}};
  o.min_tokens = 4;
  o.stop_token_ids = {30, 31};
  o.ignore_eos = true;
  const Checkpoint cp = start_checkpoint(f.model->fingerprint(), f.prompt(), o);
  auto parsed = parse_checkpoint(serialize_checkpoint(cp));
  ASSERT_TRUE(parsed.ok()) << parsed.status().to_string();
  EXPECT_TRUE(*parsed == cp);
  EXPECT_EQ(parsed->options.sampler.logit_bias, o.sampler.logit_bias);
  EXPECT_EQ(parsed->options.sampler.frequency_penalty, 0.75f);
  EXPECT_EQ(parsed->options.sampler.presence_penalty, -0.5f);
  EXPECT_EQ(parsed->options.min_tokens, 4);
  EXPECT_EQ(parsed->options.stop_token_ids, o.stop_token_ids);
  Checkpoint other = cp;
  other.options.sampler.logit_bias[1].bias = 2.0f;
  EXPECT_FALSE(other == cp);
  other = cp;
  other.options.stop_token_ids.pop_back();
  EXPECT_FALSE(other == cp);
}

TEST(Checkpoint, ResumeEqualsUninterruptedSeededSampling) {
  auto o = seeded(40, 1234);
  o.stop = {"zzz-never"};
  check_resume_equivalence(o);
  // Seeded sampling really samples: another seed gives another story.
  Fixture f;
  auto a = generate(*f.session(), f.prompt(), seeded(40, 1));
  auto b = generate(*f.session(), f.prompt(), seeded(40, 2));
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NE(a->tokens, b->tokens);
}

// A request interrupted before its first checkpoint resumes from the one its
// prompt and options make: the same as a started Generator's, so the run is
// the original one (greedy and seeded alike).
TEST(Checkpoint, StartCheckpointIsAStartedGeneratorsAndResumesToTheSameRun) {
  Fixture f;
  for (const GenerateOptions& o : {greedy(24), seeded(24, 77)}) {
    auto s = f.session();
    auto g = Generator::start(*s, f.prompt(), o);
    ASSERT_TRUE(g.ok());
    const Checkpoint started = (*g)->checkpoint();
    g->reset();
    const Checkpoint made = start_checkpoint(f.model->fingerprint(), f.prompt(), o);
    EXPECT_TRUE(made == started);
    auto ref = generate(*f.session(), f.prompt(), o);
    auto r = resume(*f.session(), made);
    ASSERT_TRUE(ref.ok() && r.ok());
    EXPECT_EQ(r->text, ref->text);
    EXPECT_EQ(r->tokens, ref->tokens);
  }
}

TEST(Checkpoint, CorruptOrTruncatedBytesAreCorruption) {
  Fixture f;
  auto s = f.session();
  auto g = Generator::start(*s, f.prompt(), seeded(20, 5));
  ASSERT_TRUE(g.ok());
  for (int i = 0; i < 4; ++i) ASSERT_TRUE((*g)->step().ok());
  const std::string bytes = serialize_checkpoint((*g)->checkpoint());
  for (size_t len : {size_t{0}, size_t{5}, size_t{12}, size_t{20}, bytes.size() / 2, bytes.size() - 1}) {
    auto r = parse_checkpoint(std::string_view(bytes).substr(0, len));
    ASSERT_FALSE(r.ok()) << len;
    EXPECT_EQ(r.status().code(), StatusCode::kCorruption) << len << " " << r.status().to_string();
  }
  for (size_t pos = 0; pos < bytes.size(); pos += 7) {
    if (pos >= 8 && pos < 12) continue;  // version bytes: InvalidArgument (tested below)
    std::string bad = bytes;
    bad[pos] = static_cast<char>(bad[pos] ^ 0x41);
    auto r = parse_checkpoint(bad);
    ASSERT_FALSE(r.ok()) << pos;
    EXPECT_EQ(r.status().code(), StatusCode::kCorruption) << pos;
  }
  std::string next = bytes;
  next[8] = static_cast<char>(Checkpoint::kVersion + 1);
  EXPECT_EQ(parse_checkpoint(next).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(parse_checkpoint(bytes + "x").status().code(), StatusCode::kCorruption);
}

// ---- OpenAI's penalties and logit_bias, vLLM's end rules ----

// Greedy stories260K repeats itself ("Lily" and her friends come back): a
// frequency penalty changes the text, and a run with penalties and biases,
// interrupted at checkpoints (serialized, resumed on another session), gives
// the tokens of the uninterrupted run: the counts come back from the tokens.
TEST(GeneratePenalties, ChangeTheGreedyTextAndResumeToTheSameRun) {
  Fixture f;
  auto plain = generate(*f.session(), f.prompt(), greedy(40));
  ASSERT_TRUE(plain.ok());
  GenerateOptions o = greedy(40);
  o.sampler.frequency_penalty = 1.0f;
  o.sampler.presence_penalty = 0.5f;
  auto penalized = generate(*f.session(), f.prompt(), o);
  ASSERT_TRUE(penalized.ok());
  EXPECT_NE(penalized->tokens, plain->tokens);
  // Fewer repeats: the most frequent token occurs less often.
  const auto max_count = [](const std::vector<TokenId>& t) {
    size_t best = 0;
    for (TokenId id : t) best = std::max(best, static_cast<size_t>(std::count(t.begin(), t.end(), id)));
    return best;
  };
  EXPECT_LT(max_count(penalized->tokens), max_count(plain->tokens));
  check_resume_equivalence(o);
  GenerateOptions s = seeded(40, 4321);
  s.stop = {"zzz-never"};
  s.sampler.frequency_penalty = 1.5f;
  s.sampler.presence_penalty = -0.25f;
  s.sampler.logit_bias = {{plain->tokens[0], -100.0f}, {plain->tokens[5], 3.0f}};
  check_resume_equivalence(s);
}

// -100 on the token greedy picks first: it never appears, the text changes;
// +100 on one token: every generated token is that token.
TEST(GeneratePenalties, LogitBiasBansAndForces) {
  Fixture f;
  auto plain = generate(*f.session(), f.prompt(), greedy(20));
  ASSERT_TRUE(plain.ok());
  const TokenId first = plain->tokens[0];
  GenerateOptions ban = greedy(20);
  ban.sampler.logit_bias = {{first, -100.0f}};
  auto banned = generate(*f.session(), f.prompt(), ban);
  ASSERT_TRUE(banned.ok());
  EXPECT_NE(banned->text, plain->text);
  EXPECT_EQ(std::count(banned->tokens.begin(), banned->tokens.end(), first), 0);
  const TokenId forced_id = f.model->tokenizer().encode(" dog", false).back();
  GenerateOptions force = seeded(12, 8);
  force.sampler.logit_bias = {{forced_id, 100.0f}};
  auto forced = generate(*f.session(), f.prompt(), force);
  ASSERT_TRUE(forced.ok());
  EXPECT_EQ(forced->tokens, std::vector<TokenId>(12, forced_id));
}

// stories260K's greedy text never reaches EOS, so the EOS is made the
// argmax with a +100 bias: alone it ends the run at once; min_tokens bans it
// (and the stop token ids) until that many tokens are out, then it ends the
// run; ignore_eos generates it as a token of no text up to max_tokens. A stop
// token id ends the run where that token comes, out of the text and the
// tokens.
TEST(GenerateEndRules, MinTokensIgnoreEosAndStopTokenIds) {
  Fixture f;
  const Tokenizer& tok = f.model->tokenizer();
  ASSERT_GE(tok.eos_id(), 0);
  auto plain = generate(*f.session(), f.prompt(), greedy(30));
  ASSERT_TRUE(plain.ok());
  GenerateOptions eos = greedy(30);
  eos.sampler.logit_bias = {{tok.eos_id(), 100.0f}};
  auto at_once = generate(*f.session(), f.prompt(), eos);
  ASSERT_TRUE(at_once.ok());
  EXPECT_EQ(at_once->finish_reason, FinishReason::kStop);
  EXPECT_TRUE(at_once->tokens.empty());

  GenerateOptions min = eos;
  min.min_tokens = 6;
  auto six = generate(*f.session(), f.prompt(), min);
  ASSERT_TRUE(six.ok());
  EXPECT_EQ(six->finish_reason, FinishReason::kStop);
  // Banned, the EOS leaves the choice to the unbiased argmax: the plain run.
  EXPECT_EQ(six->tokens, std::vector<TokenId>(plain->tokens.begin(), plain->tokens.begin() + 6));
  EXPECT_EQ(six->text, tok.decode(six->tokens, false));

  GenerateOptions ignore = eos;
  ignore.ignore_eos = true;
  ignore.max_tokens = 5;
  auto eoses = generate(*f.session(), f.prompt(), ignore);
  ASSERT_TRUE(eoses.ok());
  EXPECT_EQ(eoses->finish_reason, FinishReason::kLength);
  EXPECT_EQ(eoses->tokens, std::vector<TokenId>(5, tok.eos_id()));
  EXPECT_EQ(eoses->text, "");
  // ignore_eos with min_tokens: the EOS is not an end, so not banned.
  ignore.min_tokens = 3;
  auto still = generate(*f.session(), f.prompt(), ignore);
  ASSERT_TRUE(still.ok());
  EXPECT_EQ(still->tokens, eoses->tokens);

  // Stop token ids: the fifth token, where it first comes.
  const TokenId stop_id = plain->tokens[4];
  const auto at = std::find(plain->tokens.begin(), plain->tokens.end(), stop_id) - plain->tokens.begin();
  GenerateOptions st = greedy(30);
  st.stop_token_ids = {stop_id};
  auto stopped = generate(*f.session(), f.prompt(), st);
  ASSERT_TRUE(stopped.ok());
  EXPECT_EQ(stopped->finish_reason, FinishReason::kStop);
  EXPECT_EQ(stopped->tokens, std::vector<TokenId>(plain->tokens.begin(), plain->tokens.begin() + at));
  EXPECT_EQ(stopped->text, tok.decode(stopped->tokens, false));
  // ignore_eos does not disarm them; min_tokens bans them until then.
  st.ignore_eos = true;
  EXPECT_EQ(generate(*f.session(), f.prompt(), st)->tokens, stopped->tokens);
  st.min_tokens = static_cast<int32_t>(at) + 3;
  auto later = generate(*f.session(), f.prompt(), st);
  ASSERT_TRUE(later.ok());
  ASSERT_GE(later->tokens.size(), static_cast<size_t>(at + 3));
  for (size_t i = 0; i < static_cast<size_t>(at + 3); ++i) EXPECT_NE(later->tokens[i], stop_id) << i;

  // All of it continues from checkpoints as it runs uninterrupted.
  GenerateOptions all = greedy(30);
  all.sampler.logit_bias = {{tok.eos_id(), 100.0f}};
  all.min_tokens = 14;
  all.stop_token_ids = {stop_id};
  all.stop = {"zzz-never"};
  check_resume_equivalence(all);
}

TEST(Checkpoint, ResumeRejectsOtherModel) {
  Fixture f;
  auto s = f.session();
  auto g = Generator::start(*s, f.prompt(), greedy(5));
  ASSERT_TRUE(g.ok());
  Checkpoint cp = (*g)->checkpoint();
  auto other = testing::random_model(testing::small_spec());
  ASSERT_NE(other, nullptr);
  auto s2 = make_session(other, f.cpu, make_pool(*other, 16, 8));
  EXPECT_EQ(Generator::resume(*s2, cp).status().code(), StatusCode::kFailedPrecondition);
}

// ---- log-probabilities (GenerateOptions::logprobs) ----

// log-softmax of one row of logits, computed here in double the plain way
// (independently of step_logprobs).
std::vector<double> log_softmax(const float* row, size_t n) {
  double mx = -1e300;
  for (size_t i = 0; i < n; ++i) mx = std::max(mx, static_cast<double>(row[i]));
  double z = 0;
  for (size_t i = 0; i < n; ++i) z += std::exp(static_cast<double>(row[i]) - mx);
  std::vector<double> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = std::log(std::exp(static_cast<double>(row[i]) - mx) / z);
  return out;
}

// The text a Utf8Stream shows for `bytes` while it holds an open character.
std::string decoded(std::string_view bytes) {
  Utf8Stream u;
  return u.push(bytes);
}

// Records the callbacks and checks at each one that the entries released so
// far never run ahead of the text released so far: their bytes, decoded, are
// a prefix of it.
struct Recorder {
  std::string text;
  std::vector<TokenLogprobs> entries;
  std::string entry_bytes;
  int ahead = 0;  // calls at which the entries ran ahead
  size_t tokens = 0;  // calls for a token
  int held = 0;  // calls after which some token's entry was still held
  TokenCallback callback() {
    return [this](std::string_view t, TokenId id, std::span<const TokenLogprobs> lp) {
      text += t;
      for (const TokenLogprobs& e : lp) {
        entries.push_back(e);
        entry_bytes += e.token.piece;
      }
      if (!text.starts_with(decoded(entry_bytes))) ++ahead;
      if (id >= 0) {
        ++tokens;
        if (entries.size() < tokens) ++held;
      }
      return true;
    };
  }
};

// Where each generated token's text ends in the decoded text (contract: the
// end of the character holding its last byte), computed from whole prefixes
// of the tokens' bytes rather than incrementally as the Generator does.
std::vector<size_t> text_ends(const Tokenizer& tok, const std::vector<TokenId>& tokens) {
  std::string raw;
  std::vector<size_t> raw_end;
  for (TokenId t : tokens) {
    raw += tok.token_piece(t);
    raw_end.push_back(raw.size());
  }
  std::vector<size_t> out;
  for (size_t k = 0; k < tokens.size(); ++k) {
    size_t c = raw_end[k];
    for (;; ++c) {
      Utf8Stream u;
      const std::string d = u.push(std::string_view(raw).substr(0, c));
      if (u.pending().empty() || c == raw.size()) {
        out.push_back(u.pending().empty() ? d.size() : std::string::npos);  // open at the end: flushed
        break;
      }
    }
  }
  return out;
}

TEST(GenerateLogprobs, EntriesAreTheModelsLogSoftmaxAtEachStep) {
  Fixture f;
  ASSERT_NE(f.model, nullptr);
  const Tokenizer& tok = f.model->tokenizer();
  const size_t n_vocab = static_cast<size_t>(tok.n_vocab());
  GenerateOptions penalised = greedy(30);
  penalised.sampler.repeat_penalty = 1.5f;  // changes the choice, not the report
  GenerateOptions sampled = seeded(30, 9);
  for (GenerateOptions o : {greedy(30), penalised, sampled}) {
    o.logprobs = 5;
    auto r = generate(*f.session(), f.prompt(), o);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    ASSERT_EQ(r->finish_reason, FinishReason::kLength);
    ASSERT_EQ(r->logprobs.size(), r->tokens.size()) << "every token listed";
    // The reference: every step's logits from one evaluation of the whole
    // sequence in a fresh session (the backend is batch-size invariant).
    std::vector<TokenId> all = r->prompt_tokens;
    all.insert(all.end(), r->tokens.begin(), r->tokens.end());
    auto s = f.session();
    auto logits = s->eval_all_logits(all);
    ASSERT_TRUE(logits.ok()) << logits.status().to_string();
    int greedy_top = 0;
    for (size_t k = 0; k < r->tokens.size(); ++k) {
      const TokenLogprobs& e = r->logprobs[k];
      EXPECT_EQ(e.index, static_cast<int32_t>(k));
      EXPECT_EQ(e.token.id, r->tokens[k]);
      EXPECT_EQ(e.token.piece, tok.token_piece(r->tokens[k]));
      const size_t row = r->prompt_tokens.size() - 1 + k;  // the logits token k was sampled from
      const std::vector<double> ref = log_softmax(logits->data() + row * n_vocab, n_vocab);
      EXPECT_NEAR(e.token.logprob, ref[static_cast<size_t>(e.token.id)], 1e-9) << k;
      ASSERT_EQ(e.top.size(), 5u);
      for (size_t i = 0; i < e.top.size(); ++i) {
        EXPECT_NEAR(e.top[i].logprob, ref[static_cast<size_t>(e.top[i].id)], 1e-9) << k << " " << i;
        if (i > 0) {
          EXPECT_GE(e.top[i - 1].logprob, e.top[i].logprob);
        }
        EXPECT_EQ(e.top[i].piece, tok.token_piece(e.top[i].id, true));
      }
      // No token outside the list is more likely than its last one.
      size_t more_likely = 0;
      for (double v : ref) more_likely += v > e.top.back().logprob + 1e-9 ? 1 : 0;
      EXPECT_LE(more_likely, 4u) << k;
      greedy_top += e.top[0].id == e.token.id ? 1 : 0;
    }
    if (o.sampler.temperature == 0 && o.sampler.repeat_penalty == 1.0f) {
      EXPECT_EQ(greedy_top, 30) << "greedy without a penalty chooses the most likely token";
    }
    if (o.sampler.repeat_penalty > 1.0f && o.sampler.temperature == 0) {
      EXPECT_LT(greedy_top, 30) << "the penalty made a less likely token win somewhere, and it is reported as such";
    }
  }
  // Not asked: none computed.
  auto r = generate(*f.session(), f.prompt(), greedy(5));
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->logprobs.empty());
}

TEST(GenerateLogprobs, TheTokenCompletingAStopStringIsNotListedAndNoneRunsAhead) {
  Fixture f;
  const Tokenizer& tok = f.model->tokenizer();
  auto full = generate(*f.session(), f.prompt(), greedy(60));
  ASSERT_TRUE(full.ok());
  const size_t at = full->text.find("Lily");
  ASSERT_NE(at, std::string::npos);
  // "ily" starts inside a token, so one token straddles the stop.
  for (const char* stop : {"Lily", "ily"}) {
    GenerateOptions o = greedy(60);
    o.stop = {stop};
    o.logprobs = 2;
    Recorder rec;
    auto r = generate(*f.session(), f.prompt(), o, rec.callback());
    ASSERT_TRUE(r.ok());
    ASSERT_EQ(r->finish_reason, FinishReason::kStop);
    EXPECT_EQ(rec.ahead, 0);
    const std::vector<size_t> ends = text_ends(tok, r->tokens);
    size_t want = 0;
    while (want < ends.size() && ends[want] <= r->text.size()) ++want;
    EXPECT_EQ(rec.entries.size(), want) << stop;
    EXPECT_LT(rec.entries.size(), r->tokens.size()) << "the token completing the stop string is not listed";
    EXPECT_EQ(r->logprobs.size(), rec.entries.size());
    for (size_t k = 0; k < rec.entries.size(); ++k) EXPECT_EQ(rec.entries[k].index, static_cast<int32_t>(k));
    EXPECT_TRUE(r->text.starts_with(rec.entry_bytes)) << "the entries' text is the response's";
    EXPECT_EQ(rec.text, r->text);
  }
}

TEST(GenerateLogprobs, TextHeldForAStopStringHoldsItsEntriesAndTheFlushReleasesThem) {
  Fixture f;
  auto full = generate(*f.session(), f.prompt(), greedy(60));
  ASSERT_TRUE(full.ok());
  ASSERT_NE(full->text.find("Lily"), std::string::npos);
  GenerateOptions o = greedy(60);
  o.stop = {"Lily!!!", "e zz"};  // prefixes that occur, stop strings that do not
  o.logprobs = 0;
  Recorder rec;
  auto r = generate(*f.session(), f.prompt(), o, rec.callback());
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->finish_reason, FinishReason::kLength);
  EXPECT_EQ(r->text, full->text);
  EXPECT_EQ(rec.ahead, 0);
  ASSERT_EQ(rec.entries.size(), r->tokens.size()) << "the end releases every entry";
  EXPECT_EQ(rec.entry_bytes, r->text) << "their bytes are the text";
  EXPECT_GT(rec.held, 0) << "some text, and so its entries, was held back";
  for (const TokenLogprobs& e : rec.entries) EXPECT_TRUE(e.top.empty()) << "0 alternatives asked";
}

// A random model over the stories vocabulary samples its byte tokens often:
// characters split over tokens, invalid sequences (shown as U+FFFD), and
// stop strings near them. Every run keeps the alignment the contract states.
TEST(GenerateLogprobs, SplitAndInvalidCharactersKeepEntriesAlignedWithTheText) {
  auto model = testing::random_model(testing::small_spec());
  ASSERT_NE(model, nullptr);
  const Tokenizer& tok = model->tokenizer();
  auto cpu = std::make_shared<CpuBackend>(1);
  const std::vector<TokenId> prompt = tok.encode("Once upon a time", true);
  int split = 0, stopped = 0;  // runs with a character split over tokens; runs a stop string ended
  for (uint64_t seed = 1; seed <= 12; ++seed) {
    GenerateOptions o = seeded(60, seed);
    o.sampler.repeat_penalty = 1.0f;
    o.ignore_eos = true;  // an EOS then is a token of no bytes
    o.logprobs = 1;
    Recorder whole;
    auto r = generate(*make_session(model, cpu, make_pool(*model, 16, 8)), prompt, o, whole.callback());
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    ASSERT_EQ(r->finish_reason, FinishReason::kLength);
    EXPECT_EQ(whole.ahead, 0) << seed;
    ASSERT_EQ(whole.entries.size(), r->tokens.size()) << seed;
    Utf8Stream u;
    std::string all = u.push(whole.entry_bytes);
    all += u.flush();
    EXPECT_EQ(all, r->text) << "all entries: all the text";
    for (TokenId t : r->tokens) split += is_valid_utf8(tok.token_piece(t)) ? 0 : 1;
    // A stop string of two ASCII characters from the second half.
    size_t p = r->text.size() / 2;
    while (p + 1 < r->text.size() && !(static_cast<unsigned char>(r->text[p]) < 0x80 &&
                                        static_cast<unsigned char>(r->text[p + 1]) < 0x80)) {
      ++p;
    }
    if (p + 1 >= r->text.size()) continue;
    o.stop = {r->text.substr(p, 2)};
    Recorder rec;
    auto rs = generate(*make_session(model, cpu, make_pool(*model, 16, 8)), prompt, o, rec.callback());
    ASSERT_TRUE(rs.ok());
    ASSERT_EQ(rs->finish_reason, FinishReason::kStop);
    ++stopped;
    EXPECT_EQ(rec.ahead, 0) << seed;
    const std::vector<size_t> ends = text_ends(tok, rs->tokens);
    size_t want = 0;
    while (want < ends.size() && ends[want] <= rs->text.size()) ++want;
    EXPECT_EQ(rec.entries.size(), want) << seed << " stop " << o.stop[0];
    for (size_t k = 0; k < rec.entries.size(); ++k) EXPECT_EQ(rec.entries[k].index, static_cast<int32_t>(k));
  }
  EXPECT_GT(split, 0) << "some token was part of a character (or not UTF-8 at all)";
  EXPECT_GT(stopped, 0);
}

// A checkpoint taken while text (and so entries) is held keeps those
// entries: a generation resumed from it in memory lists every token once; one
// resumed from the checkpoint's bytes lists only what it generates.
TEST(GenerateLogprobs, ACheckpointKeepsHeldEntriesInMemoryOnly) {
  Fixture f;
  GenerateOptions o = greedy(40);
  o.stop = {"Lily!!!"};
  o.logprobs = 3;
  auto ref = generate(*f.session(), f.prompt(), o);
  ASSERT_TRUE(ref.ok());
  ASSERT_EQ(ref->logprobs.size(), 40u);
  auto s = f.session();
  auto g = Generator::start(*s, f.prompt(), o);
  ASSERT_TRUE(g.ok());
  Recorder before;
  Checkpoint cp;
  for (;;) {
    ASSERT_TRUE((*g)->step(before.callback()).ok());
    ASSERT_FALSE((*g)->finished()) << "nothing was ever held";
    cp = (*g)->checkpoint();
    if (!cp.logprobs_pending.empty()) break;
  }
  EXPECT_EQ(before.entries.size() + cp.logprobs_pending.size(), static_cast<size_t>(cp.n_generated));
  g->reset();
  Recorder after;
  auto r = resume(*f.session(), cp, after.callback());
  ASSERT_TRUE(r.ok());
  std::vector<TokenLogprobs> all = before.entries;
  all.insert(all.end(), after.entries.begin(), after.entries.end());
  ASSERT_EQ(all.size(), ref->logprobs.size());
  for (size_t k = 0; k < all.size(); ++k) {
    EXPECT_EQ(all[k].index, static_cast<int32_t>(k));
    EXPECT_EQ(all[k].token.id, ref->logprobs[k].token.id);
    EXPECT_EQ(all[k].token.logprob, ref->logprobs[k].token.logprob);
    ASSERT_EQ(all[k].top.size(), 3u);
    EXPECT_EQ(all[k].top[2].id, ref->logprobs[k].top[2].id);
  }
  auto parsed = parse_checkpoint(serialize_checkpoint(cp));
  ASSERT_TRUE(parsed.ok());
  EXPECT_TRUE(parsed->logprobs_pending.empty());
  EXPECT_EQ(parsed->options.logprobs, -1) << "not serialized";
  parsed->options.logprobs = 3;
  auto r2 = resume(*f.session(), *parsed);
  ASSERT_TRUE(r2.ok());
  ASSERT_FALSE(r2->logprobs.empty());
  EXPECT_EQ(r2->logprobs.front().index, cp.n_generated) << "the held ones are gone with the bytes";
  EXPECT_EQ(r2->logprobs.size(), static_cast<size_t>(40 - cp.n_generated));
}

// ---- response_format ----

constexpr const char* kSmallSchema =
    R"({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"enum": ["x", "y", null]},
        "c": {"type": "string", "maxLength": 4}, "d": {"type": "array", "items": {"type": "boolean"}, "maxItems": 2}},
        "required": ["a", "b"], "additionalProperties": false})";

GenerateOptions constrained(uint64_t seed) {
  GenerateOptions o = seeded(400, seed);
  o.constraint = {grammar::ConstraintKind::kJsonSchema, kSmallSchema};
  return o;
}

bool whole_document(const std::string& schema, const std::string& text) {
  auto g = grammar::compile_constraint({grammar::ConstraintKind::kJsonSchema, schema});
  if (!g.ok()) return false;
  grammar::JsonMatcher m(*g);
  return m.feed(text) && m.complete();
}

// Every seeded sample of the real model under the mask is a whole document
// of the schema, ended by the end-of-text token (the schema is bounded, so
// max_tokens is never reached).
TEST(GenerateConstraint, SeededSamplesAreWholeDocumentsOfTheSchema) {
  Fixture f;
  std::set<std::string> texts;
  for (uint64_t seed = 1; seed <= 12; ++seed) {
    auto r = generate(*f.session(), f.prompt(), constrained(seed));
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    EXPECT_EQ(r->finish_reason, FinishReason::kStop) << r->text;
    EXPECT_TRUE(whole_document(kSmallSchema, r->text)) << r->text;
    texts.insert(r->text);
  }
  EXPECT_GT(texts.size(), 6u);  // it still samples
  GenerateOptions any = greedy(200);
  any.constraint = {grammar::ConstraintKind::kJsonObject, ""};
  auto r = generate(*f.session(), f.prompt(), any);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  const size_t start = r->text.find_first_not_of(" \t\n\r");
  ASSERT_NE(start, std::string::npos) << r->text;
  EXPECT_EQ(r->text[start], '{') << r->text;
  EXPECT_LE(start, static_cast<size_t>(grammar::kMaxIndent + 2));
}

// The grammar's state is rebuilt from the checkpoint's tokens: a resumed
// constrained run (seeded) is the uninterrupted one, at every cut.
TEST(GenerateConstraint, ResumeEqualsUninterrupted) { check_resume_equivalence(constrained(5)); }

TEST(GenerateConstraint, CheckpointCarriesTheSchemaAndRefusesEndRulesItCannotKeep) {
  Fixture f;
  const Checkpoint cp = start_checkpoint(f.model->fingerprint(), f.prompt(), constrained(3));
  auto parsed = parse_checkpoint(serialize_checkpoint(cp));
  ASSERT_TRUE(parsed.ok()) << parsed.status().to_string();
  EXPECT_EQ(parsed->options.constraint, cp.options.constraint);
  Checkpoint other = cp;
  other.options.constraint.schema = "{}";
  EXPECT_FALSE(other == cp);

  auto session = f.session();
  GenerateOptions o = constrained(1);
  o.ignore_eos = true;
  auto g = Generator::start(*session, f.prompt(), o);
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.status().field(), "ignore_eos");
  o.ignore_eos = false;
  o.min_tokens = 2;
  g = Generator::start(*session, f.prompt(), o);
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.status().field(), "min_tokens");
  o.min_tokens = 0;
  o.constraint.schema = R"({"type": "string", "pattern": "a"})";
  g = Generator::start(*session, f.prompt(), o);
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.status().field(), "response_format");

  // A checkpoint whose tokens do not fit its grammar does not resume.
  auto live = Generator::start(*session, f.prompt(), greedy(5));
  ASSERT_TRUE(live.ok());
  ASSERT_TRUE((*live)->run().ok());
  Checkpoint free_text = (*live)->checkpoint();
  free_text.finish_reason = FinishReason::kNone;
  free_text.options.constraint = {grammar::ConstraintKind::kJsonObject, ""};
  auto other_session = f.session();
  auto bad = Generator::resume(*other_session, free_text);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kCorruption) << bad.status().to_string();
}

// Echo with logprobs: every prompt token but the first gets the
// log-probability the model gave it at the position before, exactly what
// evaluating the prompt one token at a time (teacher forcing) gives, with
// prefill in several ubatches; the generation itself is unchanged.
TEST(GeneratePromptLogprobs, EqualTeacherForcingStepByStep) {
  Fixture f;
  ASSERT_NE(f.model, nullptr);
  const Tokenizer& tok = f.model->tokenizer();
  const size_t n_vocab = static_cast<size_t>(tok.n_vocab());
  const std::vector<TokenId> prompt = f.prompt("Once upon a time, there was a little girl named Lily. She liked to");
  ASSERT_GT(prompt.size(), 10u);
  SessionOptions so;
  so.n_ubatch = 4;  // several prefill chunks
  auto s = make_session(f.model, f.cpu, make_pool(*f.model, 16, 32), so);
  // A session holding a prefix of the prompt: nothing of it may be reused.
  ASSERT_TRUE(s->eval(std::span<const TokenId>(prompt.data(), 5)).ok());
  GenerateOptions o = greedy(8);
  o.prompt_logprobs = 3;
  auto r = generate(*s, prompt, o);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  auto plain = generate(*f.session(), prompt, greedy(8));
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(r->tokens, plain->tokens) << "the prompt's entries change nothing generated";
  EXPECT_TRUE(plain->prompt_logprobs.empty()) << "not asked: none computed";
  ASSERT_EQ(r->prompt_logprobs.size(), prompt.size());

  // The reference: one token at a time, the logits of each step.
  auto ref = f.session();
  std::string pieces;
  for (size_t i = 0; i < prompt.size(); ++i) {
    const TokenLogprobs& e = r->prompt_logprobs[i];
    EXPECT_EQ(e.index, static_cast<int32_t>(i));
    EXPECT_EQ(e.token.id, prompt[i]);
    pieces += e.token.piece;
    if (i == 0) {
      EXPECT_TRUE(std::isnan(e.token.logprob)) << "nothing predicts the first token";
      EXPECT_TRUE(e.top.empty());
    } else {
      const std::vector<double> want = log_softmax(ref->last_logits().data(), n_vocab);
      EXPECT_NEAR(e.token.logprob, want[static_cast<size_t>(prompt[i])], 1e-9) << i;
      ASSERT_EQ(e.top.size(), 3u) << i;
      for (const PieceLogprob& t : e.top) {
        EXPECT_NEAR(t.logprob, want[static_cast<size_t>(t.id)], 1e-9) << i;
        EXPECT_EQ(t.piece, tok.token_piece(t.id, true));
      }
      EXPECT_GE(e.top[0].logprob, e.top[2].logprob);
    }
    ASSERT_TRUE(ref->eval(std::span<const TokenId>(&prompt[i], 1)).ok()) << i;
  }
  EXPECT_EQ(pieces, tok.decode(prompt)) << "the entries' text is the prompt's";
}

// The same rows through Session::eval_batch (the StepBatcher's path): a
// prompt chunk with the sink beside another session's decode step gives the
// rows one-token evaluation gives, and the other session's logits are
// untouched by it.
TEST(GeneratePromptLogprobs, EvalBatchHandsEveryRowToTheSink) {
  Fixture f;
  ASSERT_NE(f.model, nullptr);
  const size_t V = static_cast<size_t>(f.model->hparams().n_vocab);
  const std::vector<TokenId> prompt = f.prompt("Lily went to the park with her mom");
  auto a = f.session();
  auto b = f.session();
  auto b_ref = f.session();
  const std::vector<TokenId> other = f.prompt("Tom had a big red ball");
  ASSERT_TRUE(b->eval(other).ok());
  ASSERT_TRUE(b_ref->eval(other).ok());
  std::vector<std::vector<float>> rows;
  std::vector<int32_t> positions;
  a->set_row_logits_sink([&](int32_t first, int32_t n, std::span<const float> logits) {
    for (int32_t r = 0; r < n; ++r) {
      positions.push_back(first + r);
      rows.emplace_back(logits.begin() + static_cast<ptrdiff_t>(r * V), logits.begin() + static_cast<ptrdiff_t>((r + 1) * V));
    }
  });
  const TokenId next = 42;
  const size_t half = prompt.size() / 2;
  for (auto [from, to] : {std::pair<size_t, size_t>{0, half}, {half, prompt.size()}}) {
    BatchPart parts[2] = {{a.get(), std::span<const TokenId>(prompt.data() + from, to - from), to == prompt.size()},
                          {b.get(), std::span<const TokenId>(&next, 1), true}};
    for (const Status& st : Session::eval_batch(parts)) ASSERT_TRUE(st.ok()) << st.to_string();
  }
  a->set_row_logits_sink({});
  ASSERT_EQ(rows.size(), prompt.size());
  auto ref = f.session();
  for (size_t i = 0; i < prompt.size(); ++i) {
    EXPECT_EQ(positions[i], static_cast<int32_t>(i));
    auto l = ref->eval(std::span<const TokenId>(&prompt[i], 1));
    ASSERT_TRUE(l.ok());
    EXPECT_TRUE(std::equal(l->begin(), l->end(), rows[i].begin())) << "row " << i << " bitwise as one token's eval";
  }
  EXPECT_TRUE(std::equal(a->last_logits().begin(), a->last_logits().end(), rows.back().begin()));
  // b decoded `next` twice in the passes: its logits are its own eval's.
  ASSERT_TRUE(b_ref->eval(std::span<const TokenId>(&next, 1)).ok());
  auto l = b_ref->eval(std::span<const TokenId>(&next, 1));
  ASSERT_TRUE(l.ok());
  EXPECT_TRUE(std::equal(l->begin(), l->end(), b->last_logits().begin()));
}


// OpenAI's n > 1 (ChoiceGroup): one prompt evaluated once, n choices.
std::vector<TokenId> long_prompt(const Model& m, size_t n) {
  std::string text;
  std::vector<TokenId> p;
  while (p.size() < n) {
    text += "Once upon a time there was a little girl named Lily. She loved to play in the park. ";
    p = m.tokenizer().encode(text, /*add_bos=*/true);
  }
  p.resize(n);
  return p;
}

TEST(GenerateChoices, GreedyChoicesEqualTheLoneGreedyText) {
  Fixture f;
  auto lone_s = f.session();
  auto lone = generate(*lone_s, f.prompt(), greedy(40));
  ASSERT_TRUE(lone.ok()) << lone.status().to_string();
  auto s = f.session();
  std::vector<std::string> streamed(3);
  auto r = generate_choices(*s, f.prompt(), greedy(40), 3,
                            [&](int32_t c, std::string_view t, TokenId, std::span<const TokenLogprobs>) {
                              streamed.at(static_cast<size_t>(c)) += t;
                              return true;
                            });
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  ASSERT_EQ(r->size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ((*r)[i].text, lone->text) << i;
    EXPECT_EQ((*r)[i].tokens, lone->tokens) << i;
    EXPECT_EQ((*r)[i].finish_reason, lone->finish_reason) << i;
    EXPECT_EQ(streamed[i], lone->text) << i;
  }
}

TEST(GenerateChoices, SeededChoiceIIsTheLoneRunWithSeedPlusI) {
  Fixture f;
  const uint64_t seed = 1234;
  auto s = f.session();
  auto r = generate_choices(*s, f.prompt(), seeded(48, seed), 3);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  ASSERT_EQ(r->size(), 3u);
  for (int32_t i = 0; i < 3; ++i) {
    auto lone_s = f.session();
    auto lone = generate(*lone_s, f.prompt(), seeded(48, choice_seed(seed, i)));
    ASSERT_TRUE(lone.ok());
    EXPECT_EQ((*r)[static_cast<size_t>(i)].text, lone->text) << i;
    EXPECT_EQ((*r)[static_cast<size_t>(i)].tokens, lone->tokens) << i;
  }
  // Different seeds, different stories (temperature 1 over 48 tokens).
  EXPECT_NE((*r)[0].text, (*r)[1].text);
  EXPECT_NE((*r)[1].text, (*r)[2].text);
  // Again: the same three.
  auto again = generate_choices(*s, f.prompt(), seeded(48, seed), 3);
  ASSERT_TRUE(again.ok());
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ((*again)[i].text, (*r)[i].text) << i;
}

// The prompt's KV is held once: n = 3 on a 200-token prompt takes fewer
// blocks than three lone requests, and the partial block copies are the
// only prompt blocks a choice adds.
TEST(GenerateChoices, ThePromptsKvIsSharedNotCopied) {
  Fixture f;
  const auto prompt = long_prompt(*f.model, 200);
  GenerateOptions o = greedy(20);
  o.reserve_kv = true;
  auto pool = make_pool(*f.model, 16, 64, KvType::kF32);
  auto s = make_session(f.model, f.cpu, pool);
  int32_t peak = 0;
  auto r = generate_choices(*s, prompt, o, 3, [&](int32_t, std::string_view, TokenId, std::span<const TokenLogprobs>) {
    peak = std::max(peak, pool->blocks_in_use());
    return true;
  });
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  // Choice 0: ceil(220 / 16) = 14 blocks; each other choice shares the 12
  // full prompt blocks and has 2 of its own (the copied partial block, then
  // its generated tokens' up to 220).
  EXPECT_EQ(peak, 14 + 2 + 2);
  auto lone_pool = make_pool(*f.model, 16, 64, KvType::kF32);
  std::vector<std::unique_ptr<Session>> lone;
  for (int i = 0; i < 3; ++i) {
    lone.push_back(make_session(f.model, f.cpu, lone_pool));
    auto g = Generator::start(*lone.back(), prompt, o);
    ASSERT_TRUE(g.ok());
  }
  EXPECT_EQ(lone_pool->blocks_in_use(), 3 * 14);
  EXPECT_LT(peak, lone_pool->blocks_in_use());
  // The forks gave everything back with the group; the session keeps its own.
  EXPECT_EQ(pool->blocks_in_use(), 14);
  ASSERT_TRUE(s->truncate(0).ok());
  EXPECT_EQ(pool->blocks_in_use(), 0);
  // A prompt filling its last block (192 = 12 x 16): each choice copies that
  // block to evaluate the prompt's last position again (11 shared, 3 own).
  const auto aligned = long_prompt(*f.model, 192);
  peak = 0;
  auto lone_aligned = generate(*lone.front(), aligned, greedy(20));
  ASSERT_TRUE(lone_aligned.ok());
  auto r2 = generate_choices(*s, aligned, o, 3, [&](int32_t, std::string_view, TokenId, std::span<const TokenLogprobs>) {
    peak = std::max(peak, pool->blocks_in_use());
    return true;
  });
  ASSERT_TRUE(r2.ok()) << r2.status().to_string();
  EXPECT_EQ(peak, 14 + 3 + 3);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ((*r2)[i].tokens, lone_aligned->tokens) << i;
}

TEST(GenerateChoices, BadNAndAFullPool) {
  Fixture f;
  auto s = f.session();
  EXPECT_EQ(generate_choices(*s, f.prompt(), greedy(4), 0).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(generate_choices(*s, f.prompt(), greedy(4), kMaxChoices + 1).status().code(),
            StatusCode::kInvalidArgument);
  // A pool with room for two choices only: all or nothing.
  const auto prompt = long_prompt(*f.model, 40);  // 2 full blocks + 8 positions
  GenerateOptions o = greedy(8);
  o.reserve_kv = true;
  auto pool = make_pool(*f.model, 16, 4, KvType::kF32);
  auto s2 = make_session(f.model, f.cpu, pool);
  // Choice 0: 3 blocks (48 positions); choice 1: 1 block (the copy of the
  // partial one); choice 2: none left.
  auto r = generate_choices(*s2, prompt, o, 3);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(pool->blocks_in_use(), 3);  // the session's own, the forks' given back
  auto two = generate_choices(*s2, prompt, o, 2);
  ASSERT_TRUE(two.ok()) << two.status().to_string();
  EXPECT_EQ((*two)[0].text, (*two)[1].text);
}

}  // namespace
}  // namespace spw
