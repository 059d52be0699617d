// tests/integration/waiters_itest.cc — a flood of Prefer: wait duplicates from one principal,
// parked on one slow payment, must not delay another principal's new payments: parked requests
// hold no thread and have their own bound, apart from the admission limit of executing ones.
#include <sys/resource.h>

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <thread>
#include <vector>

#include "testing/raw_connection.h"
#include "tests/integration/idemd_fixture.h"

namespace idem::itest {
namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

constexpr int kWaiters = 1200;
// The waiters' sockets here and in idemd, and some to spare.
constexpr rlim_t kFilesNeeded = 2 * kWaiters + 512;

int StatusOf(const std::string& raw) {
  if (raw.size() < 12 || raw.compare(0, 9, "HTTP/1.1 ") != 0) return 0;
  return std::stoi(raw.substr(9, 3));
}

class WaitersTest : public IdemdTest {
 public:
  // Raises the soft limit on open files (inherited by idemd) before the processes start.
  void SetUp() override {
    rlimit files{};
    ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &files), 0);
    if (files.rlim_cur < kFilesNeeded) {
      files.rlim_cur = std::min(files.rlim_max, kFilesNeeded);
      ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &files), 0);
    }
    ASSERT_GE(files.rlim_cur, kFilesNeeded) << "the hard limit on open files is too low";
    IdemdTest::SetUp();
  }
};

TEST_F(WaitersTest, AThousandParkedWaitersOfOnePrincipalDoNotDelayAnothersPayments) {
  IdemdOptions options;
  options.provider_timeout_ms = 15000;
  options.lease_ms = 20000;
  options.extra_idempotency = "wait_max_ms = 30000\nmax_waiters_per_principal = 2000\n";
  options.extra_server = "max_parked = 2000\n";
  StartIdemd(options);

  // Alice's payment is slow at the provider: her duplicates will wait on it.
  Fault(R"({"fault":"slow","delay_ms":10000,"times":1})");
  const std::string key = "flood-0001-key";
  const std::string body = Body("ORD-FLOOD");
  std::atomic<bool> first_done{false};
  http::Response first_answer;
  std::thread first([&] {
    http::Request request{"POST", "/v1/payments", {}, body};
    request.headers.Set("Authorization", "Bearer " + std::string(kAlice));
    request.headers.Set("Content-Type", "application/json");
    request.headers.Set("Idempotency-Key", key);
    auto answer = http::Call(idemd_url_, std::move(request),
                             http::CallOptions{.timeout = milliseconds(30000)});
    if (answer) first_answer = std::move(*answer);
    first_done = true;
  });
  bool running = false;
  for (int i = 0; i < 100 && !running; ++i) {
    running = Get("/v1/operations/" + key).status == 200;
    if (!running) std::this_thread::sleep_for(milliseconds(20));
  }
  ASSERT_TRUE(running) << "alice's first payment never started";

  // 1,200 duplicates with Prefer: wait, each on its own connection.
  const std::string duplicate =
      "POST /v1/payments HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + std::string(kAlice) +
      "\r\nContent-Type: application/json\r\nIdempotency-Key: " + key +
      "\r\nPrefer: wait=30\r\nContent-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
  std::vector<std::unique_ptr<testing::RawConnection>> waiters;
  for (int i = 0; i < kWaiters; ++i) {
    waiters.push_back(std::make_unique<testing::RawConnection>(idemd_url_.port));
    ASSERT_TRUE(waiters.back()->Connected()) << "connection " << i;
    ASSERT_TRUE(waiters.back()->Send(duplicate)) << "connection " << i;
  }
  std::this_thread::sleep_for(milliseconds(1500));  // every waiter reaches idemd and parks

  // Meanwhile carol's new payments succeed, promptly.
  std::map<int, int> carol_statuses;
  Clock::duration slowest{0};
  for (int i = 0; i < 20; ++i) {
    const std::string n = std::to_string(1000 + i);
    const auto started = Clock::now();
    http::Response r = Pay("carol-" + n + "-key", Body("ORD-C" + n), kCarol);
    slowest = std::max(slowest, Clock::now() - started);
    ++carol_statuses[r.status];
    if (r.status != 201)
      ADD_FAILURE() << "carol's payment " << i << ": " << r.status << " " << r.body;
  }
  EXPECT_EQ(carol_statuses[201], 20);
  // The property is the order, not a speed (a wall-clock bound failed under a sanitizer build
  // sharing two cores): all of carol's payments finished inside the provider's 10 s stall, while
  // every waiter was still parked.
  EXPECT_FALSE(first_done) << "carol's payments waited for the flood (the slowest took "
                           << std::chrono::duration_cast<milliseconds>(slowest).count() << " ms)";

  // Alice's first payment finishes; every waiter gets its answer replayed.
  first.join();
  EXPECT_EQ(first_answer.status, 201) << first_answer.body;
  std::map<int, int> waiter_statuses;
  for (auto& waiter : waiters) {
    const std::string answer = waiter->ReadResponse(milliseconds(10000));
    ++waiter_statuses[StatusOf(answer)];
  }
  EXPECT_EQ(waiter_statuses[201], kWaiters) << [&] {
    std::string statuses;
    for (auto [status, count] : waiter_statuses) {
      statuses += std::to_string(status) + ": " + std::to_string(count) + "; ";
    }
    return "waiters' statuses: " + statuses;
  }();
  EXPECT_EQ(TotalCharges(), 21);
}

}  // namespace
}  // namespace idem::itest
