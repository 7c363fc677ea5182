#include "grammar/json_matcher.h"

#include <algorithm>
#include <numeric>

namespace spw::grammar {

// ---- VocabTrie ----

VocabTrie::VocabTrie(std::span<const std::string> pieces) : n_vocab_(static_cast<int32_t>(pieces.size())) {
  std::vector<int32_t> order;
  for (size_t id = 0; id < pieces.size(); ++id) {
    if (!pieces[id].empty()) order.push_back(static_cast<int32_t>(id));
  }
  // Sorted bytes put a prefix before its extensions and equal pieces side
  // by side, so one pass builds the trie in preorder.
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    return pieces[static_cast<size_t>(a)] < pieces[static_cast<size_t>(b)];
  });
  std::vector<uint32_t> path;  // node index at each depth - 1
  std::string_view prev;
  for (int32_t id : order) {
    const std::string& p = pieces[static_cast<size_t>(id)];
    size_t common = 0;
    while (common < prev.size() && common < p.size() && common < path.size() && prev[common] == p[common]) ++common;
    while (path.size() > common) {
      nodes_[path.back()].skip = static_cast<uint32_t>(nodes_.size());
      path.pop_back();
    }
    for (size_t i = path.size(); i < p.size(); ++i) {
      Node n;
      n.byte = static_cast<uint8_t>(p[i]);
      n.depth = static_cast<uint16_t>(std::min<size_t>(i + 1, UINT16_MAX));
      n.ids_begin = n.ids_end = 0;
      path.push_back(static_cast<uint32_t>(nodes_.size()));
      nodes_.push_back(n);
    }
    Node& end = nodes_[path.back()];
    if (end.ids_begin == end.ids_end) end.ids_begin = static_cast<uint32_t>(ids_.size());
    ids_.push_back(id);
    end.ids_end = static_cast<uint32_t>(ids_.size());
    max_depth_ = std::max(max_depth_, static_cast<int>(p.size()));
    prev = p;
  }
  while (!path.empty()) {
    nodes_[path.back()].skip = static_cast<uint32_t>(nodes_.size());
    path.pop_back();
  }
}

// ---- the matcher ----

namespace {

enum : uint8_t { kRootBefore, kRootDone };
enum : uint8_t { kObjOpen, kObjKey, kObjColon, kObjValue, kObjAfter, kObjComma };
enum : uint8_t { kArrOpen, kArrAfter, kArrComma };
enum : uint8_t { kStrChars, kStrEscape, kStrHex, kStrLowBackslash, kStrLowU, kStrLowHex, kStrUtf8 };
enum : uint8_t { kNumMinus, kNumZero, kNumInt, kNumDot, kNumFrac, kNumE, kNumESign, kNumExp };

bool is_ws(uint8_t b) { return b == ' ' || b == '\t' || b == '\n' || b == '\r'; }
bool is_digit(uint8_t b) { return b >= '0' && b <= '9'; }
int hex_value(uint8_t b) {
  if (b >= '0' && b <= '9') return b - '0';
  if (b >= 'a' && b <= 'f') return b - 'a' + 10;
  if (b >= 'A' && b <= 'F') return b - 'A' + 10;
  return -1;
}

// A frame in a persistent stack: frames are never changed once made, so
// readings share their common bottom and a step allocates only what it
// changes.
struct PFrame {
  Frame f;
  const PFrame* parent = nullptr;
  int depth = 0;  // frames below this one
};

// Bump allocator of PFrames in fixed blocks (pointers stay valid), rewound
// to a mark: the depth-first walk frees a subtree's frames when it leaves it.
class Arena {
 public:
  PFrame* make(const Frame& f, const PFrame* parent) {
    const size_t block = used_ / kBlock, at = used_ % kBlock;
    if (block == blocks_.size()) blocks_.push_back(std::make_unique<PFrame[]>(kBlock));
    PFrame* p = &blocks_[block][at];
    p->f = f;
    p->parent = parent;
    p->depth = parent ? parent->depth + 1 : 0;
    ++used_;
    return p;
  }
  size_t mark() const { return used_; }
  void rewind(size_t mark) { used_ = mark; }

