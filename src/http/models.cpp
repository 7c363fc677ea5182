#include "http/models.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "http/json_fields.h"

namespace spw::http {
namespace {

constexpr size_t kMaxAliasBytes = 128;

json_fields::json model_json(const ModelEntry& e, int64_t created,
                             const std::vector<gateway::ResidentModelInfo>& residency) {
  json_fields::json sp = {{"role", e.role}, {"paths", e.paths}};
  if (!e.alias_of.empty()) sp["alias_of"] = e.alias_of;
  if (!e.unavailable.empty()) {
    sp["state"] = "unavailable";
    sp["reason"] = e.unavailable;
  } else if (e.role != "catalogue") {
    sp["state"] = "loaded";
    sp["pinned"] = true;
  }
  // A catalogue model's residency units (its paths): the first-choice one's
  // figures at the top, each unit's under "units", and the state of the
  // model as a whole (loaded when some unit is).
  json_fields::json units = json_fields::json::array();
  const gateway::ResidentModelInfo* first = nullptr;
  std::string state;
  for (const gateway::ResidentModelInfo& r : residency) {
    if (r.model != e.id) continue;
    units.push_back(json_fields::resident_model_json(r));
    if (first == nullptr || (!e.paths.empty() && r.name == e.paths.front())) first = &r;
    if (r.state == "loaded" || (r.state == "loading" && state != "loaded") || state.empty()) state = r.state;
  }
  if (first != nullptr) {
    json_fields::json m = json_fields::resident_model_json(*first);
    m.erase("name");
    m.erase("model");
    sp.update(m);
    sp["state"] = state;
    sp["units"] = std::move(units);
  }
  return {{"id", e.id}, {"object", "model"}, {"created", created}, {"owned_by", "spillway"}, {"spillway", sp}};
}

}  // namespace

ModelCatalog ModelCatalog::build(const std::string& served, const std::vector<std::string>& aliases,
                                 const std::vector<gateway::ExecutionPath>& paths,
                                 const std::vector<std::pair<std::string, std::string>>& catalogue) {
  ModelCatalog c;
  c.served_ = served;
  auto in_catalogue = [&](const std::string& model) {
    return std::any_of(catalogue.begin(), catalogue.end(), [&](const auto& m) { return m.first == model; });
  };
  // The paths that run the served model: those not marked fallback_model
  // nor serving a catalogue model (a path's own name may be empty in tests:
  // it is the served model then).
  std::vector<std::string> served_paths;
  for (const gateway::ExecutionPath& p : paths)
    if (!p.fallback_model && !in_catalogue(p.model)) served_paths.push_back(p.name);
  c.entries_.push_back({served, "primary", "", served_paths, ""});
  for (const std::string& a : aliases) c.entries_.push_back({a, "alias", served, served_paths, ""});
  for (const auto& [id, why] : catalogue) {
    ModelEntry e{id, "catalogue", "", {}, why};
    for (const gateway::ExecutionPath& p : paths)
      if (p.model == id) e.paths.push_back(p.name);
    c.entries_.push_back(std::move(e));
  }
  for (const gateway::ExecutionPath& p : paths) {
    if (!p.fallback_model) continue;
    auto it = std::find_if(c.entries_.begin(), c.entries_.end(), [&](const ModelEntry& e) { return e.id == p.model; });
    if (it == c.entries_.end()) c.entries_.push_back({p.model, "fallback", "", {p.name}, ""});
    else it->paths.push_back(p.name);
  }
  return c;
}

const ModelEntry* ModelCatalog::find(std::string_view id) const {
  for (const ModelEntry& e : entries_)
    if (e.id == id) return &e;
  return nullptr;
}

std::variant<std::string, ApiError> ModelCatalog::resolve(std::string_view requested) const {
  if (requested.empty()) return std::string();
  const ModelEntry* e = find(requested);
  if (!e) return model_not_found(requested, *this);
  // The service's model may run anywhere the plan sends it; a fallback
  // model's id keeps the request to the paths that serve that model.
  if (!e->unavailable.empty()) {
    ApiError err;
    err.http_status = 404;
    err.param = "model";
    err.code = "model_unavailable";
    err.message = "The model '" + e->id + "' is in this server's catalogue but cannot be served: " + e->unavailable;
    return err;
  }
  if (e->role == "fallback" || e->role == "catalogue") return e->id;
  return std::string();
}

ApiError model_not_found(std::string_view requested, const ModelCatalog& catalog) {
  ApiError e;
  e.http_status = 404;
  e.param = "model";
  e.code = "model_not_found";
  std::string ids;
  for (const ModelEntry& m : catalog.entries()) {
    ids += (ids.empty() ? "" : ", ") + m.id;
    if (m.role != "primary") ids += " (" + m.role + ")";
  }
  e.message = "The model '" + input_excerpt(requested) + "' does not exist on this server; it serves: " + ids +
              " (GET /v1/models lists them)";
  return e;
}

std::string render_models(const ModelCatalog& catalog, int64_t created,
                          const std::vector<gateway::ResidentModelInfo>& residency) {
  json_fields::json data = json_fields::json::array();
  for (const ModelEntry& e : catalog.entries()) data.push_back(model_json(e, created, residency));
  return json_fields::dump({{"object", "list"}, {"data", data}});
}

std::string render_model(const ModelEntry& entry, int64_t created,
                         const std::vector<gateway::ResidentModelInfo>& residency) {
  return json_fields::dump(model_json(entry, created, residency));
}

Status validate_aliases(const std::vector<std::string>& aliases, const std::string& served,
                        const std::vector<std::string>& other_ids) {
  for (size_t i = 0; i < aliases.size(); ++i) {
    const std::string& a = aliases[i];
    auto bad = [&](const std::string& why) {
      return Status::invalid_argument("--alias '" + input_excerpt(a) + "': " + why);
    };
    if (a.empty()) return Status::invalid_argument("--alias: an alias may not be empty");
    if (a.size() > kMaxAliasBytes) return bad("longer than " + std::to_string(kMaxAliasBytes) + " bytes");
    if (std::any_of(a.begin(), a.end(), [](char ch) { return static_cast<unsigned char>(ch) <= 0x20 || ch == 0x7f; }))
      return bad("contains whitespace or a control character");
    if (a == served) return bad("is the served model's own id");
    if (std::find(other_ids.begin(), other_ids.end(), a) != other_ids.end()) return bad("is a fallback model's id");
    if (std::find(aliases.begin(), aliases.begin() + static_cast<ptrdiff_t>(i), a) != aliases.begin() + static_cast<ptrdiff_t>(i))
      return bad("given twice");
  }
  return Status::ok_status();
}

}  // namespace spw::http
