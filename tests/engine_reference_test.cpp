// Engine vs reference: the CPU engine's logits must match the naive double
// precision forward pass of tests/reference for every position.
//
// Measure: per position p, err_p = ||engine_p - ref_p||_inf / ||ref_p||_inf;
// the test asserts max_p err_p below a bound per weight type:
//  * F32 and F16 weights: 1e-4. Both sides see the same weight values (F16 is
//    widened exactly); the engine differs only by float rounding in sums of at
//    most a few hundred terms per dot product over a few layers, ~1e-6 relative.
//  * Q8_0 weights: 3e-2. The reference uses the exact dequantised weights d*q,
//    but the engine, like llama.cpp, also quantises each activation block to
//    Q8_0 (8-bit, scale max|x|/127) before the integer dot product. That adds a
//    rounding error of up to half a step (max|x|/254, ~0.4% of the block's
//    largest element) to every activation, on every matmul of every layer,
//    which accumulates to around 1e-2 relative in the logits of these models.
//  * Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K and a Q4_K_M mix: 3e-2, for the
//    same reason. The reference again uses the exact dequantised weights, so
//    the weights' own 4-6 bit rounding is not part of the error; what remains
//    is the 8-bit activation quantisation (Q8_0 for Q4_0/Q5_0, Q8_1 for
//    Q4_1/Q5_1: the same step max|x|/127 per 32 elements; Q8_K for the K types:
//    one step per 256 elements, coarser next to an outlier). Measured maxima:
//    2.2e-2 (stories260K Q5_0), 2.0e-2 (K types at n_embd 256); the inputs
//    are fixed, so the margin is not eaten by chance.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "core/env.h"
#include "engine/device_session.h"
#include "engine/engine_test_util.h"
#include "kv/kv_cache.h"
#include "engine/session.h"
#include "gguf/gguf.h"
#include "gguf/quant.h"
#include "model/model.h"
#include "tests/reference/llama_reference.h"
#include "tools/modelgen/random_llama.h"