 private:
  static constexpr size_t kBlock = 1024;
  std::vector<std::unique_ptr<PFrame[]>> blocks_;
  size_t used_ = 0;
};

using Tops = std::vector<const PFrame*>;

bool same_stack(const PFrame* a, const PFrame* b) {
  while (a != b) {
    if (a == nullptr || b == nullptr || !(a->f == b->f)) return false;
    a = a->parent;
    b = b->parent;
  }
  return true;
}

// Drops readings equal to an earlier one (look-alike union branches), and
// past kMaxStacks.
void dedup(Tops& t) {
  if (t.size() < 2) return;
  size_t n = 0;
  for (size_t i = 0; i < t.size(); ++i) {
    bool dup = false;
    for (size_t j = 0; j < n && !dup; ++j) dup = same_stack(t[j], t[i]);
    if (!dup && n < kMaxStacks) t[n++] = t[i];
  }
  t.resize(n);
}

}  // namespace

struct JsonMatcher::Impl {
  const Grammar& g;
  Arena live[2];  // the current readings' frames; the other one is filled by the next compaction
  int live_index = 0;
  Arena scratch;
  Arena* arena = &scratch;  // where step() allocates
  Tops tops;
  std::vector<Tops> levels;  // the walk's readings at each trie depth

  explicit Impl(const Grammar& grammar) : g(grammar) {
    Frame root;
    root.kind = FrameKind::kRoot;
    root.state = kRootBefore;
    root.node = g.root;
    tops.push_back(live[0].make(root, nullptr));
  }

  const Node& node(int32_t id) const { return g.nodes[static_cast<size_t>(id)]; }

  void emit(const Frame& f, const PFrame* parent, Tops& out) { out.push_back(arena->make(f, parent)); }

  // Whitespace in a gap (json_schema.h): Frame::ws is kGapNone, kGapOne
  // (one space or tab: nothing more), kGapCr (a \r: its \n must follow) or
  // kGapLine + the indentation after a line break. True when the byte is
  // the gap's (accepted or not); false: the frame reads it.
  static constexpr uint8_t kGapNone = 0, kGapOne = 1, kGapCr = 2, kGapLine = 3;
  bool gap(const PFrame* top, uint8_t b, Tops& out) {
    const uint8_t w = top->f.ws;
    if (w == kGapCr && b != '\n') return true;
    if (!is_ws(b)) return false;
    uint8_t next;
    if (w == kGapNone) {
      next = b == '\n' ? kGapLine : b == '\r' ? kGapCr : kGapOne;
    } else if (w == kGapCr) {
      next = kGapLine;
    } else if (w >= kGapLine && (b == ' ' || b == '\t') && w - kGapLine < kMaxIndent) {
      next = static_cast<uint8_t>(w + 1);
    } else {
      return true;
    }
    Frame f = top->f;
    f.ws = next;
    emit(f, top->parent, out);
    return true;
  }

  // The first byte of a value of `id` (any of its branches), above
  // `parent` (already in its after-the-value state).
  void start_value(const PFrame* parent, int32_t id, uint8_t b, Tops& out) {
    for (int32_t branch : node(id).branches) start_branch(parent, branch, b, out);
  }

