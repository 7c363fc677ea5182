#include "grammar/json_schema.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <unordered_map>
#include <unordered_set>

namespace spw::grammar {
namespace {

using json = nlohmann::json;

Status schema_error(std::string message) {
  return invalid_field("response_format", "response_format: " + std::move(message));
}

// A key as a JSON pointer token (RFC 6901: ~ -> ~0, / -> ~1), cut to a
// readable length: it is quoted back in error messages.
std::string pointer_token(std::string_view key) {
  std::string out;
  for (char c : key) {
    if (c == '~') out += "~0";
    else if (c == '/') out += "~1";
    else out += c;
  }
  return out;
}

// A keyword quoted in a message: at most 40 bytes of it.
std::string keyword_excerpt(std::string_view key) {
  return key.size() <= 40 ? std::string(key) : std::string(key.substr(0, 40)) + "...";
}

std::string where(const std::string& ptr) { return ptr.empty() ? "/" : ptr; }

// The canonical JSON text of a value (compact; non-ASCII raw, as the
// matcher's canonical keys and literal tries expect).
std::string canonical(const json& v) { return v.dump(-1, ' ', false, json::error_handler_t::replace); }

const std::unordered_set<std::string_view>& annotation_keywords() {
  static const std::unordered_set<std::string_view> k = {
      "title", "description", "$schema", "$id", "$comment", "examples", "default", "deprecated", "readOnly",
      "writeOnly"};
  return k;
}

const std::unordered_set<std::string_view>& supported_keywords() {
  static const std::unordered_set<std::string_view> k = {
      "type",     "properties", "required", "additionalProperties", "items", "minItems", "maxItems", "minLength",
      "maxLength", "enum",      "const",    "anyOf",               "oneOf", "$ref",     "$defs",    "definitions"};
  return k;
}

// Keywords that may stand beside $ref / anyOf / oneOf: the others would
// intersect with them, which this subset does not do.
bool is_structural_neighbour(std::string_view k) {
  return annotation_keywords().count(k) > 0 || k == "$defs" || k == "definitions";
}

// A trie under construction (then flattened into the Grammar).
struct TrieBuilder {
  std::vector<std::map<uint8_t, int32_t>> children{1};
  std::vector<int32_t> terminal{-1};
  std::vector<uint64_t> names{0};

  void insert(std::string_view word, int32_t index, uint64_t name_bit) {
    int32_t at = 0;
    names[0] |= name_bit;
    for (char ch : word) {
      const auto b = static_cast<uint8_t>(ch);
      auto it = children[static_cast<size_t>(at)].find(b);
      if (it == children[static_cast<size_t>(at)].end()) {
        const auto next = static_cast<int32_t>(children.size());
        children.emplace_back();
        terminal.push_back(-1);
        names.push_back(0);
        children[static_cast<size_t>(at)][b] = next;
        at = next;
      } else {
        at = it->second;
      }
      names[static_cast<size_t>(at)] |= name_bit;
    }
    if (terminal[static_cast<size_t>(at)] < 0) terminal[static_cast<size_t>(at)] = index;
  }

  // Appends the nodes to g (their order kept: node i -> base + i) and
  // returns the root's index.
  int32_t flatten(Grammar& g) const {
    const auto base = static_cast<int32_t>(g.trie.size());
    for (size_t i = 0; i < children.size(); ++i) {
      TrieNode t;
      t.first_child = static_cast<uint32_t>(g.trie_edges.size());
      t.n_children = static_cast<uint16_t>(children[i].size());
      t.terminal = terminal[i];
      t.names = names[i];
      for (const auto& [b, n] : children[i]) g.trie_edges.push_back({b, base + n});
      g.trie.push_back(t);
    }
    return base;
  }
};

class Compiler {
 public:
  Compiler(const json& root, Grammar& g) : root_(root), g_(g) {}

  Status run() {
    // Node 0: any JSON value (json_object's members, `true`, absent items).
    g_.any = new_node_unchecked();
    Node& any = g_.nodes[0];
    any.types = kTypeAll;
    any.additional = g_.any;
    any.items = g_.any;
    g_.nodes[0].words = words_trie(kTypeAll);
    SPW_ASSIGN_OR_RETURN(int32_t root, compile(root_, "", 0));
    g_.root = root;
    SPW_RETURN_IF_ERROR(flatten_unions());
    prune();
    if (!sat_[static_cast<size_t>(g_.root)]) return schema_error("the schema accepts no finite JSON document");
    build_key_tries();
    return Status::ok_status();
  }