namespace spw {
namespace {

using gguf::GgmlType;

constexpr double kF32Bound = 1e-4;
constexpr double kF16Bound = 1e-4;
constexpr double kQ8_0Bound = 3e-2;
constexpr double kLowBitBound = 3e-2;

using testing::source_path;

using testing::reencode;

Result<std::shared_ptr<const Model>> load_bytes(std::string bytes, const std::string& name) {
  SPW_ASSIGN_OR_RETURN(auto file, gguf::GgufFile::parse(make_memory_file(std::move(bytes), name)));
  return Model::load_from(std::move(file));
}

struct Comparison {
  double max_rel_err = 0;   // max over positions of ||e - r||_inf / ||r||_inf
  int worst_position = -1;
  bool greedy_equal = true;  // engine argmax == reference argmax at every position
};

Comparison compare(const std::vector<float>& engine, const std::vector<double>& ref, size_t n_vocab) {
  Comparison c;
  const size_t n = ref.size() / n_vocab;
  for (size_t p = 0; p < n; ++p) {
    double diff = 0, norm = 0;
    size_t ae = 0, ar = 0;
    for (size_t v = 0; v < n_vocab; ++v) {
      const double e = engine[p * n_vocab + v], r = ref[p * n_vocab + v];
      diff = std::max(diff, std::abs(e - r));
      norm = std::max(norm, std::abs(r));
      if (e > engine[p * n_vocab + ae]) ae = v;
      if (r > ref[p * n_vocab + ar]) ar = v;
    }
    const double rel = diff / norm;
    if (!(rel <= c.max_rel_err)) {  // also catches NaN
      c.max_rel_err = rel;
      c.worst_position = static_cast<int>(p);
    }
    c.greedy_equal &= ae == ar;
  }
  return c;
}

// Runs `tokens` through the engine twice -- all at once (ubatch 7, so prefill
// crosses ubatch and KV-block boundaries) and one token at a time -- and
// compares both with the reference.
void check_model(const std::shared_ptr<const Model>& model, const std::vector<TokenId>& tokens, double bound,
                 const std::string& label, bool expect_greedy_equal = true) {
  auto ref = reference::LlamaReference::load(model->file());
  ASSERT_TRUE(ref.ok()) << ref.status().to_string();
  auto ref_logits = (*ref)->forward(tokens);
  ASSERT_TRUE(ref_logits.ok()) << ref_logits.status().to_string();
  const LlamaHparams& hp = model->hparams();
  ASSERT_EQ((*ref)->hparams().n_vocab, hp.n_vocab);

  auto backend = std::make_shared<CpuBackend>(1);
  KvPoolOptions po;
  po.layer_begin = 0;
  po.layer_end = hp.n_layer;
  po.n_embd_kv = hp.n_embd_kv();
  po.block_tokens = 16;
  po.n_blocks = 2 * (static_cast<int32_t>(tokens.size()) / 16 + 2);
  auto pool = KvPool::create(po);
  ASSERT_TRUE(pool.ok()) << pool.status().to_string();

  SessionOptions so;
  so.n_ubatch = 7;
  so.n_ctx = static_cast<int32_t>(tokens.size()) + 8;
  auto batch = Session::create(model, backend, *pool, so);
  ASSERT_TRUE(batch.ok()) << batch.status().to_string();
  auto all = (*batch)->eval_all_logits(tokens);
  ASSERT_TRUE(all.ok()) << all.status().to_string();
  ASSERT_EQ(all->size(), ref_logits->size());

  auto single = Session::create(model, backend, *pool, so);
  ASSERT_TRUE(single.ok()) << single.status().to_string();
  std::vector<float> stepped;
  for (TokenId t : tokens) {
    auto l = (*single)->eval(std::span<const TokenId>(&t, 1));
    ASSERT_TRUE(l.ok()) << l.status().to_string();
    stepped.insert(stepped.end(), l->begin(), l->end());
  }

  const auto n_vocab = static_cast<size_t>(hp.n_vocab);
  const Comparison cb = compare(*all, *ref_logits, n_vocab);
  const Comparison cs = compare(stepped, *ref_logits, n_vocab);
  std::cout << "[measure] " << label << ": " << tokens.size() << " positions, max rel err batch "
            << cb.max_rel_err << " (pos " << cb.worst_position << "), token-by-token " << cs.max_rel_err
            << ", bound " << bound << "\n";
  EXPECT_LT(cb.max_rel_err, bound) << label << " worst position " << cb.worst_position;
  EXPECT_LT(cs.max_rel_err, bound) << label << " worst position " << cs.worst_position;
  if (expect_greedy_equal) {
    EXPECT_TRUE(cb.greedy_equal) << label;
    EXPECT_TRUE(cs.greedy_equal) << label;
  }
  // Batch-size invariance (Backend contract): bitwise equal.
  EXPECT_TRUE(*all == stepped) << label << ": batched and token-by-token logits differ";
}

std::vector<TokenId> story_tokens(const Model& model) {
  std::vector<TokenId> t = model.tokenizer().encode(
      "Once upon a time, there was a little girl named Lily. She loved to play outside in the park "
      "with her friends and her big red ball.",
      /*add_bos=*/true);
  return t;
}

class StoriesEngineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto m = Model::load(Env::default_env(), source_path("models/stories260K.gguf"));
    ASSERT_TRUE(m.ok()) << m.status().to_string();
    model_ = *m;
    tokens_ = story_tokens(*model_);
    ASSERT_GT(tokens_.size(), 20u);  // crosses a 16-token KV block
  }
  std::shared_ptr<const Model> model_;
  std::vector<TokenId> tokens_;
};

TEST_F(StoriesEngineTest, F32MatchesReference) {
  // stories260K: 8 query heads over 4 KV heads, so this is already GQA.
  check_model(model_, tokens_, kF32Bound, "stories260K F32");
}

TEST_F(StoriesEngineTest, F16MatchesReference) {
  auto m = load_bytes(reencode(model_->file(), GgmlType::kF16), "stories260K-f16");
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  ASSERT_EQ((*m)->layer(0).wq.type, GgmlType::kF16);
  check_model(*m, tokens_, kF16Bound, "stories260K F16");
}