  void start_branch(const PFrame* parent, int32_t id, uint8_t b, Tops& out) {
    const Node& n = node(id);
    Frame f;
    f.node = id;
    if (n.literals >= 0) {
      const int32_t c = g.trie_child(n.literals, b);
      if (c < 0) return;
      f.kind = FrameKind::kLiteral;
      f.aux = c;
      emit(f, parent, out);
      return;
    }
    const bool room = parent->depth + 1 <= kMaxDepth;
    const bool numeric = (n.types & (kTypeNumber | kTypeInteger)) != 0;
    if (b == '{' && (n.types & kTypeObject) && room) {
      f.kind = FrameKind::kObject;
      f.state = kObjOpen;
    } else if (b == '[' && (n.types & kTypeArray) && room) {
      f.kind = FrameKind::kArray;
      f.state = kArrOpen;
    } else if (b == '"' && (n.types & kTypeString)) {
      f.kind = FrameKind::kString;
      f.state = kStrChars;
    } else if (numeric && (b == '-' || is_digit(b))) {
      f.kind = FrameKind::kNumber;
      f.sub = (n.types & kTypeNumber) ? 0 : 1;
      f.state = b == '-' ? kNumMinus : b == '0' ? kNumZero : kNumInt;
      f.count = b == '-' || b == '0' ? 0 : 1;
    } else if (n.words >= 0) {
      const int32_t c = g.trie_child(n.words, b);
      if (c < 0) return;
      f.kind = FrameKind::kLiteral;
      f.aux = c;
    } else {
      return;
    }
    emit(f, parent, out);
  }

  bool object_can_end(const Frame& f) const { return (node(f.node).required & ~f.seen) == 0; }
  bool object_can_take_key(const Frame& f) const {
    const Node& n = node(f.node);
    if (n.additional >= 0) return true;
    return n.key_trie >= 0 && (g.trie[static_cast<size_t>(n.key_trie)].names & ~f.seen) != 0;
  }

  void step(const PFrame* top, uint8_t b, Tops& out) {
    switch (top->f.kind) {
      case FrameKind::kRoot: return step_root(top, b, out);
      case FrameKind::kObject: return step_object(top, b, out);
      case FrameKind::kArray: return step_array(top, b, out);
      case FrameKind::kString:
      case FrameKind::kKey: return step_string(top, b, out);
      case FrameKind::kNumber: return step_number(top, b, out);
      case FrameKind::kLiteral: return step_literal(top, b, out);
    }
  }

  void step_root(const PFrame* top, uint8_t b, Tops& out) {
    if (top->f.state != kRootBefore || gap(top, b, out)) return;
    Frame f = top->f;
    f.state = kRootDone;
    f.ws = 0;
    start_value(arena->make(f, top->parent), f.node, b, out);
  }

  void open_key(const PFrame* top, Frame f, Tops& out) {
    if (!object_can_take_key(f)) return;
    f.state = kObjKey;
    f.ws = 0;
    const PFrame* obj = arena->make(f, top->parent);
    Frame k;
    k.kind = FrameKind::kKey;
    k.state = kStrChars;
    k.node = f.node;
    k.aux = node(f.node).key_trie;  // -1: no declared names to follow
    emit(k, obj, out);
  }

  void step_object(const PFrame* top, uint8_t b, Tops& out) {
    if (gap(top, b, out)) return;
    Frame f = top->f;
    f.ws = 0;
    switch (f.state) {
      case kObjOpen:
        if (b == '"') return open_key(top, f, out);
        if (b == '}' && object_can_end(f)) out.push_back(top->parent);
        return;
      case kObjComma:
        if (b == '"') open_key(top, f, out);
        return;
      case kObjColon:
        if (b == ':') {
          f.state = kObjValue;
          emit(f, top->parent, out);
        }
        return;
      case kObjValue:
        f.state = kObjAfter;
        return start_value(arena->make(f, top->parent), f.aux, b, out);
      case kObjAfter:
        if (b == ',' && object_can_take_key(f)) {
          f.state = kObjComma;
          emit(f, top->parent, out);
        } else if (b == '}' && object_can_end(f)) {
          out.push_back(top->parent);
        }
        return;
      default:
        return;
    }
  }

