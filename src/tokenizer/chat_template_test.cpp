#include "tokenizer/chat_template.h"

#include <gtest/gtest.h>

namespace spw {
namespace {

// Template texts as they appear in the models' tokenizer_config.json
// (chat_template), with JSON escapes undone.
const char* kChatMLTemplate =  // teknium/OpenHermes-2.5-Mistral-7B
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + "
    "'\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

const char* kLlama2Template =  // meta-llama/Llama-2-7b-chat-hf
    "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}{% set system_message = "
    "messages[0]['content'] %}{% else %}{% set loop_messages = messages %}{% set system_message = false %}{% endif "
    "%}{% for message in loop_messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ "
    "raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if "
    "loop.index0 == 0 and system_message != false %}{% set content = '<<SYS>>\\n' + system_message + "
    "'\\n<</SYS>>\\n\\n' + message['content'] %}{% else %}{% set content = message['content'] %}{% endif %}{% if "
    "message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}{% elif message['role'] "
    "== 'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}";

const char* kLlama3Template =  // meta-llama/Meta-Llama-3-8B-Instruct
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + "
    "message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 "
    "%}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ "
    "'<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}";

const char* kZephyrTemplate =  // HuggingFaceH4/zephyr-7b-beta, TinyLlama/TinyLlama-1.1B-Chat-v1.0
    "{% for message in messages %}\n{% if message['role'] == 'user' %}\n{{ '<|user|>\n' + message['content'] + "
    "eos_token }}\n{% elif message['role'] == 'system' %}\n{{ '<|system|>\n' + message['content'] + eos_token }}\n{% "
    "elif message['role'] == 'assistant' %}\n{{ '<|assistant|>\n'  + message['content'] + eos_token }}\n{% endif "
    "%}\n{% if loop.last and add_generation_prompt %}\n{{ '<|assistant|>' }}\n{% endif %}\n{% endfor %}";

const char* kMistralV1Template =  // mistralai/Mistral-7B-Instruct-v0.2 (current "v1")
    "{%- if messages[0]['role'] == 'system' %}\n    {%- set system_message = messages[0]['content'] %}\n    {%- set "
    "loop_messages = messages[1:] %}\n{%- else %}\n    {%- set loop_messages = messages %}\n{%- endif %}\n\n{{- "
    "bos_token }}\n{%- for message in loop_messages %}\n    {%- if (message['role'] == 'user') != (loop.index0 % 2 == "
    "0) %}\n        {{- raise_exception('After the optional system message, conversation roles must alternate "
    "user/assistant/user/assistant/...') }}\n    {%- endif %}\n    {%- if message['role'] == 'user' %}\n        {%- if "
    "loop.first and system_message is defined %}\n            {{- ' [INST] ' + system_message + '\\n\\n' + "
    "message['content'] + ' [/INST]' }}\n        {%- else %}\n            {{- ' [INST] ' + message['content'] + ' "
    "[/INST]' }}\n        {%- endif %}\n    {%- elif message['role'] == 'assistant' %}\n        {{- ' ' + "
    "message['content'] + eos_token}}\n    {%- else %}\n        {{- raise_exception('Only user and assistant roles are "
    "supported, with the exception of an initial optional system message!') }}\n    {%- endif %}\n{%- endfor %}\n";

const char* kMistralV3Template =  // mistralai/Mistral-7B-Instruct-v0.3 (abridged: tool branches kept by marker)
    "{%- if messages[0][\"role\"] == \"system\" %}\n    {%- set system_message = messages[0][\"content\"] %}\n    "
    "{%- set loop_messages = messages[1:] %}\n{%- else %}\n    {%- set loop_messages = messages %}\n{%- endif "
    "%}\n{{- bos_token }}\n{%- for message in loop_messages %}\n    {%- if message[\"role\"] == \"user\" %}\n        "
    "{%- if tools is not none and (message == user_messages[-1]) %}\n            {{- \"[AVAILABLE_TOOLS] [\" }}\n     "
    "       {{- \"[/AVAILABLE_TOOLS]\" }}\n        {%- endif %}\n        {%- if loop.last and system_message is "
    "defined %}\n            {{- \"[INST] \" + system_message + \"\\n\\n\" + message[\"content\"] + \"[/INST]\" }}\n "
    "       {%- else %}\n            {{- \"[INST] \" + message[\"content\"] + \"[/INST]\" }}\n        {%- endif %}\n  "
    "  {%- elif message[\"role\"] == \"assistant\" %}\n        {{- \" \" + message[\"content\"]|trim + eos_token}}\n  "
    "  {%- endif %}\n{%- endfor %}\n";

const char* kMistralNemoTemplate =  // mistralai/Mistral-Nemo-Instruct-2407 (abridged as above)
    "{{- bos_token }}\n{%- for message in loop_messages %}\n    {%- if message[\"role\"] == \"user\" %}\n        {%- "
    "if tools is not none and (message == user_messages[-1]) %}\n            {{- \"[AVAILABLE_TOOLS][\" }}\n        "
    "{%- endif %}\n        {%- if loop.last and system_message is defined %}\n            {{- \"[INST]\" + "
    "system_message + \"\\n\\n\" + message[\"content\"] + \"[/INST]\" }}\n        {%- else %}\n            {{- "
    "\"[INST]\" + message[\"content\"] + \"[/INST]\" }}\n        {%- endif %}\n    {%- endif %}\n{%- endfor %}\n";

const char* kMistralLegacyTemplate =  // mistralai/Mistral-7B-Instruct-v0.2 (original)
    "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ "
    "raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if "
    "message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] == "
    "'assistant' %}{{ message['content'] + eos_token}}{% else %}{{ raise_exception('Only user and assistant roles are "
    "supported!') }}{% endif %}{% endfor %}";

// Mistral v7 (abridged to the lines detection reads): the user and system
// branches of Mistral-Large-Instruct-2411's template, and of
// Mistral-Small-3.1-24B-Instruct-2503's (tekken: no space after the tokens).
const char* kMistralV7Template =
    "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}{{ '[INST] ' + "
    "message['content'] + '[/INST]' }}{% elif message['role'] == 'system' %}{{ '[SYSTEM_PROMPT] ' + "
    "message['content'] + '[/SYSTEM_PROMPT]' }}{% endif %}{% endfor %}";
const char* kMistralSmall31Template =
    "{{- bos_token }}\n{{- '[SYSTEM_PROMPT]' + system_message + '[/SYSTEM_PROMPT]' }}\n{%- for message in "
    "loop_messages %}\n    {%- if message[\"role\"] == \"user\" %}\n        {%- if tools is not none and (message == "
    "user_messages[-1]) %}\n            {{- \"[AVAILABLE_TOOLS] [\" }}\n        {%- endif %}\n        {{- '[INST]' + "
    "message['content'] + '[/INST]' }}\n    {%- endif %}\n{%- endfor %}\n";

const char* kGemmaTemplate =  // google/gemma-7b-it
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif "
    "%}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ "
    "raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if "
    "(message['role'] == 'assistant') %}{% set role = 'model' %}{% else %}{% set role = message['role'] %}{% endif "
    "%}{{ '<start_of_turn>' + role + '\n' + message['content'] | trim + '<end_of_turn>\n' }}{% endfor %}{% if "
    "add_generation_prompt %}{{'<start_of_turn>model\n'}}{% endif %}";

const char* kPhi3Template =  // microsoft/Phi-3-mini-4k-instruct
    "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') %}{{'<|user|>' + '\n' + "
    "message['content'] + '<|end|>' + '\n' + '<|assistant|>' + '\n'}}{% elif (message['role'] == 'assistant') "
    "%}{{message['content'] + '<|end|>' + '\n'}}{% endif %}{% endfor %}";

const char* kPhi35Template =  // microsoft/Phi-3.5-mini-instruct (Jinja source: "\\n" escapes)
    "{% for message in messages %}{% if message['role'] == 'system' and message['content'] %}{{'<|system|>\\n' + "
    "message['content'] + '<|end|>\\n'}}{% elif message['role'] == 'user' %}{{'<|user|>\\n' + message['content'] + "
    "'<|end|>\\n'}}{% elif message['role'] == 'assistant' %}{{'<|assistant|>\\n' + message['content'] + "
    "'<|end|>\\n'}}{% endif %}{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% else %}{{ "
    "eos_token }}{% endif %}";

const char* kPhi4MiniTemplate =  // microsoft/Phi-4-mini-instruct
    "{% for message in messages %}{% if message['role'] == 'system' and 'tools' in message and message['tools'] is "
    "not none %}{{ '<|' + message['role'] + '|>' + message['content'] + '<|tool|>' + message['tools'] + "
    "'<|/tool|>' + '<|end|>' }}{% else %}{{ '<|' + message['role'] + '|>' + message['content'] + '<|end|>' }}{% "
    "endif %}{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>' }}{% else %}{{ eos_token }}{% endif %}";

const char* kPhi4Template =  // microsoft/phi-4
    "{% for message in messages %}{% if (message['role'] == 'system') %}{{'<|im_start|>system<|im_sep|>' + "
    "message['content'] + '<|im_end|>'}}{% elif (message['role'] == 'user') %}{{'<|im_start|>user<|im_sep|>' + "
    "message['content'] + '<|im_end|>'}}{% elif (message['role'] == 'assistant') "
    "%}{{'<|im_start|>assistant<|im_sep|>' + message['content'] + '<|im_end|>'}}{% endif %}{% endfor %}{% if "
    "add_generation_prompt %}{{ '<|im_start|>assistant<|im_sep|>' }}{% endif %}";

std::vector<ChatMessage> conversation() {
  return {
      {"system", "You are a helpful assistant"},
      {"user", "Hello"},
      {"assistant", "  Hi there  "},
      {"user", "Who are you"},
  };
}

std::string render(ChatTemplateKind k, bool gen, std::vector<ChatMessage> msgs = conversation()) {
  auto r = apply_chat_template(k, msgs, gen);
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  return r.ok() ? r.value() : std::string();
}

ChatTemplateKind detect(const char* t) {
  auto r = detect_chat_template(t);
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  return r.ok() ? r.value() : ChatTemplateKind::kChatML;
}

TEST(ChatTemplateTest, DetectsEachFamilyFromItsRealTemplate) {
  EXPECT_EQ(detect(kChatMLTemplate), ChatTemplateKind::kChatML);
  EXPECT_EQ(detect(kLlama2Template), ChatTemplateKind::kLlama2);
  EXPECT_EQ(detect(kLlama3Template), ChatTemplateKind::kLlama3);
  EXPECT_EQ(detect(kZephyrTemplate), ChatTemplateKind::kZephyr);
  EXPECT_EQ(detect(kMistralV1Template), ChatTemplateKind::kMistral);
  EXPECT_EQ(detect(kMistralV3Template), ChatTemplateKind::kMistralV3);
  EXPECT_EQ(detect(kMistralLegacyTemplate), ChatTemplateKind::kMistralLegacy);
  EXPECT_EQ(detect(kMistralNemoTemplate), ChatTemplateKind::kMistralV3Tekken);
  EXPECT_EQ(detect(kGemmaTemplate), ChatTemplateKind::kGemma);
  EXPECT_EQ(detect(kPhi3Template), ChatTemplateKind::kPhi3Legacy);
  EXPECT_EQ(detect(kPhi35Template), ChatTemplateKind::kPhi3);
  EXPECT_EQ(detect(kPhi4MiniTemplate), ChatTemplateKind::kPhi4Mini);
  EXPECT_EQ(detect(kPhi4Template), ChatTemplateKind::kPhi4);
  // "[SYSTEM_PROMPT]" wins over the tool and <<SYS>> markers, as in llama.cpp;
  // the spacing the template writes picks the variant (see the header).
  EXPECT_EQ(detect(kMistralV7Template), ChatTemplateKind::kMistralV7);
  EXPECT_EQ(detect(kMistralSmall31Template), ChatTemplateKind::kMistralV7Tekken);
  EXPECT_EQ(detect("mistral-v7"), ChatTemplateKind::kMistralV7);
  EXPECT_EQ(detect("mistral-v7-tekken"), ChatTemplateKind::kMistralV7Tekken);
  EXPECT_EQ(detect("chatml"), ChatTemplateKind::kChatML);
  EXPECT_EQ(detect("llama3"), ChatTemplateKind::kLlama3);
}

TEST(ChatTemplateTest, UnknownTemplateTellsUserWhatToDo) {
  for (const char* t : {"{{ messages }} something custom", ""}) {
    auto r = detect_chat_template(t);
    ASSERT_FALSE(r.ok()) << t;
    EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
    EXPECT_NE(r.status().message().find("--chat-template NAME"), std::string::npos) << r.status().message();
    EXPECT_NE(r.status().message().find("chatml, llama2, llama3, zephyr, mistral"), std::string::npos)
        << r.status().message();
  }
}

TEST(ChatTemplateTest, NamesRoundTripAndUnknownNameIsInvalid) {
  for (auto k : {ChatTemplateKind::kChatML, ChatTemplateKind::kLlama2, ChatTemplateKind::kLlama3,
                 ChatTemplateKind::kZephyr, ChatTemplateKind::kMistral, ChatTemplateKind::kGemma,
                 ChatTemplateKind::kMistralV3, ChatTemplateKind::kMistralLegacy, ChatTemplateKind::kMistralV3Tekken,
                 ChatTemplateKind::kMistralV7, ChatTemplateKind::kMistralV7Tekken, ChatTemplateKind::kPhi3,
                 ChatTemplateKind::kPhi3Legacy, ChatTemplateKind::kPhi4Mini, ChatTemplateKind::kPhi4}) {
    auto r = chat_template_from_name(chat_template_name(k));
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(r.value(), k);
  }
  EXPECT_EQ(chat_template_from_name("mistral-v1").value(), ChatTemplateKind::kMistral);
  auto bad = chat_template_from_name("vicuna");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("'vicuna'"), std::string::npos);
  EXPECT_NE(bad.status().message().find("gemma"), std::string::npos);
}

TEST(ChatTemplateTest, ChatML) {
  const std::string base =
      "<|im_start|>system\nYou are a helpful assistant<|im_end|>\n<|im_start|>user\nHello<|im_end|>\n"
      "<|im_start|>assistant\n  Hi there  <|im_end|>\n<|im_start|>user\nWho are you<|im_end|>\n";
  EXPECT_EQ(render(ChatTemplateKind::kChatML, false), base);
  EXPECT_EQ(render(ChatTemplateKind::kChatML, true), base + "<|im_start|>assistant\n");
}

TEST(ChatTemplateTest, Llama2) {
  const std::string expected =
      "<s>[INST] <<SYS>>\nYou are a helpful assistant\n<</SYS>>\n\nHello [/INST] Hi there </s>"
      "<s>[INST] Who are you [/INST]";
  EXPECT_EQ(render(ChatTemplateKind::kLlama2, false), expected);
  EXPECT_EQ(render(ChatTemplateKind::kLlama2, true), expected);  // the reference has no generation prompt
  EXPECT_EQ(render(ChatTemplateKind::kLlama2, true, {{"user", " Hi "}}), "<s>[INST] Hi [/INST]");
}

TEST(ChatTemplateTest, Llama3) {
  const std::string base =
      "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nYou are a helpful assistant<|eot_id|>"
      "<|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|>"
      "<|start_header_id|>assistant<|end_header_id|>\n\nHi there<|eot_id|>"
      "<|start_header_id|>user<|end_header_id|>\n\nWho are you<|eot_id|>";
  EXPECT_EQ(render(ChatTemplateKind::kLlama3, false), base);
  EXPECT_EQ(render(ChatTemplateKind::kLlama3, true), base + "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

TEST(ChatTemplateTest, Zephyr) {
  const std::string base =
      "<|system|>\nYou are a helpful assistant</s>\n<|user|>\nHello</s>\n<|assistant|>\n  Hi there  </s>\n"
      "<|user|>\nWho are you</s>\n";
  EXPECT_EQ(render(ChatTemplateKind::kZephyr, false), base);
  EXPECT_EQ(render(ChatTemplateKind::kZephyr, true), base + "<|assistant|>\n");
  // StableLM-Zephyr uses the same template with eos_token "<|endoftext|>".
  auto r = apply_chat_template(ChatTemplateKind::kZephyr, {{"user", "Hi"}}, true,
                               ChatSpecialTexts{std::nullopt, std::string("<|endoftext|>")});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.value(), "<|user|>\nHi<|endoftext|>\n<|assistant|>\n");
}

// The Phi layouts, as their published templates render the conversation
// (jinja2: the templates above).
TEST(ChatTemplateTest, Phi) {
  const std::string phi3 =
      "<|system|>\nYou are a helpful assistant<|end|>\n<|user|>\nHello<|end|>\n<|assistant|>\n  Hi there  "
      "<|end|>\n<|user|>\nWho are you<|end|>\n";
  EXPECT_EQ(render(ChatTemplateKind::kPhi3, true), phi3 + "<|assistant|>\n");
  EXPECT_EQ(render(ChatTemplateKind::kPhi3, false), phi3 + "<|endoftext|>");
  EXPECT_EQ(render(ChatTemplateKind::kPhi3, true, {{"system", ""}, {"user", "Hi"}}),
            "<|user|>\nHi<|end|>\n<|assistant|>\n");  // an empty system message is skipped
  // April 2024: no system turn (dropped, as the reference drops it), the
  // assistant's opener after every user turn, BOS first.
  const std::string legacy =
      "<s><|user|>\nHello<|end|>\n<|assistant|>\n  Hi there  <|end|>\n<|user|>\nWho are you<|end|>\n"
      "<|assistant|>\n";
  EXPECT_EQ(render(ChatTemplateKind::kPhi3Legacy, true), legacy);
  EXPECT_EQ(render(ChatTemplateKind::kPhi3Legacy, false), legacy);
  const std::string mini =
      "<|system|>You are a helpful assistant<|end|><|user|>Hello<|end|><|assistant|>  Hi there  <|end|>"
      "<|user|>Who are you<|end|>";
  EXPECT_EQ(render(ChatTemplateKind::kPhi4Mini, true), mini + "<|assistant|>");
  EXPECT_EQ(render(ChatTemplateKind::kPhi4Mini, false), mini + "<|endoftext|>");
  const std::string phi4 =
      "<|im_start|>system<|im_sep|>You are a helpful assistant<|im_end|><|im_start|>user<|im_sep|>Hello<|im_end|>"
      "<|im_start|>assistant<|im_sep|>  Hi there  <|im_end|><|im_start|>user<|im_sep|>Who are you<|im_end|>";
  EXPECT_EQ(render(ChatTemplateKind::kPhi4, true), phi4 + "<|im_start|>assistant<|im_sep|>");
  EXPECT_EQ(render(ChatTemplateKind::kPhi4, false), phi4);
}

TEST(ChatTemplateTest, MistralV1) {
  const std::string expected =
      "<s> [INST] You are a helpful assistant\n\nHello [/INST]   Hi there  </s> [INST] Who are you [/INST]";
  EXPECT_EQ(render(ChatTemplateKind::kMistral, false), expected);
  EXPECT_EQ(render(ChatTemplateKind::kMistral, true), expected);
}

TEST(ChatTemplateTest, MistralV3) {
  const std::string expected =
      "<s>[INST] Hello[/INST] Hi there</s>[INST] You are a helpful assistant\n\nWho are you[/INST]";
  EXPECT_EQ(render(ChatTemplateKind::kMistralV3, false), expected);
  EXPECT_EQ(render(ChatTemplateKind::kMistralV3, true), expected);
}

TEST(ChatTemplateTest, MistralV3Tekken) {
  // Mistral-Nemo's template (llama.cpp's models/templates copy) rendered by
  // jinja2: v3 without the spaces, the answer untrimmed.
  const std::string expected =
      "<s>[INST]Hello[/INST]  Hi there  </s>[INST]You are a helpful assistant\n\nWho are you[/INST]";
  EXPECT_EQ(render(ChatTemplateKind::kMistralV3Tekken, true), expected);
}

TEST(ChatTemplateTest, MistralLegacy) {
  const std::string expected =
      "<s>[INST] You are a helpful assistant\n\nHello [/INST]  Hi there  </s>[INST] Who are you [/INST]";
  EXPECT_EQ(render(ChatTemplateKind::kMistralLegacy, false), expected);
  EXPECT_EQ(render(ChatTemplateKind::kMistralLegacy, true), expected);
  // Without a system message this is exactly the reference template's output.
  EXPECT_EQ(render(ChatTemplateKind::kMistralLegacy, true, {{"user", "Hello"}, {"assistant", "Hi"}, {"user", "Q"}}),
            "<s>[INST] Hello [/INST]Hi</s>[INST] Q [/INST]");
}

// The Mistral v7 expectations are jinja2 renderings of the published
// templates, made by tests/data/chat_templates/make_mistral_v7_refs.py (its
// docstring names the template copies: Mistral-Large-Instruct-2411 for v7,
// Mistral-Small-3.1-24B-Instruct-2503 and -3.2-24B-Instruct-2506 for tekken),
// with bos "<s>" and eos "</s>". They equal llama.cpp's built-in mistral-v7 /
// mistral-v7-tekken renderings with the template's BOS in front.
TEST(ChatTemplateTest, MistralV7RendersAsMistralLarge2411) {
  const std::string expected =
      "<s>[SYSTEM_PROMPT] You are a helpful assistant[/SYSTEM_PROMPT][INST] Hello[/INST]   Hi there  </s>"
      "[INST] Who are you[/INST]";
  EXPECT_EQ(render(ChatTemplateKind::kMistralV7, false), expected);
  EXPECT_EQ(render(ChatTemplateKind::kMistralV7, true), expected);  // "[/INST]" already opens the answer
  EXPECT_EQ(render(ChatTemplateKind::kMistralV7, true, {{"system", " S \n"}, {"user", "\tU "}}),
            "<s>[SYSTEM_PROMPT]  S \n[/SYSTEM_PROMPT][INST] \tU [/INST]");
  // A later system message stays where it is; none at all means no block.
  EXPECT_EQ(render(ChatTemplateKind::kMistralV7, true,
                   {{"system", "S1"}, {"user", "U1"}, {"assistant", "A1"}, {"system", "S2"}, {"user", "U2"}}),
            "<s>[SYSTEM_PROMPT] S1[/SYSTEM_PROMPT][INST] U1[/INST] A1</s>[SYSTEM_PROMPT] S2[/SYSTEM_PROMPT]"
            "[INST] U2[/INST]");
  EXPECT_EQ(render(ChatTemplateKind::kMistralV7, true, {{"user", "Hello"}, {"assistant", "  Hi there  "},
                                                          {"user", "Who are you"}}),
            "<s>[INST] Hello[/INST]   Hi there  </s>[INST] Who are you[/INST]");
}

TEST(ChatTemplateTest, MistralV7TekkenRendersAsMistralSmall3) {
  const std::string expected =
      "<s>[SYSTEM_PROMPT]You are a helpful assistant[/SYSTEM_PROMPT][INST]Hello[/INST]  Hi there  </s>"
      "[INST]Who are you[/INST]";
  EXPECT_EQ(render(ChatTemplateKind::kMistralV7Tekken, false), expected);
  EXPECT_EQ(render(ChatTemplateKind::kMistralV7Tekken, true), expected);
  EXPECT_EQ(render(ChatTemplateKind::kMistralV7Tekken, true, {{"system", " S \n"}, {"user", "\tU "}}),
            "<s>[SYSTEM_PROMPT] S \n[/SYSTEM_PROMPT][INST]\tU [/INST]");
  // Mistral-Small-3.2's template renders a later system message in place.
  EXPECT_EQ(render(ChatTemplateKind::kMistralV7Tekken, true,
                   {{"system", "S1"}, {"user", "U1"}, {"assistant", "A1"}, {"system", "S2"}, {"user", "U2"}}),
            "<s>[SYSTEM_PROMPT]S1[/SYSTEM_PROMPT][INST]U1[/INST]A1</s>[SYSTEM_PROMPT]S2[/SYSTEM_PROMPT]"
            "[INST]U2[/INST]");
  // Where the published templates would write their dated default system
  // message, Spillway writes none (as llama.cpp without --jinja; see the header).
  EXPECT_EQ(render(ChatTemplateKind::kMistralV7Tekken, true, {{"user", "Hello"}}), "<s>[INST]Hello[/INST]");
  // The vocabulary's own texts replace the defaults; "" leaves BOS out.
  auto r = apply_chat_template(ChatTemplateKind::kMistralV7Tekken, {{"user", "Q"}, {"assistant", "A"}}, true,
                               ChatSpecialTexts{std::string(""), std::string("<eos>")});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, "[INST]Q[/INST]A<eos>");
  auto bad = apply_chat_template(ChatTemplateKind::kMistralV7, {{"developer", "x"}}, true);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("'developer'"), std::string::npos);
}

