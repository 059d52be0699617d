// bench/loadgen/options_test.cc — idem-bench's command line: what a run needs, and --no-check,
// which measures a server that is not idemd (scripts/bench's fixed answer) without provider-sim.
#include "bench/loadgen/options.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace idem::bench {
namespace {

Result<Options> Parse(std::vector<std::string> args) { return ParseOptions(args); }

// A usage error whose message mentions `words`.
void ExpectUsage(const std::vector<std::string>& args, const std::string& words) {
  auto o = Parse(args);
  ASSERT_FALSE(o.has_value()) << "accepted: " << ::testing::PrintToString(args);
  EXPECT_EQ(o.error().code, Errc::kInvalidArgument);
  EXPECT_NE(o.error().message.find(words), std::string::npos) << o.error().message;
}

TEST(Options, ARunNeedsTheTargetAndTheProviderForItsCheck) {
  auto o = Parse({"--url", "http://127.0.0.1:8080", "--provider=http://127.0.0.1:8090",
                  "--scenario", "replay", "--connections", "64", "--rate", "500.5"});
  ASSERT_TRUE(o.has_value()) << o.error().message;
  EXPECT_EQ(o->url, "http://127.0.0.1:8080");
  EXPECT_EQ(o->provider, "http://127.0.0.1:8090");
  EXPECT_EQ(o->scenario, Scenario::kReplay);
  EXPECT_EQ(o->connections, 64);
  EXPECT_DOUBLE_EQ(o->rate, 500.5);
  EXPECT_FALSE(o->no_check);

  ExpectUsage({"--url", "http://127.0.0.1:8080"}, "--provider is required");
  ExpectUsage({"--provider", "http://127.0.0.1:8090"}, "--url is required");
  ExpectUsage({"--url", "http://x:1", "--provider", "http://y:2", "--connections", "0"},
              "bad value for --connections");
  ExpectUsage({"--url", "http://x:1", "--provider", "http://y:2", "--bogus"}, "unknown option");
}

TEST(Options, PrincipalsSpreadTheIntentsOverThatManyKeys) {
  auto one = Parse({"--url", "http://x:1", "--provider", "http://y:2"});
  ASSERT_TRUE(one.has_value()) << one.error().message;
  EXPECT_EQ(one->principals, 0);  // the one --api-key
  auto many = Parse({"--url", "http://x:1", "--provider", "http://y:2", "--api-key", "bench",
                     "--principals", "1000"});
  ASSERT_TRUE(many.has_value()) << many.error().message;
  EXPECT_EQ(many->principals, 1000);
  EXPECT_EQ(many->api_key, "bench");
  ExpectUsage({"--url", "http://x:1", "--provider", "http://y:2", "--principals", "0"},
              "bad value for --principals");
}

TEST(Options, NoCheckRunsWithoutAProvider) {
  auto o = Parse({"--no-check", "--url", "http://127.0.0.1:9000", "--duration", "2"});
  ASSERT_TRUE(o.has_value()) << o.error().message;
  EXPECT_TRUE(o->no_check);
  EXPECT_TRUE(o->provider.empty());
  EXPECT_EQ(o->scenario, Scenario::kUnique);
  EXPECT_DOUBLE_EQ(o->duration_s, 2);

  // A provider may still be given; it is simply not asked.
  auto with_provider = Parse({"--url", "http://x:1", "--provider", "http://y:2", "--no-check"});
  ASSERT_TRUE(with_provider.has_value()) << with_provider.error().message;
  EXPECT_TRUE(with_provider->no_check);
}

TEST(Options, NoCheckRefusesWhatOnlyACheckUses) {
  // The slow scenario sets provider-sim's fault: it needs the provider even without a check.
  ExpectUsage({"--no-check", "--url", "http://x:1", "--scenario", "slow"}, "needs --provider");
  auto slow = Parse(
      {"--no-check", "--url", "http://x:1", "--scenario", "slow", "--provider", "http://y:2"});
  EXPECT_TRUE(slow.has_value());
  // --intents keeps a run for a later check, which --no-check never makes; --check-only is only
  // a check.
  ExpectUsage({"--no-check", "--url", "http://x:1", "--intents", "i.json"}, "--intents");
  ExpectUsage({"--no-check", "--check-only", "--intents", "i.json", "--provider", "http://y:2"},
              "exclude each other");
  // A flag takes no value.
  ExpectUsage({"--no-check=yes", "--url", "http://x:1"}, "unknown option");
}

}  // namespace
}  // namespace idem::bench