  void step_array(const PFrame* top, uint8_t b, Tops& out) {
    if (gap(top, b, out)) return;
    Frame f = top->f;
    f.ws = 0;
    const Node& n = node(f.node);
    switch (f.state) {
      case kArrOpen:
        if (b == ']') {
          if (n.min_items == 0) out.push_back(top->parent);
          return;
        }
        if (n.max_items == 0) return;
        f.count = 1;
        f.state = kArrAfter;
        return start_value(arena->make(f, top->parent), n.items, b, out);
      case kArrAfter:
        if (b == ',' && f.count < n.max_items) {
          f.state = kArrComma;
          emit(f, top->parent, out);
        } else if (b == ']' && f.count >= n.min_items) {
          out.push_back(top->parent);
        }
        return;
      case kArrComma:
        ++f.count;
        f.state = kArrAfter;
        return start_value(arena->make(f, top->parent), n.items, b, out);
      default:
        return;
    }
  }

  // A key's closing quote: which property it named, into its object.
  void close_key(const PFrame* top, Tops& out) {
    const PFrame* obj = top->parent;
    Frame o = obj->f;
    const Node& n = node(o.node);
    const int32_t t = top->f.aux;
    const int32_t p = t >= 0 ? g.trie[static_cast<size_t>(t)].terminal : -1;
    if (p >= 0) {
      const Property& prop = n.properties[static_cast<size_t>(p)];
      if ((o.seen >> p & 1) || !prop.usable) return;  // written already, or nothing can follow it
      o.seen |= uint64_t{1} << p;
      o.aux = prop.node;
    } else {
      if (n.additional < 0) return;
      o.aux = n.additional;
    }
    o.state = kObjColon;
    o.ws = 0;
    emit(o, obj->parent, out);
  }

  // A key byte (escapes included) that is not the closing quote: the
  // declared names it may still spell.
  bool key_byte(Frame& f, const PFrame* top, uint8_t b) {
    if (f.aux >= 0) f.aux = g.trie_child(f.aux, b);
    const Node& n = node(f.node);
    if (n.additional >= 0) return true;
    return f.aux >= 0 && (g.trie[static_cast<size_t>(f.aux)].names & ~top->parent->f.seen) != 0;
  }

  void step_string(const PFrame* top, uint8_t b, Tops& out) {
    Frame f = top->f;
    const bool key = f.kind == FrameKind::kKey;
    const Node& n = node(f.node);
    const uint32_t max_len = key ? UINT32_MAX : n.max_length;
    switch (f.state) {
      case kStrChars:
        if (b == '"') {
          if (key) return close_key(top, out);
          if (f.count >= n.min_length) out.push_back(top->parent);
          return;
        }
        if (b < 0x20 || f.count >= max_len) return;
        if (b == '\\') {
          f.state = kStrEscape;
        } else if (b >= 0x80) {
          // RFC 3629: the lead byte fixes the length and the range of the
          // second byte (no overlongs, surrogates or past U+10FFFF).
          uint8_t need = 0, lo = 0x80, hi = 0xBF;
          if (b >= 0xC2 && b <= 0xDF) need = 1;
          else if (b == 0xE0) need = 2, lo = 0xA0;
          else if (b == 0xED) need = 2, hi = 0x9F;
          else if (b >= 0xE1 && b <= 0xEF) need = 2;
          else if (b == 0xF0) need = 3, lo = 0x90;
          else if (b >= 0xF1 && b <= 0xF3) need = 3;
          else if (b == 0xF4) need = 3, hi = 0x8F;
          else return;
          f.state = kStrUtf8;
          f.sub = need;
          f.scratch = lo | (hi << 8);
        }
        ++f.count;
        break;
      case kStrUtf8:
        if (b < (f.scratch & 0xFF) || b > (f.scratch >> 8)) return;
        if (--f.sub == 0) f.state = kStrChars;
        f.scratch = 0x80 | (0xBF << 8);
        break;
      case kStrEscape:
        if (b == 'u') {
          f.state = kStrHex;
          f.sub = 0;
          f.scratch = 0;
        } else if (b == '"' || b == '\\' || b == 'b' || b == 'f' || b == 'n' || b == 'r' || b == 't' ||
                   (b == '/' && !key)) {
          f.state = kStrChars;
        } else {
          return;
        }
        break;
      case kStrHex: {
        const int h = hex_value(b);
        if (h < 0) return;
        // Keys: \u00XX below U+0020 only (canonical form, json_schema.h).
        if (key && ((f.sub < 2 && h != 0) || (f.sub == 2 && h > 1))) return;
        f.scratch = f.scratch * 16 + static_cast<uint32_t>(h);
        ++f.sub;
        if (f.sub == 2 && f.scratch >= 0xDC && f.scratch <= 0xDF) return;  // a low surrogate alone
        if (f.sub == 4) f.state = f.scratch >= 0xD800 && f.scratch <= 0xDBFF ? kStrLowBackslash : kStrChars;
        break;
      }
      case kStrLowBackslash:
        if (b != '\\') return;
        f.state = kStrLowU;
        break;
      case kStrLowU:
        if (b != 'u') return;
        f.state = kStrLowHex;
        f.sub = 0;
        break;
      case kStrLowHex: {
        const int h = hex_value(b);
        if (h < 0 || (f.sub == 0 && h != 0xD) || (f.sub == 1 && h < 0xC)) return;
        if (++f.sub == 4) f.state = kStrChars;
        break;
      }
      default:
        return;
    }
    if (key && !key_byte(f, top, b)) return;
    emit(f, top->parent, out);
  }

