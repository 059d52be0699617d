// tests/integration/slow_provider_itest.cc — a slow provider must cost waiting requests memory,
// not threads: another tenant's replay is answered while many charges wait on the provider, and
// one principal's concurrent charges beyond its quota are refused with 429 at once, by the quota
// rather than by a pool of threads.
//
// The properties are orders of events (an answer arrives while the provider still stalls every
// charge), not speeds: the provider's stall is far longer than anything the test waits for.
#include <atomic>
#include <chrono>
#include <map>
#include <thread>
#include <vector>

#include "idem/mutex.h"
#include "tests/integration/idemd_fixture.h"

namespace idem::itest {
namespace {

using std::chrono::milliseconds;

class SlowProviderTest : public IdemdTest {
 protected:
  // Sends `count` payments of `api_key` under distinct keys, each on its own thread and
  // connection; each answer is recorded as it arrives, with whether the stall was still on.
  struct Flight {
    std::vector<std::thread> threads;
    Mutex mu;
    std::vector<http::Response> answers IDEM_GUARDED_BY(mu);
    std::atomic<int> answered{0};
    ~Flight() {
      for (std::thread& t : threads) t.join();
    }
    // The answers so far.
    std::vector<http::Response> Answers() {
      MutexLock lock(mu);
      return answers;
    }
  };
  void Launch(Flight& flight, int count, const std::string& prefix, const char* api_key) {
    for (int i = 0; i < count; ++i) {
      flight.threads.emplace_back([this, &flight, i, prefix, api_key] {
        const std::string n = std::to_string(i);
        http::Request request{"POST", "/v1/payments", {}, Body("ORD-" + prefix + n)};
        request.headers.Set("Authorization", "Bearer " + std::string(api_key));
        request.headers.Set("Content-Type", "application/json");
        request.headers.Set("Idempotency-Key", prefix + "-key-" + n);
        auto answer = http::Call(idemd_url_, std::move(request),
                                 http::CallOptions{.timeout = milliseconds(60000)});
        MutexLock lock(flight.mu);
        flight.answers.push_back(answer ? *answer : http::Response{0, {}, answer.error().message});
        ++flight.answered;
      });
    }
  }
};

// 40 charges of alice wait on a provider that stalls each for 8 s; meanwhile carol's replay of a
// finished payment and her GET of it are answered, and no charge of alice has finished yet. With
// requests holding a thread each for the whole provider call (16 of them in the old model), the
// replay queued behind the charges until the first of them finished.
TEST_F(SlowProviderTest, AReplayStaysFastWhileChargesWaitOnASlowProvider) {
  IdemdOptions options;
  options.provider_timeout_ms = 15000;
  options.lease_ms = 20000;
  options.settle_ms = 20000;
  StartIdemd(options);

  const http::Response paid = Pay("carol-replay-key", Body("ORD-CAROL"), kCarol);
  ASSERT_EQ(paid.status, 201) << paid.body;
  const std::string payment = ParseObject(paid.body).at("id").as_string().c_str();

  constexpr int kCharges = 40;
  Fault(R"({"fault":"slow","delay_ms":8000,"times":40})");
  Flight flight;
  Launch(flight, kCharges, "alice-slow", kAlice);
  // Every charge reaches the provider (provider-sim counts a slow charge when it is made, before
  // its delayed answer).
  bool all_sent = false;
  for (int i = 0; i < 300 && !all_sent; ++i) {
    all_sent = TotalCharges() >= kCharges + 1;
    if (!all_sent) std::this_thread::sleep_for(milliseconds(20));
  }
  ASSERT_TRUE(all_sent) << "only " << TotalCharges() - 1 << " of " << kCharges
                        << " charges reached the provider while they were all in flight";

  const http::Response replay = Pay("carol-replay-key", Body("ORD-CAROL"), kCarol);
  const http::Response read = Get("/v1/payments/" + payment, kCarol);
  const int finished_by_then = flight.answered;
  EXPECT_EQ(replay.status, 201) << replay.body;
  EXPECT_EQ(replay.headers.Get("idempotent-replayed"), "true");
  EXPECT_EQ(read.status, 200) << read.body;
  EXPECT_EQ(finished_by_then, 0) << "the replay waited for charges stalled at the provider";

  for (std::thread& t : flight.threads) t.join();
  flight.threads.clear();
  std::map<int, int> statuses;
  for (const http::Response& r : flight.Answers()) ++statuses[r.status];
  EXPECT_EQ(statuses[201], kCharges);
  EXPECT_EQ(TotalCharges(), kCharges + 1) << "one charge per payment";
}

// alice may have 30 operations running (max_processing); 100 of her charges arrive at once while
// the provider stalls each for 8 s. The 70 beyond the quota are answered 429 + Retry-After while
// the 30 still wait at the provider, and the provider sees exactly 30 charges. With a pool of 16
// threads bounding concurrency, the quota was never reached: nobody got a 429, and the last
// charges waited for the first to finish.
TEST_F(SlowProviderTest, ConcurrentSlowRequestsOfOnePrincipalBeyondTheQuotaGet429) {
  IdemdOptions options;
  options.provider_timeout_ms = 15000;
  options.lease_ms = 20000;
  options.settle_ms = 20000;
  options.extra_idempotency = "max_processing = 30\n";
  StartIdemd(options);

  Fault(R"({"fault":"slow","delay_ms":8000,"times":100})");
  Flight flight;
  Launch(flight, 100, "alice-quota", kAlice);
  // The 70 refusals come while the 30 admitted charges stall.
  bool refused = false;
  for (int i = 0; i < 300 && !refused; ++i) {
    refused = flight.answered >= 70;
    if (!refused) std::this_thread::sleep_for(milliseconds(20));
  }
  std::map<int, int> early;
  for (const http::Response& r : flight.Answers()) ++early[r.status];
  EXPECT_EQ(early[429], 70) << "the quota, not a thread pool, bounds one principal's charges";
  EXPECT_EQ(early[201], 0) << "refusals came only after charges finished";
  EXPECT_LE(TotalCharges(), 30) << "more charges than the quota reached the provider";

  for (std::thread& t : flight.threads) t.join();
  flight.threads.clear();
  std::map<int, int> statuses;
  for (const http::Response& r : flight.Answers()) {
    ++statuses[r.status];
    if (r.status == 429) {
      EXPECT_TRUE(r.headers.Get("retry-after").has_value());
      EXPECT_NE(r.body.find("urn:idem:problem:"), std::string::npos) << r.body;
    }
  }
  EXPECT_EQ(statuses[201], 30);
  EXPECT_EQ(statuses[429], 70);
  EXPECT_EQ(TotalCharges(), 30) << "a refused request charges nothing";
}

}  // namespace
}  // namespace idem::itest