 private:
  int32_t new_node_unchecked() {
    g_.nodes.emplace_back();
    return static_cast<int32_t>(g_.nodes.size() - 1);
  }
  Result<int32_t> new_node() {
    if (g_.nodes.size() >= kMaxNodes) {
      return schema_error("the schema compiles to more than " + std::to_string(kMaxNodes) +
                          " sub-schemas (limit kMaxNodes)");
    }
    return new_node_unchecked();
  }

  Status count_literal(size_t bytes) {
    literal_bytes_ += bytes;
    if (literal_bytes_ > kMaxLiteralBytes) {
      return schema_error("enum/const values and property names exceed " + std::to_string(kMaxLiteralBytes) +
                          " bytes together (limit kMaxLiteralBytes)");
    }
    return Status::ok_status();
  }

  int32_t words_trie(uint8_t types) {
    const int key = ((types & kTypeBoolean) ? 1 : 0) | ((types & kTypeNull) ? 2 : 0);
    if (key == 0) return -1;
    if (words_[key] >= 0) return words_[key];
    TrieBuilder t;
    if (key & 1) {
      t.insert("true", 0, 0);
      t.insert("false", 1, 0);
    }
    if (key & 2) t.insert("null", 2, 0);
    words_[key] = t.flatten(g_);
    return words_[key];
  }

  static Result<uint32_t> count_keyword(const json& v, const char* key, const std::string& ptr) {
    if (v.is_number_unsigned()) return static_cast<uint32_t>(std::min<uint64_t>(v.get<uint64_t>(), UINT32_MAX));
    if (v.is_number_integer() && v.get<int64_t>() >= 0) return static_cast<uint32_t>(std::min<int64_t>(v.get<int64_t>(), UINT32_MAX));
    if (v.is_number_float()) {
      const double d = v.get<double>();
      if (d >= 0 && d == std::floor(d)) return static_cast<uint32_t>(std::min(d, 4294967295.0));
    }
    return schema_error(std::string("'") + key + "' must be a non-negative integer at " + where(ptr));
  }

  // The json a $ref names: "#", "#/$defs/<name>", "#/definitions/<name>".
  Result<std::pair<const json*, std::string>> resolve_ref(const json& ref, const std::string& ptr) {
    if (!ref.is_string()) return schema_error("'$ref' must be a string at " + where(ptr));
    const std::string r = ref.get<std::string>();
    if (r == "#") return std::pair<const json*, std::string>{&root_, ""};
    for (const char* prefix : {"#/$defs/", "#/definitions/"}) {
      const std::string_view p(prefix);
      if (r.compare(0, p.size(), p) != 0) continue;
      const std::string name_token = r.substr(p.size());
      // The name as a pointer token: ~1 is '/', ~0 is '~'; a '/' left
      // would point deeper, which this subset does not follow.
      if (name_token.find('/') != std::string::npos) break;
      std::string name;
      for (size_t i = 0; i < name_token.size(); ++i) {
        if (name_token[i] == '~' && i + 1 < name_token.size() && (name_token[i + 1] == '0' || name_token[i + 1] == '1')) {
          name += name_token[i + 1] == '0' ? '~' : '/';
          ++i;
        } else {
          name += name_token[i];
        }
      }
      const std::string container(p.substr(2, p.size() - 3));  // "$defs" / "definitions"
      auto defs = root_.is_object() ? root_.find(container) : root_.end();
      if (defs == root_.end() || !defs->is_object() || !defs->contains(name)) {
        return schema_error("'$ref' \"" + r.substr(0, 80) + "\" at " + where(ptr) + " names no schema");
      }
      return std::pair<const json*, std::string>{&(*defs)[name], "/" + container + "/" + name_token};
    }
    return schema_error("'$ref' \"" + r.substr(0, 80) + "\" at " + where(ptr) +
                        " is not supported (only \"#\", \"#/$defs/<name>\" and \"#/definitions/<name>\")");
  }

