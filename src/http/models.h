// The model ids a server answers to, and what a request's `model` field means.
//
// Contract: a catalog is built once from the served model's id (the first
// path's model), the operator's aliases for it (--alias) and the paths'
// models (a --fallback-model serves under its own id). Ids are matched
// exactly (case-sensitive, as OpenAI's are). resolve():
//   - empty (the field absent) or the served id or an alias: the service's
//     model, wherever the plan runs it (a fallback model included, marked as
//     such in the response): route model "".
//   - a fallback model's or a catalogue model's id: that model only (the
//     client chose it): route model = the id, so only paths serving it are
//     eligible.
//   - an unavailable catalogue model's id: 404 with code
//     "model_unavailable" and the reason.
//   - anything else: 404 with code "model_not_found", `param` "model", and a
//     message that names the ids this server answers to.
// Roles in /v1/models: "primary" (the served id), "alias" (alias_of the
// served id), "fallback" (a fallback model's id); each entry lists the paths
// that serve it.
// validate_aliases() refuses (InvalidArgument naming the alias) an empty
// alias, one longer than 128 bytes or with whitespace or control characters,
// a duplicate, and one equal to the served id or a fallback model's id (it
// would be ambiguous).
// Thread safety: immutable after build; shared freely.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "core/status.h"
#include "gateway/gateway.h"
#include "http/openai.h"

namespace spw::http {

struct ModelEntry {
  std::string id;
  std::string role;      // "primary", "alias", "fallback", "catalogue"
  std::string alias_of;  // role "alias": the served id; else empty
  std::vector<std::string> paths;  // names of the paths serving it
  std::string unavailable;         // a catalogue model that cannot be served: why ("": it is served)
};

class ModelCatalog {
 public:
  ModelCatalog() = default;
  // `catalogue`: the catalogue's models beyond the served one (id, and why
  // it is unavailable or ""), whose paths are theirs alone.
  static ModelCatalog build(const std::string& served, const std::vector<std::string>& aliases,
                            const std::vector<gateway::ExecutionPath>& paths,
                            const std::vector<std::pair<std::string, std::string>>& catalogue = {});

  // The route model for a request's `model` field (see the contract), or the
  // 404 error.
  std::variant<std::string, ApiError> resolve(std::string_view requested) const;
  // The entry with this id (nullptr: none).
  const ModelEntry* find(std::string_view id) const;
  const std::vector<ModelEntry>& entries() const { return entries_; }
  const std::string& served() const { return served_; }

 private:
  std::string served_;
  std::vector<ModelEntry> entries_;
};

// The 404 an unknown id gets (catalog: the ids to name in the message).
ApiError model_not_found(std::string_view requested, const ModelCatalog& catalog);

// GET /v1/models: {"object":"list","data":[model...]}; GET /v1/models/{id}:
// one model: {"id","object":"model","created","owned_by":"spillway",
// "spillway":{"role","alias_of"|absent,"paths":[...],"state",...}}. The
// state: "loaded" for the served model (always resident); a catalogue
// model's from `residency` (loaded, loading, unloaded, with its memory,
// last use, keep-alive left, loads and evictions), or "unavailable" with
// "reason".
std::string render_models(const ModelCatalog& catalog, int64_t created,
                          const std::vector<gateway::ResidentModelInfo>& residency = {});
std::string render_model(const ModelEntry& entry, int64_t created,
                         const std::vector<gateway::ResidentModelInfo>& residency = {});

Status validate_aliases(const std::vector<std::string>& aliases, const std::string& served,
                        const std::vector<std::string>& other_ids);

}  // namespace spw::http
