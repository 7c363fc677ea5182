// Byte-level BPE pre-tokenizers over PCRE2 (see pre_tokenizer.h for the
// contract and how llama.cpp's matching is reproduced).
//
// The regexes are the models' own (their tokenizer.json pre_tokenizer), in
// the form llama.cpp uses them (e.g. Llama 3's (?i:...) spelled out as
// character pairs); DeepSeek's non-ASCII literals are written as \x{...}.
#include "tokenizer/pre_tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <utility>

namespace spw {
namespace {

// ---- the regex sets ----------------------------------------------------------

// GPT-2's split, shared by most sets.
constexpr const char* kGpt2 = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S))";
constexpr const char* kLlama3 =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// Qwen2: Llama 3's with single digits.
constexpr const char* kQwen2 =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr const char* kBloom = R"( ?[^(\s|.,!?\x{2026}\x{3002}\x{FF0C}\x{3001}\x{964}\x{6D4}\x{60C})]+)";
constexpr const char* kCjk = R"([\x{4E00}-\x{9FA5}\x{800}-\x{4E00}\x{AC00}-\x{D7FF}]+)";
// DeepSeek LLM's letters: the Latin, Greek, Cyrillic, ... letter ranges of
// its tokenizer.json, not \p{L}.
constexpr const char* kDeepseekLetters =
    R"(\s?[A-Za-z\x{B5}\x{C0}-\x{D6}\x{D8}-\x{F6}\x{F8}-\x{1BA}\x{1BC}-\x{1BF}\x{1C4}-\x{293}\x{295}-\x{2AF})"
    R"(\x{370}-\x{373}\x{376}\x{377}\x{37B}-\x{37D}\x{37F}\x{386}\x{388}-\x{38A}\x{38C}\x{38E}-\x{3A1})"
    R"(\x{3A3}-\x{3F5}\x{3F7}-\x{481}\x{48A}-\x{52F}\x{531}-\x{556}\x{10A0}-\x{10C5}\x{13A0}-\x{13F5})"
    R"(\x{13F8}-\x{13FD}\x{1C90}-\x{1CBA}\x{1CBD}-\x{1CBF}\x{1D00}-\x{1D2B}\x{1D6B}-\x{1D77}\x{1D79}-\x{1D9A})"
    R"(\x{1E00}-\x{1F15}\x{1F18}-\x{1F1D}\x{1F20}-\x{1F45}\x{1F48}-\x{1F4D}\x{1F50}-\x{1F57}\x{1F59}\x{1F5B})"
    R"(\x{1F5D}\x{1F5F}-\x{1F7D}\x{1F80}-\x{1FB4}\x{1FB6}-\x{1FBC}\x{1FBE}\x{1FC2}-\x{1FC4}\x{1FC6}-\x{1FCC})"
    R"(\x{1FD0}-\x{1FD3}\x{1FD6}-\x{1FDB}\x{1FE0}-\x{1FEC}\x{1FF2}-\x{1FF4}\x{1FF6}-\x{1FFC}\x{2102}\x{2107})"
    R"(\x{210A}-\x{2113}\x{2115}\x{2119}-\x{211D}\x{2124}\x{2126}\x{2128}\x{212A}-\x{212D}\x{212F}-\x{2134})"
    R"(\x{2139}\x{213C}-\x{213F}\x{2145}-\x{2149}\x{214E}\x{2183}\x{2184}\x{2C00}-\x{2C7B}\x{2C7E}-\x{2CE4})"
    R"(\x{2CEB}-\x{2CEE}\x{2CF2}\x{2CF3}\x{A640}-\x{A66D}\x{A680}-\x{A69B}\x{A722}-\x{A76F}\x{A771}-\x{A787})"
    R"(\x{A78B}-\x{A78E}\x{AB70}-\x{ABBF}\x{FB00}-\x{FB06}\x{FB13}-\x{FB17}\x{FF21}-\x{FF3A}\x{FF41}-\x{FF5A})"
    R"(\x{10400}-\x{1044F}\x{104B0}-\x{104D3}\x{104D8}-\x{104FB}\x{10C80}-\x{10CB2}\x{10CC0}-\x{10CF2})"
    R"(\x{118A0}-\x{118DF}\x{1E900}-\x{1E943}]+)";
