#include "engine/checkpoint.h"

#include "core/hash.h"

#include <cstring>

namespace spw {

namespace {

constexpr char kMagic[8] = {'S', 'P', 'W', 'C', 'K', 'P', 'T', '\0'};


class Writer {
 public:
  void u8(uint8_t v) { out.push_back(static_cast<char>(v)); }
  void u32(uint32_t v) {
    for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  }
  void u64(uint64_t v) {
    for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  }
  void i32(int32_t v) { u32(static_cast<uint32_t>(v)); }
  void f32(float v) {
    uint32_t b;
    std::memcpy(&b, &v, 4);
    u32(b);
  }
  void str(const std::string& s) {
    u32(static_cast<uint32_t>(s.size()));
    out += s;
  }
  void ids(const std::vector<TokenId>& v) {
    u32(static_cast<uint32_t>(v.size()));
    for (TokenId t : v) i32(t);
  }
  std::string out;
};

class Reader {
 public:
  explicit Reader(std::string_view d) : d_(d) {}
  Status need(size_t n, const char* field) {
    if (d_.size() - pos_ < n)
      return Status::corruption(std::string("checkpoint truncated in field '") + field + "' at offset " +
                                std::to_string(pos_));
    return Status();
  }
  Status u8(uint8_t& v, const char* f) {
    SPW_RETURN_IF_ERROR(need(1, f));
    v = static_cast<uint8_t>(d_[pos_++]);
    return Status();
  }
  Status u32(uint32_t& v, const char* f) {
    SPW_RETURN_IF_ERROR(need(4, f));
    v = 0;
    for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(static_cast<uint8_t>(d_[pos_++])) << (8 * i);
    return Status();
  }
  Status u64(uint64_t& v, const char* f) {
    SPW_RETURN_IF_ERROR(need(8, f));
    v = 0;
    for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(static_cast<uint8_t>(d_[pos_++])) << (8 * i);
    return Status();
  }
  // The locals start at 0 although u32 sets them before any use: GCC for
  // AArch64 inlines differently and warns (-Wmaybe-uninitialized) otherwise.
  Status i32(int32_t& v, const char* f) {
    uint32_t u = 0;
    SPW_RETURN_IF_ERROR(u32(u, f));
    v = static_cast<int32_t>(u);
    return Status();
  }
  Status f32(float& v, const char* f) {
    uint32_t u = 0;
    SPW_RETURN_IF_ERROR(u32(u, f));
    std::memcpy(&v, &u, 4);
    return Status();
  }
  Status str(std::string& s, const char* f) {
    uint32_t n = 0;
    SPW_RETURN_IF_ERROR(u32(n, f));
    SPW_RETURN_IF_ERROR(need(n, f));
    s.assign(d_.substr(pos_, n));
    pos_ += n;
    return Status();
  }
  Status ids(std::vector<TokenId>& v, const char* f) {
    uint32_t n = 0;
    SPW_RETURN_IF_ERROR(u32(n, f));
    SPW_RETURN_IF_ERROR(need(static_cast<size_t>(n) * 4, f));  // checked before reserving
    v.resize(n);
    for (auto& t : v) SPW_RETURN_IF_ERROR(i32(t, f));
    return Status();
  }
  size_t pos() const { return pos_; }
  size_t remaining() const { return d_.size() - pos_; }

