// src/backends/thread_pool.hpp — a fixed pool that runs one parallel loop at a time.
#ifndef SHARDADAM_SRC_BACKENDS_THREAD_POOL_HPP_
#define SHARDADAM_SRC_BACKENDS_THREAD_POOL_HPP_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

namespace sa {

class ThreadPool {
 public:
  // `threads` workers in all, counting the calling thread (threads - 1 are spawned).
  explicit ThreadPool(int threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return static_cast<int>(workers_.size()) + 1; }

  // Calls body(i) for every i in [0, n), spread dynamically over all threads (the caller
  // included), and returns when all are done. `body` must not throw. No allocation.
  template <class Body>
  void parallel_for(int64_t n, const Body& body) {
    run(
        n, [](const void* ctx, int64_t i) { (*static_cast<const Body*>(ctx))(i); }, &body);
  }

 private:
  using Task = void (*)(const void* ctx, int64_t index);
  void run(int64_t n, Task task, const void* ctx);
  void drain();
  void worker_loop();

  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::condition_variable done_;
  uint64_t generation_ = 0;  // bumped per loop; workers wait for a new one
  int busy_ = 0;             // workers still inside the current loop
  bool stop_ = false;
  Task task_ = nullptr;
  const void* ctx_ = nullptr;
  int64_t count_ = 0;
  std::atomic<int64_t> next_{0};
};

}  // namespace sa

#endif  // SHARDADAM_SRC_BACKENDS_THREAD_POOL_HPP_