TEST(ChatTemplateTest, Gemma) {
  const std::string base =
      "<bos><start_of_turn>user\nYou are a helpful assistant\n\nHello<end_of_turn>\n"
      "<start_of_turn>model\nHi there<end_of_turn>\n<start_of_turn>user\nWho are you<end_of_turn>\n";
  EXPECT_EQ(render(ChatTemplateKind::kGemma, false), base);
  EXPECT_EQ(render(ChatTemplateKind::kGemma, true), base + "<start_of_turn>model\n");
}

TEST(ChatTemplateTest, SpecialTextOverridesAndRoleErrors) {
  auto r = apply_chat_template(ChatTemplateKind::kLlama2, {{"user", "x"}}, true, ChatSpecialTexts{"", std::nullopt});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.value(), "[INST] x [/INST]");

  auto bad = apply_chat_template(ChatTemplateKind::kChatML, {{"robot", "x"}}, true);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("'robot'"), std::string::npos);
  // A tool result in a family without a tool format.
  auto tool = apply_chat_template(ChatTemplateKind::kGemma, {{"tool", "x"}}, true);
  ASSERT_FALSE(tool.ok());
  EXPECT_NE(tool.status().message().find("gemma template has no tool-call format"), std::string::npos)
      << tool.status().message();

  auto late_system = apply_chat_template(ChatTemplateKind::kGemma, {{"user", "a"}, {"system", "b"}}, true);
  ASSERT_FALSE(late_system.ok());
  EXPECT_EQ(late_system.status().code(), StatusCode::kInvalidArgument);

  EXPECT_EQ(render(ChatTemplateKind::kZephyr, true, {}), "");
  EXPECT_EQ(render(ChatTemplateKind::kChatML, true, {}), "<|im_start|>assistant\n");
}


