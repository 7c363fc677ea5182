// `--config FILE` and `--dump-config` for a CLI verb (commands.h): a TOML
// file whose top-level keys are the verb's flag names without the leading
// dashes. CLI11 2.1.2 (Debian) never reads a config set on a subcommand, so
// the file is read here, with toml++, from the --config option's callback:
// that callback runs after the whole command line is parsed and before any
// other option of the verb is validated, stored or checked for being
// required (CLI11 runs a subcommand's own options' callbacks, in the order
// they were added, before those of its option groups). Each key becomes the
// results of its option exactly as if it had been given on the command line,
// unless the command line gave that option: the command line wins.
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <system_error>
#include <vector>

#include <toml++/toml.h>

#include "app/commands.h"
#include "gateway/builder.h"

namespace spw::app {
namespace {

// Bad config files are bad usage: exit code 2, like the other usage errors of
// the verbs, with the file (and line) named.
[[noreturn]] void refuse(const std::string& file, std::size_t line, const std::string& what) {
  std::string where = "config file '" + file + "'";
  if (line > 0) where += " line " + std::to_string(line);
  throw CLI::ConfigError(where + ": " + what, 2);
}

const char* toml_kind(const toml::node& n) {
  switch (n.type()) {
    case toml::node_type::string: return "a string";
    case toml::node_type::integer: return "an integer";
    case toml::node_type::floating_point: return "a floating-point number";
    case toml::node_type::boolean: return "a boolean";
    case toml::node_type::array: return "an array";
    case toml::node_type::table: return "a table";
    default: return "a date or time";
  }
}

// The option's value type as CLI11 names it (INT, UINT, FLOAT, TEXT,
// BOOLEAN, ...), without the validators' descriptions it appends.
std::string base_type(const CLI::Option& opt) {
  std::string t = opt.get_type_name();
  return t.substr(0, t.find(':'));
}

bool is_flag(const CLI::Option& opt) { return opt.get_items_expected_max() == 0; }
bool is_repeatable(const CLI::Option& opt) { return opt.get_expected_max() > 1; }

std::string float_text(double v) {
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
  return ec == std::errc() ? std::string(buf, end) : std::to_string(v);
}

// One TOML scalar as the text the command line would carry, or nullopt when
// the option does not take that kind of value.
std::optional<std::string> scalar_text(const CLI::Option& opt, const toml::node& n) {
  const std::string type = base_type(opt);
  const bool integral = type == "INT" || type == "UINT";
  if (type == "BOOLEAN") {
    if (auto b = n.value_exact<bool>()) return std::string(*b ? "true" : "false");
    return std::nullopt;
  }
  const bool numeric = integral || type == "FLOAT";
  // A size takes a byte count or a string with a unit ("512MiB"); every
  // other text option only a string: `journal = 5` is a mistake, not a file
  // named "5".
  if (numeric || type == "SIZE") {
    if (auto i = n.value_exact<int64_t>()) return std::to_string(*i);
  }
  if (integral) return std::nullopt;
  if (type == "FLOAT") {
    if (auto d = n.value_exact<double>()) return float_text(*d);
    return std::nullopt;
  }
  if (auto s = n.value_exact<std::string>()) return *s;
  return std::nullopt;
}

std::string expected_kind(const CLI::Option& opt) {
  const std::string type = base_type(opt);
  if (type == "INT" || type == "UINT") return "an integer";
  if (type == "FLOAT") return "a number";
  if (type == "BOOLEAN") return "true or false";
  if (type == "SIZE") return "a size (a byte count, or a string such as \"512MiB\")";
  return "a string";
}

std::string read_file_or_refuse(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) refuse(path, 0, "does not exist");
  if (std::filesystem::is_directory(path, ec)) refuse(path, 0, "is a directory");
  std::ifstream in(path, std::ios::binary);
  if (!in) refuse(path, 0, std::string("cannot be opened: ") + std::strerror(errno));
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) refuse(path, 0, "cannot be read");
  return ss.str();
}