  static bool number_can_end(const Frame& f) {
    return f.state == kNumZero || f.state == kNumInt || f.state == kNumFrac || f.state == kNumExp;
  }

  void step_number(const PFrame* top, uint8_t b, Tops& out) {
    Frame f = top->f;
    const bool integer = f.sub != 0;
    const bool digit = is_digit(b);
    auto to = [&](uint8_t state, uint32_t count) {
      f.state = state;
      f.count = count;
      emit(f, top->parent, out);
    };
    switch (f.state) {
      case kNumMinus:
        if (b == '0') return to(kNumZero, 0);
        if (digit) return to(kNumInt, 1);
        return;
      case kNumZero:
      case kNumInt:
        if (digit && f.state == kNumInt && f.count < kMaxIntDigits) return to(kNumInt, f.count + 1);
        if (!integer && b == '.') return to(kNumDot, 0);
        if (!integer && (b == 'e' || b == 'E')) return to(kNumE, 0);
        break;
      case kNumDot:
        if (digit) to(kNumFrac, 1);
        return;
      case kNumFrac:
        if (digit && f.count < kMaxFracDigits) return to(kNumFrac, f.count + 1);
        if (b == 'e' || b == 'E') return to(kNumE, 0);
        break;
      case kNumE:
        if (b == '+' || b == '-') return to(kNumESign, 0);
        if (digit) to(kNumExp, 1);
        return;
      case kNumESign:
        if (digit) to(kNumExp, 1);
        return;
      case kNumExp:
        if (digit && f.count < kMaxExpDigits) return to(kNumExp, f.count + 1);
        break;
      default:
        return;
    }
    // The number ended before this byte: the byte is its parent's.
    if (number_can_end(f) && top->parent != nullptr) step(top->parent, b, out);
  }

  void step_literal(const PFrame* top, uint8_t b, Tops& out) {
    const int32_t c = g.trie_child(top->f.aux, b);
    if (c >= 0) {
      Frame f = top->f;
      f.aux = c;
      emit(f, top->parent, out);
    } else if (g.trie[static_cast<size_t>(top->f.aux)].terminal >= 0 && top->parent != nullptr) {
      step(top->parent, b, out);
    }
  }

  bool stack_complete(const PFrame* top) const {
    const Frame& f = top->f;
    if (f.kind == FrameKind::kNumber && number_can_end(f)) top = top->parent;
    else if (f.kind == FrameKind::kLiteral && g.trie[static_cast<size_t>(f.aux)].terminal >= 0) top = top->parent;
    return top != nullptr && top->f.kind == FrameKind::kRoot && top->f.state == kRootDone;
  }

