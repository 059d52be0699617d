// testing/memory_store.cc — the in-memory reference model of the records (see memory_store.h).
//
// Each operation below names the statement of src/store/sql.cc it mirrors; a change to one must
// change the other (memory_store_test.cc runs both on the same operations and compares).
#include "testing/memory_store.h"

#include <algorithm>
#include <functional>
#include <map>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "idem/limits.h"
#include "idem/mutex.h"

namespace idem::testing {
namespace {

// The write lock: one write transaction (or sweep) at a time, like SQLite's. Any thread may
// release it, since a transaction may be dropped on another thread than the one that began it.
class WriteLock {
 public:
  bool TryLockFor(Millis wait) {
    MutexLock lock(mu_);
    if (!cv_.WaitFor(mu_, wait, [&]() IDEM_REQUIRES(mu_) { return !held_; })) return false;
    held_ = true;
    return true;
  }
  void Unlock() {
    {
      MutexLock lock(mu_);
      held_ = false;
    }
    cv_.NotifyOne();
  }

 private:
  Mutex mu_;
  CondVar cv_;
  bool held_ IDEM_GUARDED_BY(mu_) = false;
};

constexpr const char* kNoSql = "the memory store runs no SQL";

Error Fenced(const char* op) {
  return MakeError(Errc::kFenced,
                   std::string(op) + ": lease lost (owner token or fence no longer match)");
}

// A copy as read at `now`.
Record Observed(Record r, Timestamp now) {
  r.observed_at = now;
  return r;
}

// The WHERE of every fenced statement: owner_token = ? AND fence = ? AND state = 'PROCESSING'.
bool Holds(const Record& r, const Lease& lease) {
  return r.lease.owner == lease.owner && r.lease.fence == lease.fence &&
         r.state == RecordState::kProcessing;
}

// SQLite's LIMIT: a negative limit is none.
std::size_t Bounded(std::size_t n, int64_t limit) {
  if (limit < 0) return n;
  return std::min<std::size_t>(n, static_cast<std::size_t>(limit));
}

}  // namespace

struct MemoryData {
  explicit MemoryData(Millis wait) : lock_wait(wait) {}

  const Millis lock_wait;
  WriteLock write_lock;  // held by the open write transaction, or a sweep
  mutable SharedMutex mu;
  // Committed; observed_at is set on the way out.
  std::map<ScopeHash, Record> records IDEM_GUARDED_BY(mu);
};

Status CheckTransition(const std::optional<Record>& before, const Record& after, Timestamp now) {
  if (before ? IsLegalTransition(*before, after.state, now)
             : after.state == RecordState::kProcessing) {
    return Ok();
  }
  std::string from = "no record";
  if (before) {
    from = std::string(RecordStateName(before->state)) + " at point '" + before->recovery_point +
           "'" + (before->expires_at <= now ? ", expired," : "");
  }
  return MakeError(Errc::kInternal, "memory store: an illegal transition from " + from + " to " +
                                        std::string(RecordStateName(after.state)) + " was refused");
}

std::shared_ptr<MemoryData> NewMemoryData(Millis lock_wait) {
  return std::make_shared<MemoryData>(lock_wait);
}

namespace {

// One write transaction: holds the write lock from Begin until Commit or destruction, and keeps
// its writes in an overlay until Commit applies them.
class MemoryTxn final : public StoreTxn {
 public:
  // The caller has taken data->write_lock for this transaction.
  MemoryTxn(std::shared_ptr<MemoryData> data, Clock& clock, Random& random)
      : data_(std::move(data)), clock_(clock), random_(random) {}
  ~MemoryTxn() override {
    if (!ended_) data_->write_lock.Unlock();  // rolled back: the overlay is dropped
  }
  MemoryTxn(const MemoryTxn&) = delete;
  MemoryTxn& operator=(const MemoryTxn&) = delete;

