// Cost of one response_format step: the token mask (JsonMatcher over the
// vocabulary's byte trie, engine/output_constraint.h) for a few states of a
// schema, on three vocabularies: the bundled stories260K (512 tokens, SPM),
// Llama 2's (32,000 tokens, SPM with byte fallback) and GPT-2's (50,257,
// byte-level BPE) from tests/data. The states are where a mask costs least
// (after a value: a handful of structural bytes) and most (inside a string:
// almost the whole trie is walked). docs/PERFORMANCE.md has the figures.
// Also: the trie build (once per vocabulary per process) and a schema
// compile (once per request).
#include <benchmark/benchmark.h>

#include <string>

#include "core/env.h"
#include "engine/output_constraint.h"
#include "gguf/gguf.h"
#include "grammar/json_matcher.h"
#include "tokenizer/tokenizer.h"

namespace spw {
namespace {

const char* kVocabs[] = {"models/stories260K.gguf", "tests/data/llama-2-tiny-random.gguf",
                         "tests/data/vocab/ggml-vocab-gpt-2.gguf"};

const Tokenizer& tokenizer(int which) {
  static std::unique_ptr<Tokenizer> t[3];
  if (!t[which]) {
    auto f = gguf::GgufFile::open(Env::default_env(), std::string(SPILLWAY_SOURCE_DIR) + "/" + kVocabs[which]);
    if (!f.ok()) std::abort();
    auto tok = Tokenizer::from_gguf(**f);
    if (!tok.ok()) std::abort();
    t[which] = std::move(*tok);
  }
  return *t[which];
}

constexpr const char* kSchema =
    R"({"type": "object", "properties": {"name": {"type": "string", "maxLength": 40}, "age": {"type": "integer"},
        "tags": {"type": "array", "items": {"enum": ["red", "green", "blue"]}}, "note": {"anyOf": [{"type": "null"},
        {"type": "string"}]}}, "required": ["name", "age"], "additionalProperties": false})";

// The prefix each state is reached by.
const char* kStates[] = {"", "{\"name\": \"Li", "{\"name\": \"Lily\", \"age\": 4", "{\"name\": \"Lily\", \"tags\": [\"re",
                         "{\"name\": \"Lily\", \"age\": 4, \"note\": \"a"};
const char* kStateNames[] = {"start", "in_string", "in_number", "in_enum", "in_union_string"};

void BM_Mask(benchmark::State& state) {
  const Tokenizer& tok = tokenizer(static_cast<int>(state.range(0)));
  auto trie = vocab_trie_for(tok);
  auto g = grammar::compile_constraint({grammar::ConstraintKind::kJsonSchema, kSchema});
  if (!g.ok()) std::abort();
  grammar::JsonMatcher m(*g);
  if (!m.feed(kStates[state.range(1)])) std::abort();
  std::vector<uint64_t> mask;
  size_t allowed = 0;
  for (auto _ : state) {
    m.allowed_tokens(*trie, mask);
    benchmark::DoNotOptimize(mask.data());
  }
  for (uint64_t w : mask) allowed += static_cast<size_t>(__builtin_popcountll(w));
  state.SetLabel(std::string(kVocabs[state.range(0)]) + " " + kStateNames[state.range(1)] + " n_vocab=" +
                 std::to_string(tok.n_vocab()) + " trie_nodes=" + std::to_string(trie->n_nodes()) +
                 " allowed=" + std::to_string(allowed));
}
BENCHMARK(BM_Mask)->ArgsProduct({{0, 1, 2}, {0, 1, 2, 3, 4}})->Unit(benchmark::kMicrosecond);

void BM_TrieBuild(benchmark::State& state) {
  const Tokenizer& tok = tokenizer(static_cast<int>(state.range(0)));
  std::vector<std::string> pieces(static_cast<size_t>(tok.n_vocab()));
  for (TokenId id = 0; id < tok.n_vocab(); ++id) pieces[static_cast<size_t>(id)] = tok.token_piece(id);
  for (auto _ : state) {
    grammar::VocabTrie t(pieces);
    benchmark::DoNotOptimize(t.n_nodes());
  }
  state.SetLabel(kVocabs[state.range(0)]);
}
BENCHMARK(BM_TrieBuild)->Arg(0)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond);

void BM_Compile(benchmark::State& state) {
  for (auto _ : state) {
    auto g = grammar::compile_constraint({grammar::ConstraintKind::kJsonSchema, kSchema});
    benchmark::DoNotOptimize(g.ok());
  }
}
BENCHMARK(BM_Compile)->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace spw

BENCHMARK_MAIN();
