// src/store/common.h — pieces every SQL backend shares: a bounded connection pool, the record
// columns and their mapping from rows. Internal to the store targets.
#pragma once

#include <algorithm>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "include/idem/record.h"
#include "include/idem/store.h"

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
    std::unique_lock lock(mu_);
    if (!cv_.wait_for(lock, wait, [&] { return !idle_.empty() || missing_ > 0; })) {
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
    lock.unlock();
    auto fresh = factory_ ? factory_()
                          : Result<std::unique_ptr<Conn>>(
                                MakeError(Errc::kUnavailable, name_ + ": connection lost"));
    if (!fresh) {
      std::lock_guard relock(mu_);
      ++missing_;
      cv_.notify_one();
      return std::move(fresh).error();
    }
    return fresh->release();
  }

  void Release(Conn* conn, bool broken) {
    {
      std::lock_guard lock(mu_);
      if (broken) {
        delete conn;
        ++missing_;
      } else {
        idle_.emplace_back(conn);
      }
    }
    cv_.notify_one();
  }

 private:
  std::string name_;
  int missing_ = 0;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::unique_ptr<Conn>> idle_;
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
    if (conn_ != nullptr) pool_->Release(conn_, conn_->broken());
  }
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

// The records table's columns, in the order RecordFromRow reads them.
inline constexpr std::string_view kRecordColumns =
    "scope_hash, tenant, user_id, route, request_hash, fp_version, secret_id, state, "
    "recovery_point, resource_id, status_code, response, owner_token, fence, lease_until, "
    "created_at, updated_at, expires_at";

// Errors: kDataLoss for a row that is not a record.
Result<Record> RecordFromRow(const SqlRow& row);

// The one integer a query like "SELECT count(*)" returns. Errors: kDataLoss for anything else.
Result<int64_t> SingleInteger(const std::vector<SqlRow>& rows, const char* what);

inline Blob BytesOf(const uint8_t* data, std::size_t size) {
  return Blob{std::string(reinterpret_cast<const char*>(data), size)};
}
template <std::size_t N>
Blob BytesOf(const std::array<uint8_t, N>& a) {
  return BytesOf(a.data(), N);
}

// A fresh PROCESSING record for `spec` at `now` with `fence` and a new owner token.
Record NewRecord(const ClaimSpec& spec, Timestamp now, int64_t fence, Random& random);

// Applies the migrations of `component` newer than `current`, in order: `run_sql` executes one
// migration's statements, `record` writes its row in the schema table. Errors: kDataLoss when
// `current` is newer than every migration this build knows; kInvalidArgument naming a migration
// the database rejects.
Status ApplyMigrations(std::string_view component, const std::vector<Migration>& migrations,
                       int64_t current, const std::function<Status(const std::string&)>& run_sql,
                       const std::function<Status(int)>& record);

// What Reclaim returns, from the rows its conditional updates changed and the record as it is
// now: the record when one changed; kNotFound when it is gone; kConflict when it moved on.
Result<Record> ReclaimResult(int changed, std::optional<Record> current);

inline Error Fenced(const char* op) {
  return MakeError(Errc::kFenced,
                   std::string(op) + ": lease lost (owner token or fence no longer match)");
}

}  // namespace idem::store_internal