TEST_F(StoriesEngineTest, Q8_0MatchesReference) {
  auto m = load_bytes(reencode(model_->file(), GgmlType::kQ8_0), "stories260K-q8_0");
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  ASSERT_EQ((*m)->layer(0).wq.type, GgmlType::kQ8_0);
  // Activation quantisation may flip a near-tie argmax; the bound is the check.
  check_model(*m, tokens_, kQ8_0Bound, "stories260K Q8_0", /*expect_greedy_equal=*/false);
}

TEST_F(StoriesEngineTest, LegacyLowBitTypesMatchReference) {
  // stories260K is 64 wide: whole 32-blocks, not K super-blocks.
  for (GgmlType t : {GgmlType::kQ4_0, GgmlType::kQ4_1, GgmlType::kQ5_0, GgmlType::kQ5_1}) {
    const std::string name = gguf::ggml_type_name(static_cast<uint32_t>(t));
    auto m = load_bytes(reencode(model_->file(), t), "stories260K-" + name);
    ASSERT_TRUE(m.ok()) << m.status().to_string();
    ASSERT_EQ((*m)->layer(0).wq.type, t);
    check_model(*m, tokens_, kLowBitBound, "stories260K " + name, /*expect_greedy_equal=*/false);
  }
}

TEST(TinyRandomEngineTest, RealF16FileMatchesReference) {
  // llama-2-tiny-random: a real converted F16 file with a 32000-token vocab.
  auto m = Model::load(Env::default_env(), source_path("tests/data/llama-2-tiny-random.gguf"));
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  std::vector<TokenId> tokens = {1};
  for (int i = 0; i < 23; ++i) tokens.push_back(static_cast<TokenId>((i * 7919 + 13) % 32000));
  check_model(*m, tokens, kF16Bound, "llama-2-tiny-random F16");
}

struct GenCase {
  uint32_t n_head_kv;
  GgmlType type;
  double bound;
  bool tied_output = false;
  uint32_t n_embd = 64;  // 256 for the K types (their super-block)
  uint32_t n_ff = 128;
  modelgen::RandomLlamaMix mix = modelgen::RandomLlamaMix::kNone;
  const char* arch = "llama";
  uint32_t head_dim = 0;  // 0: n_embd / n_head
  uint32_t rope_dims = 0;  // 0: the head size
  uint32_t n_expert = 0;   // a mixture of experts (n_ff is then each expert's width)
  uint32_t n_expert_used = 0;
  float expert_weights_scale = 0.0f;  // <arch>.expert_weights_scale when > 0
  // Gemma: layers (0: 2), positions (0: 37), the sliding window and caps as
  // RandomLlamaSpec's, and a linear RoPE factor (Gemma 3's global layers).
  uint32_t n_layer = 0;
  int n_positions = 0;
  uint32_t sliding_window = 0;
  float attn_softcap = 0.0f;
  float final_softcap = 0.0f;
  float rope_scale = 0.0f;
};

class GeneratedEngineTest : public ::testing::TestWithParam<GenCase> {};

