// FanOutObserver: one RequestObserver slot (SchedulerOptions::observer) for
// several observers, e.g. the journal and a path's circuit breaker.
//
// Contract: every call goes to each non-null observer, in the order given;
// make() returns the only non-null one as is (no wrapper), or null when none.
// Thread safety: as the observers it holds (the list itself is immutable).
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "serve/scheduler.h"

namespace spw::serve {

class FanOutObserver final : public RequestObserver {
 public:
  static std::shared_ptr<RequestObserver> make(std::vector<std::shared_ptr<RequestObserver>> observers) {
    std::vector<std::shared_ptr<RequestObserver>> kept;
    for (auto& o : observers)
      if (o) kept.push_back(std::move(o));
    if (kept.empty()) return nullptr;
    if (kept.size() == 1) return kept.front();
    return std::shared_ptr<RequestObserver>(new FanOutObserver(std::move(kept)));
  }

  void on_start(const Ticket& ticket, const std::string& placement) override {
    for (const auto& o : observers_) o->on_start(ticket, placement);
  }
  void on_finish(const Ticket& ticket, const RequestEvent& final_event, const std::string& text) override {
    for (const auto& o : observers_) o->on_finish(ticket, final_event, text);
  }
  void on_failover(const Ticket& ticket, const Status& failure) override {
    for (const auto& o : observers_) o->on_failover(ticket, failure);
  }
  void on_checkpoint(const Ticket& ticket, const Checkpoint& checkpoint) override {
    for (const auto& o : observers_) o->on_checkpoint(ticket, checkpoint);
  }

 private:
  explicit FanOutObserver(std::vector<std::shared_ptr<RequestObserver>> observers)
      : observers_(std::move(observers)) {}
  const std::vector<std::shared_ptr<RequestObserver>> observers_;
};

}  // namespace spw::serve
