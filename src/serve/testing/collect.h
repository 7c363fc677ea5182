// collect(): drains a Ticket's events in a test, checking the stream's
// contract on the way (no text after the finished event; exactly one
// finished event is the caller's to assert through n_finished).
// Bounded in real time: a request that does not finish within `timeout` is a
// test failure (ADD_FAILURE), never a hang.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <vector>

#include "serve/scheduler.h"

namespace spw::serve::testing {

struct Collected {
  std::string text;
  std::vector<TokenLogprobs> logprobs;  // every kText event's, in order
  RequestEvent fin;
  int n_finished = 0;
};

inline Collected collect(Ticket& t, std::chrono::milliseconds timeout = std::chrono::seconds(30)) {
  Collected c;
  const auto until = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < until) {
    RequestEvent ev;
    const PopResult r = t.next_event(ev, std::chrono::milliseconds(20));
    if (r == PopResult::kClosed) return c;
    if (r == PopResult::kTimeout) continue;
    if (ev.kind == RequestEvent::Kind::kText) {
      EXPECT_EQ(c.n_finished, 0) << "text after the finished event";
      c.text += ev.text;
      c.logprobs.insert(c.logprobs.end(), ev.logprobs.begin(), ev.logprobs.end());
    } else {
      ++c.n_finished;
      c.fin = ev;
    }
  }
  ADD_FAILURE() << "request " << t.id() << " did not finish";
  return c;
}

}  // namespace spw::serve::testing