  // claim: INSERT ... ON CONFLICT (scope_hash) DO NOTHING RETURNING ...; on a conflict, get.
  Result<ClaimResult> Claim(const ClaimSpec& spec) override {
    IDEM_RETURN_IF_ERROR(Open());
    OwnerToken owner;
    random_.Fill(owner);
    const Timestamp now = clock_.Now();
    if (std::optional<Record> existing = Current(spec.scope)) {
      return ClaimResult{false, Observed(std::move(*existing), now)};
    }
    Record r;
    r.scope = spec.scope;
    r.tenant = spec.tenant;
    r.user = spec.user;
    r.route = spec.route;
    r.fingerprint = spec.fingerprint;
    r.state = RecordState::kProcessing;
    r.lease = Lease{owner, 1, now + spec.lease_ttl};
    r.created_at = now;
    r.updated_at = now;
    r.expires_at = now + spec.retention;
    r.sent_at = Timestamp{};
    IDEM_RETURN_IF_ERROR(Put(r, now));
    return ClaimResult{true, Observed(std::move(r), now)};
  }

  // reclaim_fresh, else reclaim_resume, then get.
  Result<Record> Reclaim(const ClaimSpec& spec, int64_t seen_fence) override {
    IDEM_RETURN_IF_ERROR(Open());
    OwnerToken owner;
    random_.Fill(owner);
    const int64_t fence = seen_fence + 1;
    const Timestamp now = clock_.Now();
    std::optional<Record> current = Current(spec.scope);
    if (!current) return MakeError(Errc::kNotFound, "reclaim: record is gone");
    Record& r = *current;
    bool changed = false;
    if (r.lease.fence == seen_fence && r.expires_at <= now && r.state != RecordState::kProcessing) {
      // reclaim_fresh: a new operation, every column from the spec.
      r.tenant = spec.tenant;
      r.user = spec.user;
      r.route = spec.route;
      r.fingerprint = spec.fingerprint;
      r.state = RecordState::kProcessing;
      r.recovery_point.clear();
      r.resource_id.clear();
      r.status_code = 0;
      r.response.clear();
      r.lease = Lease{owner, fence, now + spec.lease_ttl};
      r.created_at = now;
      r.updated_at = now;
      r.expires_at = now + spec.retention;
      r.sent_at = Timestamp{};
      changed = true;
    } else if (r.lease.fence == seen_fence &&
               (r.state == RecordState::kFailedRetryable ||
                (r.state == RecordState::kProcessing && r.lease.until < now))) {
      // reclaim_resume: the same operation, kept at least a full retention from now.
      r.state = RecordState::kProcessing;
      r.lease = Lease{owner, fence, now + spec.lease_ttl};
      r.updated_at = now;
      if (r.expires_at < now + spec.retention) r.expires_at = now + spec.retention;
      changed = true;
    }
    if (!changed) {
      return MakeError(Errc::kConflict, "reclaim: record moved on (fence " +
                                            std::to_string(r.lease.fence) + ", state " +
                                            std::string(RecordStateName(r.state)) + ")");
    }
    IDEM_RETURN_IF_ERROR(Put(r, now));
    return Observed(std::move(r), now);
  }

  // renew: UPDATE ... SET lease_until = now + ttl, updated_at = now ... RETURNING lease_until.
  Result<Lease> Renew(const ScopeHash& scope, const Lease& lease, Millis ttl) override {
    IDEM_RETURN_IF_ERROR(Open());
    const Timestamp now = clock_.Now();
    std::optional<Record> current = Current(scope);
    if (!current || !Holds(*current, lease)) return Fenced("renew");
    current->lease.until = now + ttl;
    current->updated_at = now;
    IDEM_RETURN_IF_ERROR(Put(*current, now));
    Lease renewed = lease;
    renewed.until = now + ttl;
    return renewed;
  }

  // advance: the recovery point, and the resource id unless the new one is empty.
  Status Advance(const ScopeHash& scope, const Lease& lease, std::string_view point,
                 std::string_view resource_id) override {
    IDEM_RETURN_IF_ERROR(Open());
    IDEM_RETURN_IF_ERROR(CheckProgress(point, resource_id));
    const Timestamp now = clock_.Now();
    std::optional<Record> current = Current(scope);
    if (!current || !Holds(*current, lease)) return Fenced("advance");
    current->recovery_point = std::string(point);
    if (!resource_id.empty()) current->resource_id = std::string(resource_id);
    current->updated_at = now;
    IDEM_RETURN_IF_ERROR(Put(*current, now));
    return Ok();
  }

