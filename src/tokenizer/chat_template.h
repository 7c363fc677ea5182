// Chat templates: turn a list of messages into one prompt string.
//
// Contract: detect_chat_template() recognises the common families from the text
// of `tokenizer.chat_template` by the markers llama.cpp uses (e.g. "<|im_start|>"
// for ChatML, "<|start_header_id|>" for Llama-3, "[INST]" with/without system
// handling for Llama-2/Mistral, "<|user|>" for Zephyr, "<start_of_turn>" for
// Gemma); anything else is NotFound, with a message that says to name a template
// (--chat-template). chat_template_from_name() maps user-facing names
// ("chatml", "llama2", "llama3", "zephyr", "mistral", "gemma") and rejects others
// with InvalidArgument listing the valid names. apply_chat_template() renders
// exactly what the reference Jinja template renders for these families.
// Thread safety: pure functions.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace spw {

enum class ChatTemplateKind { kChatML, kLlama2, kLlama3, kZephyr, kMistral, kGemma };

struct ChatMessage {
  std::string role;  // "system", "user", "assistant"
  std::string content;
};

std::string_view chat_template_name(ChatTemplateKind kind);
Result<ChatTemplateKind> detect_chat_template(std::string_view template_text);
Result<ChatTemplateKind> chat_template_from_name(std::string_view name);
// `add_generation_prompt` appends the assistant turn opener. An unknown role is
// InvalidArgument naming it; a role the family cannot express (e.g. system for
// Gemma) is folded the way the reference template does.
Result<std::string> apply_chat_template(ChatTemplateKind kind, const std::vector<ChatMessage>& messages,
                                        bool add_generation_prompt);

}  // namespace spw