// Tool calls, against the reference templates rendered by Python's jinja2 with
// transformers' `tojson` (json.dumps, ensure_ascii=False): Qwen/Qwen2.5-7B-
// Instruct's and meta-llama/Llama-3.2-3B-Instruct's chat_template (as
// published in the models' tokenizer_config.json), the conversation below and
// two tools; add_generation_prompt=true; Llama's date_string left at the
// template's default.
std::vector<ChatTool> weather_tools() {
  return {{"get_weather",
           "{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"Weather in a city, "
           "now\", \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\", "
           "\"description\": \"City \u2014 name\"}}, \"required\": [\"city\"]}}}",
           "{\n    \"type\": \"function\",\n    \"function\": {\n        \"name\": \"get_weather\",\n        "
           "\"description\": \"Weather in a city, now\",\n        \"parameters\": {\n            \"type\": \"object\",\n"
           "            \"properties\": {\n                \"city\": {\n                    \"type\": \"string\",\n"
           "                    \"description\": \"City \u2014 name\"\n                }\n            },\n"
           "            \"required\": [\n                \"city\"\n            ]\n        }\n    }\n}"},
          {"now", "{\"type\": \"function\", \"function\": {\"name\": \"now\", \"parameters\": {}}}",
           "{\n    \"type\": \"function\",\n    \"function\": {\n        \"name\": \"now\",\n        \"parameters\": {}\n"
           "    }\n}"}};
}

