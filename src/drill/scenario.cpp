// Scenario parsing: toml++ tree -> Scenario, refusing anything it does not
// understand (see scenario.h for the layout and the rules).
#include "drill/scenario.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <initializer_list>
#include <limits>
#include <set>
#include <sstream>

#include <toml++/toml.h>

#include "core/size.h"

namespace spw::drill {

std::string_view fault_kind_name(FaultKind k) {
  switch (k) {
    case FaultKind::kPressure: return "pressure";
    case FaultKind::kAllocFail: return "alloc_fail";
    case FaultKind::kDeviceLost: return "device_lost";
    case FaultKind::kCancelQueued: return "cancel_queued";
    case FaultKind::kKill: return "kill";
  }
  return "unknown";
}

Result<FaultKind> parse_fault_kind(std::string_view name) {
  for (FaultKind k : {FaultKind::kPressure, FaultKind::kAllocFail, FaultKind::kDeviceLost, FaultKind::kCancelQueued,
                      FaultKind::kKill}) {
    if (fault_kind_name(k) == name) return k;
  }
  return Status::invalid_argument("unknown fault kind '" + std::string(name) +
                                  "' (expected pressure, alloc_fail, device_lost, cancel_queued or kill)");
}

Result<uint64_t> parse_size(std::string_view text) { return parse_byte_size(text, /*allow_zero=*/true); }

std::vector<std::string> simulated_serve_args(const Scenario& sc, const std::string& model_path) {
  std::vector<std::string> args = {"--model", model_path};
  args.insert(args.end(), sc.server.args.begin(), sc.server.args.end());
  for (const std::string& m : sc.server.models) args.insert(args.end(), {"--model", m});
  return args;
}

const RequestClass* Scenario::find_class(std::string_view n) const {
  for (const auto& c : classes) {
    if (c.name == n) return &c;
  }
  return nullptr;
}

double Scenario::total_s() const {
  double t = 0;
  for (const auto& p : phases) t += p.duration_s;
  return t;
}

namespace {

// Reads one TOML table into typed fields; every error names the key by its
// full path ("phase[2].fault[1].bytes") and the line toml++ recorded.
class Reader {
 public:
  Reader(std::string source) : source_(std::move(source)) {}

  Status error(const toml::node* node, const std::string& key, const std::string& what) const {
    std::string where = source_;
    if (node != nullptr && node->source().begin.line > 0) where += ":" + std::to_string(node->source().begin.line);
    return Status::invalid_argument(where + ": " + key + ": " + what);
  }

  // Refuses keys of `t` not in `allowed`, naming the first one.
  Status only_keys(const toml::table& t, const std::string& prefix, std::initializer_list<std::string_view> allowed,
                   std::string_view why = {}) const {
    for (const auto& [k, v] : t) {
      const std::string_view key = k.str();
      if (std::find(allowed.begin(), allowed.end(), key) == allowed.end()) {
        std::string msg = "unknown key";
        if (!why.empty()) msg = std::string(why);
        std::string list;
        for (auto a : allowed) list += (list.empty() ? "" : ", ") + std::string(a);
        return error(&v, join(prefix, key), msg + " (expected one of: " + list + ")");
      }
    }
    return Status::ok_status();
  }

  static std::string join(const std::string& prefix, std::string_view key) {
    return prefix.empty() ? std::string(key) : prefix + "." + std::string(key);
  }

  Status get_string(const toml::table& t, const std::string& prefix, std::string_view key, std::string& out,
                    bool required, bool non_empty) const {
    const toml::node* n = t.get(key);
    if (n == nullptr) {
      if (required) return error(&t, join(prefix, key), "missing (required)");
      return Status::ok_status();
    }
    const auto* s = n->as_string();
    if (s == nullptr) return error(n, join(prefix, key), std::string("expected a string, got ") + type_name(*n));
    if (non_empty && s->get().empty()) return error(n, join(prefix, key), "must not be empty");
    out = s->get();
    return Status::ok_status();
  }

