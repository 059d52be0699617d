// src/store/cache/replay_cache.cc — the in-process replay cache (replay_cache.h).
#include "idem/store/replay_cache.h"

#include "idem/failpoint.h"
#include "src/store/cache/replay_lru.h"

namespace idem {
namespace {

// Owns the store it wraps; only Read, ReadCached and KeepFinished differ, everything else is
// forwarded.
class ReplayCachedStore final : public StoreWrapper {
 public:
  ReplayCachedStore(std::unique_ptr<Store> inner, const ReplayCacheOptions& options, Clock& clock)
      : StoreWrapper(*inner),
        inner_(std::move(inner)),
        clock_(clock),
        monotonic_(options.monotonic != nullptr ? *options.monotonic : SystemMonotonicClock()),
        lru_(options.max_entries, options.max_bytes) {
    caps_ = inner_->capabilities();
    caps_.name = "cached+" + caps_.name;
  }

  const StoreCapabilities& capabilities() const override { return caps_; }

  std::optional<Record> ReadCached(const ScopeHash& scope) override {
    auto hit = lru_.Get(scope, monotonic_.Now());
    if (hit && hit->scope == scope && cache::Usable(*hit, clock_.Now())) return hit;
    return std::nullopt;
  }

  void KeepFinished(const Record& record, SteadyTime as_of) override {
    if (cache::Usable(record, clock_.Now())) {
      lru_.Put(record.scope, record, as_of + cache::Left(record));
    }
  }

  // An entry lives for what the store said the record had left, counted from before the read.
  Result<std::optional<Record>> Read(const ScopeHash& scope) override {
    const SteadyTime asked = monotonic_.Now();
    if (auto hit = ReadCached(scope)) return hit;
    IDEM_ASSIGN_OR_RETURN(std::optional<Record> record, inner_->Read(scope));
    if (record && record->scope == scope && cache::Usable(*record, clock_.Now()) &&
        IDEM_FAILPOINT("cache_before_fill")) {
      lru_.Put(scope, *record, asked + cache::Left(*record));
    }
    return record;
  }

 private:
  std::unique_ptr<Store> inner_;
  Clock& clock_;
  MonotonicClock& monotonic_;
  cache::Lru lru_;
  StoreCapabilities caps_;
};

}  // namespace

std::unique_ptr<Store> WrapWithReplayCache(std::unique_ptr<Store> inner,
                                           const ReplayCacheOptions& options, Clock& clock) {
  return std::make_unique<ReplayCachedStore>(std::move(inner), options, clock);
}

}  // namespace idem