std::vector<ChatMessage> weather_conversation(bool second_result) {
  ChatMessage call;
  call.role = "assistant";
  call.tool_calls = {{"call_1", "get_weather", "{\"city\": \"Paris\", \"unit\": \"\u00b0C\"}"}};
  ChatMessage r1;
  r1.role = "tool";
  r1.tool_call_id = "call_1";
  r1.content = "{\"temp\": 21}";
  ChatMessage r2;
  r2.role = "tool";
  r2.tool_call_id = "call_2";
  r2.content = "line1\nline2 \"q\"";
  std::vector<ChatMessage> m = {{"system", "You are terse."}, {"user", " Weather in Paris and the time? "}, call, r1};
  if (second_result) m.push_back(r2);
  m.push_back({"user", "Thanks"});
  return m;
}

TEST(ChatTemplateToolsTest, ChatMLRendersAsQwen25) {
  const char* expected =
    "<|im_start|>system\n"
    "You are terse.\n"
    "\n"
    "# Tools\n"
    "\n"
    "You may call one or more functions to assist with the user query.\n"
    "\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n"
    "<tools>\n"
    "{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"Weather in a city, now\", \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\", \"description\": \"City — name\"}}, \"required\": [\"city\"]}}}\n"
    "{\"type\": \"function\", \"function\": {\"name\": \"now\", \"parameters\": {}}}\n"
    "</tools>\n"
    "\n"
    "For each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n"
    "<tool_call>\n"
    "{\"name\": <function-name>, \"arguments\": <args-json-object>}\n"
    "</tool_call><|im_end|>\n"
    "<|im_start|>user\n"
    " Weather in Paris and the time? <|im_end|>\n"
    "<|im_start|>assistant\n"
    "<tool_call>\n"
    "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"°C\"}}\n"
    "</tool_call><|im_end|>\n"
    "<|im_start|>user\n"
    "<tool_response>\n"
    "{\"temp\": 21}\n"
    "</tool_response>\n"
    "<tool_response>\n"
    "line1\n"
    "line2 \"q\"\n"
    "</tool_response><|im_end|>\n"
    "<|im_start|>user\n"
    "Thanks<|im_end|>\n"
    "<|im_start|>assistant\n";
  auto r = apply_chat_template(ChatTemplateKind::kChatML, weather_conversation(true), true, {}, weather_tools());
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(*r, expected);
}

