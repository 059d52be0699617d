// http/async_test.cc — the coroutine seam: BlockingPool, WhileRunning, RunWithin, and the
// stepped EventLoop with its timer clock (the simulator's).
#include "http/async.h"

#include <gtest/gtest.h>

#include <atomic>
#include <fstream>
#include <string>
#include <thread>

#include "idem/thread_name.h"
#include "testing/fakes.h"

namespace idem::http {
namespace {

using std::chrono::milliseconds;

// The simulator's time for this thread's timers, set for one test and restored after it.
class SimulatedTime {
 public:
  SimulatedTime() { SetTimerClock(&clock); }
  ~SimulatedTime() { SetTimerClock(nullptr); }
  testing::FakeMonotonicClock clock;
};

// A coroutine spawned on an EventLoop outlives the statement that spawns it: what it uses comes
// in as parameters (a lambda's captures would die with the lambda).
Async<void> Sleep(milliseconds duration, bool& woke) {
  co_await SleepFor(duration);
  woke = true;
}

TEST(EventLoopTest, ATimerIsDueByTheTimerClockNotByRealTime) {
  SimulatedTime time;
  EventLoop loop;
  bool woke = false;
  loop.Spawn(Sleep(milliseconds(5000), woke));
  loop.RunReady();
  std::this_thread::sleep_for(milliseconds(20));
  loop.RunReady();
  EXPECT_FALSE(woke) << "woke by real time";
  time.clock.Advance(milliseconds(4999));
  loop.RunReady();
  EXPECT_FALSE(woke);
  time.clock.Advance(milliseconds(1));
  loop.RunReady();
  EXPECT_TRUE(woke);
}

Async<void> TickWhileSleeping(BlockingPool& pool, int& ticks, bool& ended) {
  bool woke = false;
  co_await WhileRunning(Sleep(milliseconds(1000), woke), milliseconds(300), pool,
                        [&ticks] { ++ticks; });
  ended = woke;
}

TEST(EventLoopTest, WhileRunningTicksInSimulatedTime) {
  SimulatedTime time;
  EventLoop loop;
  BlockingPool pool(BlockingPool::OnTheLoop{});
  int ticks = 0;
  bool ended = false;
  loop.Spawn(TickWhileSleeping(pool, ticks, ended));
  loop.RunReady();
  for (int i = 0; i < 10 && !ended; ++i) {
    time.clock.Advance(milliseconds(100));
    loop.RunReady();
  }
  EXPECT_TRUE(ended);
  EXPECT_EQ(ticks, 3);  // at 300, 600 and 900 ms
}

Async<void> Named(char name, BlockingPool& pool, std::string& order, std::thread::id& ran_on) {
  order += name;
  co_await pool.Run([&] {
    ran_on = std::this_thread::get_id();
    order += static_cast<char>(name - 'a' + 'A');
  });
  if (name == 'a') order += '.';  // after b's work too: a yielded after its own
}

// On the loop, a blocking call is a step: the calling coroutine yields, the others that are
// ready go first, and the work runs on the loop's thread.
TEST(EventLoopTest, APoolOnTheLoopYieldsBeforeEachCall) {
  EventLoop loop;
  BlockingPool pool(BlockingPool::OnTheLoop{});
  std::string order;
  std::thread::id ran_on;
  loop.Spawn(Named('a', pool, order, ran_on));
  loop.Spawn(Named('b', pool, order, ran_on));
  EXPECT_TRUE(loop.RunOne());
  EXPECT_EQ(order, "a");
  loop.RunReady();
  EXPECT_EQ(order, "abAB.");
  EXPECT_EQ(ran_on, std::this_thread::get_id());
  EXPECT_FALSE(loop.RunOne());
}

Async<void> HoldWhileSleeping(std::shared_ptr<int> held, bool& woke) {
  co_await Sleep(milliseconds(10), woke);
  woke = woke && *held == 1;
}

Async<void> Throw() {
  co_await SleepFor(milliseconds(0));
  throw std::runtime_error("a bug in a spawned coroutine");
}

// Nothing a spawned coroutine throws is swallowed: the step that ran it throws it.
TEST(EventLoopTest, WhatASpawnedCoroutineThrowsComesOutOfTheStep) {
  EventLoop loop;
  loop.Spawn(Throw());
  EXPECT_THROW(loop.RunReady(), std::runtime_error);
}

// A loop destroyed with a coroutine waiting destroys it, as a process that dies: it never
// resumes, and what it holds is released.
TEST(EventLoopTest, DestroyingTheLoopDestroysWhatWaits) {
  SimulatedTime time;
  auto held = std::make_shared<int>(1);
  bool woke = false;
  {
    EventLoop loop;
    loop.Spawn(HoldWhileSleeping(held, woke));
    loop.RunReady();
    EXPECT_EQ(held.use_count(), 2);
  }
  EXPECT_EQ(held.use_count(), 1);
  EXPECT_FALSE(woke);
}

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

// The name of the calling thread, as the kernel keeps it.
std::string ThreadName() {
  std::ifstream comm("/proc/thread-self/comm");
  std::string name;
  std::getline(comm, name);
  return name;
}

TEST(BlockingPoolTest, ItsThreadsBearItsNameForCallsAndPosts) {
  BlockingPool pool(1, "store-test");
  EXPECT_EQ(RunSync(pool.Call([] { return ThreadName(); })), "store-test");
  std::atomic<bool> done = false;
  std::string posted;
  pool.Post([&] {
    posted = ThreadName();
    done = true;
  });
  pool.Join();
  ASSERT_TRUE(done);
  EXPECT_EQ(posted, "store-test");
  EXPECT_NE(ThreadName(), "store-test");  // the caller's own name is left alone
}

TEST(NameThisThreadTest, CutsANameToTheFifteenBytesLinuxKeeps) {
  std::string seen;
  std::thread([&] {
    NameThisThread("a-name-longer-than-fifteen");
    seen = ThreadName();
  }).join();
  EXPECT_EQ(seen, "a-name-longer-t");
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