  // advance_covered: only while lease_until >= now + must_cover; sets sent_at.
  Status AdvanceCovered(const ScopeHash& scope, const Lease& lease, std::string_view point,
                        Millis must_cover) override {
    IDEM_RETURN_IF_ERROR(Open());
    IDEM_RETURN_IF_ERROR(CheckProgress(point, {}));
    const Timestamp now = clock_.Now();
    std::optional<Record> current = Current(scope);
    if (!current || !Holds(*current, lease)) return Fenced("advance");
    if (current->lease.until < now + must_cover) {
      const Millis left = std::chrono::duration_cast<Millis>(current->lease.until - now);
      return MakeError(Errc::kConflict,
                       "advance: the lease ends in " + std::to_string(left.count()) +
                           " ms, before the call it must cover would (" +
                           std::to_string(must_cover.count()) + " ms); renew first");
    }
    current->recovery_point = std::string(point);
    current->updated_at = now;
    current->sent_at = now;
    IDEM_RETURN_IF_ERROR(Put(*current, now));
    return Ok();
  }

  // finish: the outcome; the recovery point unless the outcome's is empty; past its expiry, a
  // retention from now.
  Status Finish(const ScopeHash& scope, const Lease& lease, const Outcome& outcome) override {
    IDEM_CHECK(outcome.state != RecordState::kProcessing);
    IDEM_RETURN_IF_ERROR(Open());
    IDEM_RETURN_IF_ERROR(CheckProgress(outcome.recovery_point, {}));
    const Timestamp now = clock_.Now();
    std::optional<Record> current = Current(scope);
    if (!current || !Holds(*current, lease)) return Fenced("finish");
    current->state = outcome.state;
    current->status_code = outcome.status_code;
    current->response = outcome.sealed_response;  // SQL stores NULL for "", read back as ""
    if (!outcome.recovery_point.empty()) current->recovery_point = outcome.recovery_point;
    current->updated_at = now;
    if (current->expires_at <= now) current->expires_at = now + outcome.retention;
    IDEM_RETURN_IF_ERROR(Put(*current, now));
    return Ok();
  }

  // settle: the outcome, the recovery point as given, fence + 1, only from a held outcome with
  // the fence the operator read.
  Status Settle(const ScopeHash& scope, int64_t seen_fence, const Outcome& outcome) override {
    IDEM_RETURN_IF_ERROR(Open());
    IDEM_RETURN_IF_ERROR(CheckSettlement(outcome));
    const Timestamp now = clock_.Now();
    std::optional<Record> current = Current(scope);
    if (!current || current->lease.fence != seen_fence ||
        current->state != RecordState::kFailedFinal ||
        current->recovery_point != kOutcomeUnknownPoint || current->expires_at <= now) {
      return SettleRefused(current ? std::optional<Record>(Observed(*current, now)) : std::nullopt,
                           seen_fence);
    }
    current->state = outcome.state;
    current->status_code = outcome.status_code;
    current->response = outcome.sealed_response;
    current->recovery_point = outcome.recovery_point;
    current->lease.fence += 1;
    current->updated_at = now;
    IDEM_RETURN_IF_ERROR(Put(*current, now));
    return Ok();
  }

  Result<std::optional<Record>> Get(const ScopeHash& scope) override {
    IDEM_RETURN_IF_ERROR(Open());
    const Timestamp now = clock_.Now();
    std::optional<Record> current = Current(scope);
    if (!current) return std::optional<Record>();
    return std::optional<Record>(Observed(std::move(*current), now));
  }

  // count_any / count_state, bounded by LIMIT. The write lock serialises principals already.
  Result<int64_t> Count(std::string_view tenant, std::string_view user,
                        std::optional<RecordState> state, int64_t limit) override {
    IDEM_RETURN_IF_ERROR(Open());
    auto counts = [&](const Record& r) {
      return r.tenant == tenant && r.user == user && (!state || r.state == *state);
    };
    std::size_t n = 0;
    for (const auto& [scope, r] : overlay_) n += counts(r) ? 1 : 0;
    {
      ReaderMutexLock lock(data_->mu);
      for (const auto& [scope, r] : data_->records) {
        if (!overlay_.contains(scope) && counts(r)) ++n;
      }
    }
    return static_cast<int64_t>(Bounded(n, limit));
  }

  Result<std::vector<SqlRow>> Exec(std::string_view sql,
                                   const std::vector<SqlValue>& params) override {
    (void)sql;
    (void)params;
    return MakeError(Errc::kInvalidArgument, kNoSql);
  }