TEST(ChatTemplateToolsTest, Llama3RendersAsLlama32) {
  const char* expected =
    "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n"
    "\n"
    "Environment: ipython\n"
    "Cutting Knowledge Date: December 2023\n"
    "Today Date: 26 Jul 2024\n"
    "\n"
    "You are terse.<|eot_id|><|start_header_id|>user<|end_header_id|>\n"
    "\n"
    "Given the following functions, please respond with a JSON for a function call with its proper arguments that best answers the given prompt.\n"
    "\n"
    "Respond in the format {\"name\": function name, \"parameters\": dictionary of argument name and its value}.Do not use variables.\n"
    "\n"
    "{\n"
    "    \"type\": \"function\",\n"
    "    \"function\": {\n"
    "        \"name\": \"get_weather\",\n"
    "        \"description\": \"Weather in a city, now\",\n"
    "        \"parameters\": {\n"
    "            \"type\": \"object\",\n"
    "            \"properties\": {\n"
    "                \"city\": {\n"
    "                    \"type\": \"string\",\n"
    "                    \"description\": \"City — name\"\n"
    "                }\n"
    "            },\n"
    "            \"required\": [\n"
    "                \"city\"\n"
    "            ]\n"
    "        }\n"
    "    }\n"
    "}\n"
    "\n"
    "{\n"
    "    \"type\": \"function\",\n"
    "    \"function\": {\n"
    "        \"name\": \"now\",\n"
    "        \"parameters\": {}\n"
    "    }\n"
    "}\n"
    "\n"
    "Weather in Paris and the time?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n"
    "\n"
    "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\", \"unit\": \"°C\"}}<|eot_id|><|start_header_id|>ipython<|end_header_id|>\n"
    "\n"
    "\"{\\\"temp\\\": 21}\"<|eot_id|><|start_header_id|>user<|end_header_id|>\n"
    "\n"
    "Thanks<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n"
    "\n";
  auto r = apply_chat_template(ChatTemplateKind::kLlama3, weather_conversation(false), true, {}, weather_tools());
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(*r, expected);
}