toml::table parse_or_refuse(const std::string& path) {
  const std::string text = read_file_or_refuse(path);
#if TOML_EXCEPTIONS
  try {
    return toml::parse(text, path);
  } catch (const toml::parse_error& e) {
    refuse(path, e.source().begin.line, std::string(e.description()));
  }
#else
  toml::parse_result res = toml::parse(text, path);
  if (!res) refuse(path, res.error().source().begin.line, std::string(res.error().description()));
  return std::move(res).table();
#endif
}

// Adds `values` to the option named `flag` (when the command line did not
// give it) and runs its callback, a bad value reported against the file.
void add_values(CLI::App& app, const std::string& path, std::size_t line, const std::string& flag,
                const std::vector<std::string>& values) {
  CLI::Option* opt = app.get_option_no_throw(flag);
  if (opt == nullptr || values.empty() || opt->count() > 0) return;
  opt->add_result(values);
  try {
    opt->run_callback();
  } catch (const CLI::Error& e) {
    refuse(path, line, flag.substr(2) + ": " + e.what());
  }
}

// `[[model]]` tables (`spillway serve`'s catalogue): each with `path`
// (required), `name` (default: the file's stem), `pinned`, `preload` and
// `keep_alive` (a duration string or seconds), standing for the --model
// NAME=PATH, --pin, --preload and --model-keep-alive flags. The first table
// is the served model (no name, pinned, preload or keep_alive: it is always
// loaded and named by its file). The command line's --model replaces all of
// them. Returns false when `node` is not an array of tables.
bool apply_model_tables(CLI::App& app, const std::string& path, const toml::node& node, std::size_t line) {
  const toml::array* arr = node.as_array();
  if (arr == nullptr || arr->empty() || !(*arr)[0].is_table()) return false;
  CLI::Option* model = app.get_option_no_throw("--model");
  if (model == nullptr || model->count() > 0) return true;
  std::vector<std::string> models, pins, preloads, keep_alives;
  for (std::size_t i = 0; i < arr->size(); ++i) {
    const toml::table* t = (*arr)[i].as_table();
    std::size_t at = (*arr)[i].source().begin.line > 0 ? (*arr)[i].source().begin.line : line;
    if (t == nullptr) refuse(path, at, "model: every entry of [[model]] must be a table");
    for (const auto& [k, v] : *t) {
      const std::string key(k.str());
      if (key != "path" && key != "name" && key != "pinned" && key != "preload" && key != "keep_alive") {
        refuse(path, at, "[[model]]: unknown key '" + key + "' (path, name, pinned, preload, keep_alive)");
      }
    }
    const std::optional<std::string> file = (*t)["path"].value_exact<std::string>();
    if (!file) refuse(path, at, "[[model]]: `path` (a string, the GGUF file) is required");
    const std::optional<std::string> name = (*t)["name"].value_exact<std::string>();
    if ((*t).contains("name") && !name) refuse(path, at, "[[model]]: `name` must be a string");
    const std::string id = name ? *name : gateway::model_name_from_path(*file);
    if (i == 0) {
      if (t->size() != 1) {
        refuse(path, at, "[[model]]: the first table is the served model (always loaded, named by its file): only "
                         "`path` there");
      }
      models.push_back(*file);
      continue;
    }
    models.push_back(name ? *name + "=" + *file : *file);
    for (const char* flag : {"pinned", "preload"}) {
      if (!t->contains(flag)) continue;
      const std::optional<bool> b = (*t)[flag].value_exact<bool>();
      if (!b) refuse(path, at, std::string("[[model]]: `") + flag + "` must be true or false");
      if (*b) (std::string(flag) == "pinned" ? pins : preloads).push_back(id);
    }
    if (t->contains("keep_alive")) {
      const toml::node& ka = *(*t).get("keep_alive");
      std::optional<std::string> text = ka.value_exact<std::string>();
      if (!text) {
        if (auto n = ka.value_exact<int64_t>()) text = std::to_string(*n);
        else if (auto d = ka.value_exact<double>()) text = float_text(*d);
      }
      if (!text) refuse(path, at, "[[model]]: `keep_alive` must be a duration string (\"5m\") or seconds");
      keep_alives.push_back(id + "=" + *text);
    }
  }
  add_values(app, path, line, "--model", models);
  add_values(app, path, line, "--pin", pins);
  add_values(app, path, line, "--preload", preloads);
  add_values(app, path, line, "--model-keep-alive", keep_alives);
  return true;
}