  Result<int32_t> compile(const json& s, const std::string& ptr, size_t depth) {
    if (auto it = memo_.find(ptr); it != memo_.end()) return it->second;
    if (depth > kMaxSchemaDepth) {
      return schema_error("the schema nests deeper than " + std::to_string(kMaxSchemaDepth) +
                          " levels at " + where(ptr) + " (limit kMaxSchemaDepth)");
    }
    if (s.is_boolean()) {
      if (s.get<bool>()) return g_.any;
      SPW_ASSIGN_OR_RETURN(int32_t id, new_node());  // false: accepts nothing (types 0)
      memo_[ptr] = id;
      return id;
    }
    if (!s.is_object()) return schema_error("a schema must be an object or a boolean at " + where(ptr));
    for (const auto& [key, value] : s.items()) {
      if (!supported_keywords().count(key) && !annotation_keywords().count(key)) {
        return schema_error("unsupported keyword '" + keyword_excerpt(key) + "' at " + where(ptr));
      }
    }
    for (const char* container : {"$defs", "definitions"}) {
      auto d = s.find(container);
      if (d != s.end() && !d->is_object()) {
        return schema_error(std::string("'") + container + "' must be an object at " + where(ptr));
      }
      if (d != s.end() && &s != &root_) {
        return schema_error(std::string("'") + container + "' is only supported at the root (at " + where(ptr) + ")");
      }
    }
    if (auto ref = s.find("$ref"); ref != s.end()) return compile_ref(s, *ref, ptr, depth);
    const bool any_of = s.contains("anyOf"), one_of = s.contains("oneOf");
    if (any_of || one_of) return compile_union(s, any_of ? "anyOf" : "oneOf", ptr, depth);

    SPW_ASSIGN_OR_RETURN(int32_t id, new_node());
    memo_[ptr] = id;
    SPW_ASSIGN_OR_RETURN(uint8_t types, compile_types(s, ptr));
    g_.nodes[static_cast<size_t>(id)].types = types;
    SPW_RETURN_IF_ERROR(compile_lengths(s, id, ptr));
    SPW_RETURN_IF_ERROR(compile_object(s, id, ptr, depth));
    SPW_RETURN_IF_ERROR(compile_array(s, id, ptr, depth));
    SPW_RETURN_IF_ERROR(compile_literals(s, id, ptr));
    Node& n = g_.nodes[static_cast<size_t>(id)];
    if (n.literals < 0) n.words = words_trie(n.types);
    return id;
  }

  Result<int32_t> compile_ref(const json& s, const json& ref, const std::string& ptr, size_t depth) {
    for (const auto& [key, value] : s.items()) {
      if (key != "$ref" && !is_structural_neighbour(key)) {
        return schema_error("keyword '" + keyword_excerpt(key) + "' beside '$ref' at " + where(ptr) +
                            " is not supported (put the constraints in the referenced schema)");
      }
    }
    SPW_ASSIGN_OR_RETURN(auto target, resolve_ref(ref, ptr));
    // A target compiled already (or being compiled: a recursion through an
    // object, array or union) is shared.
    if (auto it = memo_.find(target.second); it != memo_.end()) {
      memo_[ptr] = it->second;
      return it->second;
    }
    if (resolving_.count(target.second)) {
      return schema_error("'$ref' at " + where(ptr) + " is a cycle of references that never reaches a schema");
    }
    resolving_.insert(target.second);
    Result<int32_t> r = compile(*target.first, target.second, depth + 1);
    resolving_.erase(target.second);
    if (r.ok()) memo_[ptr] = *r;
    return r;
  }

  Result<int32_t> compile_union(const json& s, const char* keyword, const std::string& ptr, size_t depth) {
    for (const auto& [key, value] : s.items()) {
      if (key != keyword && !is_structural_neighbour(key)) {
        return schema_error("keyword '" + keyword_excerpt(key) + "' beside '" + keyword + "' at " + where(ptr) +
                            " is not supported (move it into each branch)");
      }
    }
    const json& list = s[keyword];
    if (!list.is_array() || list.empty()) {
      return schema_error(std::string("'") + keyword + "' must be a non-empty array at " + where(ptr));
    }
    SPW_ASSIGN_OR_RETURN(int32_t id, new_node());
    memo_[ptr] = id;
    g_.nodes[static_cast<size_t>(id)].is_union = true;
    std::vector<int32_t> members;
    for (size_t i = 0; i < list.size(); ++i) {
      SPW_ASSIGN_OR_RETURN(int32_t m, compile(list[i], ptr + "/" + keyword + "/" + std::to_string(i), depth + 1));
      members.push_back(m);
    }
    union_members_[id] = std::move(members);
    return id;
  }