// Mistral: mistralai/Mistral-7B-Instruct-v0.3's chat_template and
// Mistral-Nemo-Instruct-2407's (llama.cpp's models/templates copy), rendered
// by jinja2 as above, on this conversation: two parallel calls with 9-character
// ids, two results, an answer, a last user turn; the tool "now" has a
// non-string member ("strict": true) that the template writes through tojson.
std::vector<ChatTool> mistral_tools() {
  auto tools = weather_tools();
  tools[0].function_fields = {{"name", true, "get_weather"},
                              {"description", true, "Weather in a city, now"},
                              {"parameters", false,
                               "{\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\", "
                               "\"description\": \"City \u2014 name\"}}, \"required\": [\"city\"]}"}};
  tools[1].function_fields = {{"name", true, "now"}, {"parameters", false, "{}"}, {"strict", false, "true"}};
  return tools;
}

std::vector<ChatMessage> mistral_conversation() {
  ChatMessage call;
  call.role = "assistant";
  call.tool_calls = {{"abcDEF123", "get_weather", "{\"city\": \"Paris\", \"unit\": \"\u00b0C\"}"},
                     {"Z9y8X7w6V", "now", "{}"}};
  ChatMessage r1;
  r1.role = "tool";
  r1.tool_call_id = "abcDEF123";
  r1.content = "{\"temp\": 21}";
  ChatMessage r2;
  r2.role = "tool";
  r2.tool_call_id = "Z9y8X7w6V";
  r2.content = "line1\nline2 \"q\"";
  return {{"system", "You are terse."}, {"user", " Weather in Paris and the time? "}, call, r1, r2,
          {"assistant", "  21 C, 10:00.  "}, {"user", "Thanks"}};
}

