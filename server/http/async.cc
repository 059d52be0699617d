// server/http/async.cc — BlockingPool over an Asio thread pool, and RunSync.
#include "server/http/async.h"

#include <boost/asio.hpp>
#include <exception>

namespace idem::http {

namespace net = boost::asio;

struct BlockingPool::Impl {
  explicit Impl(int threads) : pool(static_cast<std::size_t>(threads)) {}
  net::thread_pool pool;
};

BlockingPool::BlockingPool(int threads)
    : impl_(std::make_unique<Impl>(threads < 1 ? 1 : threads)), threads_(threads < 1 ? 1 : threads) {}

BlockingPool::~BlockingPool() { Join(); }

Async<void> BlockingPool::Run(std::function<void()> work) {
  // co_spawn onto the pool resumes this coroutine on its own executor once the work is done.
  co_await net::co_spawn(
      impl_->pool,
      [&]() -> Async<void> {
        work();
        co_return;
      },
      net::use_awaitable);
}

void BlockingPool::Post(std::function<void()> work) { net::post(impl_->pool, std::move(work)); }

void BlockingPool::Join() { impl_->pool.join(); }

void RunSyncVoid(Async<void> task) {
  net::io_context ioc;
  std::exception_ptr failure;
  net::co_spawn(ioc, std::move(task), [&](std::exception_ptr e) { failure = e; });
  ioc.run();
  if (failure) std::rethrow_exception(failure);
}

}  // namespace idem::http
