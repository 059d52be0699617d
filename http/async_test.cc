// http/async_test.cc — the coroutine seam: BlockingPool, WhileRunning, RunWithin.
#include "http/async.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>

namespace idem::http {
namespace {

using std::chrono::milliseconds;

TEST(BlockingPoolTest, CallRunsOnAPoolThreadAndResumesTheCaller) {
  BlockingPool pool(2);
  const std::thread::id caller = std::this_thread::get_id();
  std::thread::id ran_on;
  const int answer = RunSync([&]() -> Async<int> {
    co_return co_await pool.Call([&] {
      ran_on = std::this_thread::get_id();
      return 42;
    });
  }());
  EXPECT_EQ(answer, 42);
  EXPECT_NE(ran_on, caller);
}

// The main task ends while a tick runs on the pool, hundreds of times: WhileRunning returns only
// after that tick, and nothing of it runs afterwards. (Before the ticks' pool calls were made
// uncancellable, the cancellation that ends the ticker was forwarded to the pool and crashed when
// it arrived after the tick's end.)
TEST(WhileRunningTest, EndsAfterARunningTickAndNoTickRunsAfterIt) {
  BlockingPool pool(2);
  std::atomic<int> ticks{0};
  std::atomic<bool> ticking{false};
  for (int i = 0; i < 300; ++i) {
    std::atomic<bool> ended{false};
    RunSync([&]() -> Async<void> {
      co_await WhileRunning(SleepFor(milliseconds(2)), milliseconds(1), pool, [&] {
        ticking = true;
        EXPECT_FALSE(ended) << "a tick ran after WhileRunning returned";
        std::this_thread::sleep_for(milliseconds(1));
        ++ticks;
        ticking = false;
      });
      EXPECT_FALSE(ticking) << "WhileRunning returned while a tick ran";
      ended = true;
    }());
  }
  EXPECT_GT(ticks, 0);
}

TEST(WhileRunningTest, PassesOnWhatTheMainTaskThrows) {
  BlockingPool pool(1);
  EXPECT_THROW(RunSync([&]() -> Async<void> {
                 co_await WhileRunning(
                     []() -> Async<void> {
                       co_await SleepFor(milliseconds(1));
                       throw std::runtime_error("main failed");
                     }(),
                     milliseconds(50), pool, [] {});
               }()),
               std::runtime_error);
}

// RunWithin gives up waiting at its limit while the work runs on, and the work may end after
// the waiter and its event loop are gone.
TEST(RunWithinTest, GivesUpAtTheLimitAndTheWorkMayOutliveTheWaiter) {
  BlockingPool pool(1);
  auto finished = std::make_shared<std::atomic<bool>>(false);
  const bool in_time = RunSync(pool.RunWithin(
      [finished] {
        std::this_thread::sleep_for(milliseconds(300));
        *finished = true;
      },
      milliseconds(50)));
  EXPECT_FALSE(in_time);
  EXPECT_FALSE(*finished);
  pool.Join();  // the work ends after RunSync's loop is gone
  EXPECT_TRUE(*finished);

  BlockingPool fast(1);
  EXPECT_TRUE(RunSync(fast.RunWithin([] {}, milliseconds(5000))));
}

}  // namespace
}  // namespace idem::http
