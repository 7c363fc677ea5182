#include "core/status.h"

#include <gtest/gtest.h>

#include <memory>

namespace spw {
namespace {

Result<int> parse_positive(int x) {
  if (x <= 0) return Status::invalid_argument("x must be positive, got " + std::to_string(x));
  return x;
}

Result<int> doubled(int x) {
  SPW_ASSIGN_OR_RETURN(int v, parse_positive(x));
  return v * 2;
}

Status check_both(int a, int b) {
  SPW_RETURN_IF_ERROR(parse_positive(a).status());
  SPW_RETURN_IF_ERROR(parse_positive(b).status());
  return Status::ok_status();
}

TEST(StatusTest, OkAndErrorCarryCodeAndMessage) {
  EXPECT_TRUE(Status().ok());
  Status s = Status::corruption("tensor 'w' past end (offset 12)");
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kCorruption);
  EXPECT_EQ(s.to_string(), "Corruption: tensor 'w' past end (offset 12)");
  EXPECT_EQ(s.with_context("model.gguf").message(), "model.gguf: tensor 'w' past end (offset 12)");
}

TEST(StatusTest, MacrosPropagateErrors) {
  EXPECT_EQ(doubled(4).value(), 8);
  Result<int> bad = doubled(-1);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("-1"), std::string::npos);
  EXPECT_TRUE(check_both(1, 2).ok());
  EXPECT_EQ(check_both(1, 0).code(), StatusCode::kInvalidArgument);
}

TEST(StatusTest, ResultHoldsMoveOnlyValues) {
  Result<std::unique_ptr<int>> r(std::make_unique<int>(7));
  ASSERT_TRUE(r.ok());
  std::unique_ptr<int> p = std::move(r).value();
  EXPECT_EQ(*p, 7);
}

}  // namespace
}  // namespace spw