TEST_P(GeneratedEngineTest, MatchesReference) {
  const GenCase c = GetParam();
  modelgen::RandomLlamaSpec spec;
  spec.arch = c.arch;
  spec.head_dim = c.head_dim;
  spec.rope_dims = c.rope_dims;
  spec.n_embd = c.n_embd;
  spec.n_layer = c.n_layer > 0 ? c.n_layer : 2;
  spec.n_head = 4;
  spec.n_head_kv = c.n_head_kv;
  spec.n_ff = c.n_ff;
  spec.type = c.type;
  spec.mix = c.mix;
  spec.tied_output = c.tied_output;
  spec.seed = 1234 + c.n_head_kv;
  spec.n_expert = c.n_expert;
  spec.n_expert_used = c.n_expert_used;
  spec.n_ff_shexp = 2 * c.n_ff;  // qwen2moe's shared expert: wider than one expert, as in Qwen1.5-MoE
  spec.expert_weights_scale = c.expert_weights_scale;
  spec.sliding_window = c.sliding_window;
  spec.attn_softcap = c.attn_softcap;
  spec.final_softcap = c.final_softcap;
  spec.rope_scale_linear = c.rope_scale;
  spec.rope_freq_base = spec.arch == "llama" ? 10000.0f : 1000000.0f;  // Qwen's base
  spec.vocab_path = source_path("models/stories260K.gguf");
  auto bytes = modelgen::make_random_llama(spec);
  ASSERT_TRUE(bytes.ok()) << bytes.status().to_string();
  auto m = load_bytes(std::move(bytes).value(), "random");
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  ASSERT_EQ((*m)->hparams().n_head, 4);
  ASSERT_EQ((*m)->hparams().n_head_kv, static_cast<int32_t>(c.n_head_kv));
  ASSERT_EQ((*m)->output_tied(), c.tied_output);
  std::vector<TokenId> tokens;
  const int n_positions = c.n_positions > 0 ? c.n_positions : 37;
  for (int i = 0; i < n_positions; ++i) tokens.push_back(static_cast<TokenId>((i * 31 + 3) % (*m)->hparams().n_vocab));
  ASSERT_EQ((*m)->hparams().arch, c.arch);
  const std::string label = std::string(c.arch) + " head_dim=" + std::to_string((*m)->hparams().head_dim()) +
                            " n_embd=" + std::to_string(c.n_embd) + " n_head=4 n_head_kv=" +
                            std::to_string(c.n_head_kv) + " n_rot=" + std::to_string((*m)->hparams().n_rot) + " " +
                            (c.mix == modelgen::RandomLlamaMix::kQ4_K_M ? std::string("Q4_K_M mix")
                                                                        : gguf::ggml_type_name(static_cast<uint32_t>(c.type))) +
                            (c.tied_output ? " tied" : "") +
                            (c.n_expert > 0 ? " experts " + std::to_string(c.n_expert_used) + "/" +
                                                  std::to_string(c.n_expert)
                                            : "");
  // Quantised activations may flip a near-tie argmax; the bound is the check.
  const bool float_weights = c.type == GgmlType::kF32 || c.type == GgmlType::kF16;
  check_model(*m, tokens, c.bound, label, float_weights && c.mix == modelgen::RandomLlamaMix::kNone);
}

INSTANTIATE_TEST_SUITE_P(
    Gqa, GeneratedEngineTest,
    ::testing::Values(GenCase{2, GgmlType::kF32, kF32Bound}, GenCase{1, GgmlType::kF32, kF32Bound},
                      GenCase{4, GgmlType::kF32, kF32Bound}, GenCase{2, GgmlType::kF32, kF32Bound, true},
                      GenCase{2, GgmlType::kF16, kF16Bound}, GenCase{1, GgmlType::kF16, kF16Bound},
                      GenCase{2, GgmlType::kQ8_0, kQ8_0Bound}, GenCase{1, GgmlType::kQ8_0, kQ8_0Bound},
                      GenCase{1, GgmlType::kQ8_0, kQ8_0Bound, true}));

// The low-bit types: legacy ones at n_embd 64, K types at 256 (one super-block
// per row of attn_*; ffn_down rows are n_ff = 512 wide).
INSTANTIATE_TEST_SUITE_P(
    LowBit, GeneratedEngineTest,
    ::testing::Values(GenCase{2, GgmlType::kQ4_0, kLowBitBound}, GenCase{2, GgmlType::kQ4_1, kLowBitBound},
                      GenCase{2, GgmlType::kQ5_0, kLowBitBound}, GenCase{1, GgmlType::kQ5_1, kLowBitBound, true},
                      GenCase{2, GgmlType::kQ4_K, kLowBitBound, false, 256, 512},
                      GenCase{2, GgmlType::kQ5_K, kLowBitBound, false, 256, 512},
                      GenCase{1, GgmlType::kQ6_K, kLowBitBound, true, 256, 512},
                      GenCase{2, GgmlType::kF32, kLowBitBound, false, 256, 512, modelgen::RandomLlamaMix::kQ4_K_M}));