TEST(ChatTemplateToolsTest, MistralV3RendersAsMistral7BInstructV03AndNemo) {
  const std::string tools_v3 =
      "[AVAILABLE_TOOLS] [{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": "
      "\"Weather in a city, now\", \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": "
      "\"string\", \"description\": \"City \u2014 name\"}}, \"required\": [\"city\"]}}}, {\"type\": \"function\", "
      "\"function\": {\"name\": \"now\", \"parameters\": {}, \"strict\": true}}][/AVAILABLE_TOOLS]";
  const std::string v3 =
      "<s>[INST]  Weather in Paris and the time? [/INST][TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": "
      "{\"city\": \"Paris\", \"unit\": \"\u00b0C\"}, \"id\": \"abcDEF123\"}, {\"name\": \"now\", \"arguments\": {}, "
      "\"id\": \"Z9y8X7w6V\"}]</s>[TOOL_RESULTS] {\"content\": {\"temp\": 21}, \"call_id\": "
      "\"abcDEF123\"}[/TOOL_RESULTS][TOOL_RESULTS] {\"content\": line1\nline2 \"q\", \"call_id\": "
      "\"Z9y8X7w6V\"}[/TOOL_RESULTS] 21 C, 10:00.</s>" +
      tools_v3 + "[INST] You are terse.\n\nThanks[/INST]";
  auto r = apply_chat_template(ChatTemplateKind::kMistralV3, mistral_conversation(), true, {}, mistral_tools());
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(*r, v3);

  std::string tools_nemo = tools_v3;
  tools_nemo.erase(tools_nemo.find("] [") + 1, 1);  // "[AVAILABLE_TOOLS]["
  const std::string nemo =
      "<s>[INST] Weather in Paris and the time? [/INST][TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": "
      "{\"city\": \"Paris\", \"unit\": \"\u00b0C\"}, \"id\": \"abcDEF123\"}, {\"name\": \"now\", \"arguments\": {}, "
      "\"id\": \"Z9y8X7w6V\"}]</s>[TOOL_RESULTS]{\"content\": {\"temp\": 21}, \"call_id\": "
      "\"abcDEF123\"}[/TOOL_RESULTS][TOOL_RESULTS]{\"content\": line1\nline2 \"q\", \"call_id\": "
      "\"Z9y8X7w6V\"}[/TOOL_RESULTS]  21 C, 10:00.  </s>" +
      tools_nemo + "[INST]You are terse.\n\nThanks[/INST]";
  r = apply_chat_template(ChatTemplateKind::kMistralV3Tekken, mistral_conversation(), true, {}, mistral_tools());
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(*r, nemo);

  // The first turn: tools before the only user message, the system with it.
  auto first = mistral_conversation();
  first.resize(2);
  r = apply_chat_template(ChatTemplateKind::kMistralV3, first, true, {}, mistral_tools());
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(*r, "<s>" + tools_v3 + "[INST] You are terse.\n\n Weather in Paris and the time? [/INST]");
  // "return" is left out of a tool, as the reference does.
  auto with_return = mistral_tools();
  with_return[1].function_fields.push_back({"return", false, "{\"type\": \"string\"}"});
  auto rr = apply_chat_template(ChatTemplateKind::kMistralV3, first, true, {}, with_return);
  ASSERT_TRUE(rr.ok());
  EXPECT_EQ(*rr, *r);
  // Call ids of any other length: the reference raises; a 400 naming it here.
  auto bad = mistral_conversation();
  bad[2].tool_calls[0].id = "call_42_0";
  bad[2].tool_calls[0].id += "x";
  auto e = apply_chat_template(ChatTemplateKind::kMistralV3, bad, true, {}, mistral_tools());
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(e.status().message().find("9 characters"), std::string::npos) << e.status().message();
  bad = mistral_conversation();
  bad[3].tool_call_id = "short";
  EXPECT_FALSE(apply_chat_template(ChatTemplateKind::kMistralV3, bad, true, {}, mistral_tools()).ok());
  // Without tools both render as their plain templates.
  for (ChatTemplateKind k : {ChatTemplateKind::kMistralV3, ChatTemplateKind::kMistralV3Tekken}) {
    auto a = apply_chat_template(k, conversation(), true, {}, {});
    ASSERT_TRUE(a.ok());
    EXPECT_EQ(*a, render(k, true));
  }
}

