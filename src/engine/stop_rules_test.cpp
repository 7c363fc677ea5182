#include "engine/stop_rules.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
#include <utility>
#include <vector>

namespace spw {
namespace {

// Feeds pieces one at a time; returns everything emitted and whether it stopped.
std::pair<std::string, bool> run(StopMatcher& m, const std::vector<std::string>& pieces) {
  std::string out;
  for (const auto& p : pieces) {
    StopMatcher::Step s = m.push(p);
    out += s.emit;
    if (s.stopped) return {out, true};
  }
  out += m.flush();
  return {out, false};
}

TEST(StopMatcherTest, NoStopStringsPassesEverythingThrough) {
  StopMatcher m({});
  auto s = m.push("hello");
  EXPECT_EQ(s.emit, "hello");
  EXPECT_FALSE(s.stopped);
  EXPECT_EQ(m.held(), "");
  EXPECT_EQ(m.flush(), "");
}

TEST(StopMatcherTest, StopInsideOnePush) {
  StopMatcher m({"STOP"});
  auto s = m.push("abcSTOPdef");
  EXPECT_TRUE(s.stopped);
  EXPECT_EQ(s.emit, "abc");
  // After a stop nothing more comes out.
  auto s2 = m.push("more");
  EXPECT_TRUE(s2.stopped);
  EXPECT_EQ(s2.emit, "");
}

TEST(StopMatcherTest, StopSplitAcrossPushes) {
  StopMatcher m({"</s>"});
  auto a = m.push("Hello <");
  EXPECT_EQ(a.emit, "Hello ");
  EXPECT_EQ(m.held(), "<");
  auto b = m.push("/");
  EXPECT_EQ(b.emit, "");
  EXPECT_EQ(m.held(), "</");
  auto c = m.push("s");
  EXPECT_EQ(c.emit, "");
  auto d = m.push(">tail");
  EXPECT_TRUE(d.stopped);
  EXPECT_EQ(d.emit, "");
}

TEST(StopMatcherTest, PartialPrefixReleasedWhenItDiverges) {
  StopMatcher m({"</s>"});
  auto a = m.push("x </");
  EXPECT_EQ(a.emit, "x ");
  EXPECT_EQ(m.held(), "</");
  auto b = m.push("div>");
  EXPECT_FALSE(b.stopped);
  EXPECT_EQ(b.emit, "</div>");
  EXPECT_EQ(m.held(), "");
}

TEST(StopMatcherTest, DivergingPrefixMayStartANewPrefix) {
  StopMatcher m({"abc"});
  EXPECT_EQ(m.push("ab").emit, "");
  auto b = m.push("ab");  // "abab": "ab" at 2 may still start "abc"
  EXPECT_EQ(b.emit, "ab");
  EXPECT_EQ(m.held(), "ab");
  auto c = m.push("c!");
  EXPECT_TRUE(c.stopped);
  EXPECT_EQ(c.emit, "");
}

TEST(StopMatcherTest, RepeatedCharacterPrefix) {
  // "aaab" with stop "aab": the occurrence starts at 1, not 0.
  StopMatcher m({"aab"});
  auto [out, stopped] = run(m, {"a", "a", "a", "b", "zzz"});
  EXPECT_TRUE(stopped);
  EXPECT_EQ(out, "a");
}

TEST(StopMatcherTest, StopAtVeryBeginning) {
  StopMatcher m({"User:"});
  auto [out, stopped] = run(m, {"Us", "er:", " hi"});
  EXPECT_TRUE(stopped);
  EXPECT_EQ(out, "");
  StopMatcher m2({"\n"});
  auto s = m2.push("\nabc");
  EXPECT_TRUE(s.stopped);
  EXPECT_EQ(s.emit, "");
}

TEST(StopMatcherTest, MultipleStopStringsEarliestWins) {
  StopMatcher m({"END", "\n\n", "###"});
  auto [out, stopped] = run(m, {"line one\n", "\nEND"});
  EXPECT_TRUE(stopped);
  EXPECT_EQ(out, "line one");
  StopMatcher m2({"END", "\n\n", "###"});
  auto [out2, stopped2] = run(m2, {"a#", "#", "#b"});
  EXPECT_TRUE(stopped2);
  EXPECT_EQ(out2, "a");
}

TEST(StopMatcherTest, OverlappingCandidates) {
  // "abcd" and "bc": while "ab" could be "abcd", "bc" completes first at 1.
  StopMatcher m({"abcd", "bc"});
  auto [out, stopped] = run(m, {"xa", "b", "c", "d"});
  EXPECT_TRUE(stopped);
  EXPECT_EQ(out, "xa");
  // Longer candidate is a prefix-holder for a shorter one: "abc" held under
  // "abcd", then the text diverges into "abce" -> released entirely.
  StopMatcher m2({"abcd", "cd"});
  auto a = m2.push("abc");
  EXPECT_EQ(a.emit, "");
  EXPECT_EQ(m2.held(), "abc");
  auto b = m2.push("e");
  EXPECT_FALSE(b.stopped);
  EXPECT_EQ(b.emit, "abce");
}

TEST(StopMatcherTest, FlushReturnsHeldText) {
  StopMatcher m({"<|end|>"});
  auto [out, stopped] = run(m, {"the end <|e", "n"});
  EXPECT_FALSE(stopped);
  EXPECT_EQ(out, "the end <|en");
  EXPECT_EQ(m.held(), "");
}

TEST(StopMatcherTest, HeldRoundTripContinuesIdentically) {
  StopMatcher a({"<|end|>", "STOP"});
  EXPECT_EQ(a.push("text <|en").emit, "text ");
  const std::string saved = a.held();
  EXPECT_EQ(saved, "<|en");
  StopMatcher b({"<|end|>", "STOP"});
  b.set_held(saved);
  EXPECT_EQ(b.held(), "<|en");
  auto sa = a.push("d|> ignored");
  auto sb = b.push("d|> ignored");
  EXPECT_TRUE(sa.stopped);
  EXPECT_TRUE(sb.stopped);
  EXPECT_EQ(sa.emit, sb.emit);
  EXPECT_EQ(sb.emit, "");
}

TEST(StopMatcherTest, EveryCharacterSplitMatchesWholeString) {
  // Whatever the chunking, the emitted text is the same.
  const std::string text = "say hello<stop> then more";
  for (size_t chunk = 1; chunk <= text.size(); ++chunk) {
    StopMatcher m({"<stop>", "lo<x"});
    std::vector<std::string> pieces;
    for (size_t i = 0; i < text.size(); i += chunk) pieces.push_back(text.substr(i, chunk));
    auto [out, stopped] = run(m, pieces);
    EXPECT_TRUE(stopped) << chunk;
    EXPECT_EQ(out, "say hello") << chunk;
  }
}

TEST(StopMatcherTest, EmptyStopStringsIgnored) {
  StopMatcher m({"", "x"});
  EXPECT_EQ(m.stop_strings().size(), 1u);
  auto s = m.push("abc");
  EXPECT_EQ(s.emit, "abc");
  EXPECT_FALSE(s.stopped);
}

TEST(StopMatcherTest, Utf8StopStringHoldsWholeCharacters) {
  StopMatcher m({"\xE2\x80\x94" "END"});  // em dash + END
  auto a = m.push("caf\xC3\xA9 \xE2\x80\x94");
  EXPECT_EQ(a.emit, "caf\xC3\xA9 ");
  EXPECT_EQ(m.held(), "\xE2\x80\x94");
  auto b = m.push("x");
  EXPECT_EQ(b.emit, "\xE2\x80\x94x");
}

TEST(StopMatcherTest, StopInsideRestoredHeldTextStopsOnNextPush) {
  // A checkpoint's held text is taken as it comes: a stop string inside it
  // stops the next push, as it would have had it been held.
  StopMatcher m({"</s>"});
  m.set_held("a</s>b");
  EXPECT_EQ(m.held(), "a</s>b");
  auto s = m.push("");
  EXPECT_TRUE(s.stopped);
  EXPECT_EQ(s.emit, "a");
  // Held text that no stop string can continue is released by the next push.
  StopMatcher m2({"</s>"});
  m2.set_held("xyz<");
  EXPECT_EQ(m2.held_size(), 4u);
  auto t = m2.push("a");
  EXPECT_FALSE(t.stopped);
  EXPECT_EQ(t.emit, "xyz<a");
  EXPECT_EQ(m2.held(), "");
}

TEST(StopMatcherTest, LongerOccurrenceCompletedInTheSamePushStartsEarlierAndWins) {
  // "bc" completes first, but "abcd" completes in the same push and starts
  // one byte earlier: within what is known, the earliest start wins.
  StopMatcher m({"abcd", "bc"});
  auto s = m.push("xabcd");
  EXPECT_TRUE(s.stopped);
  EXPECT_EQ(s.emit, "x");
}

// The matcher this one replaced, kept as the reference: every stop string
// searched for in held + pushed text, then the longest suffix that is a
// proper prefix of some stop string held back. Slow (quadratic in the stop
// strings' length per push) but plainly right.
class NaiveStopMatcher {
 public:
  explicit NaiveStopMatcher(std::vector<std::string> stops) {
    for (auto& s : stops) {
      if (!s.empty()) stops_.push_back(std::move(s));
    }
  }
  StopMatcher::Step push(std::string_view text) {
    StopMatcher::Step step;
    if (stopped_) {
      step.stopped = true;
      return step;
    }
    std::string buf = std::move(held_);
    held_.clear();
    buf.append(text);
    size_t stop_at = std::string::npos;
    for (const std::string& s : stops_) stop_at = std::min(stop_at, buf.find(s));
    if (stop_at != std::string::npos) {
      stopped_ = true;
      step.stopped = true;
      buf.resize(stop_at);
      step.emit = std::move(buf);
      return step;
    }
    size_t hold_from = buf.size();
    for (const std::string& s : stops_) {
      for (size_t len = std::min(s.size() - 1, buf.size()); len > 0; --len) {
        if (std::string_view(buf).substr(buf.size() - len) == std::string_view(s).substr(0, len)) {
          hold_from = std::min(hold_from, buf.size() - len);
          break;
        }
      }
    }
    held_ = buf.substr(hold_from);
    buf.resize(hold_from);
    step.emit = std::move(buf);
    return step;
  }
  std::string flush() { return std::exchange(held_, std::string()); }
  const std::string& held() const { return held_; }
  void set_held(std::string held) { held_ = std::move(held); }

