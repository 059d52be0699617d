// http/async.cc — BlockingPool over an Asio thread pool, and RunSync.
#include "http/async.h"

#include <atomic>
#include <boost/asio.hpp>
#include <exception>

#include "idem/thread_name.h"

namespace idem::http {

namespace net = boost::asio;

namespace {

thread_local const MonotonicClock* timer_clock = nullptr;

// steady_clock, or the thread's timer clock (SetTimerClock): what SleepFor's and WhileRunning's
// timers expire by. The names are the ones Asio's clock and wait traits requirements use.
// NOLINTBEGIN(readability-identifier-naming)
struct TimerClock {
  using duration = std::chrono::steady_clock::duration;
  using rep = duration::rep;
  using period = duration::period;
  using time_point = std::chrono::steady_clock::time_point;
  static time_point now() {
    return timer_clock != nullptr ? timer_clock->Now() : std::chrono::steady_clock::now();
  }
};
// How long the reactor waits in real time for a timer: as long as it has to go, or, on the
// timer clock, no time at all, so that every run of the loop looks at its timers by that clock.
struct TimerWaitTraits {
  static TimerClock::duration to_wait_duration(const TimerClock::duration& d) {
    return timer_clock != nullptr ? TimerClock::duration::zero() : d;
  }
  static TimerClock::duration to_wait_duration(const TimerClock::time_point& t) {
    return net::wait_traits<TimerClock>::to_wait_duration(timer_clock != nullptr ? TimerClock::now()
                                                                                 : t);
  }
};
// NOLINTEND(readability-identifier-naming)
using Timer = net::basic_waitable_timer<TimerClock, TimerWaitTraits>;

}  // namespace

void SetTimerClock(const MonotonicClock* clock) { timer_clock = clock; }

struct BlockingPool::Impl {
  Impl(int threads, std::string thread_name)
      : pool(std::in_place, static_cast<std::size_t>(threads)), name(std::move(thread_name)) {}
  Impl() = default;
  // On a pool thread, before its work: names the thread the first time. A thread of a
  // net::thread_pool serves that pool alone.
  void Named() const {
    thread_local bool named = false;
    if (!named) NameThisThread(name);
    named = true;
  }
  std::optional<net::thread_pool> pool;  // none: on the loop
  std::string name;
  std::atomic<uint64_t> given{0};
};

BlockingPool::BlockingPool(int threads, std::string name)
    : impl_(std::make_unique<Impl>(threads < 1 ? 1 : threads, std::move(name))) {}

BlockingPool::BlockingPool(OnTheLoop) : impl_(std::make_unique<Impl>()) {}

BlockingPool::~BlockingPool() { Join(); }

Async<void> BlockingPool::Run(std::function<void()> work) {
  impl_->given.fetch_add(1, std::memory_order_relaxed);
  if (!impl_->pool) {
    // As from a pool thread: the caller hops away before the work and back after it.
    const net::any_io_executor ex = co_await net::this_coro::executor;
    co_await net::post(ex, net::use_awaitable);
    work();
    co_await net::post(ex, net::use_awaitable);
    co_return;
  }
  // co_spawn onto the pool resumes this coroutine on its own executor once the work is done. The
  // work is not cancellable (it runs to its end anyway), so no cancellation slot is bound: a
  // cancellation of the caller would otherwise be forwarded to the pool from the caller's
  // executor and race with the spawned coroutine's end, which Asio 1.81 does not survive (a use
  // after free in co_spawn_cancellation_handler; WhileRunningTest).
  co_await net::co_spawn(
      *impl_->pool,
      [&]() -> Async<void> {
        impl_->Named();
        work();
        co_return;
      },
      net::bind_cancellation_slot(net::cancellation_slot(), net::use_awaitable));
}

Async<bool> BlockingPool::RunWithin(std::function<void()> work, std::chrono::milliseconds limit) {
  if (!impl_->pool) {
    co_await Run(std::move(work));  // counted there
    co_return true;
  }
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

void BlockingPool::Post(std::function<void()> work) {
  impl_->given.fetch_add(1, std::memory_order_relaxed);
  if (!impl_->pool) {
    work();
    return;
  }
  net::post(*impl_->pool, [impl = impl_.get(), work = std::move(work)] {
    impl->Named();
    work();
  });
}

uint64_t BlockingPool::Given() const { return impl_->given.load(std::memory_order_relaxed); }

void BlockingPool::Join() {
  if (impl_->pool) impl_->pool->join();
}

Async<void> SleepFor(std::chrono::milliseconds duration) {
  Timer timer(co_await net::this_coro::executor, duration);
  co_await timer.async_wait(net::as_tuple(net::use_awaitable));
}

namespace {

// What WhileRunning and its ticker share; touched only on their executor (one at a time).
struct Ticking {
  explicit Ticking(const net::any_io_executor& ex) : sleep(ex), finished(ex) {
    finished.expires_at(Timer::time_point::max());
  }
  Timer sleep;     // the ticker's wait for its next tick
  Timer finished;  // cancelled when the ticker has ended
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

struct EventLoop::Impl {
  net::io_context ioc{1};
};

EventLoop::EventLoop() : impl_(std::make_unique<Impl>()) {}

EventLoop::~EventLoop() = default;

void EventLoop::Spawn(Async<void> task) {
  net::co_spawn(impl_->ioc, std::move(task), [](std::exception_ptr e) {
    if (e) std::rethrow_exception(e);
  });
}

bool EventLoop::RunOne() {
  if (impl_->ioc.stopped()) impl_->ioc.restart();
  return impl_->ioc.poll_one() > 0;
}

std::size_t EventLoop::RunReady() {
  if (impl_->ioc.stopped()) impl_->ioc.restart();
  return impl_->ioc.poll();
}

}  // namespace idem::http
