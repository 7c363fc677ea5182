// Integration: `spillway reserve -- CMD` against the real `spillway serve`.
// The reservation exists (and counts in the ledger) exactly while CMD runs,
// the verb exits with CMD's status, and CMD is never started when the server
// cannot take the reservation. The child writes a marker file and waits for
// the test to remove it, so the test observes the server while CMD runs
// without sleeping for a guessed time; every wait is bounded.
#include <gtest/gtest.h>
#include <httplib.h>

#include <chrono>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "spillway_process.h"

namespace {

using nlohmann::json;
using spw::testing::Server;
using Clock = std::chrono::steady_clock;

json get_json(httplib::Client& c, const std::string& path) {
  auto r = c.Get(path);
  if (!r || r->status != 200) return json::object();
  return json::parse(r->body, nullptr, false);
}

bool wait_until(std::chrono::seconds limit, const std::function<bool()>& ok) {
  const auto deadline = Clock::now() + limit;
  while (Clock::now() < deadline) {
    if (ok()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

class ReserveCli : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / ("spw_reserve_test_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  // A child that says it started (marker), runs until the marker is removed
  // (at most 60 s) and exits with `code`.
  std::vector<std::string> child(int code) const {
    const std::string m = marker();
    return {"--", "sh", "-c",
            "touch '" + m + "'; i=0; while [ -e '" + m + "' ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done; exit " +
                std::to_string(code)};
  }
  std::string marker() const { return (dir_ / "running").string(); }
  // `spillway ARGS -- child(code)`, run to its end (at most 30 s).
  static spw::testing::Finished run_to_end(std::vector<std::string> args, const std::vector<std::string>& cmd) {
    args.insert(args.end(), cmd.begin(), cmd.end());
    int err = -1;
    const pid_t pid = spw::testing::start(args, &err);
    if (pid <= 0) return {};
    return spw::testing::wait_for(pid, err, std::chrono::seconds(30));
  }
  std::filesystem::path dir_;
};

TEST_F(ReserveCli, HoldsTheReservationWhileTheCommandRunsAndExitsWithItsStatus) {
  Server s({"--device", "cpu"});
  ASSERT_GT(s.port(), 0) << s.ready_line();
  httplib::Client c("127.0.0.1", s.port());
  std::vector<std::string> args = {"reserve", "--bytes", "3MiB", "--name", "whisper", "--server", s.url(),
                                   "--ttl-s", "1"};
  for (auto& a : child(7)) args.push_back(a);
  int err = -1;
  const pid_t pid = spw::testing::start(args, &err);
  ASSERT_GT(pid, 0);
  ASSERT_TRUE(wait_until(std::chrono::seconds(30), [&] { return std::filesystem::exists(marker()); }))
      << "the command never started";

  // While it runs: listed, counted as a co-tenant in the ledger, and kept
  // alive by renewals past its 1 s ttl.
  json list = get_json(c, "/v1/reservations");
  ASSERT_EQ(list["data"].size(), 1u) << list.dump();
  EXPECT_EQ(list["data"][0]["name"], "whisper");
  EXPECT_EQ(list["data"][0]["bytes"], 3u << 20);
  const json status = get_json(c, "/v1/status");
  ASSERT_FALSE(status["ledgers"].empty()) << status.dump();
  EXPECT_EQ(status["ledgers"][0]["reserved_bytes"]["co-tenant"], 3u << 20) << status.dump();
  std::this_thread::sleep_for(std::chrono::milliseconds(2500));  // 2.5 ttls: only renewals keep it
  list = get_json(c, "/v1/reservations");
  ASSERT_EQ(list["data"].size(), 1u) << "renewed while the command runs: " << list.dump();

  std::filesystem::remove(marker());  // the command ends
  const spw::testing::Finished f = spw::testing::wait_for(pid, err, std::chrono::seconds(30));
  EXPECT_EQ(f.exit_code, 7) << f.err;
  EXPECT_NE(f.err.find("reservation 1 for 'whisper'"), std::string::npos) << f.err;
  EXPECT_NE(f.err.find("reservation 1 released"), std::string::npos) << f.err;
  list = get_json(c, "/v1/reservations");
  EXPECT_TRUE(list["data"].empty()) << "released when the command exited: " << list.dump();
}

TEST_F(ReserveCli, NeverStartsTheCommandWithoutItsReservation) {
  // No server there: exit 1, the command does not run.
  spw::testing::Finished f =
      run_to_end({"reserve", "--bytes", "1MiB", "--server", "http://127.0.0.1:1"}, child(0));
  EXPECT_EQ(f.exit_code, 1) << f.err;
  EXPECT_NE(f.err.find("not starting the command"), std::string::npos) << f.err;
  EXPECT_FALSE(std::filesystem::exists(marker()));

  // A server that refuses the reservation (a name over 64 characters): exit
  // 1 with the server's reason.
  Server s({"--device", "cpu"});
  ASSERT_GT(s.port(), 0) << s.ready_line();
  f = run_to_end({"reserve", "--bytes", "1MiB", "--server", s.url(), "--name", std::string(70, 'n')}, child(0));
  EXPECT_EQ(f.exit_code, 1) << f.err;
  EXPECT_NE(f.err.find("refused the reservation (HTTP 400)"), std::string::npos) << f.err;
  EXPECT_NE(f.err.find("\"param\":\"name\""), std::string::npos) << f.err;
  EXPECT_FALSE(std::filesystem::exists(marker()));

  // A bad size is the CLI's own error, before any request.
  f = run_to_end({"reserve", "--bytes", "lots", "--server", s.url()}, child(0));
  EXPECT_EQ(f.exit_code, 2) << f.err;
  EXPECT_NE(f.err.find("--bytes lots"), std::string::npos) << f.err;
  EXPECT_FALSE(std::filesystem::exists(marker()));
}

}  // namespace

// A server with API keys: without the key the reservation is refused (401,
// with the hint) and the command never starts; with --api-key it is held,
// renewed and released as on an open server.
TEST_F(ReserveCli, SendsTheApiKeyToAServerThatWantsOne) {
  Server s({"--device", "cpu", "--api-key", "k-reserve-0123456789"});
  ASSERT_GT(s.port(), 0) << s.ready_line();
  spw::testing::Finished f = run_to_end({"reserve", "--bytes", "1MiB", "--server", s.url()}, child(0));
  EXPECT_EQ(f.exit_code, 1) << f.err;
  EXPECT_NE(f.err.find("(HTTP 401)"), std::string::npos) << f.err;
  EXPECT_NE(f.err.find("--api-key or $SPILLWAY_API_KEY"), std::string::npos) << f.err;
  EXPECT_FALSE(std::filesystem::exists(marker()));

  std::vector<std::string> args = {"reserve", "--bytes", "1MiB", "--server", s.url(), "--api-key",
                                   "k-reserve-0123456789", "--ttl-s", "1"};
  for (auto& a : child(3)) args.push_back(a);
  int err = -1;
  const pid_t pid = spw::testing::start(args, &err);
  ASSERT_GT(pid, 0);
  ASSERT_TRUE(wait_until(std::chrono::seconds(30), [&] { return std::filesystem::exists(marker()); }))
      << "the command never started";
  httplib::Client c("127.0.0.1", s.port());
  c.set_bearer_token_auth("k-reserve-0123456789");
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));  // 1.5 ttls: renewals carry the key too
  EXPECT_EQ(get_json(c, "/v1/reservations")["data"].size(), 1u);
  std::filesystem::remove(marker());
  f = spw::testing::wait_for(pid, err, std::chrono::seconds(30));
  EXPECT_EQ(f.exit_code, 3) << f.err;
  EXPECT_NE(f.err.find("released"), std::string::npos) << f.err;
  EXPECT_TRUE(get_json(c, "/v1/reservations")["data"].empty());
}