  static Result<uint8_t> compile_types(const json& s, const std::string& ptr) {
    auto t = s.find("type");
    if (t == s.end()) return static_cast<uint8_t>(kTypeAll);
    auto one = [&](const json& v) -> Result<uint8_t> {
      if (!v.is_string()) return schema_error("'type' must be a string or an array of strings at " + where(ptr));
      const std::string name = v.get<std::string>();
      static const std::pair<const char*, uint8_t> kNames[] = {
          {"null", kTypeNull},     {"boolean", kTypeBoolean}, {"object", kTypeObject}, {"array", kTypeArray},
          {"string", kTypeString}, {"number", kTypeNumber},   {"integer", kTypeInteger}};
      for (const auto& [n, bit] : kNames) {
        if (name == n) return bit;
      }
      return schema_error("unknown type '" + name.substr(0, 40) + "' at " + where(ptr) + "/type");
    };
    uint8_t types = 0;
    if (t->is_array()) {
      if (t->empty()) return schema_error("'type' must not be an empty array at " + where(ptr));
      for (const json& v : *t) {
        SPW_ASSIGN_OR_RETURN(uint8_t b, one(v));
        types |= b;
      }
    } else {
      SPW_ASSIGN_OR_RETURN(types, one(*t));
    }
    if (types & kTypeNumber) types = static_cast<uint8_t>(types & ~kTypeInteger);
    return types;
  }

  Status compile_lengths(const json& s, int32_t id, const std::string& ptr) {
    Node& n = g_.nodes[static_cast<size_t>(id)];
    struct K {
      const char* key;
      uint32_t* out;
    } keys[] = {{"minLength", &n.min_length}, {"maxLength", &n.max_length}, {"minItems", &n.min_items},
                {"maxItems", &n.max_items}};
    for (const K& k : keys) {
      auto it = s.find(k.key);
      if (it == s.end()) continue;
      SPW_ASSIGN_OR_RETURN(*k.out, count_keyword(*it, k.key, ptr));
    }
    return Status::ok_status();
  }

  Status compile_object(const json& s, int32_t id, const std::string& ptr, size_t depth) {
    auto props = s.find("properties");
    std::vector<Property> properties;
    if (props != s.end()) {
      if (!props->is_object()) return schema_error("'properties' must be an object at " + where(ptr));
      if (props->size() > kMaxProperties) {
        return schema_error("'properties' at " + where(ptr) + " declares " + std::to_string(props->size()) +
                            " properties, more than " + std::to_string(kMaxProperties) + " (limit kMaxProperties)");
      }
      for (const auto& [name, sub] : props->items()) {
        Property p;
        const std::string quoted = canonical(json(name));
        p.name = quoted.substr(1, quoted.size() - 2);
        SPW_RETURN_IF_ERROR(count_literal(p.name.size()));
        SPW_ASSIGN_OR_RETURN(p.node, compile(sub, ptr + "/properties/" + pointer_token(name), depth + 1));
        properties.push_back(std::move(p));
      }
    }
    int32_t additional = g_.any;
    if (auto ap = s.find("additionalProperties"); ap != s.end()) {
      if (ap->is_boolean()) {
        additional = ap->get<bool>() ? g_.any : -1;
      } else {
        SPW_ASSIGN_OR_RETURN(additional, compile(*ap, ptr + "/additionalProperties", depth + 1));
      }
    }
    uint64_t required = 0;
    if (auto req = s.find("required"); req != s.end()) {
      if (!req->is_array()) return schema_error("'required' must be an array of strings at " + where(ptr));
      for (const json& r : *req) {
        if (!r.is_string()) return schema_error("'required' must be an array of strings at " + where(ptr));
        const std::string quoted = canonical(r);
        const std::string name = quoted.substr(1, quoted.size() - 2);
        auto it = std::find_if(properties.begin(), properties.end(), [&](const Property& p) { return p.name == name; });
        if (it == properties.end()) {
          // Required but undeclared: a declared property whose schema is
          // the additional one (none allowed: nothing satisfies this).
          if (properties.size() >= kMaxProperties) {
            return schema_error("the object at " + where(ptr) + " has more than " + std::to_string(kMaxProperties) +
                                " properties with 'required' (limit kMaxProperties)");
          }
          SPW_RETURN_IF_ERROR(count_literal(name.size()));
          Property p;
          p.name = name;
          if (additional < 0) {
            SPW_ASSIGN_OR_RETURN(p.node, new_node());  // accepts nothing: the object is unsatisfiable
          } else {
            p.node = additional;
          }
          properties.push_back(std::move(p));
          it = properties.end() - 1;
        }
        required |= uint64_t{1} << static_cast<size_t>(it - properties.begin());
      }
    }
    Node& n = g_.nodes[static_cast<size_t>(id)];
    n.properties = std::move(properties);
    n.required = required;
    n.additional = additional;
    return Status::ok_status();
  }