  Status Commit() override {
    IDEM_CHECK(!ended_);
    {
      WriterMutexLock lock(data_->mu);
      for (auto& [scope, r] : overlay_) data_->records[scope] = std::move(r);
    }
    overlay_.clear();
    ended_ = true;
    data_->write_lock.Unlock();
    for (const auto& fn : after_commit_) fn();
    return Ok();
  }

  void AfterCommit(std::function<void()> fn) override { after_commit_.push_back(std::move(fn)); }

 private:
  // Every operation after a Commit is a bug of the caller (a SQL store would run it outside the
  // transaction).
  Status Open() const {
    if (ended_) return MakeError(Errc::kInternal, "memory store: the transaction has ended");
    return Ok();
  }

  // The record as this transaction sees it: its own writes over the committed records (which
  // nothing else changes while this transaction holds the write lock).
  std::optional<Record> Current(const ScopeHash& scope) const {
    if (auto it = overlay_.find(scope); it != overlay_.end()) return it->second;
    ReaderMutexLock lock(data_->mu);
    if (auto it = data_->records.find(scope); it != data_->records.end()) return it->second;
    return std::nullopt;
  }

  // Writes `r` over the record as this transaction sees it, at `now`, if the state machine
  // allows it (CheckTransition).
  Status Put(Record r, Timestamp now) {
    IDEM_RETURN_IF_ERROR(CheckTransition(Current(r.scope), r, now));
    r.observed_at = Timestamp{};
    overlay_[r.scope] = std::move(r);
    return Ok();
  }

  std::shared_ptr<MemoryData> data_;
  Clock& clock_;
  Random& random_;
  std::map<ScopeHash, Record> overlay_;  // records are only ever deleted by Sweep, outside
  bool ended_ = false;                   // committed; the write lock is released
  std::vector<std::function<void()>> after_commit_;  // AfterCommit's hooks, run by Commit
};

class MemoryStore final : public Store {
 public:
  MemoryStore(std::shared_ptr<MemoryData> data, Clock& clock, Random& random)
      : data_(std::move(data)), clock_(clock), random_(random) {
    caps_.name = "memory";
    caps_.shared_across_processes = false;
    caps_.durable = false;
    caps_.notifications = false;
    caps_.business_sql = false;
  }

  const StoreCapabilities& capabilities() const override { return caps_; }

  // Nothing to reach: always ready, also while a transaction holds the write lock.
  Status Ping(Millis timeout) override {
    (void)timeout;
    return Ok();
  }

  Result<std::unique_ptr<StoreTxn>> Begin() override {
    if (!data_->write_lock.TryLockFor(data_->lock_wait)) {
      return MakeError(Errc::kUnavailable, "begin: the write lock was not free within " +
                                               std::to_string(data_->lock_wait.count()) + " ms");
    }
    return std::unique_ptr<StoreTxn>(std::make_unique<MemoryTxn>(data_, clock_, random_));
  }

  // get, on the committed records.
  Result<std::optional<Record>> Read(const ScopeHash& scope) override {
    const Timestamp now = clock_.Now();
    ReaderMutexLock lock(data_->mu);
    auto it = data_->records.find(scope);
    if (it == data_->records.end()) return std::optional<Record>();
    return std::optional<Record>(Observed(it->second, now));
  }

  Result<std::vector<SqlRow>> Query(std::string_view sql,
                                    const std::vector<SqlValue>& params) override {
    (void)sql;
    (void)params;
    return MakeError(Errc::kInvalidArgument, kNoSql);
  }

  // The validation of sent points (store_internal::AppendSentPoints).
  static Status CheckSentPoints(std::string_view op, const std::vector<std::string>& sent_points) {
    if (sent_points.size() > limits::kMaxSentPoints) {
      return MakeError(Errc::kInvalidArgument, std::string(op) + ": more than " +
                                                   std::to_string(limits::kMaxSentPoints) +
                                                   " recovery points past the send");
    }
    for (const std::string& point : sent_points) {
      if (point.empty()) {
        return MakeError(Errc::kInvalidArgument,
                         std::string(op) + ": an empty recovery point is no send");
      }
    }
    return Ok();
  }
  // A retryable failure at one of `sent_points`: left to the takeover loop.
  static bool PastSend(const Record& r, const std::vector<std::string>& sent_points) {
    return r.state == RecordState::kFailedRetryable && !r.recovery_point.empty() &&
           std::find(sent_points.begin(), sent_points.end(), r.recovery_point) != sent_points.end();
  }

