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
#include <functional>
#include <memory>
#include <optional>
#include <type_traits>
#include <utility>

namespace idem::http {

template <class T>
using Async = boost::asio::awaitable<T>;

// A fixed set of threads for blocking calls (the store). Thread-safe.
class BlockingPool {
 public:
  explicit BlockingPool(int threads);
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

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Resumes the calling coroutine after `duration`, on its own executor; holds no thread meanwhile.
Async<void> SleepFor(std::chrono::milliseconds duration);

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