constexpr const char* kDeepseekPunct = R"(\s?[!-/:-~\x{FF01}-\x{FF0F}\x{FF1A}-\x{FF5E}\x{2018}-\x{201F}\x{3000}-\x{3002}]+)";
// DeepSeek V3/R1: digits in threes, CJK ideographs and kana, then Llama 3's
// split with punctuation and symbols apart from letters (to_pcre() gives its
// \p{S} llama.cpp's meaning).
constexpr const char* kDeepseekV3Cjk = R"([\x{4E00}-\x{9FA5}\x{3040}-\x{309F}\x{30A0}-\x{30FF}]+)";
constexpr const char* kDeepseekV3 =
    R"([!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

struct PreSpec {
  std::vector<std::string_view> names;
  std::vector<const char*> patterns;
  bool ignore_merges = false;
  bool add_bos = false;
};

// tokenizer.ggml.pre values and their sets, as llama.cpp (2025-02) maps them.
const std::vector<PreSpec>& specs() {
  static const std::vector<PreSpec> kSpecs = {
      {{"default", ""},
       {R"([\p{P}\$\+<=>\^~\|]+)", kGpt2, R"(\p{N}+)", R"([0-9][0-9][0-9])"}},
      {{"llama3", "llama-v3", "llama-bpe", "falcon3"}, {kLlama3}, true, true},
      {{"dbrx", "smaug-bpe", "chatglm-bpe"}, {kLlama3}},
      {{"deepseek-llm"}, {R"([\r\n])", kDeepseekLetters, kDeepseekPunct, R"(\s+$)", kCjk, R"(\p{N}+)"}},
      {{"deepseek-coder"}, {R"([\r\n])", R"(\s?\p{L}+)", R"(\s?\p{P}+)", kCjk, R"(\p{N})"}},
      {{"falcon"}, {R"([\p{P}\$\+<=>\^~\|`]+)", kGpt2, R"([0-9][0-9][0-9])"}},
      {{"starcoder", "refact", "command-r", "smollm", "codeshell", "exaone", "minerva-7b"}, {R"(\p{N})", kGpt2}},
      {{"gpt-2", "mpt", "olmo", "jais", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v1-en", "jina-v2-es",
        "jina-v2-de", "jina-v2-code", "roberta-bpe"},
       {kGpt2}},
      {{"qwen2", "deepseek-r1-qwen", "megrez", "stablelm2"}, {kQwen2}},
      {{"deepseek-v3"}, {R"(\p{N}{1,3})", kDeepseekV3Cjk, kDeepseekV3}},
      {{"chameleon"},
       {R"(<sentinel:[0-9]+>)", R"((IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z)", "([\t\n]|    |  )", R"(\p{N})",
        R"([\p{P}!-/:-@\[-`{-~])", kGpt2},
       false,
       true},
      {{"poro-chat", "bloom", "gpt3-finnish"}, {kBloom}},
      {{"viking"}, {kBloom, R"(\p{N})"}},
      {{"tekken"},
       {R"([^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)"},
       true,
       true},
  };
  return kSpecs;
}

// ---- llama.cpp's code point view of the text ------------------------------------

constexpr uint32_t kReplacementCpt = 0xFFFD;
constexpr uint32_t kPrivateUseCpt = 0xE000;

