// JSON Schema -> a compiled grammar that a JsonMatcher (json_matcher.h) runs
// byte by byte, for OpenAI's response_format (json_object, json_schema).
//
// Contract: compile_constraint(spec) turns a ConstraintSpec into an immutable
// Grammar, or InvalidArgument (FailureReason::kInvalidField, field
// "response_format") whose message names the keyword and its JSON pointer in
// the schema ("unsupported keyword 'pattern' at /properties/name") or the
// limit that was exceeded and its value. Nothing a client sends can make it
// allocate more than the limits below allow: the schema text is bounded
// before it is parsed, and every structure it builds is counted as it grows.
//
// The subset (anything else is refused by name, never ignored):
//   type: "object" | "array" | "string" | "number" | "integer" | "boolean" |
//         "null", or a non-empty list of them;
//   properties, required (names must be properties when additionalProperties
//         is false), additionalProperties (false, true or a schema; absent =
//         true, as JSON Schema says);
//   items (one schema), minItems, maxItems;
//   minLength, maxLength (Unicode code points, as JSON Schema counts);
//   enum, const (values written exactly as the schema spells them, compact:
//         {"a":1} not { "a" : 1 }; members of the wrong `type` dropped);
//   anyOf, oneOf (both as a union: a document matching several branches of
//         a oneOf is not refused), alone beside annotations and $defs;
//   $ref to "#", "#/$defs/<name>" or "#/definitions/<name>" (recursion
//         allowed), with $defs / definitions holding the targets;
//   annotations, ignored: title, description, $schema, $id, $comment,
//         examples, default, deprecated, readOnly, writeOnly.
// What the grammar generates is a subset of what the schema accepts, chosen
// so that generation always terminates in a document:
//   - between two tokens of JSON (and before the value; nothing after it:
//     the document ends there) whitespace is nothing, one space or tab, or
//     a line break (\n or \r\n) and at most kMaxIndent spaces or tabs, as
//     llama.cpp's JSON grammar has it: a pretty-printer's layout fits, a
//     loop on spaces does not;
//   - numbers: at most kMaxIntDigits integer digits, kMaxFracDigits fraction
//     digits, kMaxExpDigits exponent digits; "integer" is -?(0|[1-9][0-9]*);
//   - object keys are written in canonical form: the only escapes are the
//     two-character ones but the solidus's, and \u00XX below U+0020, so
//     that a key is a declared property exactly when its bytes are (no
//     "\u0061" for "a"); declared
//     properties at most once each; string values take every JSON escape;
//   - nesting at most kMaxDepth containers deep.
// A schema no finite document satisfies (an unreachable required property,
// minItems > maxItems, an empty enum, a required recursion ...) is refused:
// every prefix the matcher accepts can be completed.
// Thread safety: a Grammar is immutable and shared between threads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace spw::grammar {

// Limits (each refused with a 400 that names it). Far above a real schema
// (OpenAI's own: 100 properties in all, 5 levels of nesting, 500 enum
// values), low enough that compiling one costs microseconds to a millisecond.
inline constexpr size_t kMaxSchemaBytes = 64 * 1024;   // the schema as compact JSON
inline constexpr size_t kMaxNodes = 2048;              // sub-schemas after $ref sharing
inline constexpr size_t kMaxProperties = 64;           // declared properties of one object
inline constexpr size_t kMaxLiteralBytes = 32 * 1024;  // enum/const values and property names together
inline constexpr size_t kMaxAlternatives = 64;         // branches of one union, nested unions flattened
inline constexpr size_t kMaxSchemaDepth = 64;          // nesting of the schema document itself
inline constexpr int kMaxDepth = 64;                   // containers nested in a generated document
inline constexpr int kMaxIndent = 12;                  // spaces/tabs after a line break between two JSON tokens
inline constexpr int kMaxIntDigits = 16;
inline constexpr int kMaxFracDigits = 16;
inline constexpr int kMaxExpDigits = 2;  // 1e99 at most: every such number is a finite double

enum class ConstraintKind : uint8_t { kNone = 0, kJsonObject = 1, kJsonSchema = 2 };

// What a request asked for: the source a Grammar is compiled from. It, not
// the compiled form, travels in checkpoints and journal rows.
struct ConstraintSpec {
  ConstraintKind kind = ConstraintKind::kNone;
  std::string schema;  // kJsonSchema: the schema as JSON text; else empty
  bool active() const { return kind != ConstraintKind::kNone; }
  bool operator==(const ConstraintSpec&) const = default;
};

// Type bits of a node.
enum TypeBit : uint8_t {
  kTypeNull = 1,
  kTypeBoolean = 2,
  kTypeObject = 4,
  kTypeArray = 8,
  kTypeString = 16,
  kTypeNumber = 32,   // includes integers
  kTypeInteger = 64,
  kTypeAll = 127,
};

// A byte trie over literal texts (enum/const values, true/false/null) and
// over an object's property names. Children are sorted by byte.
struct TrieNode {
  uint32_t first_child = 0;  // index into Grammar::trie_edges
  uint16_t n_children = 0;
  int32_t terminal = -1;     // property index / literal index ending here; -1 none
  uint64_t names = 0;        // property tries: bit i = property i lies in this subtree
};
struct TrieEdge {
  uint8_t byte;
  int32_t node;
};

struct Property {
  std::string name;  // canonical JSON string content (escaped as the matcher requires)
  int32_t node = -1;
  bool usable = true;  // false: its schema accepts nothing, so the key may not be written
};

struct Node {
  uint8_t types = 0;              // TypeBit set (a union's: 0)
  bool is_union = false;
  // The non-union nodes a value of this node may be: itself, or a union's
  // satisfiable branches, nested unions flattened. Never empty once
  // compiled (an unsatisfiable node is refused or pruned away).
  std::vector<int32_t> branches;
  int32_t literals = -1;          // enum/const: trie root (then nothing else applies)
  int32_t words = -1;             // true/false/null trie for the boolean/null types
  // object
  std::vector<Property> properties;
  uint64_t required = 0;          // bit i = properties[i] is required
  int32_t additional = -1;        // node of additional properties; -1: none allowed
  int32_t key_trie = -1;          // trie over the canonical property names
  // array
  int32_t items = -1;             // -1: any value
  uint32_t min_items = 0, max_items = UINT32_MAX;
  // string
  uint32_t min_length = 0, max_length = UINT32_MAX;
};

struct Grammar {
  std::vector<Node> nodes;
  std::vector<TrieNode> trie;
  std::vector<TrieEdge> trie_edges;
  int32_t root = 0;
  int32_t any = -1;  // the node of an unconstrained JSON value
  ConstraintSpec spec;

  // The child of trie node `at` along `byte`, or -1.
  int32_t trie_child(int32_t at, uint8_t byte) const {
    const TrieNode& t = trie[static_cast<size_t>(at)];
    for (uint32_t i = t.first_child, e = t.first_child + t.n_children; i < e; ++i) {
      if (trie_edges[i].byte == byte) return trie_edges[i].node;
      if (trie_edges[i].byte > byte) break;
    }
    return -1;
  }
};

// Compiles a ConstraintSpec (kind kNone is InvalidArgument: nothing to
// compile). See the contract for the subset and the errors.
Result<std::shared_ptr<const Grammar>> compile_constraint(const ConstraintSpec& spec);

}  // namespace spw::grammar
