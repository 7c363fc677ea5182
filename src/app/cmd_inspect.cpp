// `spillway inspect M`: metadata, tensor table, parameter count, bytes per type.
#include <cstdio>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "app/commands.h"
#include "core/env.h"
#include "gguf/gguf.h"
#include "tokenizer/tokenizer.h"

namespace spw::app {
namespace {

struct InspectOptions {
  std::string model;
  bool json = false;
  bool all_metadata = false;
};

// Long arrays (vocabularies) are summarised: 32000 tokens are not useful output.
nlohmann::json value_to_json(const gguf::Value& v, bool full) {
  using gguf::ValueType;
  switch (v.type) {
    case ValueType::kString: return std::get<std::string>(v.v);
    case ValueType::kBool: return std::get<bool>(v.v);
    case ValueType::kFloat32:
    case ValueType::kFloat64: return std::get<double>(v.v);
    case ValueType::kArray: {
      const auto& a = std::get<gguf::Array>(v.v);
      constexpr size_t kShown = 8;
      if (!full && a.items.size() > kShown) {
        nlohmann::json head = nlohmann::json::array();
        for (size_t i = 0; i < kShown; ++i) head.push_back(value_to_json(a.items[i], false));
        return {{"array_of", std::string(gguf::value_type_name(a.elem_type))},
                {"length", a.items.size()},
                {"first", head}};
      }
      nlohmann::json out = nlohmann::json::array();
      for (const auto& item : a.items) out.push_back(value_to_json(item, full));
      return out;
    }
    default:
      if (std::holds_alternative<uint64_t>(v.v)) return std::get<uint64_t>(v.v);
      return std::get<int64_t>(v.v);
  }
}

std::string value_to_text(const gguf::Value& v, bool full) {
  if (v.type == gguf::ValueType::kString) {
    std::string s = std::get<std::string>(v.v);
    if (!full && s.size() > 120) s = s.substr(0, 117) + "...";
    for (char& c : s) {
      if (c == '\n') c = ' ';
    }
    return s;
  }
  return value_to_json(v, full).dump();
}

// The vocabulary as Spillway would tokenize with it: kind, pre-tokenizer,
// size and special tokens; or why it cannot (unsupported model or
// pre-tokenizer, named). Null when the file has no tokenizer.ggml.model.
nlohmann::json tokenizer_summary(const gguf::GgufFile& f) {
  if (!f.has("tokenizer.ggml.model")) return nullptr;
  auto t = Tokenizer::from_gguf(f);
  if (!t.ok()) return {{"supported", false}, {"error", t.status().to_string()}};
  const Tokenizer& tok = **t;
  auto special = [&](TokenId id) -> nlohmann::json {
    if (id < 0) return nullptr;
    return {{"id", id}, {"text", tok.token_text(id)}};
  };
  nlohmann::json j = {{"supported", true},
                      {"model", std::string(tok.model_name())},
                      {"kind", tok.model_name() == "gpt2" ? "byte-level BPE" : "SentencePiece BPE"},
                      {"n_vocab", tok.n_vocab()},
                      {"bos", special(tok.bos_id())},
                      {"eos", special(tok.eos_id())},
                      {"eot", special(tok.eot_id())},
                      {"add_bos", tok.add_bos_default()},
                      {"add_eos", tok.add_eos_default()}};
  if (!tok.pre_tokenizer().empty()) j["pre_tokenizer"] = std::string(tok.pre_tokenizer());
  return j;
}

std::string tokenizer_line(const nlohmann::json& j) {
  if (!j.value("supported", false)) return "not supported: " + j.value("error", std::string());
  std::string s = j["model"].get<std::string>() + " (" + j["kind"].get<std::string>();
  if (j.contains("pre_tokenizer")) s += ", pre-tokenizer " + j["pre_tokenizer"].get<std::string>();
  s += "), " + std::to_string(j["n_vocab"].get<int>()) + " tokens";
  for (const char* k : {"bos", "eos", "eot"}) {
    if (!j[k].is_null()) s += ", " + std::string(k) + " " + std::to_string(j[k]["id"].get<int>()) + " " + j[k]["text"].dump();
  }
  s += j["add_bos"].get<bool>() ? ", adds BOS" : ", no BOS added";
  return s;
}

int run_inspect(const InspectOptions& o) {
  auto file = gguf::GgufFile::open(Env::default_env(), o.model);
  if (!file.ok()) {
    std::fprintf(stderr, "spillway inspect: %s\n", file.status().to_string().c_str());
    return 1;
  }
  const gguf::GgufFile& f = **file;
  uint64_t n_params = 0;
  std::map<std::string, std::pair<uint64_t, uint64_t>> by_type;  // name -> (tensors, bytes)
  for (const auto& t : f.tensors()) {
    n_params += t.n_elements;
    auto& e = by_type[gguf::ggml_type_name(t.type)];
    e.first += 1;
    e.second += t.nbytes;
  }

  if (o.json) {
    nlohmann::json j;
    j["path"] = f.path();
    j["version"] = f.version();
    j["alignment"] = f.alignment();
    j["file_bytes"] = f.file_size();
    j["data_offset"] = f.data_offset();
    j["n_params"] = n_params;
    nlohmann::json meta = nlohmann::json::object();
    for (const auto& [k, v] : f.metadata()) meta[k] = value_to_json(v, o.all_metadata);
    j["metadata"] = meta;
    j["tokenizer"] = tokenizer_summary(f);
    nlohmann::json tensors = nlohmann::json::array();
    for (const auto& t : f.tensors()) {
      nlohmann::json shape = nlohmann::json::array();
      for (uint32_t d = 0; d < t.n_dims; ++d) shape.push_back(t.ne[d]);
      tensors.push_back({{"name", t.name}, {"type", gguf::ggml_type_name(t.type)}, {"shape", shape},
                         {"offset", t.offset}, {"bytes", t.nbytes}});
    }
    j["tensors"] = tensors;
    nlohmann::json types = nlohmann::json::object();
    for (const auto& [name, e] : by_type) types[name] = {{"tensors", e.first}, {"bytes", e.second}};
    j["bytes_by_type"] = types;
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }

  std::printf("file      %s\n", f.path().c_str());
  std::printf("format    GGUF v%u, alignment %u, %llu bytes, data at %llu\n", f.version(), f.alignment(),
              static_cast<unsigned long long>(f.file_size()),
              static_cast<unsigned long long>(f.data_offset()));
  std::printf("params    %llu (%.2f M)\n", static_cast<unsigned long long>(n_params), n_params / 1e6);
  if (nlohmann::json tok = tokenizer_summary(f); !tok.is_null()) {
    std::printf("tokenizer %s\n", tokenizer_line(tok).c_str());
  }
  std::printf("\nmetadata (%zu keys)\n", f.metadata().size());
  for (const auto& [k, v] : f.metadata()) {
    std::printf("  %-44s %s\n", k.c_str(), value_to_text(v, o.all_metadata).c_str());
  }
  std::printf("\ntensors (%zu)\n", f.tensors().size());
  for (const auto& t : f.tensors()) {
    std::string shape;
    for (uint32_t d = 0; d < t.n_dims; ++d) shape += (d ? " x " : "") + std::to_string(t.ne[d]);
    std::printf("  %-36s %-6s %-20s %12llu bytes\n", t.name.c_str(), gguf::ggml_type_name(t.type).c_str(),
                shape.c_str(), static_cast<unsigned long long>(t.nbytes));
  }
  std::printf("\nbytes by tensor type\n");
  for (const auto& [name, e] : by_type) {
    std::printf("  %-6s %4llu tensors %14llu bytes\n", name.c_str(), static_cast<unsigned long long>(e.first),
                static_cast<unsigned long long>(e.second));
  }
  return 0;
}

}  // namespace

void add_inspect(CLI::App& app, int& exit_code) {
  auto o = std::make_shared<InspectOptions>();
  CLI::App* sub = app.add_subcommand("inspect", "Show a GGUF file's metadata, tensors and parameter count");
  sub->add_option("model", o->model, "GGUF file")->required();
  sub->add_flag("--json", o->json, "Print JSON");
  sub->add_flag("--all", o->all_metadata, "Print long arrays and strings in full");
  sub->callback([o, &exit_code] { exit_code = run_inspect(*o); });
}

}  // namespace spw::app