// Decodes as llama.cpp's unicode_cpts_from_utf8: lead bytes decide the length,
// continuation bytes are checked only for their 10xxxxxx form (so overlongs
// and surrogates pass), and a byte that fails becomes U+FFFD on its own.
std::vector<uint32_t> lenient_code_points(std::string_view s) {
  std::vector<uint32_t> out;
  out.reserve(s.size());
  auto cont = [&](size_t i) { return i < s.size() && (static_cast<uint8_t>(s[i]) & 0xC0) == 0x80; };
  auto b = [&](size_t i) { return static_cast<uint32_t>(static_cast<uint8_t>(s[i])); };
  size_t i = 0;
  while (i < s.size()) {
    uint32_t c = b(i);
    if (c < 0x80) {
      out.push_back(c);
      i += 1;
    } else if ((c & 0x40) == 0) {
      out.push_back(kReplacementCpt);
      i += 1;
    } else if ((c & 0x20) == 0) {
      if (cont(i + 1)) {
        out.push_back(((c & 0x1F) << 6) | (b(i + 1) & 0x3F));
        i += 2;
      } else {
        out.push_back(kReplacementCpt);
        i += 1;
      }
    } else if ((c & 0x10) == 0) {
      if (cont(i + 1) && cont(i + 2)) {
        out.push_back(((c & 0x0F) << 12) | ((b(i + 1) & 0x3F) << 6) | (b(i + 2) & 0x3F));
        i += 3;
      } else {
        out.push_back(kReplacementCpt);
        i += 1;
      }
    } else if ((c & 0x08) == 0) {
      if (cont(i + 1) && cont(i + 2) && cont(i + 3)) {
        out.push_back(((c & 0x07) << 18) | ((b(i + 1) & 0x3F) << 12) | ((b(i + 2) & 0x3F) << 6) | (b(i + 3) & 0x3F));
        i += 4;
      } else {
        out.push_back(kReplacementCpt);
        i += 1;
      }
    } else {
      out.push_back(kReplacementCpt);
      i += 1;
    }
  }
  return out;
}

// UTF-8 of a code point as llama.cpp writes it (surrogates included);
// beyond U+10FFFF, where llama.cpp throws, U+FFFD.
void append_utf8(uint32_t c, std::string* out) {
  if (c > 0x10FFFF) c = kReplacementCpt;
  if (c <= 0x7F) {
    out->push_back(static_cast<char>(c));
  } else if (c <= 0x7FF) {
    out->push_back(static_cast<char>(0xC0 | (c >> 6)));
    out->push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else if (c <= 0xFFFF) {
    out->push_back(static_cast<char>(0xE0 | (c >> 12)));
    out->push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (c >> 18)));
    out->push_back(static_cast<char>(0x80 | ((c >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (c & 0x3F)));
  }
}

// Unicode's White_Space property (PropList.txt), which is llama.cpp's table.
bool is_white_space(uint32_t c) {
  if (c >= 0x09 && c <= 0x0D) return true;
  if (c >= 0x2000 && c <= 0x200A) return true;
  switch (c) {
    case 0x20: case 0x85: case 0xA0: case 0x1680: case 0x2028: case 0x2029: case 0x202F: case 0x205F:
    case 0x3000:
      return true;
    default:
      return false;
  }
}

// The whitespace class after non-ASCII whitespace became U+000B.
constexpr std::string_view kWsClassBody = R"(\t\n\x0B\f\r )";

// A character class's body with \s rewritten (see to_pcre).
Result<std::string> class_body(std::string_view body, std::string_view pattern) {
  std::string out;
  for (size_t i = 0; i < body.size(); ++i) {
    if (body[i] == '\\' && i + 1 < body.size()) {
      const char e = body[++i];
      // \S inside a class would need set subtraction; no supported pattern has one.
      if (e == 'S') return Status::internal("pre-tokenizer regex has \\S inside a class: " + std::string(pattern));
      if (e == 's') {
        out.append(kWsClassBody);
      } else {
        out.push_back('\\');
        out.push_back(e);
      }
      continue;
    }
    out.push_back(body[i]);
  }
  return out;
}

// llama.cpp's regex text -> what PCRE2 runs for the same matches:
// - \s and \S become explicit classes (see pre_tokenizer.h).
// - \p{S} loses ASCII '~': llama.cpp matches its categories on a collapsed
//   text where ASCII keeps itself and \p{S} is rewritten to its table's
//   symbols plus the ASCII list $+<=>^`| (unicode.cpp's k_ucat_map), which
//   leaves out '~' (Unicode Sm). Outside a class that is [^\P{S}~]; a class
//   with \p{S} and no '~' of its own becomes (?:(?!~)[...]), or (?:~|[^...])
//   when negated (then '~' is outside the set, so the negation takes it).
//   A class that writes '~' (alone or ending a range) keeps it either way.
Result<std::string> to_pcre(std::string_view p) {
  std::string out;
  for (size_t i = 0; i < p.size(); ++i) {
    const char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      const char e = p[++i];
      if (e == 's') {
        out.append("[").append(kWsClassBody).append("]");
      } else if (e == 'S') {
        out.append("[^").append(kWsClassBody).append("]");
      } else if (e == 'p' && p.substr(i + 1, 3) == "{S}") {
        out.append("[^\\P{S}~]");
        i += 3;
      } else {
        out.push_back('\\');
        out.push_back(e);
      }
      continue;
    }
    if (c != '[') {
      out.push_back(c);
      continue;
    }
    // A class: find its closing ']' (escapes skipped; no nested classes).
    size_t end = i + 1;
    while (end < p.size() && p[end] != ']') end += p[end] == '\\' ? 2 : 1;
    if (end >= p.size()) return Status::internal("pre-tokenizer regex has an unclosed class: " + std::string(p));
    const std::string_view body = p.substr(i + 1, end - i - 1);
    SPW_ASSIGN_OR_RETURN(std::string rewritten, class_body(body, p));
    const std::string cls = "[" + rewritten + "]";
    const bool symbols_without_tilde =
        body.find("\\p{S}") != std::string_view::npos && body.find('~') == std::string_view::npos;
    if (!symbols_without_tilde) {
      out.append(cls);
    } else if (!body.empty() && body[0] == '^') {
      out.append("(?:~|").append(cls).append(")");
    } else {
      out.append("(?:(?!~)").append(cls).append(")");
    }
    i = end;
  }
  return out;
}

}  // namespace