  // Copies the readings into the live arena not in use, so that the scratch
  // arena and the old live one can be reused.
  void compact(Tops& from) {
    Arena& to = live[1 - live_index];
    to.rewind(0);
    tops.clear();
    for (const PFrame* t : from) {
      std::vector<const PFrame*> chain;
      for (const PFrame* p = t; p != nullptr; p = p->parent) chain.push_back(p);
      const PFrame* parent = nullptr;
      for (auto it = chain.rbegin(); it != chain.rend(); ++it) parent = to.make((*it)->f, parent);
      tops.push_back(parent);
    }
    live_index = 1 - live_index;
  }
};

JsonMatcher::JsonMatcher(std::shared_ptr<const Grammar> grammar)
    : grammar_(std::move(grammar)), impl_(std::make_unique<Impl>(*grammar_)) {}

JsonMatcher::~JsonMatcher() = default;

bool JsonMatcher::feed(std::string_view bytes) {
  Impl& m = *impl_;
  m.scratch.rewind(0);
  m.arena = &m.scratch;
  Tops cur = m.tops, next;
  for (char c : bytes) {
    next.clear();
    for (const PFrame* t : cur) m.step(t, static_cast<uint8_t>(c), next);
    dedup(next);
    if (next.empty()) return false;
    cur.swap(next);
  }
  m.compact(cur);
  return true;
}

bool JsonMatcher::complete() const {
  for (const PFrame* t : impl_->tops) {
    if (impl_->stack_complete(t)) return true;
  }
  return false;
}

bool JsonMatcher::can_continue() { return !allowed_bytes().empty(); }

std::vector<uint8_t> JsonMatcher::allowed_bytes() {
  Impl& m = *impl_;
  std::vector<uint8_t> bytes;
  for (int b = 0; b < 256; ++b) {
    m.scratch.rewind(0);
    m.arena = &m.scratch;
    Tops out;
    for (const PFrame* t : m.tops) m.step(t, static_cast<uint8_t>(b), out);
    if (!out.empty()) bytes.push_back(static_cast<uint8_t>(b));
  }
  return bytes;
}

void JsonMatcher::allowed_tokens(const VocabTrie& vocab, std::vector<uint64_t>& mask) {
  Impl& m = *impl_;
  mask.assign((static_cast<size_t>(vocab.n_vocab()) + 63) / 64, 0);
  const auto& nodes = vocab.nodes();
  const auto& ids = vocab.ids();
  if (m.levels.size() < static_cast<size_t>(vocab.max_depth()) + 1) m.levels.resize(static_cast<size_t>(vocab.max_depth()) + 1);
  std::vector<size_t> marks(m.levels.size(), 0);
  m.scratch.rewind(0);
  m.arena = &m.scratch;
  m.levels[0] = m.tops;
  marks[0] = m.scratch.mark();
  for (size_t i = 0; i < nodes.size();) {
    const VocabTrie::Node& n = nodes[i];
    // Everything allocated below this depth belonged to the subtree left.
    m.scratch.rewind(marks[n.depth - 1]);
    Tops& out = m.levels[n.depth];
    out.clear();
    for (const PFrame* t : m.levels[n.depth - 1]) m.step(t, n.byte, out);
    if (out.empty()) {
      i = n.skip;
      continue;
    }
    dedup(out);
    marks[n.depth] = m.scratch.mark();
    for (uint32_t k = n.ids_begin; k < n.ids_end; ++k) {
      const auto id = static_cast<size_t>(ids[k]);
      mask[id / 64] |= uint64_t{1} << (id % 64);
    }
    ++i;
  }
}

std::vector<std::vector<Frame>> JsonMatcher::stacks() const {
  std::vector<std::vector<Frame>> out;
  for (const PFrame* t : impl_->tops) {
    std::vector<Frame> s;
    for (const PFrame* p = t; p != nullptr; p = p->parent) s.push_back(p->f);
    std::reverse(s.begin(), s.end());
    out.push_back(std::move(s));
  }
  return out;
}

}  // namespace spw::grammar