// Reads `path` into the options of `app` that the command line did not give.
void apply_config_file(CLI::App& app, const std::string& path) {
  const toml::table root = parse_or_refuse(path);
  for (const auto& [key_obj, node] : root) {
    const std::string key(key_obj.str());
    std::size_t line = key_obj.source().begin.line;
    if (line == 0) line = node.source().begin.line;
    if (key == "model" && apply_model_tables(app, path, node, line)) continue;
    CLI::Option* opt = key.empty() || key.front() == '-' ? nullptr : app.get_option_no_throw("--" + key);
    if (opt == nullptr && node.is_table()) {
      refuse(path, line,
             "[" + key + "] is a section; the settings are top-level keys, the flag names without -- "
             "(`spillway " + app.get_name() + " --dump-config` prints them all)");
    }
    if (opt == nullptr) {
      refuse(path, line,
             "unknown key '" + key + "' (the keys are the flag names of `spillway " + app.get_name() +
                 "` without --; --dump-config prints them all)");
    }
    if (!opt->get_configurable()) refuse(path, line, "'" + key + "' cannot be set in a config file");
    if (opt->count() > 0) continue;  // given on the command line, which wins

    std::vector<std::string> values;
    if (is_flag(*opt)) {
      // `key = true` is the flag given; `key = false` the flag not given.
      auto b = node.value_exact<bool>();
      if (!b) refuse(path, line, key + ": expected true or false, got " + toml_kind(node));
      if (*b) values.push_back(opt->get_flag_value(key, std::string{}));
    } else if (const toml::array* arr = node.as_array()) {
      if (!is_repeatable(*opt)) refuse(path, line, key + ": takes one value, not an array");
      for (const toml::node& item : *arr) {
        auto text = scalar_text(*opt, item);
        if (!text) {
          refuse(path, item.source().begin.line > 0 ? item.source().begin.line : line,
                 key + ": expected an array of " + (expected_kind(*opt) == "a string" ? std::string("strings")
                                                                                        : expected_kind(*opt)) +
                     ", got " + toml_kind(item) + " in it");
        }
        values.push_back(*text);
      }
    } else {
      auto text = scalar_text(*opt, node);
      if (!text) refuse(path, line, key + ": expected " + expected_kind(*opt) + ", got " + toml_kind(node));
      values.push_back(*text);
    }
    if (values.empty()) continue;
    opt->add_result(values);
    // Validate, convert and store now, so that a bad value is reported
    // against the file (CLI11 does not run the callback a second time).
    try {
      opt->run_callback();
    } catch (const CLI::Error& e) {
      // CLI11's messages start with the flag ("--port: Value ..."); the key
      // already names it.
      std::string what = e.what();
      const std::string flag = "--" + key + ": ";
      if (what.starts_with(flag)) what.erase(0, flag.size());
      refuse(path, line, key + ": " + what);
    }
  }
}

