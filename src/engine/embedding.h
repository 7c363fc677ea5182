// Sentence embeddings: a prompt's token states pooled into one vector, as
// llama.cpp's llama-embedding computes them for a model whose GGUF declares
// a pooling type.
//
// Contract: embed_tokens(session, tokens, pooling) evaluates `tokens` from
// position 0 on `session` (its earlier tokens are dropped first: truncate(0)),
// takes every row's hidden state after the last layer (Session's
// RowHiddenSink), applies the model's output RMS norm to each in double
// precision (the same host arithmetic whatever the placement, so the CPU and
// Vulkan paths differ only by their hidden states), pools them (mean over
// the rows, the first row (cls), or the last row) and scales the result to
// unit Euclidean length (llama-embedding's default --embd-normalize 2; a zero
// vector stays zero). n_embd floats. Errors: InvalidArgument for no tokens
// or a pooling that is not mean, cls or last; the session's eval errors
// (context, KV, backend) as they come. The session is left with `tokens`
// evaluated and no sink.
// embedding_support(hp): OK when a model can be embedded (a pooling type of
// mean, cls or last and causal attention, which is all this engine computes),
// else InvalidArgument saying why.
// Thread safety: as Session (one thread at a time per session).
#pragma once

#include <span>
#include <vector>

#include "core/status.h"
#include "engine/session.h"
#include "model/hparams.h"

namespace spw {

Status embedding_support(const LlamaHparams& hp);
Result<std::vector<float>> embed_tokens(Session& session, std::span<const TokenId> tokens, Pooling pooling);

}  // namespace spw
