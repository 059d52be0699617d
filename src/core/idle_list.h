// src/core/idle_list.h — a bounded free list of keyed OpenSSL contexts, shared by threads.
//
// Keying a context (an HMAC key, an AES key schedule) and fetching its algorithm cost more than
// using it on a short input; a used context re-initialised with the key it holds costs neither.
// The fingerprinter and the sealer keep their keyed contexts here.
#pragma once

#include <cstddef>
#include <utility>
#include <vector>

#include "idem/mutex.h"

namespace idem {

template <class Ctx>  // a std::unique_ptr to an OpenSSL context, with its deleter
class IdleList {
 public:
  // The last context given back, or an empty one when none is idle.
  Ctx Take() {
    MutexLock lock(mu_);
    if (idle_.empty()) return Ctx();
    Ctx ctx = std::move(idle_.back());
    idle_.pop_back();
    return ctx;
  }

  // Keeps `ctx` for the next Take, unless kMaxIdle are idle already (then frees it).
  void Give(Ctx ctx) {
    MutexLock lock(mu_);
    if (idle_.size() < kMaxIdle) idle_.push_back(std::move(ctx));
  }

 private:
  static constexpr std::size_t kMaxIdle = 64;

  Mutex mu_;
  std::vector<Ctx> idle_ IDEM_GUARDED_BY(mu_);
};

}  // namespace idem