// A TOML basic string.
std::string toml_string(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    const auto u = static_cast<unsigned char>(c);
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      case '\r': out += "\\r"; break;
      default:
        if (u < 0x20 || u == 0x7f) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", u);
          out += buf;
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

// `text` as a TOML value of the option's type: bare when it is a number (or
// boolean) TOML reads back as one, quoted otherwise.
std::string toml_value(const CLI::Option& opt, const std::string& text) {
  const std::string type = base_type(opt);
  if (type == "BOOLEAN" && (text == "true" || text == "false")) return text;
  if (type == "INT" || type == "UINT" || type == "FLOAT" || type == "SIZE") {
    try {
      const toml::table t = toml::parse("v = " + text);
      const toml::node* v = t.get("v");
      if (v != nullptr && (v->is_integer() || (type == "FLOAT" && v->is_floating_point()))) return text;
    } catch (...) {
    }
  }
  return toml_string(text);
}

std::string comment(const std::string& text) {
  std::string out = "# ";
  for (char c : text) {
    out += c;
    if (c == '\n') out += "# ";
  }
  return out + "\n";
}

// The option's current setting (what the command line or file gave, else its
// default) as one TOML line; commented out when it has no value to show.
std::string dump_option(const CLI::Option& opt) {
  const std::string& name = opt.get_lnames().empty() ? opt.get_single_name() : opt.get_lnames().front();
  if (is_flag(opt)) {
    // The flag given (`true`) or not (`false`): a result is what one plain
    // use of the flag leaves (`--flag=false` leaves something else).
    const std::string given = opt.get_flag_value(name, std::string{});
    bool on = false;
    for (const std::string& r : opt.results()) on = on || r == given;
    return name + " = " + (on ? "true" : "false") + "\n";
  }
  std::vector<std::string> values = opt.results();
  if (values.empty() && !opt.get_default_str().empty()) {
    std::string d = opt.get_default_str();
    if (is_repeatable(opt) && d.size() >= 2 && d.front() == '[' && d.back() == ']') {
      std::stringstream items(d.substr(1, d.size() - 2));
      for (std::string item; std::getline(items, item, ',');) values.push_back(item);
    } else {
      values.push_back(d);
    }
  }
  if (is_repeatable(opt)) {
    std::string out = name + " = [";
    for (std::size_t i = 0; i < values.size(); ++i) out += (i ? ", " : "") + toml_value(opt, values[i]);
    return out + "]\n";
  }
  if (values.empty()) return "# " + name + " = " + toml_value(opt, "") + "  (not set)\n";
  return name + " = " + toml_value(opt, values.back()) + "\n";
}

void dump_options(CLI::App& app, std::string& out) {
  for (CLI::Option* opt : app.get_options()) {
    if (!opt->get_configurable() || opt->get_lnames().empty()) continue;
    out += "\n";
    if (!opt->get_description().empty()) out += comment(opt->get_description());
    out += dump_option(*opt);
  }
  for (CLI::App* group : app.get_subcommands([](CLI::App* s) { return s->get_name().empty(); })) {
    out += "\n" + comment("---- " + group->get_group() + " ----");
    dump_options(*group, out);
  }
}

}  // namespace

void add_config_file_options(CLI::App& sub) {
  CLI::App* app = &sub;
  sub.add_option_function<std::string>(
         "--config", [app](const std::string& path) { apply_config_file(*app, path); },
         "TOML file of settings: top-level keys are the flag names without --, e.g. `cpu-queue = 8`, "
         "`api-key-hash = [\"sha256:...\"]` (arrays for repeatable flags), `log-requests = true`; flags given on "
         "the command line win. --dump-config prints every key")
      ->type_name("FILE")
      ->configurable(false);
  sub.add_flag_callback(
         "--dump-config",
         [app] {
           std::string out = comment("spillway " + app->get_name() +
                                     " settings, for --config FILE (keys are the flag names without --)");
           dump_options(*app, out);
           std::fwrite(out.data(), 1, out.size(), stdout);
           std::fflush(stdout);
           std::exit(0);
         },
         "Print every setting as a TOML config file (the values the command line and --config gave, else the "
         "defaults), then exit")
      ->configurable(false);
}

}  // namespace spw::app