struct PreTokenizer::Regex {
  pcre2_code* code = nullptr;
  ~Regex() {
    if (code != nullptr) pcre2_code_free(code);
  }
};

PreTokenizer::~PreTokenizer() = default;

std::vector<std::string_view> PreTokenizer::supported_names() {
  std::vector<std::string_view> out;
  for (const PreSpec& s : specs()) {
    for (std::string_view n : s.names) {
      if (!n.empty()) out.push_back(n);
    }
  }
  return out;
}

Result<std::unique_ptr<PreTokenizer>> PreTokenizer::create(std::string_view name) {
  const PreSpec* spec = nullptr;
  for (const PreSpec& s : specs()) {
    if (std::find(s.names.begin(), s.names.end(), name) != s.names.end()) spec = &s;
  }
  if (spec == nullptr) {
    std::string list;
    for (std::string_view n : supported_names()) list.append(list.empty() ? "" : ", ").append(n);
    return Status::invalid_argument("tokenizer.ggml.pre '" + std::string(name) +
                                    "' is not a supported BPE pre-tokenizer; supported: " + list);
  }
  std::unique_ptr<PreTokenizer> p(new PreTokenizer());
  p->name_ = name.empty() ? "default" : std::string(name);
  p->ignore_merges_ = spec->ignore_merges;
  p->add_bos_ = spec->add_bos;
  for (const char* pattern : spec->patterns) {
    p->patterns_.emplace_back(pattern);
    SPW_ASSIGN_OR_RETURN(std::string rewritten, to_pcre(pattern));
    int err = 0;
    PCRE2_SIZE err_off = 0;
    auto re = std::make_unique<Regex>();
    re->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(rewritten.data()), rewritten.size(),
                             PCRE2_UTF | PCRE2_UCP | PCRE2_DOLLAR_ENDONLY, &err, &err_off, nullptr);
    if (re->code == nullptr) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(err, msg, sizeof msg);
      return Status::internal("pre-tokenizer '" + p->name_ + "': regex does not compile at offset " +
                              std::to_string(err_off) + ": " + reinterpret_cast<const char*>(msg));
    }
    // JIT is an optimisation only: without it pcre2_match interprets.
    (void)pcre2_jit_compile(re->code, PCRE2_JIT_COMPLETE);
    p->regexes_.push_back(std::move(re));
  }
  return p;
}

