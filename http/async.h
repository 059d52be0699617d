// http/async.h — the one seam between coroutines on the I/O threads and blocking work.
//
// Handlers run as coroutines (Async<T>) on the server's I/O threads, so a request that waits — for
// a provider, for another request — holds memory, not a thread. The store API is synchronous, so
// every store call runs on one BlockingPool, sized to the database pool; the coroutine resumes on
// its own executor afterwards. Only this header's Asio piece (awaitable) reaches the files that
// write coroutines; the rest of Asio stays in the server and client sources.
#pragma once

#include <boost/asio/awaitable.hpp>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>

#include "idem/clock.h"

namespace idem::http {

template <class T>
using Async = boost::asio::awaitable<T>;

// A fixed set of threads for blocking calls (the store). Thread-safe.
class BlockingPool {
 public:
  // Its threads are named `name` (idem/thread_name.h) as they first run work.
  explicit BlockingPool(int threads, std::string name = "blocking");
  // No threads: Run and Call yield to the calling coroutine's event loop (any other ready
  // coroutine goes first), run the work on that loop's thread, and yield again before the
  // caller goes on, as a hop to a pool thread and back does; Post runs it at once;
  // RunWithin runs it and answers true. For a caller that steps one event loop itself (the
  // simulator, EventLoop): every blocking call is a step of its schedule.
  struct OnTheLoop {};
  explicit BlockingPool(OnTheLoop);
  ~BlockingPool();  // Join()
  BlockingPool(const BlockingPool&) = delete;
  BlockingPool& operator=(const BlockingPool&) = delete;

  // Runs `work` on a pool thread, then resumes the calling coroutine on its own executor. An
  // exception thrown by `work` is rethrown in the caller.
  Async<void> Run(std::function<void()> work);

  // Run, returning what `work` returns.
  template <class F>
  Async<std::invoke_result_t<F&>> Call(F work) {
    std::optional<std::invoke_result_t<F&>> out;
    co_await Run([&] { out.emplace(work()); });
    co_return std::move(*out);
  }

  // Runs `work` on a pool thread and waits for it at most `limit` (polling, at most 20 ms late):
  // true if it ended in time, false if not (it runs on to its end, so it must own or outlive
  // what it uses).
  Async<bool> RunWithin(std::function<void()> work, std::chrono::milliseconds limit);

  // Runs `work` on a pool thread later, detached (not awaited).
  void Post(std::function<void()> work);

  // Waits for queued work to finish and stops the threads. Idempotent.
  void Join();

  // How many pieces of work Run, Call, RunWithin and Post have been given so far (counted
  // before each is queued).
  uint64_t Given() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Resumes the calling coroutine after `duration`, on its own executor; holds no thread meanwhile.
// Timed by steady_clock, or by the timer clock of the thread that runs the event loop.
Async<void> SleepFor(std::chrono::milliseconds duration);

// The clock SleepFor's and WhileRunning's timers expire by on this thread's event loops, from
// now on; nullptr: steady_clock again. For the simulator, whose loops (EventLoop) run on one
// thread in simulated time: `clock` must outlive the loops that use it.
void SetTimerClock(const MonotonicClock* clock);

// An event loop its caller steps (the simulator): coroutines spawned on it run only inside
// RunOne and RunReady, on the calling thread, in the order they became ready; timers are due by
// the thread's timer clock. Destroying it destroys the coroutines that have not finished, as a
// process that dies leaves them. Not thread-safe.
class EventLoop {
 public:
  EventLoop();
  ~EventLoop();
  EventLoop(const EventLoop&) = delete;
  EventLoop& operator=(const EventLoop&) = delete;

  // Starts `task` at the next step. What it throws comes out of the RunOne or RunReady that ran
  // it.
  void Spawn(Async<void> task);
  // Runs one handler that is ready (a coroutine that can go on, a timer that is due): whether
  // there was one.
  bool RunOne();
  // Runs handlers until none is ready; how many ran.
  std::size_t RunReady();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Awaits `main`; meanwhile, every `every`, runs `tick` on `pool`. Returns (or rethrows what `main`
// throws) once `main` has ended and no tick is running: nothing of `tick` runs afterwards.
Async<void> WhileRunning(Async<void> main, std::chrono::milliseconds every, BlockingPool& pool,
                         std::function<void()> tick);

// Runs `task` to completion on a private event loop in the calling thread and returns its result
// (tests and tools that call a coroutine from plain code). Rethrows what the task throws.
void RunSyncVoid(Async<void> task);
inline void RunSync(Async<void> task) { RunSyncVoid(std::move(task)); }
template <class T>
T RunSync(Async<T> task) {
  std::optional<T> out;
  RunSyncVoid([](Async<T> t, std::optional<T>& o) -> Async<void> {
    o.emplace(co_await std::move(t));
  }(std::move(task), out));
  return std::move(*out);
}

}  // namespace idem::http
