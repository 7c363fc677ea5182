// Byte-level BPE tokenizer (`tokenizer.ggml.model = "gpt2"`), as llama.cpp's
// llm_tokenizer_bpe implements it. Internal to src/tokenizer: the contract is
// tokenizer.h; Tokenizer::from_gguf dispatches here.
#pragma once

#include <memory>
#include <string>

#include "core/status.h"
#include "gguf/gguf.h"
#include "tokenizer/tokenizer.h"

namespace spw::tok_detail {

Result<std::unique_ptr<Tokenizer>> load_bpe(const gguf::GgufFile& file, std::string model);

}  // namespace spw::tok_detail
