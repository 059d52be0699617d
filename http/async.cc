// http/async.cc — BlockingPool over an Asio thread pool, and RunSync.
#include "http/async.h"

#include <atomic>
#include <boost/asio.hpp>
#include <exception>

namespace idem::http {

namespace net = boost::asio;

struct BlockingPool::Impl {
  explicit Impl(int threads) : pool(static_cast<std::size_t>(threads)) {}
  net::thread_pool pool;
};

BlockingPool::BlockingPool(int threads)
    : impl_(std::make_unique<Impl>(threads < 1 ? 1 : threads)) {}

BlockingPool::~BlockingPool() { Join(); }

Async<void> BlockingPool::Run(std::function<void()> work) {
  // co_spawn onto the pool resumes this coroutine on its own executor once the work is done. The
  // work is not cancellable (it runs to its end anyway), so no cancellation slot is bound: a
  // cancellation of the caller would otherwise be forwarded to the pool from the caller's
  // executor and race with the spawned coroutine's end, which Asio 1.81 does not survive (a use
  // after free in co_spawn_cancellation_handler; WhileRunningTest).
  co_await net::co_spawn(
      impl_->pool,
      [&]() -> Async<void> {
        work();
        co_return;
      },
      net::bind_cancellation_slot(net::cancellation_slot(), net::use_awaitable));
}

Async<bool> BlockingPool::RunWithin(std::function<void()> work, std::chrono::milliseconds limit) {
  // The waiter polls a flag the work sets: nothing of the waiter (its timer, its executor) is
  // touched from the pool's thread, so the work may end after the waiter, or its event loop, is
  // gone.
  auto done = std::make_shared<std::atomic<bool>>(false);
  Post([done, work = std::move(work)] {
    work();
    *done = true;
  });
  const auto deadline = std::chrono::steady_clock::now() + limit;
  auto poll = std::chrono::milliseconds(1);
  while (!*done && std::chrono::steady_clock::now() < deadline) {
    co_await SleepFor(std::min(poll, std::chrono::ceil<std::chrono::milliseconds>(
                                         deadline - std::chrono::steady_clock::now())));
    poll = std::min(poll * 2, std::chrono::milliseconds(20));
  }
  co_return done->load();
}

void BlockingPool::Post(std::function<void()> work) { net::post(impl_->pool, std::move(work)); }

void BlockingPool::Join() { impl_->pool.join(); }

Async<void> SleepFor(std::chrono::milliseconds duration) {
  net::steady_timer timer(co_await net::this_coro::executor, duration);
  co_await timer.async_wait(net::as_tuple(net::use_awaitable));
}

namespace {

// What WhileRunning and its ticker share; touched only on their executor (one at a time).
struct Ticking {
  explicit Ticking(const net::any_io_executor& ex) : sleep(ex), finished(ex) {
    finished.expires_at(net::steady_timer::time_point::max());
  }
  net::steady_timer sleep;     // the ticker's wait for its next tick
  net::steady_timer finished;  // cancelled when the ticker has ended
  bool stop = false;
  bool ended = false;
};

Async<void> Ticker(std::shared_ptr<Ticking> t, std::chrono::milliseconds every, BlockingPool& pool,
                   std::function<void()> tick) {
  while (!t->stop) {
    t->sleep.expires_after(every);
    co_await t->sleep.async_wait(net::as_tuple(net::use_awaitable));
    if (t->stop) break;
    co_await pool.Run(tick);
  }
  t->ended = true;
  t->finished.cancel();
}

}  // namespace

// Plain flags and timers on one executor rather than Asio's awaitable operators, whose
// cancellation of the ticker (1.81) hung when the main task threw.
Async<void> WhileRunning(Async<void> main, std::chrono::milliseconds every, BlockingPool& pool,
                         std::function<void()> tick) {
  const net::any_io_executor ex = co_await net::this_coro::executor;
  auto ticking = std::make_shared<Ticking>(ex);
  net::co_spawn(ex, Ticker(ticking, every, pool, std::move(tick)), net::detached);
  std::exception_ptr failure;
  try {
    co_await std::move(main);
  } catch (...) {
    failure = std::current_exception();
  }
  ticking->stop = true;
  ticking->sleep.cancel();
  // A tick running on the pool ends first: nothing of `tick` runs after this returns.
  if (!ticking->ended) co_await ticking->finished.async_wait(net::as_tuple(net::use_awaitable));
  if (failure) std::rethrow_exception(failure);
}

void RunSyncVoid(Async<void> task) {
  net::io_context ioc;
  std::exception_ptr failure;
  net::co_spawn(ioc, std::move(task), [&](std::exception_ptr e) { failure = e; });
  ioc.run();
  if (failure) std::rethrow_exception(failure);
}

}  // namespace idem::http
