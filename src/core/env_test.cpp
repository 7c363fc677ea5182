#include "core/env.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>

namespace spw {
namespace {

TEST(EnvTest, WriteMapReadRoundTrip) {
  Env& env = Env::default_env();
  std::string path = (std::filesystem::temp_directory_path() / "spw_env_test.bin").string();
  std::string payload("abc\0def", 7);
  ASSERT_TRUE(env.write_file(path, payload).ok());
  EXPECT_TRUE(env.file_exists(path));
  auto mapped = env.map_file(path);
  ASSERT_TRUE(mapped.ok()) << mapped.status().to_string();
  ASSERT_EQ((*mapped)->size(), 7u);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>((*mapped)->data()), 7), payload);
  auto read = env.read_file(path);
  ASSERT_TRUE(read.ok());
  EXPECT_EQ(*read, payload);
  std::remove(path.c_str());
}

TEST(EnvTest, MissingFileIsIOErrorNamingPath) {
  auto r = Env::default_env().map_file("/nonexistent/spillway/x.gguf");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kIOError);
  EXPECT_NE(r.status().message().find("/nonexistent/spillway/x.gguf"), std::string::npos);
}

TEST(EnvTest, DirectoryIsRejected) {
  auto r = Env::default_env().map_file("/tmp");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
}

TEST(EnvTest, ClockIsMonotonic) {
  Env& env = Env::default_env();
  int64_t a = env.now_ns();
  env.sleep_for_ns(1000000);
  EXPECT_GE(env.now_ns() - a, 1000000);
}

}  // namespace
}  // namespace spw