  Status get_int(const toml::table& t, const std::string& prefix, std::string_view key, int64_t& out, int64_t lo,
                 int64_t hi) const {
    const toml::node* n = t.get(key);
    if (n == nullptr) return Status::ok_status();
    const auto* i = n->as_integer();
    if (i == nullptr) return error(n, join(prefix, key), std::string("expected an integer, got ") + type_name(*n));
    const int64_t v = i->get();
    if (v < lo || v > hi) {
      return error(n, join(prefix, key),
                   "value " + std::to_string(v) + " out of range [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
    }
    out = v;
    return Status::ok_status();
  }

  Status get_int32(const toml::table& t, const std::string& prefix, std::string_view key, int32_t& out,
                   int32_t lo) const {
    int64_t v = out;
    SPW_RETURN_IF_ERROR(get_int(t, prefix, key, v, lo, std::numeric_limits<int32_t>::max()));
    out = static_cast<int32_t>(v);
    return Status::ok_status();
  }

  // A number (integer or float). `positive`: > 0, else >= 0.
  Status get_number(const toml::table& t, const std::string& prefix, std::string_view key, double& out,
                    bool positive, double hi = std::numeric_limits<double>::infinity()) const {
    const toml::node* n = t.get(key);
    if (n == nullptr) return Status::ok_status();
    double v = 0;
    if (const auto* i = n->as_integer()) {
      v = static_cast<double>(i->get());
    } else if (const auto* f = n->as_floating_point()) {
      v = f->get();
    } else {
      return error(n, join(prefix, key), std::string("expected a number, got ") + type_name(*n));
    }
    if (!std::isfinite(v)) return error(n, join(prefix, key), "must be a finite number");
    if (positive && !(v > 0)) return error(n, join(prefix, key), "must be greater than 0");
    if (!positive && v < 0) return error(n, join(prefix, key), "must not be negative");
    if (v > hi) return error(n, join(prefix, key), "must be at most " + format_number(hi));
    out = v;
    return Status::ok_status();
  }

  Status get_bool(const toml::table& t, const std::string& prefix, std::string_view key, bool& out) const {
    const toml::node* n = t.get(key);
    if (n == nullptr) return Status::ok_status();
    const auto* b = n->as_boolean();
    if (b == nullptr) return error(n, join(prefix, key), std::string("expected true or false, got ") + type_name(*n));
    out = b->get();
    return Status::ok_status();
  }

  // A size: a string ("64MiB") or an integer (bytes). `allow_zero`: 0 means
  // "none held" (a co-tenant that lets go).
  Status get_size(const toml::table& t, const std::string& prefix, std::string_view key, uint64_t& out,
                  bool allow_zero) const {
    const toml::node* n = t.get(key);
    if (n == nullptr) return Status::ok_status();
    uint64_t v = 0;
    if (const auto* i = n->as_integer()) {
      if (i->get() < 0) return error(n, join(prefix, key), "must not be negative");
      v = static_cast<uint64_t>(i->get());
    } else if (const auto* s = n->as_string()) {
      auto r = parse_size(s->get());
      if (!r.ok()) return error(n, join(prefix, key), r.status().message());
      v = *r;
    } else {
      return error(n, join(prefix, key), std::string("expected a size (\"64MiB\" or bytes), got ") + type_name(*n));
    }
    if (v == 0 && !allow_zero) return error(n, join(prefix, key), "must be greater than 0");
    out = v;
    return Status::ok_status();
  }

  Status get_string_array(const toml::table& t, const std::string& prefix, std::string_view key,
                          std::vector<std::string>& out) const {
    const toml::node* n = t.get(key);
    if (n == nullptr) return Status::ok_status();
    const auto* a = n->as_array();
    if (a == nullptr) return error(n, join(prefix, key), std::string("expected an array of strings, got ") + type_name(*n));
    out.clear();
    for (size_t i = 0; i < a->size(); ++i) {
      const auto* s = (*a)[i].as_string();
      if (s == nullptr) {
        return error(&(*a)[i], join(prefix, key) + "[" + std::to_string(i + 1) + "]",
                     std::string("expected a string, got ") + type_name((*a)[i]));
      }
      out.push_back(s->get());
    }
    return Status::ok_status();
  }

  // The array of tables under `key` ([[key]]); absent: empty.
  Result<const toml::array*> get_table_array(const toml::table& t, const std::string& prefix,
                                             std::string_view key) const {
    const toml::node* n = t.get(key);
    if (n == nullptr) return static_cast<const toml::array*>(nullptr);
    const auto* a = n->as_array();
    if (a == nullptr || !a->is_array_of_tables()) {
      if (a != nullptr && a->empty()) return a;
      return error(n, join(prefix, key), "expected an array of tables ([[" + join(prefix, key) + "]])");
    }
    return a;
  }

  static const char* type_name(const toml::node& n) {
    switch (n.type()) {
      case toml::node_type::string: return "a string";
      case toml::node_type::integer: return "an integer";
      case toml::node_type::floating_point: return "a float";
      case toml::node_type::boolean: return "a boolean";
      case toml::node_type::table: return "a table";
      case toml::node_type::array: return "an array";
      case toml::node_type::date:
      case toml::node_type::time:
      case toml::node_type::date_time: return "a date/time";
      default: return "something else";
    }
  }

  static std::string format_number(double v) {
    std::ostringstream o;
    o << v;
    return o.str();
  }

 private:
  std::string source_;
};

Result<RequestClass> read_class(const Reader& r, const toml::table& t, const std::string& p) {
  SPW_RETURN_IF_ERROR(r.only_keys(t, p,
                                  {"name", "prompt", "prompt_repeat", "max_tokens", "stream", "greedy",
                                   "idempotency_share", "retry_share", "model"}));
  RequestClass c;
  SPW_RETURN_IF_ERROR(r.get_string(t, p, "name", c.name, true, true));
  SPW_RETURN_IF_ERROR(r.get_string(t, p, "prompt", c.prompt, true, true));
  SPW_RETURN_IF_ERROR(r.get_int32(t, p, "prompt_repeat", c.prompt_repeat, 1));
  SPW_RETURN_IF_ERROR(r.get_int32(t, p, "max_tokens", c.max_tokens, 1));
  SPW_RETURN_IF_ERROR(r.get_bool(t, p, "stream", c.stream));
  SPW_RETURN_IF_ERROR(r.get_bool(t, p, "greedy", c.greedy));
  SPW_RETURN_IF_ERROR(r.get_string(t, p, "model", c.model, false, true));
  SPW_RETURN_IF_ERROR(r.get_number(t, p, "idempotency_share", c.idempotency_share, false, 1.0));
  SPW_RETURN_IF_ERROR(r.get_number(t, p, "retry_share", c.retry_share, false, 1.0));
  return c;
}

Result<FaultSpec> read_fault(const Reader& r, const toml::table& t, const std::string& p, double phase_s) {
  std::string kind_name;
  SPW_RETURN_IF_ERROR(r.get_string(t, p, "kind", kind_name, true, true));
  auto kind = parse_fault_kind(kind_name);
  if (!kind.ok()) return r.error(t.get("kind"), Reader::join(p, "kind"), kind.status().message());
  FaultSpec f;
  f.kind = *kind;
  // Keys that mean nothing for a kind are refused too: `bytes` on a kill is a
  // mistake the drill would otherwise ignore silently.
  const std::string why = "not a key of a " + kind_name + " fault";
  switch (f.kind) {
    case FaultKind::kPressure:
      SPW_RETURN_IF_ERROR(r.only_keys(t, p, {"kind", "at_s", "bytes"}, why));
      if (t.get("bytes") == nullptr) return r.error(&t, Reader::join(p, "bytes"), "missing (required for a pressure fault)");
      break;
    case FaultKind::kAllocFail:
      SPW_RETURN_IF_ERROR(r.only_keys(t, p, {"kind", "at_s", "path", "count"}, why));
      break;
    case FaultKind::kDeviceLost:
      SPW_RETURN_IF_ERROR(r.only_keys(t, p, {"kind", "at_s", "path", "count", "after_submits"}, why));
      break;
    case FaultKind::kCancelQueued:
      SPW_RETURN_IF_ERROR(r.only_keys(t, p, {"kind", "at_s", "path", "count"}, why));
      f.path = "cpu";  // documented default: the CPU path's queue
      break;
    case FaultKind::kKill:
      SPW_RETURN_IF_ERROR(r.only_keys(t, p, {"kind", "at_s", "restart_after_s"}, why));
      break;
  }
  if (t.get("at_s") == nullptr) return r.error(&t, Reader::join(p, "at_s"), "missing (required)");
  SPW_RETURN_IF_ERROR(r.get_number(t, p, "at_s", f.at_s, false));
  if (f.at_s >= phase_s) {
    return r.error(t.get("at_s"), Reader::join(p, "at_s"),
                   "fault at " + Reader::format_number(f.at_s) + " s is outside its phase (duration_s " +
                       Reader::format_number(phase_s) + ")");
  }
  SPW_RETURN_IF_ERROR(r.get_string(t, p, "path", f.path, false, true));
  SPW_RETURN_IF_ERROR(r.get_int32(t, p, "count", f.count, 1));
  SPW_RETURN_IF_ERROR(r.get_int32(t, p, "after_submits", f.after_submits, 0));
  SPW_RETURN_IF_ERROR(r.get_size(t, p, "bytes", f.bytes, true));
  SPW_RETURN_IF_ERROR(r.get_number(t, p, "restart_after_s", f.restart_after_s, true));
  return f;
}

Result<Phase> read_phase(const Reader& r, const toml::table& t, const std::string& p, const Scenario& sc) {
  SPW_RETURN_IF_ERROR(r.only_keys(t, p, {"name", "duration_s", "cotenant_bytes", "undeclared_bytes", "load", "fault"}));
  Phase ph;
  SPW_RETURN_IF_ERROR(r.get_string(t, p, "name", ph.name, true, true));
  SPW_RETURN_IF_ERROR(r.get_number(t, p, "duration_s", ph.duration_s, true));
  SPW_RETURN_IF_ERROR(r.get_size(t, p, "cotenant_bytes", ph.cotenant_bytes, true));
  SPW_RETURN_IF_ERROR(r.get_size(t, p, "undeclared_bytes", ph.undeclared_bytes, true));

  SPW_ASSIGN_OR_RETURN(const toml::array* loads, r.get_table_array(t, p, "load"));
  std::set<std::string> seen;
  for (size_t i = 0; loads != nullptr && i < loads->size(); ++i) {
    const std::string lp = p + ".load[" + std::to_string(i + 1) + "]";
    const toml::table& lt = *(*loads)[i].as_table();
    SPW_RETURN_IF_ERROR(r.only_keys(lt, lp, {"class", "rate_per_s", "concurrency"}));
    Phase::Load l;
    SPW_RETURN_IF_ERROR(r.get_string(lt, lp, "class", l.cls, true, true));
    if (sc.find_class(l.cls) == nullptr) {
      return r.error(lt.get("class"), lp + ".class", "no [[class]] named '" + l.cls + "'");
    }
    if (!seen.insert(l.cls).second) {
      return r.error(lt.get("class"), lp + ".class", "class '" + l.cls + "' has two loads in one phase");
    }
    SPW_RETURN_IF_ERROR(r.get_number(lt, lp, "rate_per_s", l.rate_per_s, true));
    SPW_RETURN_IF_ERROR(r.get_int32(lt, lp, "concurrency", l.concurrency, 1));
    ph.load.push_back(std::move(l));
  }

  SPW_ASSIGN_OR_RETURN(const toml::array* faults, r.get_table_array(t, p, "fault"));
  for (size_t i = 0; faults != nullptr && i < faults->size(); ++i) {
    const std::string fp = p + ".fault[" + std::to_string(i + 1) + "]";
    SPW_ASSIGN_OR_RETURN(FaultSpec f, read_fault(r, *(*faults)[i].as_table(), fp, ph.duration_s));
    ph.faults.push_back(std::move(f));
  }
  return ph;
}

Result<Scenario> read_scenario(const Reader& r, const toml::table& root) {
  SPW_RETURN_IF_ERROR(r.only_keys(root, "", {"name", "description", "seed", "drain_s", "server", "class", "phase"}));
  Scenario sc;
  SPW_RETURN_IF_ERROR(r.get_string(root, "", "name", sc.name, true, true));
  SPW_RETURN_IF_ERROR(r.get_string(root, "", "description", sc.description, false, false));
  int64_t seed = static_cast<int64_t>(sc.seed);
  SPW_RETURN_IF_ERROR(r.get_int(root, "", "seed", seed, 0, std::numeric_limits<int64_t>::max()));
  sc.seed = static_cast<uint64_t>(seed);
  SPW_RETURN_IF_ERROR(r.get_number(root, "", "drain_s", sc.drain_s, true));

  if (const toml::node* sn = root.get("server")) {
    const auto* st = sn->as_table();
    if (st == nullptr) return r.error(sn, "server", "expected a table ([server])");
    SPW_RETURN_IF_ERROR(r.only_keys(*st, "server", {"model", "device", "device_memory", "args", "models"}));
    SPW_RETURN_IF_ERROR(r.get_string(*st, "server", "model", sc.server.model, false, true));
    SPW_RETURN_IF_ERROR(r.get_string(*st, "server", "device", sc.server.device, false, true));
    const toml::node* dm = st->get("device_memory");
    if (dm != nullptr && dm->is_string() && dm->as_string()->get().empty()) {
      sc.server.device_memory.clear();  // "" = the device's heap, as unset
    } else if (dm != nullptr) {
      // Validated here, passed on verbatim as --device-memory (an integer
      // becomes its decimal byte count).
      uint64_t bytes = 0;
      SPW_RETURN_IF_ERROR(r.get_size(*st, "server", "device_memory", bytes, false));
      sc.server.device_memory = dm->is_string() ? dm->as_string()->get() : std::to_string(bytes);
    }
    SPW_RETURN_IF_ERROR(r.get_string_array(*st, "server", "args", sc.server.args));
    SPW_RETURN_IF_ERROR(r.get_string_array(*st, "server", "models", sc.server.models));
    for (const std::string& m : sc.server.models) {
      const size_t eq = m.find('=');
      if (eq == 0 || eq == std::string::npos || eq + 1 == m.size()) {
        return r.error(st->get("models"), "server.models", "expected NAME=FILE, got '" + m + "'");
      }
    }
  }

  SPW_ASSIGN_OR_RETURN(const toml::array* classes, r.get_table_array(root, "", "class"));
  if (classes == nullptr || classes->empty()) return r.error(&root, "class", "missing: at least one [[class]] is required");
  for (size_t i = 0; i < classes->size(); ++i) {
    const std::string p = "class[" + std::to_string(i + 1) + "]";
    SPW_ASSIGN_OR_RETURN(RequestClass c, read_class(r, *(*classes)[i].as_table(), p));
    if (sc.find_class(c.name) != nullptr) {
      return r.error(&(*classes)[i], p + ".name", "duplicate class name '" + c.name + "'");
    }
    if (!c.model.empty() && std::none_of(sc.server.models.begin(), sc.server.models.end(), [&](const std::string& m) {
          return m.substr(0, m.find('=')) == c.model;
        })) {
      return r.error(&(*classes)[i], p + ".model", "'" + c.model + "' is not a name of server.models");
    }
    sc.classes.push_back(std::move(c));
  }

  SPW_ASSIGN_OR_RETURN(const toml::array* phases, r.get_table_array(root, "", "phase"));
  if (phases == nullptr || phases->empty()) return r.error(&root, "phase", "missing: at least one [[phase]] is required");
  std::set<std::string> names;
  for (size_t i = 0; i < phases->size(); ++i) {
    const std::string p = "phase[" + std::to_string(i + 1) + "]";
    SPW_ASSIGN_OR_RETURN(Phase ph, read_phase(r, *(*phases)[i].as_table(), p, sc));
    if (!names.insert(ph.name).second) {
      return r.error(&(*phases)[i], p + ".name", "duplicate phase name '" + ph.name + "'");
    }
    sc.phases.push_back(std::move(ph));
  }
  return sc;
}

}  // namespace

Result<Scenario> parse_scenario(std::string_view toml_text, std::string_view source_name) {
  const std::string source(source_name.empty() ? std::string_view("scenario") : source_name);
  toml::table root;
  // toml++ reports syntax errors by exception or by result depending on how
  // it was configured; neither may leave this function.
#if TOML_EXCEPTIONS
  try {
    root = toml::parse(toml_text, source);
  } catch (const toml::parse_error& e) {
    return Status::invalid_argument(source + ":" + std::to_string(e.source().begin.line) + ": " +
                                    std::string(e.description()));
  } catch (const std::exception& e) {
    return Status::invalid_argument(source + ": " + e.what());
  }
#else
  toml::parse_result res = toml::parse(toml_text, source);
  if (!res) {
    return Status::invalid_argument(source + ":" + std::to_string(res.error().source().begin.line) + ": " +
                                    std::string(res.error().description()));
  }
  root = std::move(res).table();
#endif
  Reader reader(source);
  return read_scenario(reader, root);
}

Result<Scenario> load_scenario(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::not_found("scenario file '" + path + "' cannot be opened");
  std::ostringstream buf;
  buf << in.rdbuf();
  if (in.bad()) return Status::io_error("scenario file '" + path + "': read failed");
  return parse_scenario(buf.str(), path);
}

}  // namespace spw::drill