// Qwen2 (Q/K/V biases, NeoX RoPE), Qwen3 (per-head Q/K norms, NeoX RoPE,
// a head size that is not n_embd / n_head, as every Qwen3 has) and Phi-3,
// against the reference's own implementation of each.
constexpr modelgen::RandomLlamaMix kNoMix = modelgen::RandomLlamaMix::kNone;
INSTANTIATE_TEST_SUITE_P(
    Architectures, GeneratedEngineTest,
    ::testing::Values(GenCase{2, GgmlType::kF32, kF32Bound, false, 64, 128, kNoMix, "qwen2"},
                      GenCase{2, GgmlType::kF32, kF32Bound, true, 64, 128, kNoMix, "qwen2"},
                      GenCase{2, GgmlType::kQ8_0, kQ8_0Bound, false, 64, 128, kNoMix, "qwen2"},
                      GenCase{2, GgmlType::kF32, kF32Bound, false, 64, 128, kNoMix, "qwen3", 32},
                      GenCase{1, GgmlType::kF16, kF16Bound, true, 64, 128, kNoMix, "qwen3", 32},
                      GenCase{2, GgmlType::kQ8_0, kQ8_0Bound, false, 64, 128, kNoMix, "qwen3", 32},
                      GenCase{2, GgmlType::kF32, kF32Bound, false, 64, 128, kNoMix, "llama", 8},
                      // Phi-3 (Q, K, V in one attn_qkv; gate and up in one ffn_up, bound as row
                      // ranges) and Phi-4-mini's partial RoPE (12 of 16 dimensions rotated).
                      GenCase{2, GgmlType::kF32, kF32Bound, false, 64, 128, kNoMix, "phi3"},
                      GenCase{4, GgmlType::kF16, kF16Bound, true, 64, 128, kNoMix, "phi3", 0, 12},
                      GenCase{1, GgmlType::kQ8_0, kQ8_0Bound, false, 64, 128, kNoMix, "phi3"}));

// Mixtures of experts (the reference's own router and experts): Mixtral
// (llama with experts), Qwen2-MoE (a shared expert, weights not
// renormalised) and Qwen3-MoE, 37 positions over 2 layers, so every expert
// is chosen by some rows and the batched pass groups several rows per
// expert. The router stays F32 in every file (as llama.cpp's quantiser
// leaves it); with Q8_0 experts the activations' quantisation may move a
// row's router input across a near tie between two experts, so that case
// checks the bound only, as the dense Q8_0 cases do.
INSTANTIATE_TEST_SUITE_P(
    Experts, GeneratedEngineTest,
    ::testing::Values(GenCase{2, GgmlType::kF32, kF32Bound, false, 64, 64, kNoMix, "llama", 0, 0, 8, 2},
                      GenCase{2, GgmlType::kF16, kF16Bound, true, 64, 64, kNoMix, "qwen2moe", 0, 0, 4, 2},
                      GenCase{2, GgmlType::kF32, kF32Bound, false, 64, 64, kNoMix, "qwen3moe", 32, 0, 8, 3},
                      GenCase{2, GgmlType::kQ8_0, kQ8_0Bound, false, 64, 64, kNoMix, "qwen3moe", 32, 0, 8, 2},
                      // expert_weights_scale: the chosen experts' weights scaled after the renormalisation.
                      GenCase{2, GgmlType::kF32, kF32Bound, false, 64, 64, kNoMix, "qwen3moe", 32, 0, 8, 2, 2.5f}));

// Gemma 2 and 3 (the reference's own post-norms, GELU, embedding scale,
// soft-capping, sliding windows and per-layer RoPE): 75 positions with a
// window of 8, so that a sliding layer's rows start past KV tiles the
// attention skips and within tiles it masks, in prefill chunks of 7 and one
// by one. Gemma 2's caps are set where random weights' scores and logits
// reach them (its defaults, 50 and 30, would leave them linear); Gemma 3's
// six layers are five sliding ones (base 10000, unscaled) and a global one
// (the file's base, linear factor 8).
INSTANTIATE_TEST_SUITE_P(
    Gemma, GeneratedEngineTest,
    ::testing::Values(
        GenCase{2, GgmlType::kF32, kF32Bound, true, 64, 128, kNoMix, "gemma2", 32, 0, 0, 0, 0, 3, 75, 8, 0.05f, 0.5f},
        GenCase{1, GgmlType::kQ8_0, kQ8_0Bound, true, 64, 128, kNoMix, "gemma2", 0, 0, 0, 0, 0, 2, 75, 8},
        GenCase{2, GgmlType::kF32, kF32Bound, true, 64, 128, kNoMix, "gemma3", 32, 0, 0, 0, 0, 6, 75, 8, 0, 0, 8},
        GenCase{2, GgmlType::kF16, kF16Bound, true, 64, 128, kNoMix, "gemma3", 16, 0, 0, 0, 0, 6, 75, 8}));