 private:
  std::vector<std::string> stops_;
  std::string held_;
  bool stopped_ = false;
};

std::string random_string(std::mt19937& rng, const std::string& alphabet, size_t min_len, size_t max_len) {
  std::uniform_int_distribution<size_t> len(min_len, max_len);
  std::uniform_int_distribution<size_t> pick(0, alphabet.size() - 1);
  std::string s(len(rng), ' ');
  for (char& c : s) c = alphabet[pick(rng)];
  return s;
}

// Stop sets over a small alphabet, with strings that are prefixes, suffixes
// and substrings of one another (and empty ones, and duplicates).
std::vector<std::string> random_stops(std::mt19937& rng, const std::string& alphabet) {
  std::vector<std::string> stops;
  const size_t n = std::uniform_int_distribution<size_t>(0, 6)(rng);
  for (size_t i = 0; i < n; ++i) {
    const int kind = std::uniform_int_distribution<int>(0, 5)(rng);
    if (stops.empty() || kind <= 1) {
      stops.push_back(random_string(rng, alphabet, 1, 7));
      continue;
    }
    const std::string& base = stops[std::uniform_int_distribution<size_t>(0, stops.size() - 1)(rng)];
    const size_t a = std::uniform_int_distribution<size_t>(0, base.size())(rng);
    const size_t b = std::uniform_int_distribution<size_t>(a, base.size())(rng);
    if (kind == 2) {
      stops.push_back(base.substr(0, b));  // a prefix (maybe empty)
    } else if (kind == 3) {
      stops.push_back(base.substr(a));  // a suffix
    } else if (kind == 4) {
      stops.push_back(base.substr(a, b - a));  // a substring
    } else {
      stops.push_back(base + random_string(rng, alphabet, 0, 3));  // an extension
    }
  }
  return stops;
}

std::vector<std::string> random_chunks(std::mt19937& rng, const std::string& text) {
  std::vector<std::string> chunks;
  std::uniform_int_distribution<size_t> len(0, 6);
  for (size_t i = 0; i < text.size();) {
    const size_t n = std::min(len(rng), text.size() - i);
    chunks.push_back(text.substr(i, n));
    i += n;
  }
  return chunks;
}

size_t longest(const std::vector<std::string>& stops) {
  size_t n = 0;
  for (const auto& s : stops) n = std::max(n, s.size());
  return n;
}

TEST(StopMatcherTest, MatchesTheNaiveMatcherOnRandomStreams) {
  std::mt19937 rng(20240611);
  const std::string alphabets[] = {"a", "ab", "abc", "abcd"};
  for (int iter = 0; iter < 20000; ++iter) {
    const std::string& alphabet = alphabets[iter % 4];
    const std::vector<std::string> stops = random_stops(rng, alphabet);
    const std::string text = random_string(rng, alphabet, 0, 40);
    const std::vector<std::string> chunks = random_chunks(rng, text);
    SCOPED_TRACE(testing::Message() << "iter " << iter << " text '" << text << "' stops "
                                    << testing::PrintToString(stops));
    StopMatcher m(stops);
    NaiveStopMatcher ref(stops);
    uint64_t fed = 0;
    for (size_t k = 0; k < chunks.size(); ++k) {
      // Now and then continue on a matcher restored from the held text, as
      // a checkpoint's resume does.
      if (std::uniform_int_distribution<int>(0, 3)(rng) == 0 && !m.stopped()) {
        StopMatcher restored(stops);
        restored.set_held(m.held());
        ASSERT_EQ(restored.held(), ref.held()) << "chunk " << k;
        m = std::move(restored);
        fed = m.held_size();  // the new matcher's count starts with the restored bytes
      }
      const StopMatcher::Step got = m.push(chunks[k]);
      const StopMatcher::Step want = ref.push(chunks[k]);
      fed += chunks[k].size();
      ASSERT_EQ(got.emit, want.emit) << "chunk " << k;
      ASSERT_EQ(got.stopped, want.stopped) << "chunk " << k;
      ASSERT_EQ(m.held(), ref.held()) << "chunk " << k;
      ASSERT_EQ(m.held_size(), ref.held().size()) << "chunk " << k;
      if (!stops.empty() && !got.stopped) {
        ASSERT_LT(m.held_size(), longest(stops));
      }
      ASSERT_LE(m.transitions(), 2 * fed);
      if (got.stopped) break;
    }
    ASSERT_EQ(m.flush(), ref.flush());
    ASSERT_EQ(m.held(), "");
  }
}

TEST(StopMatcherTest, RestoredArbitraryHeldTextBehavesLikeTheNaiveMatcher) {
  // A checkpoint's held text from elsewhere need not be what this matcher
  // would hold (another build, a stop inside it): the next pushes still
  // treat it as held text.
  std::mt19937 rng(7);
  const std::string alphabets[] = {"ab", "abc"};
  for (int iter = 0; iter < 5000; ++iter) {
    const std::string& alphabet = alphabets[iter % 2];
    const std::vector<std::string> stops = random_stops(rng, alphabet);
    const std::string held = random_string(rng, alphabet, 0, 12);
    const std::vector<std::string> chunks = random_chunks(rng, random_string(rng, alphabet, 0, 20));
    SCOPED_TRACE(testing::Message() << "iter " << iter << " held '" << held << "' stops "
                                    << testing::PrintToString(stops));
    StopMatcher m(stops);
    NaiveStopMatcher ref(stops);
    m.set_held(held);
    ref.set_held(held);
    ASSERT_EQ(m.held(), held);
    ASSERT_EQ(m.held_size(), held.size());
    bool stopped = false;
    for (size_t k = 0; k < chunks.size() && !stopped; ++k) {
      const StopMatcher::Step got = m.push(chunks[k]);
      const StopMatcher::Step want = ref.push(chunks[k]);
      ASSERT_EQ(got.emit, want.emit) << "chunk " << k;
      ASSERT_EQ(got.stopped, want.stopped) << "chunk " << k;
      ASSERT_EQ(m.held(), ref.held()) << "chunk " << k;
      stopped = got.stopped;
    }
    if (chunks.empty()) {
      // An empty push finds a stop string inside the held text too.
      const StopMatcher::Step got = m.push("");
      const StopMatcher::Step want = ref.push("");
      ASSERT_EQ(got.emit, want.emit);
      ASSERT_EQ(got.stopped, want.stopped);
      stopped = got.stopped;
    }
    if (!stopped) {
      ASSERT_EQ(m.flush(), ref.flush());
    }
  }
}

TEST(StopMatcherTest, LongStopStringsCostNothingPerToken) {
  // The hostile request: 16 stop strings of 64 KiB, 2000 tokens of text that
  // keeps the longest possible partial match held. The naive matcher scanned
  // every stop string over the held text on every push; this one takes at
  // most two automaton transitions per byte pushed, and its held text never
  // reaches a stop string's length. (No timing: the bound is structural.)
  constexpr size_t kLen = 64 * 1024;
  std::vector<std::string> stops;
  for (size_t i = 0; i < 16; ++i) {
    const std::string unit = std::string(i + 1, 'a') + "b";
    std::string s;
    while (s.size() < kLen - 1) s += unit;
    s.resize(kLen - 1);
    stops.push_back(s + "c");
  }
  StopMatcher m(stops);
  std::string chunk;
  for (int u = 0; u < 7; ++u) chunk += "aaaaab";  // a token's worth of stops[4]'s period
  uint64_t pushed = 0;
  uint64_t emitted = 0;
  for (int k = 0; k < 2000; ++k) {
    const StopMatcher::Step s = m.push(chunk);
    pushed += chunk.size();
    emitted += s.emit.size();
    ASSERT_FALSE(s.stopped) << k;
    ASSERT_LE(m.held_size(), kLen - 1) << k;
    ASSERT_EQ(emitted + m.held_size(), pushed) << k;
    ASSERT_LE(m.transitions(), 2 * pushed) << k;
  }
  // The text ends in a partial match as long as the held text can be: once
  // it is saturated, each push emits what it pushed.
  // Whole periods of stops[4]: 10922 of 6 bytes, its first kLen - 1 bytes less 3.
  ASSERT_EQ(m.held_size(), kLen - 4);
  // Complete stops[4]: its occurrence starts kLen - 1 bytes before the 'c'.
  const StopMatcher::Step tail = m.push("aaa");
  emitted += tail.emit.size();
  pushed += 3;
  ASSERT_EQ(m.held_size(), kLen - 1);
  const StopMatcher::Step stop = m.push("c");
  emitted += stop.emit.size();
  EXPECT_TRUE(stop.stopped);
  EXPECT_EQ(emitted, pushed - (kLen - 1));
  EXPECT_LE(m.transitions(), 2 * (pushed + 1));
}

}  // namespace
}  // namespace spw