std::vector<std::string> PreTokenizer::split(std::string_view text) const {
  std::vector<std::string> words;
  if (text.empty()) return words;
  const std::vector<uint32_t> cpts = lenient_code_points(text);

  // The subject PCRE2 sees: valid UTF-8, non-ASCII whitespace as U+000B,
  // code points PCRE2 would refuse (surrogates, > U+10FFFF) as U+E000, a
  // private-use (category C) code point, because llama.cpp's table calls
  // surrogates control and knows nothing beyond U+10FFFF: neither is a
  // letter, number, punctuation, symbol or mark there (U+FFFD would be a
  // symbol to deepseek-v3's \p{S}); starts[i] = byte offset of code point i.
  std::string subject;
  subject.reserve(text.size());
  std::vector<size_t> starts(cpts.size() + 1);
  for (size_t i = 0; i < cpts.size(); ++i) {
    starts[i] = subject.size();
    uint32_t c = cpts[i];
    if (c > 0x7F && is_white_space(c)) c = 0x0B;
    if ((c >= 0xD800 && c <= 0xDFFF) || c > 0x10FFFF) c = kPrivateUseCpt;
    append_utf8(c, &subject);
  }
  starts[cpts.size()] = subject.size();
  auto cpt_at = [&](size_t byte) {
    return static_cast<size_t>(std::lower_bound(starts.begin(), starts.end(), byte) - starts.begin());
  };

  // Words as [begin, end) code point ranges.
  std::vector<std::pair<size_t, size_t>> spans = {{0, cpts.size()}}, next;
  for (const auto& re : regexes_) {
    pcre2_match_data* md = pcre2_match_data_create_from_pattern(re->code, nullptr);
    next.clear();
    for (auto [cb, ce] : spans) {
      const size_t b0 = starts[cb], b1 = starts[ce];
      const auto* subj = reinterpret_cast<PCRE2_SPTR>(subject.data() + b0);
      const size_t len = b1 - b0;
      size_t prev = 0, at = 0;
      while (at < len) {
        int rc = pcre2_match(re->code, subj, len, at, PCRE2_NO_UTF_CHECK, md, nullptr);
        if (rc < 0 && rc != PCRE2_ERROR_NOMATCH) {
          // A JIT stack or match limit: retry interpreted, else give up on
          // the rest of this word (it stays one piece).
          rc = pcre2_match(re->code, subj, len, at, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, md, nullptr);
        }
        if (rc < 0) break;
        const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
        size_t m0 = ov[0], m1 = ov[1];
        if (m1 <= m0) {  // empty match: none of our patterns has one; step on
          at = m0 + 1;
          while (at < len && (static_cast<uint8_t>(subject[b0 + at]) & 0xC0) == 0x80) ++at;
          continue;
        }
        if (m0 > prev) next.emplace_back(cpt_at(b0 + prev), cpt_at(b0 + m0));
        next.emplace_back(cpt_at(b0 + m0), cpt_at(b0 + m1));
        prev = at = m1;
      }
      if (prev < len) next.emplace_back(cpt_at(b0 + prev), ce);
    }
    pcre2_match_data_free(md);
    spans.swap(next);
  }

  words.reserve(spans.size());
  for (auto [cb, ce] : spans) {
    std::string w;
    for (size_t i = cb; i < ce; ++i) append_utf8(cpts[i], &w);
    words.push_back(std::move(w));
  }
  return words;
}

}  // namespace spw
