// src/store/pool.h — a bounded pool of connections, shared by the SQL backends and the Redis
// cache. Internal to the store targets.
#pragma once

#include <algorithm>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "idem/mutex.h"
#include "idem/store.h"

namespace idem::store_internal {

// A bounded pool of connections of type Conn. Thread-safe. A connection released as broken is
// destroyed; a new one is made (by `factory`) when one is next needed.
template <typename Conn>
class Pool {
 public:
  using Factory = std::function<Result<std::unique_ptr<Conn>>()>;

  // `conns` are ready; `lazy` more are made by `factory` when first needed.
  Pool(std::string name, std::vector<std::unique_ptr<Conn>> conns, Factory factory = {},
       int lazy = 0)
      : name_(std::move(name)),
        missing_(lazy),
        idle_(std::move(conns)),
        factory_(std::move(factory)) {}

  // Errors: kUnavailable when none is free within `wait`, or a new one cannot be made.
  Result<Conn*> Acquire(Millis wait) {
    MutexLock lock(mu_);
    if (!cv_.WaitFor(mu_, wait,
                     [&]() IDEM_REQUIRES(mu_) { return !idle_.empty() || missing_ > 0; })) {
      return MakeError(Errc::kUnavailable, name_ + ": no free connection within " +
                                               std::to_string(wait.count()) + " ms");
    }
    if (!idle_.empty()) {
      Conn* c = idle_.back().release();
      idle_.pop_back();
      return c;
    }
    // Replace a connection that broke earlier.
    --missing_;
    lock.Unlock();
    auto fresh = factory_ ? factory_()
                          : Result<std::unique_ptr<Conn>>(
                                MakeError(Errc::kUnavailable, name_ + ": connection lost"));
    if (!fresh) {
      MutexLock relock(mu_);
      ++missing_;
      cv_.NotifyOne();
      return std::move(fresh).error();
    }
    return fresh->release();
  }

  void Release(Conn* conn, bool broken) {
    {
      MutexLock lock(mu_);
      if (broken) {
        delete conn;
        ++missing_;
      } else {
        idle_.emplace_back(conn);
      }
    }
    cv_.NotifyOne();
  }

 private:
  std::string name_;
  int missing_ IDEM_GUARDED_BY(mu_) = 0;
  Mutex mu_;
  CondVar cv_;
  std::vector<std::unique_ptr<Conn>> idle_ IDEM_GUARDED_BY(mu_);
  Factory factory_;
};

// A connection lent by a Pool, returned at scope exit (destroyed if marked broken).
template <typename Conn>
class Lent {
 public:
  Lent(Pool<Conn>& pool, Conn* conn) : pool_(&pool), conn_(conn) {}
  Lent(Lent&& o) noexcept : pool_(o.pool_), conn_(std::exchange(o.conn_, nullptr)) {}
  Lent(const Lent&) = delete;
  Lent& operator=(const Lent&) = delete;
  ~Lent() {
    if (conn_ != nullptr) pool_->Release(conn_, conn_->Broken());
  }
  // Gives this connection back (destroyed if broken) and borrows another from the same pool.
  // Errors: as Pool::Acquire; the Lent then holds none, and only its destruction is left.
  Status Replace(Millis wait) {
    Conn* gone = std::exchange(conn_, nullptr);
    pool_->Release(gone, gone->Broken());
    IDEM_ASSIGN_OR_RETURN(conn_, pool_->Acquire(wait));
    return Ok();
  }

  // Whether it holds a connection (always, unless Replace failed).
  explicit operator bool() const { return conn_ != nullptr; }
  Conn& operator*() const { return *conn_; }
  Conn* operator->() const { return conn_; }

 private:
  Pool<Conn>* pool_;
  Conn* conn_;
};

template <typename Conn>
Result<Lent<Conn>> Borrow(Pool<Conn>& pool, Millis wait) {
  IDEM_ASSIGN_OR_RETURN(Conn * c, pool.Acquire(wait));
  return Lent<Conn>(pool, c);
}

}  // namespace idem::store_internal
