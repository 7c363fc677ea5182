#include "engine/stop_rules.h"

#include <gtest/gtest.h>

#include <string>
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

}  // namespace
}  // namespace spw
