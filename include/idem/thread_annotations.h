// include/idem/thread_annotations.h — clang's thread-safety attributes, as macros.
//
// Under clang they let -Wthread-safety check, at compile time, that a member marked
// IDEM_GUARDED_BY(mu_) is touched only with mu_ held and that a function marked
// IDEM_REQUIRES(mu_) is called only with it held (scripts/lint runs that analysis). Under other
// compilers they expand to nothing. The capabilities they name are idem::Mutex and
// idem::SharedMutex (idem/mutex.h): std::mutex carries no attributes.
#pragma once

#if defined(__clang__)
#define IDEM_THREAD_ANNOTATION(x) __attribute__((x))
#else
#define IDEM_THREAD_ANNOTATION(x)
#endif

// On a type: it is a capability (a mutex), or an object that holds one for its scope.
#define IDEM_CAPABILITY(name) IDEM_THREAD_ANNOTATION(capability(name))
#define IDEM_SCOPED_CAPABILITY IDEM_THREAD_ANNOTATION(scoped_lockable)

// On a data member (or a global): read and written only with `x` held (shared for reads, for a
// SharedMutex). PT_: the same for what a pointer points to.
#define IDEM_GUARDED_BY(x) IDEM_THREAD_ANNOTATION(guarded_by(x))
#define IDEM_PT_GUARDED_BY(x) IDEM_THREAD_ANNOTATION(pt_guarded_by(x))

// On a function: the caller must hold (exclusively, or at least shared) / must not hold these.
#define IDEM_REQUIRES(...) IDEM_THREAD_ANNOTATION(requires_capability(__VA_ARGS__))
#define IDEM_REQUIRES_SHARED(...) IDEM_THREAD_ANNOTATION(requires_shared_capability(__VA_ARGS__))
#define IDEM_EXCLUDES(...) IDEM_THREAD_ANNOTATION(locks_excluded(__VA_ARGS__))

// On a function: it takes / gives up these (no argument: the object it is called on).
#define IDEM_ACQUIRE(...) IDEM_THREAD_ANNOTATION(acquire_capability(__VA_ARGS__))
#define IDEM_ACQUIRE_SHARED(...) IDEM_THREAD_ANNOTATION(acquire_shared_capability(__VA_ARGS__))
#define IDEM_RELEASE(...) IDEM_THREAD_ANNOTATION(release_capability(__VA_ARGS__))
#define IDEM_RELEASE_SHARED(...) IDEM_THREAD_ANNOTATION(release_shared_capability(__VA_ARGS__))
// It takes them when it returns `result` (true or false).
#define IDEM_TRY_ACQUIRE(...) IDEM_THREAD_ANNOTATION(try_acquire_capability(__VA_ARGS__))

// On a function whose locking the analysis cannot follow; say why beside it.
#define IDEM_NO_THREAD_SAFETY_ANALYSIS IDEM_THREAD_ANNOTATION(no_thread_safety_analysis)