// The serving layout's pools (open_session_group) give a Gemma's sliding
// layers the window plane (kv_cache.h): 150 positions in ubatches of 7
// with a window of 8 and blocks of 4 hold a ring of window blocks, not the
// context's, and still match the reference (which keeps every position);
// a truncate back past the window, and a fork, continue with the logits an
// uninterrupted session gives (the truncated one evaluates its tokens again).
TEST(GemmaWindowPlane, MatchesReferenceInARingOfBlocks) {
  for (const char* arch : {"gemma2", "gemma3"}) {
    modelgen::RandomLlamaSpec spec = testing::gemma_spec(arch);
    spec.sliding_window = 8;
    spec.n_ctx = 160;
    auto bytes = modelgen::make_random_llama(spec);
    ASSERT_TRUE(bytes.ok()) << bytes.status().to_string();
    auto m = load_bytes(std::move(bytes).value(), arch);
    ASSERT_TRUE(m.ok()) << m.status().to_string();
    SessionGroupOptions go;
    go.n_ctx = 160;
    go.n_ubatch = 7;
    go.kv_block_tokens = 4;
    go.n_sessions = 2;  // room for the fork's blocks
    auto group = open_session_group(*m, go);
    ASSERT_TRUE(group.ok()) << group.status().to_string();
    KvPool& pool = *group->pools[0];
    ASSERT_TRUE(pool.has_window()) << arch;
    const int32_t ring = pool.ring_blocks();
    EXPECT_EQ(pool.plane_blocks(1), 2 * ring);
    EXPECT_LT(ring, 40);  // the context's blocks
    Session& s = *group->sessions[0];
    std::vector<TokenId> tokens;
    for (int i = 0; i < 150; ++i) tokens.push_back(static_cast<TokenId>((i * 37 + 5) % (*m)->hparams().n_vocab));
    ASSERT_TRUE(s.reserve_kv(160).ok());
    EXPECT_EQ(pool.window_blocks_in_use(), ring);
    auto all = s.eval_all_logits(tokens);
    ASSERT_TRUE(all.ok()) << all.status().to_string();
    EXPECT_EQ(pool.window_blocks_in_use(), ring) << "took window blocks past its reservation";
    auto ref = reference::LlamaReference::load((*m)->file());
    ASSERT_TRUE(ref.ok()) << ref.status().to_string();
    auto ref_logits = (*ref)->forward(tokens);
    ASSERT_TRUE(ref_logits.ok());
    const Comparison c = compare(*all, *ref_logits, static_cast<size_t>((*m)->hparams().n_vocab));
    std::cout << "[measure] " << arch << " window plane: " << ring << " window blocks for 150 positions, max rel err "
              << c.max_rel_err << "\n";
    EXPECT_LT(c.max_rel_err, kF32Bound) << arch << " worst position " << c.worst_position;
    const size_t V = static_cast<size_t>((*m)->hparams().n_vocab);
    // Back to position 20 (its window long given back), then on: the logits
    // of positions 20.. as before, bitwise.
    ASSERT_TRUE(s.truncate(20).ok());
    auto again = s.eval_all_logits(std::span<const TokenId>(tokens).subspan(20, 30));
    ASSERT_TRUE(again.ok()) << again.status().to_string();
    EXPECT_TRUE(std::equal(again->begin(), again->end(), all->begin() + 20 * V)) << arch << ": after truncate";
    // A fork at 50 continues as the original does.
    auto f = s.fork();
    ASSERT_TRUE(f.ok()) << f.status().to_string();
    auto next = (*f)->eval(std::span<const TokenId>(tokens).subspan(50, 1));
    ASSERT_TRUE(next.ok()) << next.status().to_string();
    EXPECT_TRUE(std::equal(next->begin(), next->end(), all->begin() + 50 * V)) << arch << ": fork";
  }
}

}  // namespace
}  // namespace spw
