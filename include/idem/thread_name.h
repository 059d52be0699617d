// include/idem/thread_name.h — names the calling thread, as `top -H`, `ps -L` and `perf report
// --sort comm` show it: which of a process's threads spend its CPU (its event loops, the store's
// blocking calls, the log writer).
#pragma once

#include <pthread.h>

#include <string>
#include <string_view>

namespace idem {

// Linux keeps 15 bytes of a thread's name; a longer one is cut there. Failing to name a thread
// changes nothing else, so its error is ignored.
inline void NameThisThread(std::string_view name) {
  const std::string cut(name.substr(0, 15));
  pthread_setname_np(pthread_self(), cut.c_str());
}

}  // namespace idem
