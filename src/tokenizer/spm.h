// SentencePiece-BPE tokenizer (`tokenizer.ggml.model = "llama"`), as llama.cpp's
// llm_tokenizer_spm implements it. Internal to src/tokenizer: the contract is
// tokenizer.h; Tokenizer::from_gguf dispatches here.
#pragma once

#include <memory>
#include <string>

#include "core/status.h"
#include "gguf/gguf.h"
#include "tokenizer/tokenizer.h"

namespace spw::tok_detail {

Result<std::unique_ptr<Tokenizer>> load_spm(const gguf::GgufFile& file, std::string model);

}  // namespace spw::tok_detail