  // list_held: the same WHERE, ORDER BY updated_at (ties by scope hash), LIMIT.
  Result<std::vector<Record>> ListHeld(std::string_view route, int limit) override {
    const Timestamp now = clock_.Now();
    std::vector<Record> held;
    {
      ReaderMutexLock lock(data_->mu);
      for (const auto& [scope, r] : data_->records) {
        if (r.state == RecordState::kFailedFinal && r.recovery_point == kOutcomeUnknownPoint &&
            r.expires_at > now && (route.empty() || r.route == route)) {
          held.push_back(Observed(r, now));
        }
      }
    }
    std::stable_sort(held.begin(), held.end(),
                     [](const Record& a, const Record& b) { return a.updated_at < b.updated_at; });
    held.resize(Bounded(held.size(), limit));
    return held;
  }

  // list_stale: the same validation (ListStaleRecords), the same WHERE, ORDER BY lease_until
  // (ties by scope hash, the order of SQLite's index), LIMIT.
  Result<std::vector<Record>> ListStale(std::string_view route,
                                        const std::vector<std::string>& sent_points,
                                        int limit) override {
    IDEM_RETURN_IF_ERROR(CheckSentPoints("list stale", sent_points));
    const Timestamp now = clock_.Now();
    std::vector<Record> stale;
    {
      ReaderMutexLock lock(data_->mu);
      for (const auto& [scope, r] : data_->records) {
        if (r.route != route || r.lease.until >= now) continue;
        if (r.state == RecordState::kProcessing || PastSend(r, sent_points)) {
          stale.push_back(Observed(r, now));
        }
      }
    }
    std::stable_sort(stale.begin(), stale.end(), [](const Record& a, const Record& b) {
      return a.lease.until < b.lease.until;
    });
    stale.resize(Bounded(stale.size(), limit));
    return stale;
  }

  // sweep: on the write lock, like every write; ORDER BY expires_at (ties by scope hash) LIMIT.
  Result<int> Sweep(int batch, const std::vector<std::string>& sent_points) override {
    IDEM_RETURN_IF_ERROR(CheckSentPoints("sweep", sent_points));
    if (!data_->write_lock.TryLockFor(data_->lock_wait)) {
      return MakeError(Errc::kUnavailable, "sweep: the write lock was not free within " +
                                               std::to_string(data_->lock_wait.count()) + " ms");
    }
    const Timestamp now = clock_.Now();
    std::size_t deleted = 0;
    {
      WriterMutexLock lock(data_->mu);
      std::vector<std::pair<Timestamp, ScopeHash>> expired;
      for (const auto& [scope, r] : data_->records) {
        if (r.expires_at <= now && r.state != RecordState::kProcessing &&
            !PastSend(r, sent_points)) {
          expired.emplace_back(r.expires_at, scope);
        }
      }
      std::sort(expired.begin(), expired.end());
      deleted = Bounded(expired.size(), batch);
      for (std::size_t i = 0; i < deleted; ++i) data_->records.erase(expired[i].second);
    }
    data_->write_lock.Unlock();
    return static_cast<int>(deleted);
  }

  // census: the committed records, counted one by one (the model has no index to mind).
  Result<RecordCensus> Census() override {
    const Timestamp now = clock_.Now();
    RecordCensus census;
    ReaderMutexLock lock(data_->mu);
    for (const auto& [scope, r] : data_->records) {
      ++census.retained;
      if (r.state == RecordState::kFailedRetryable) ++census.failed_retryable;
      if (r.state != RecordState::kProcessing) continue;
      ++census.processing;
      ++census.processing_by_route[r.route];
      const Millis age =
          std::max(Millis(0), std::chrono::duration_cast<Millis>(now - r.created_at));
      census.oldest_processing_age = std::max(census.oldest_processing_age.value_or(age), age);
    }
    return census;
  }

 private:
  std::shared_ptr<MemoryData> data_;
  Clock& clock_;
  Random& random_;
  StoreCapabilities caps_;
};

}  // namespace

std::unique_ptr<Store> MakeMemoryStore(std::shared_ptr<MemoryData> data, Clock& clock,
                                       Random& random) {
  return std::make_unique<MemoryStore>(std::move(data), clock, random);
}

std::unique_ptr<Store> MakeMemoryStore(Clock& clock, Random& random) {
  return MakeMemoryStore(NewMemoryData(), clock, random);
}

}  // namespace idem::testing