// Mistral Small 3.1's template (the copy named in
// tests/data/chat_templates/make_mistral_v7_refs.py, its "\n" escapes
// restored) rendered by jinja2 on mistral_conversation() with a second call
// id longer than 9 characters, which the template cuts to its last 9.
TEST(ChatTemplateToolsTest, MistralV7TekkenRendersAsMistralSmall31) {
  EXPECT_TRUE(chat_template_renders_tools(ChatTemplateKind::kMistralV7Tekken));
  const std::string preamble =
      "You are a helpful assistant that can call tools. If you call one or more tools, format them in a single JSON "
      "array or objects, where each object is a tool call, not as separate objects outside of an array or multiple "
      "arrays. Use the format [{\"name\": tool call name, \"arguments\": tool call arguments}, additional tool "
      "calls] if you call more than one tool. If you call tools, do not attempt to interpret them or otherwise "
      "provide a response until you receive a tool call result that you can interpret for the user.";
  const std::string tools =
      "[AVAILABLE_TOOLS] [{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": "
      "\"Weather in a city, now\", \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": "
      "\"string\", \"description\": \"City \u2014 name\"}}, \"required\": [\"city\"]}}}, {\"type\": \"function\", "
      "\"function\": {\"name\": \"now\", \"parameters\": {}, \"strict\": true}}][/AVAILABLE_TOOLS]";
  const std::string expected =
      "<s>[SYSTEM_PROMPT]" + preamble + "\n\nYou are terse.[/SYSTEM_PROMPT][INST] Weather in Paris and the time? "
      "[/INST][TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": "
      "\"\u00b0C\"}, \"id\": \"abcDEF123\"}, {\"name\": \"now\", \"arguments\": {}, \"id\": \"Z9y8X7w6V\"}]</s>"
      "[TOOL_RESULTS] {\"content\": {\"temp\": 21}, \"call_id\": \"abcDEF123\"}[/TOOL_RESULTS][TOOL_RESULTS] "
      "{\"content\": line1\nline2 \"q\", \"call_id\": \"Z9y8X7w6V\"}[/TOOL_RESULTS]  21 C, 10:00.  </s>" +
      tools + "[INST]Thanks[/INST]";
  auto conv = mistral_conversation();
  conv[2].tool_calls[1].id = "call_7_Z9y8X7w6V";
  conv[4].tool_call_id = "call_7_Z9y8X7w6V";
  auto r = apply_chat_template(ChatTemplateKind::kMistralV7Tekken, conv, true, {}, mistral_tools());
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(*r, expected);
  // The first turn: the tools before the only user message.
  conv.resize(2);
  r = apply_chat_template(ChatTemplateKind::kMistralV7Tekken, conv, true, {}, mistral_tools());
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(*r, "<s>[SYSTEM_PROMPT]" + preamble + "\n\nYou are terse.[/SYSTEM_PROMPT]" + tools +
                    "[INST] Weather in Paris and the time? [/INST]");
  // Without a system message the preamble stands alone (the template's own
  // branch for an undefined system message; it would use its dated default).
  r = apply_chat_template(ChatTemplateKind::kMistralV7Tekken, {{"user", "Hi"}}, true, {}, mistral_tools());
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, "<s>[SYSTEM_PROMPT]" + preamble + "[/SYSTEM_PROMPT]" + tools + "[INST]Hi[/INST]");
  // Ids shorter than 9: the reference raises; a 400 naming it here.
  auto bad = mistral_conversation();
  bad[3].tool_call_id = "short";
  auto e = apply_chat_template(ChatTemplateKind::kMistralV7Tekken, bad, true, {}, mistral_tools());
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(e.status().message().find("at least 9 characters"), std::string::npos) << e.status().message();
  // Without tools it renders as its plain template; v7 (spaced) refuses them.
  const std::vector<ChatMessage> plain = {{"system", "S"}, {"user", "U"}};
  EXPECT_EQ(*apply_chat_template(ChatTemplateKind::kMistralV7Tekken, plain, true, {}, {}),
            "<s>[SYSTEM_PROMPT]S[/SYSTEM_PROMPT][INST]U[/INST]");
  EXPECT_FALSE(chat_template_renders_tools(ChatTemplateKind::kMistralV7));
}

TEST(ChatTemplateToolsTest, WithoutToolsTheFamiliesRenderAsBeforeAndOthersRefuseToolsByName) {
  const std::vector<ChatMessage> plain = {{"system", "S"}, {"user", "U"}};
  for (ChatTemplateKind k : {ChatTemplateKind::kChatML, ChatTemplateKind::kLlama3, ChatTemplateKind::kMistral}) {
    auto a = apply_chat_template(k, plain, true, {}, {});
    auto b = apply_chat_template(k, plain, true, {});
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_EQ(*a, *b);
  }
  for (ChatTemplateKind k : {ChatTemplateKind::kMistral, ChatTemplateKind::kGemma, ChatTemplateKind::kZephyr,
                             ChatTemplateKind::kLlama2, ChatTemplateKind::kMistralLegacy, ChatTemplateKind::kMistralV7}) {
    EXPECT_FALSE(chat_template_renders_tools(k)) << chat_template_name(k);
    auto t = apply_chat_template(k, plain, true, {}, weather_tools());
    ASSERT_FALSE(t.ok());
    EXPECT_NE(t.status().message().find(std::string(chat_template_name(k))), std::string::npos) << t.status().message();
    auto m = apply_chat_template(k, weather_conversation(false), true, {});
    ASSERT_FALSE(m.ok()) << chat_template_name(k);
    EXPECT_NE(m.status().message().find("no tool-call format"), std::string::npos) << m.status().message();
  }
  // Llama 3 renders one call per assistant message, as its reference does,
  // and needs a user message for the tools.
  auto two = weather_conversation(false);
  two[2].tool_calls.push_back({"call_2", "now", "{}"});
  EXPECT_FALSE(apply_chat_template(ChatTemplateKind::kLlama3, two, true, {}, weather_tools()).ok());
  EXPECT_FALSE(apply_chat_template(ChatTemplateKind::kLlama3, {{"system", "S"}}, true, {}, weather_tools()).ok());
  EXPECT_EQ(json_quote("a\"b\\c\nd\x01\u00e9"), "\"a\\\"b\\\\c\\nd\\u0001\u00e9\"");
}

}  // namespace
}  // namespace spw
