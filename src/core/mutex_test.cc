// src/core/mutex_test.cc — idem::Mutex, MutexLock and CondVar hold and give up the mutex as
// std::mutex, std::unique_lock and std::condition_variable do.
#include "idem/mutex.h"

#include <gtest/gtest.h>

#include <chrono>
#include <stdexcept>
#include <thread>

namespace idem {
namespace {

// Whether another thread finds `mu` free.
bool FreeElsewhere(Mutex& mu) {
  bool free = false;
  std::thread([&] {
    if (mu.TryLock()) {
      free = true;
      mu.Unlock();
    }
  }).join();
  return free;
}

TEST(MutexTest, MutexLockHoldsForItsScopeAndCanStepOut) {
  Mutex mu;
  {
    MutexLock lock(mu);
    EXPECT_FALSE(FreeElsewhere(mu));
    lock.Unlock();
    EXPECT_TRUE(FreeElsewhere(mu));
    lock.Lock();
    EXPECT_FALSE(FreeElsewhere(mu));
  }
  EXPECT_TRUE(FreeElsewhere(mu));
  {
    MutexLock lock(mu);
    lock.Unlock();  // left unlocked: the destructor does not unlock again
  }
  EXPECT_TRUE(FreeElsewhere(mu));
}

TEST(MutexTest, AWaitReturnsWithTheMutexHeld) {
  Mutex mu;
  CondVar changed;
  bool ready = false;
  std::thread setter([&] {
    MutexLock lock(mu);
    ready = true;
    changed.NotifyAll();
  });
  {
    MutexLock lock(mu);
    changed.Wait(mu, [&] { return ready; });
    EXPECT_FALSE(FreeElsewhere(mu));
    EXPECT_FALSE(changed.WaitFor(mu, std::chrono::milliseconds(1), [] { return false; }));
    EXPECT_FALSE(FreeElsewhere(mu));
    EXPECT_TRUE(changed.WaitUntil(mu, std::chrono::steady_clock::now(), [] { return true; }));
    EXPECT_FALSE(FreeElsewhere(mu));
  }
  setter.join();
  EXPECT_TRUE(FreeElsewhere(mu));
}

TEST(MutexTest, APredicateThatThrowsLeavesTheMutexHeld) {
  Mutex mu;
  CondVar changed;
  {
    MutexLock lock(mu);
    EXPECT_THROW(changed.Wait(mu, []() -> bool { throw std::runtime_error("predicate"); }),
                 std::runtime_error);
    EXPECT_FALSE(FreeElsewhere(mu));
  }
  EXPECT_TRUE(FreeElsewhere(mu));
}

TEST(MutexTest, SharedMutexAdmitsReadersTogetherAndOneWriter) {
  SharedMutex mu;
  {
    ReaderMutexLock reading(mu);
    bool read_too = false;
    std::thread([&] {
      ReaderMutexLock also(mu);
      read_too = true;
    }).join();
    EXPECT_TRUE(read_too);
  }
  WriterMutexLock writing(mu);
}

}  // namespace
}  // namespace idem
