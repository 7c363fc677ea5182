#include "http/models.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace spw::http {
namespace {

using json = nlohmann::json;

std::vector<gateway::ExecutionPath> paths_with_fallback() {
  std::vector<gateway::ExecutionPath> paths(3);
  paths[0].name = "gpu";
  paths[0].model = "Llama-3.2-3B-Q4_K_M";
  paths[1].name = "hybrid";
  paths[1].model = "Llama-3.2-3B-Q4_K_M";
  paths[2].name = "cpu";
  paths[2].model = "Llama-3.2-1B-Q8_0";
  paths[2].fallback_model = true;
  return paths;
}

TEST(ModelCatalog, ResolvesServedIdAliasesAndTheFallbackModel) {
  const ModelCatalog c = ModelCatalog::build("Llama-3.2-3B-Q4_K_M", {"llama3.2"}, paths_with_fallback());
  ASSERT_EQ(c.entries().size(), 3u);
  EXPECT_EQ(c.entries()[0].role, "primary");
  EXPECT_EQ(c.entries()[0].paths, (std::vector<std::string>{"gpu", "hybrid"}));
  EXPECT_EQ(c.entries()[1].role, "alias");
  EXPECT_EQ(c.entries()[1].alias_of, "Llama-3.2-3B-Q4_K_M");
  EXPECT_EQ(c.entries()[2].role, "fallback");
  EXPECT_EQ(c.entries()[2].paths, (std::vector<std::string>{"cpu"}));

  // The service's model (by any of its names, or none) runs wherever the plan
  // sends it; the fallback model's id restricts the route to it.
  for (const char* id : {"", "Llama-3.2-3B-Q4_K_M", "llama3.2"}) {
    auto r = c.resolve(id);
    ASSERT_TRUE(std::holds_alternative<std::string>(r)) << id;
    EXPECT_EQ(std::get<std::string>(r), "") << id;
  }
  auto f = c.resolve("Llama-3.2-1B-Q8_0");
  ASSERT_TRUE(std::holds_alternative<std::string>(f));
  EXPECT_EQ(std::get<std::string>(f), "Llama-3.2-1B-Q8_0");

  // Ids are exact: another case or a near miss is not the model.
  for (const char* id : {"LLAMA3.2", "llama3.2 ", "gpt-4o"}) {
    auto r = c.resolve(id);
    ASSERT_TRUE(std::holds_alternative<ApiError>(r)) << id;
    const ApiError& e = std::get<ApiError>(r);
    EXPECT_EQ(e.http_status, 404);
    EXPECT_EQ(e.code, "model_not_found");
    EXPECT_EQ(e.param, "model");
    EXPECT_NE(e.message.find("Llama-3.2-3B-Q4_K_M, llama3.2 (alias), Llama-3.2-1B-Q8_0 (fallback)"),
              std::string::npos)
        << e.message;
  }
  // A long id is quoted as an excerpt, not whole.
  const std::string huge(100000, 'x');
  const ApiError e = std::get<ApiError>(c.resolve(huge));
  EXPECT_LT(e.message.size(), 400u) << e.message.size();
}

TEST(ModelCatalog, RendersTheListAndOneModelWithRoles) {
  const ModelCatalog c = ModelCatalog::build("m", {"a"}, paths_with_fallback());
  const json list = json::parse(render_models(c, 1700000000));
  EXPECT_EQ(list["object"], "list");
  ASSERT_EQ(list["data"].size(), 3u);
  EXPECT_EQ(list["data"][1], json::parse(R"({"id":"a","object":"model","created":1700000000,"owned_by":"spillway",
      "spillway":{"role":"alias","alias_of":"m","paths":["gpu","hybrid"],"state":"loaded","pinned":true}})"));
  const json one = json::parse(render_model(*c.find("Llama-3.2-1B-Q8_0"), 5));
  EXPECT_EQ(one["spillway"]["role"], "fallback");
  EXPECT_FALSE(one["spillway"].contains("alias_of"));
  EXPECT_EQ(c.find("nope"), nullptr);
}

TEST(ModelCatalog, CatalogueModelsResolveToThemselvesAndUnavailableOnesSayWhy) {
  std::vector<gateway::ExecutionPath> paths = paths_with_fallback();
  paths.emplace_back();
  paths.back().name = "gpu/coder";
  paths.back().model = "coder";
  const ModelCatalog c =
      ModelCatalog::build("Llama-3.2-3B-Q4_K_M", {}, paths, {{"coder", ""}, {"broken", "unsupported architecture 'x'"}});
  // The served model's paths exclude the catalogue model's.
  EXPECT_EQ(c.entries()[0].paths, (std::vector<std::string>{"gpu", "hybrid"}));
  const ModelEntry* coder = c.find("coder");
  ASSERT_NE(coder, nullptr);
  EXPECT_EQ(coder->role, "catalogue");
  EXPECT_EQ(coder->paths, std::vector<std::string>{"gpu/coder"});
  EXPECT_EQ(std::get<std::string>(c.resolve("coder")), "coder");
  const ApiError e = std::get<ApiError>(c.resolve("broken"));
  EXPECT_EQ(e.http_status, 404);
  EXPECT_EQ(e.code, "model_unavailable");
  EXPECT_NE(e.message.find("unsupported architecture 'x'"), std::string::npos) << e.message;
  // The residency's figures are rendered with the entry.
  gateway::ResidentModelInfo r;
  r.name = "gpu/coder";
  r.model = "coder";
  r.state = "unloaded";
  r.bytes = 123;
  r.charges = {{"vulkan:0", 100}, {"host", 23}};
  r.evictions = 2;
  const json one = json::parse(render_model(*coder, 5, {r}));
  EXPECT_EQ(one["spillway"]["state"], "unloaded");
  EXPECT_EQ(one["spillway"]["memory_by_ledger"]["vulkan:0"], 100);
  EXPECT_EQ(one["spillway"]["evictions"], 2);
  EXPECT_TRUE(one["spillway"]["last_used"].is_null());
  ASSERT_EQ(one["spillway"]["units"].size(), 1u);
  EXPECT_EQ(one["spillway"]["units"][0]["name"], "gpu/coder");
  const json broken = json::parse(render_model(*c.find("broken"), 5));
  EXPECT_EQ(broken["spillway"]["state"], "unavailable");
  EXPECT_EQ(broken["spillway"]["reason"], "unsupported architecture 'x'");
}

TEST(ModelCatalog, AliasesThatWouldBeAmbiguousOrMalformedAreRefusedByName) {
  EXPECT_TRUE(validate_aliases({"gpt-4o-mini", "org/model:latest"}, "m", {"f"}).ok());
  struct Case {
    std::vector<std::string> aliases;
    const char* says;
  };
  for (const Case& k : std::vector<Case>{{{""}, "may not be empty"},
                                         {{"m"}, "served model's own id"},
                                         {{"f"}, "fallback model's id"},
                                         {{"a", "b", "a"}, "given twice"},
                                         {{"two words"}, "whitespace"},
                                         {{"tab\there"}, "whitespace or a control character"},
                                         {{std::string(129, 'a')}, "longer than 128 bytes"}}) {
    Status st = validate_aliases(k.aliases, "m", {"f"});
    ASSERT_FALSE(st.ok()) << k.says;
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(st.message().find(k.says), std::string::npos) << st.message();
    EXPECT_NE(st.message().find("--alias"), std::string::npos) << st.message();
  }
}

}  // namespace
}  // namespace spw::http