  Status compile_array(const json& s, int32_t id, const std::string& ptr, size_t depth) {
    int32_t items = g_.any;
    if (auto it = s.find("items"); it != s.end()) {
      if (it->is_array()) {
        return schema_error("'items' as an array (tuple validation) at " + where(ptr) + " is not supported");
      }
      SPW_ASSIGN_OR_RETURN(items, compile(*it, ptr + "/items", depth + 1));
    }
    g_.nodes[static_cast<size_t>(id)].items = items;
    return Status::ok_status();
  }

  static uint8_t value_types(const json& v) {
    switch (v.type()) {
      case json::value_t::null: return kTypeNull;
      case json::value_t::boolean: return kTypeBoolean;
      case json::value_t::number_integer:
      case json::value_t::number_unsigned: return kTypeNumber | kTypeInteger;
      case json::value_t::number_float: {
        const double d = v.get<double>();
        return d == static_cast<double>(static_cast<int64_t>(d)) ? (kTypeNumber | kTypeInteger) : kTypeNumber;
      }
      case json::value_t::string: return kTypeString;
      case json::value_t::array: return kTypeArray;
      default: return kTypeObject;
    }
  }

  Status compile_literals(const json& s, int32_t id, const std::string& ptr) {
    auto e = s.find("enum");
    auto c = s.find("const");
    if (e == s.end() && c == s.end()) return Status::ok_status();
    if (e != s.end() && c != s.end()) {
      return schema_error("'enum' and 'const' together at " + where(ptr) + " are not supported");
    }
    std::vector<const json*> values;
    if (c != s.end()) {
      values.push_back(&*c);
    } else {
      if (!e->is_array()) return schema_error("'enum' must be an array at " + where(ptr));
      for (const json& v : *e) values.push_back(&v);
    }
    const uint8_t types = g_.nodes[static_cast<size_t>(id)].types;
    TrieBuilder t;
    int32_t n_kept = 0;
    for (size_t i = 0; i < values.size(); ++i) {
      if ((value_types(*values[i]) & types) == 0) continue;  // the schema's type rules it out
      const std::string text = canonical(*values[i]);
      SPW_RETURN_IF_ERROR(count_literal(text.size()));
      t.insert(text, static_cast<int32_t>(i), 0);
      ++n_kept;
    }
    // An empty trie (root only, not terminal) accepts nothing: prune()
    // finds the node unsatisfiable.
    Node& n = g_.nodes[static_cast<size_t>(id)];
    (void)n_kept;
    n.literals = t.flatten(g_);
    return Status::ok_status();
  }

  // Each union's non-union members, nested unions flattened (a union
  // reached again through a $ref cycle adds nothing new).
  Status flatten_unions() {
    for (size_t id = 0; id < g_.nodes.size(); ++id) {
      Node& n = g_.nodes[id];
      if (!n.is_union) {
        n.branches = {static_cast<int32_t>(id)};
        continue;
      }
      std::vector<int32_t> out;
      std::unordered_set<int32_t> seen;
      std::vector<int32_t> todo{static_cast<int32_t>(id)};
      while (!todo.empty()) {
        const int32_t u = todo.back();
        todo.pop_back();
        if (!seen.insert(u).second) continue;
        if (!g_.nodes[static_cast<size_t>(u)].is_union) {
          out.push_back(u);
          continue;
        }
        const std::vector<int32_t>& m = union_members_[u];
        for (auto it = m.rbegin(); it != m.rend(); ++it) todo.push_back(*it);
      }
      if (out.size() > kMaxAlternatives) {
        return schema_error("a union (anyOf/oneOf) has " + std::to_string(out.size()) + " branches once nested "
                            "unions are flattened, more than " + std::to_string(kMaxAlternatives) +
                            " (limit kMaxAlternatives)");
      }
      g_.nodes[id].branches = std::move(out);
    }
    return Status::ok_status();
  }