 private:
  std::string_view d_;
  size_t pos_ = 0;
};

// The fields version 3 appended (see the header), in their order.
Status parse_v3_fields(Reader& r, Checkpoint& c) {
  SamplerParams& s = c.options.sampler;
  SPW_RETURN_IF_ERROR(r.f32(s.frequency_penalty, "options.sampler.frequency_penalty"));
  SPW_RETURN_IF_ERROR(r.f32(s.presence_penalty, "options.sampler.presence_penalty"));
  uint32_t n_bias;
  SPW_RETURN_IF_ERROR(r.u32(n_bias, "options.sampler.logit_bias"));
  // Checked before reserving: 8 bytes an entry must follow.
  if (n_bias > r.remaining() / 8) return Status::corruption("checkpoint: field 'options.sampler.logit_bias' count too large");
  s.logit_bias.resize(n_bias);
  for (LogitBias& b : s.logit_bias) {
    SPW_RETURN_IF_ERROR(r.i32(b.id, "options.sampler.logit_bias"));
    SPW_RETURN_IF_ERROR(r.f32(b.bias, "options.sampler.logit_bias"));
  }
  SPW_RETURN_IF_ERROR(r.i32(c.options.min_tokens, "options.min_tokens"));
  return r.ids(c.options.stop_token_ids, "options.stop_token_ids");
}

// Version 4's: the response_format constraint's source.
Status parse_v4_fields(Reader& r, Checkpoint& c) {
  uint8_t kind = 0;
  SPW_RETURN_IF_ERROR(r.u8(kind, "options.constraint.kind"));
  if (kind > static_cast<uint8_t>(grammar::ConstraintKind::kJsonSchema)) {
    return Status::corruption("checkpoint: field 'options.constraint.kind' = " + std::to_string(kind));
  }
  c.options.constraint.kind = static_cast<grammar::ConstraintKind>(kind);
  return r.str(c.options.constraint.schema, "options.constraint.schema");
}

}  // namespace

bool Checkpoint::operator==(const Checkpoint& o) const {
  return model_fingerprint == o.model_fingerprint && tokens == o.tokens && n_prompt == o.n_prompt &&
         n_generated == o.n_generated && sampler.rng == o.sampler.rng && sampler.recent == o.sampler.recent &&
         stop_held == o.stop_held && utf8_pending == o.utf8_pending && text == o.text &&
         finish_reason == o.finish_reason && options.max_tokens == o.options.max_tokens &&
         options.stop == o.options.stop && options.ignore_eos == o.options.ignore_eos &&
         options.sampler == o.options.sampler && options.min_tokens == o.options.min_tokens &&
         options.stop_token_ids == o.options.stop_token_ids && options.constraint == o.options.constraint &&
         kv_type == o.kv_type;
}

std::string serialize_checkpoint(const Checkpoint& c) {
  Writer p;
  p.str(c.model_fingerprint);
  p.ids(c.tokens);
  p.i32(c.n_prompt);
  p.i32(c.n_generated);
  for (uint64_t w : c.sampler.rng) p.u64(w);
  p.ids(c.sampler.recent);
  p.str(c.stop_held);
  p.str(c.utf8_pending);
  p.str(c.text);
  p.str(std::string(finish_reason_name(c.finish_reason)));  // by name: the format is text, as it was
  p.i32(c.options.max_tokens);
  p.u8(c.options.ignore_eos ? 1 : 0);
  const SamplerParams& s = c.options.sampler;
  p.f32(s.temperature);
  p.i32(s.top_k);
  p.f32(s.top_p);
  p.f32(s.min_p);
  p.f32(s.repeat_penalty);
  p.i32(s.repeat_last_n);
  p.u64(s.seed);
  p.u32(static_cast<uint32_t>(c.options.stop.size()));
  for (const auto& st : c.options.stop) p.str(st);
  p.str(c.kv_type);  // version 2
  p.f32(s.frequency_penalty);  // version 3
  p.f32(s.presence_penalty);
  p.u32(static_cast<uint32_t>(s.logit_bias.size()));
  for (const LogitBias& b : s.logit_bias) {
    p.i32(b.id);
    p.f32(b.bias);
  }
  p.i32(c.options.min_tokens);
  p.ids(c.options.stop_token_ids);
  p.u8(static_cast<uint8_t>(c.options.constraint.kind));  // version 4
  p.str(c.options.constraint.schema);

  Writer w;
  w.out.assign(kMagic, sizeof kMagic);
  w.u32(Checkpoint::kVersion);
  w.u64(p.out.size());
  w.out += p.out;
  w.u64(fnv1a64(p.out));
  return w.out;
}

Result<Checkpoint> parse_checkpoint(std::string_view bytes) {
  Reader h(bytes);
  SPW_RETURN_IF_ERROR(h.need(sizeof kMagic, "magic"));
  if (std::memcmp(bytes.data(), kMagic, sizeof kMagic) != 0) return Status::corruption("checkpoint: bad magic");
  Reader r0(bytes.substr(sizeof kMagic));
  uint32_t version;
  uint64_t size;
  SPW_RETURN_IF_ERROR(r0.u32(version, "version"));
  if (version < 1 || version > Checkpoint::kVersion)
    return Status::invalid_argument("checkpoint: unsupported version " + std::to_string(version));
  SPW_RETURN_IF_ERROR(r0.u64(size, "payload_size"));
  if (size > r0.remaining() || r0.remaining() - size < 8)
    return Status::corruption("checkpoint truncated: payload_size " + std::to_string(size) + " but " +
                              std::to_string(r0.remaining()) + " bytes follow");
  if (r0.remaining() - size > 8)
    return Status::corruption("checkpoint: " + std::to_string(r0.remaining() - size - 8) + " trailing bytes");
  const size_t payload_off = sizeof kMagic + 12;
  std::string_view payload = bytes.substr(payload_off, static_cast<size_t>(size));
  Reader tail(bytes.substr(payload_off + static_cast<size_t>(size)));
  uint64_t sum;
  SPW_RETURN_IF_ERROR(tail.u64(sum, "checksum"));
  if (sum != fnv1a64(payload)) return Status::corruption("checkpoint: checksum mismatch (field 'checksum')");

  Checkpoint c;
  Reader r(payload);
  SPW_RETURN_IF_ERROR(r.str(c.model_fingerprint, "model_fingerprint"));
  SPW_RETURN_IF_ERROR(r.ids(c.tokens, "tokens"));
  SPW_RETURN_IF_ERROR(r.i32(c.n_prompt, "n_prompt"));
  SPW_RETURN_IF_ERROR(r.i32(c.n_generated, "n_generated"));
  for (auto& w : c.sampler.rng) SPW_RETURN_IF_ERROR(r.u64(w, "sampler.rng"));
  SPW_RETURN_IF_ERROR(r.ids(c.sampler.recent, "sampler.recent"));
  SPW_RETURN_IF_ERROR(r.str(c.stop_held, "stop_held"));
  SPW_RETURN_IF_ERROR(r.str(c.utf8_pending, "utf8_pending"));
  SPW_RETURN_IF_ERROR(r.str(c.text, "text"));
  std::string finish;
  SPW_RETURN_IF_ERROR(r.str(finish, "finish_reason"));
  const std::optional<FinishReason> fr = parse_finish_reason(finish);
  if (!fr) return Status::corruption("checkpoint: field 'finish_reason' = '" + finish + "'");
  c.finish_reason = *fr;
  SPW_RETURN_IF_ERROR(r.i32(c.options.max_tokens, "options.max_tokens"));
  uint8_t ie = 0;
  SPW_RETURN_IF_ERROR(r.u8(ie, "options.ignore_eos"));
  if (ie > 1) return Status::corruption("checkpoint: field 'options.ignore_eos' = " + std::to_string(ie));
  c.options.ignore_eos = ie != 0;
  SamplerParams& s = c.options.sampler;
  SPW_RETURN_IF_ERROR(r.f32(s.temperature, "options.sampler.temperature"));
  SPW_RETURN_IF_ERROR(r.i32(s.top_k, "options.sampler.top_k"));
  SPW_RETURN_IF_ERROR(r.f32(s.top_p, "options.sampler.top_p"));
  SPW_RETURN_IF_ERROR(r.f32(s.min_p, "options.sampler.min_p"));
  SPW_RETURN_IF_ERROR(r.f32(s.repeat_penalty, "options.sampler.repeat_penalty"));
  SPW_RETURN_IF_ERROR(r.i32(s.repeat_last_n, "options.sampler.repeat_last_n"));
  SPW_RETURN_IF_ERROR(r.u64(s.seed, "options.sampler.seed"));
  uint32_t n_stop;
  SPW_RETURN_IF_ERROR(r.u32(n_stop, "options.stop"));
  if (n_stop > r.remaining() / 4) return Status::corruption("checkpoint: field 'options.stop' count too large");
  c.options.stop.resize(n_stop);
  for (auto& st : c.options.stop) SPW_RETURN_IF_ERROR(r.str(st, "options.stop"));
  if (version >= 2) SPW_RETURN_IF_ERROR(r.str(c.kv_type, "kv_type"));
  if (version >= 3) SPW_RETURN_IF_ERROR(parse_v3_fields(r, c));
  if (version >= 4) SPW_RETURN_IF_ERROR(parse_v4_fields(r, c));
  if (r.remaining() != 0)
    return Status::corruption("checkpoint: " + std::to_string(r.remaining()) + " unparsed payload bytes");
  if (c.n_prompt < 0 || static_cast<size_t>(c.n_prompt) > c.tokens.size())
    return Status::corruption("checkpoint: field 'n_prompt' = " + std::to_string(c.n_prompt) + " exceeds " +
                              std::to_string(c.tokens.size()) + " tokens");
  if (c.n_generated != static_cast<int32_t>(c.tokens.size()) - c.n_prompt)
    return Status::corruption("checkpoint: field 'n_generated' = " + std::to_string(c.n_generated) +
                              " inconsistent with tokens/n_prompt");
  return c;
}

Checkpoint start_checkpoint(std::string model_fingerprint, std::vector<TokenId> prompt, GenerateOptions options) {
  Checkpoint cp;
  cp.model_fingerprint = std::move(model_fingerprint);
  cp.n_prompt = static_cast<int32_t>(prompt.size());
  cp.tokens = std::move(prompt);
  // As Generator::start leaves it: seeded, the prompt in its penalty window.
  Sampler sampler(options.sampler);
  sampler.accept_prompt(cp.tokens);
  cp.sampler = sampler.state();
  cp.options = std::move(options);
  return cp;
}

Status check_safe_point(const Checkpoint& cp, const SafePointRules& rules) {
  if (cp.finish_reason != FinishReason::kNone) {
    return Status(StatusCode::kFailedPrecondition,
                  "the generation already finished (" + std::string(finish_reason_name(cp.finish_reason)) + ")",
                  FailureReason::kNotSafePoint);
  }
  // Text the stop matcher holds back is part of the generation too: a marker
  // may be split between the emitted text and the held part.
  const std::string text = cp.text + cp.stop_held;
  for (const SafePointRules::Span& span : rules.spans) {
    if (span.open.empty()) continue;
    const size_t open = text.rfind(span.open);
    if (open == std::string::npos) continue;
    if (!span.close.empty() && text.find(span.close, open + span.open.size()) != std::string::npos) continue;
    return Status(StatusCode::kFailedPrecondition,
                  "not a safe point: token " + std::to_string(cp.n_generated) + " is inside \"" + span.open +
                      "\" ... \"" + span.close + "\" (opened at byte " + std::to_string(open) + ")",
                  FailureReason::kNotSafePoint);
  }
  return Status::ok_status();
}

}  // namespace spw
