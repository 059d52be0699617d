// include/idem/mutex.h — std::mutex and std::shared_mutex as capabilities clang's thread-safety
// analysis knows (idem/thread_annotations.h), with their scoped locks and a condition variable.
//
// Every mutex of the tree is one of these, so that -Wthread-safety (scripts/lint) checks what it
// guards:
//
//   mutable Mutex mu_;
//   int count_ IDEM_GUARDED_BY(mu_) = 0;
//   void BumpLocked() IDEM_REQUIRES(mu_) { ++count_; }
//   ...
//   MutexLock lock(mu_);
//   ready_.Wait(mu_, [&]() IDEM_REQUIRES(mu_) { return count_ > 0; });
//
// A predicate is checked as a function of its own, so it says that it runs with the mutex held.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <shared_mutex>
#include <utility>

#include "idem/thread_annotations.h"

namespace idem {

// A std::mutex. Constant-initialised, so a global one is safe to use from any static initialiser.
class IDEM_CAPABILITY("mutex") Mutex {
 public:
  constexpr Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void Lock() IDEM_ACQUIRE() { mu_.lock(); }
  void Unlock() IDEM_RELEASE() { mu_.unlock(); }
  bool TryLock() IDEM_TRY_ACQUIRE(true) { return mu_.try_lock(); }

  // BasicLockable, for std::condition_variable_any, which unlocks and relocks it while it waits.
  void lock() IDEM_ACQUIRE() { mu_.lock(); }      // NOLINT(readability-identifier-naming)
  void unlock() IDEM_RELEASE() { mu_.unlock(); }  // NOLINT(readability-identifier-naming)

 private:
  friend class CondVar;
  std::mutex mu_;
};

// Holds a Mutex from construction to destruction, as std::unique_lock does: Unlock and Lock again
// leave it for a stretch of the scope.
class IDEM_SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex& mu) IDEM_ACQUIRE(mu) : mu_(mu) { mu_.Lock(); }
  ~MutexLock() IDEM_RELEASE() {
    if (held_) mu_.Unlock();
  }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

  void Unlock() IDEM_RELEASE() {
    mu_.Unlock();
    held_ = false;
  }
  void Lock() IDEM_ACQUIRE() {
    mu_.Lock();
    held_ = true;
  }

 private:
  Mutex& mu_;
  bool held_ = true;
};

// A std::condition_variable waited on with a Mutex the caller holds (through a MutexLock). Only
// waits with a predicate: a wake-up proves nothing by itself. The mutex is held again when a wait
// returns, however it returns.
class CondVar {
 public:
  void NotifyOne() noexcept { cv_.notify_one(); }
  void NotifyAll() noexcept { cv_.notify_all(); }

  template <typename Predicate>
  void Wait(Mutex& mu, Predicate done) IDEM_REQUIRES(mu) {
    Lent lent(mu);
    cv_.wait(lent.lock, std::move(done));
  }
  // False when `done` is still false at the timeout.
  template <typename Rep, typename Period, typename Predicate>
  bool WaitFor(Mutex& mu, const std::chrono::duration<Rep, Period>& timeout, Predicate done)
      IDEM_REQUIRES(mu) {
    Lent lent(mu);
    return cv_.wait_for(lent.lock, timeout, std::move(done));
  }
  template <typename Clock, typename Duration, typename Predicate>
  bool WaitUntil(Mutex& mu, const std::chrono::time_point<Clock, Duration>& deadline,
                 Predicate done) IDEM_REQUIRES(mu) {
    Lent lent(mu);
    return cv_.wait_until(lent.lock, deadline, std::move(done));
  }

 private:
  // The caller's hold on the mutex, lent to std::condition_variable for one wait and handed back
  // (still locked) when the wait ends, by a return or an exception from the predicate.
  struct Lent {
    explicit Lent(Mutex& mu) : lock(mu.mu_, std::adopt_lock) {}
    ~Lent() { (void)lock.release(); }
    Lent(const Lent&) = delete;
    Lent& operator=(const Lent&) = delete;
    std::unique_lock<std::mutex> lock;
  };

  std::condition_variable cv_;
};

// A std::shared_mutex: one writer, or any number of readers.
class IDEM_CAPABILITY("mutex") SharedMutex {
 public:
  SharedMutex() = default;
  SharedMutex(const SharedMutex&) = delete;
  SharedMutex& operator=(const SharedMutex&) = delete;

  void Lock() IDEM_ACQUIRE() { mu_.lock(); }
  void Unlock() IDEM_RELEASE() { mu_.unlock(); }
  void LockShared() IDEM_ACQUIRE_SHARED() { mu_.lock_shared(); }
  void UnlockShared() IDEM_RELEASE_SHARED() { mu_.unlock_shared(); }

 private:
  std::shared_mutex mu_;
};

// Holds a SharedMutex exclusively for its scope.
class IDEM_SCOPED_CAPABILITY WriterMutexLock {
 public:
  explicit WriterMutexLock(SharedMutex& mu) IDEM_ACQUIRE(mu) : mu_(mu) { mu_.Lock(); }
  ~WriterMutexLock() IDEM_RELEASE() { mu_.Unlock(); }
  WriterMutexLock(const WriterMutexLock&) = delete;
  WriterMutexLock& operator=(const WriterMutexLock&) = delete;

 private:
  SharedMutex& mu_;
};

// Holds a SharedMutex shared for its scope.
class IDEM_SCOPED_CAPABILITY ReaderMutexLock {
 public:
  explicit ReaderMutexLock(SharedMutex& mu) IDEM_ACQUIRE_SHARED(mu) : mu_(mu) { mu_.LockShared(); }
  ~ReaderMutexLock() IDEM_RELEASE() { mu_.UnlockShared(); }
  ReaderMutexLock(const ReaderMutexLock&) = delete;
  ReaderMutexLock& operator=(const ReaderMutexLock&) = delete;

 private:
  SharedMutex& mu_;
};

}  // namespace idem