  bool object_sat(const Node& n) const {
    for (size_t i = 0; i < n.properties.size(); ++i) {
      if ((n.required >> i & 1) && !sat_[static_cast<size_t>(n.properties[i].node)]) return false;
    }
    return true;
  }
  bool array_sat(const Node& n) const {
    return n.min_items <= n.max_items && (n.min_items == 0 || sat_[static_cast<size_t>(n.items)]);
  }

  // Which nodes some finite document satisfies (least fixpoint: recursion
  // only counts once it bottoms out), then what is not satisfiable is
  // removed, so that the matcher never offers a way into a dead end.
  void prune() {
    sat_.assign(g_.nodes.size(), false);
    for (bool changed = true; changed;) {
      changed = false;
      for (size_t id = 0; id < g_.nodes.size(); ++id) {
        if (sat_[id]) continue;
        const Node& n = g_.nodes[id];
        bool s = false;
        if (n.is_union) {
          for (int32_t b : n.branches) s = s || sat_[static_cast<size_t>(b)];
        } else if (n.literals >= 0) {
          s = g_.trie[static_cast<size_t>(n.literals)].n_children > 0;
        } else {
          s = (n.types & (kTypeNull | kTypeBoolean | kTypeNumber | kTypeInteger)) ||
              ((n.types & kTypeString) && n.min_length <= n.max_length) ||
              ((n.types & kTypeArray) && array_sat(n)) || ((n.types & kTypeObject) && object_sat(n));
        }
        if (s) {
          sat_[id] = true;
          changed = true;
        }
      }
    }
    for (size_t id = 0; id < g_.nodes.size(); ++id) {
      Node& n = g_.nodes[id];
      if (n.is_union) {
        std::erase_if(n.branches, [&](int32_t b) { return !sat_[static_cast<size_t>(b)]; });
        continue;
      }
      if ((n.types & kTypeString) && n.min_length > n.max_length) n.types &= ~kTypeString;
      if ((n.types & kTypeArray) && !array_sat(n)) n.types &= ~kTypeArray;
      if ((n.types & kTypeObject) && !object_sat(n)) n.types &= ~kTypeObject;
      if (n.items >= 0 && !sat_[static_cast<size_t>(n.items)]) n.max_items = 0;
      if (n.additional >= 0 && !sat_[static_cast<size_t>(n.additional)]) n.additional = -1;
      for (Property& p : n.properties) p.usable = sat_[static_cast<size_t>(p.node)];
      if (!sat_[id]) n.branches.clear();
    }
  }

  void build_key_tries() {
    for (Node& n : g_.nodes) {
      if (n.is_union || !(n.types & kTypeObject) || n.properties.empty()) continue;
      TrieBuilder t;
      for (size_t i = 0; i < n.properties.size(); ++i) {
        t.insert(n.properties[i].name, static_cast<int32_t>(i), n.properties[i].usable ? uint64_t{1} << i : 0);
      }
      n.key_trie = t.flatten(g_);
    }
  }

  const json& root_;
  Grammar& g_;
  std::unordered_map<std::string, int32_t> memo_;
  std::unordered_set<std::string> resolving_;
  std::unordered_map<int32_t, std::vector<int32_t>> union_members_;
  std::vector<bool> sat_;
  int32_t words_[4] = {-1, -1, -1, -1};
  size_t literal_bytes_ = 0;
};

}  // namespace

Result<std::shared_ptr<const Grammar>> compile_constraint(const ConstraintSpec& spec) {
  auto g = std::make_shared<Grammar>();
  g->spec = spec;
  json schema;
  switch (spec.kind) {
    case ConstraintKind::kNone:
      return Status::invalid_argument("compile_constraint: no constraint to compile");
    case ConstraintKind::kJsonObject:
      schema = json{{"type", "object"}};
      break;
    case ConstraintKind::kJsonSchema: {
      if (spec.schema.size() > kMaxSchemaBytes) {
        return schema_error("the schema is " + std::to_string(spec.schema.size()) + " bytes, more than " +
                            std::to_string(kMaxSchemaBytes) + " (limit kMaxSchemaBytes)");
      }
      schema = json::parse(spec.schema, nullptr, /*allow_exceptions=*/false);
      if (schema.is_discarded()) return schema_error("the schema is not valid JSON");
      break;
    }
  }
  Compiler c(schema, *g);
  SPW_RETURN_IF_ERROR(c.run());
  return std::shared_ptr<const Grammar>(std::move(g));
}

}  // namespace spw::grammar
