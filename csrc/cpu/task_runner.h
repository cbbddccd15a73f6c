// A minimal "run these independent tasks" interface. Kernels split their work
// into tasks and hand them to a runner; the FFI layer adapts XLA's intra-op
// thread pool to it, so the kernels need no XLA header.
#pragma once

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <utility>

namespace jax_topk::cpu {

class TaskRunner {
 public:
  virtual ~TaskRunner() = default;
  // How many tasks can make progress at once (>= 1).
  virtual int64_t concurrency() const = 0;
  // Runs task(i) for every i in [0, num_tasks) and returns once all finished.
  virtual void run(int64_t num_tasks, const std::function<void(int64_t)>& task) = 0;
};

// Runs every task on the calling thread (tests, tools, single-threaded hosts).
class SerialRunner final : public TaskRunner {
 public:
  int64_t concurrency() const override { return 1; }
  void run(int64_t num_tasks, const std::function<void(int64_t)>& task) override {
    for (int64_t i = 0; i < num_tasks; ++i) task(i);
  }
};

// Runs tasks on the calling thread plus up to threads - 1 helper jobs that
// schedule(job) (job: a std::function<void()>) hands to a pool. Each worker
// claims the next task until none is left; the caller waits only for the
// tasks claimed, never for a helper to start, so a caller running on a pool
// thread, or a pool of one, cannot deadlock. The FFI layer schedules on XLA's
// intra-op pool (ffi/common.h), the CPU tests on a pool of their own.
template <typename Schedule>
class HelpingTaskRunner : public TaskRunner {
 public:
  HelpingTaskRunner(int64_t threads, Schedule schedule)
      : threads_(std::max<int64_t>(1, threads)), schedule_(std::move(schedule)) {}

  int64_t concurrency() const override { return threads_; }

  void run(int64_t num_tasks, const std::function<void(int64_t)>& task) override {
    if (num_tasks <= 1 || threads_ <= 1) {
      for (int64_t i = 0; i < num_tasks; ++i) task(i);
      return;
    }
    auto state = std::make_shared<State>(num_tasks, &task);
    const int64_t helpers = std::min(num_tasks, threads_) - 1;
    for (int64_t h = 0; h < helpers; ++h) schedule_(std::function<void()>([state] { state->work(); }));
    state->work();
    std::unique_lock<std::mutex> lock(state->mutex);
    state->all_done.wait(lock, [&] { return state->done.load() == num_tasks; });
  }

 private:
  struct State {
    State(int64_t n, const std::function<void(int64_t)>* t) : num_tasks(n), task(t) {}
    void work() {
      for (int64_t i = next.fetch_add(1); i < num_tasks; i = next.fetch_add(1)) {
        (*task)(i);
        if (done.fetch_add(1) + 1 == num_tasks) {
          std::lock_guard<std::mutex> lock(mutex);
          all_done.notify_all();
        }
      }
    }
    const int64_t num_tasks;
    const std::function<void(int64_t)>* task;  // valid until every claimed task is done
    std::atomic<int64_t> next{0};
    std::atomic<int64_t> done{0};
    std::mutex mutex;
    std::condition_variable all_done;
  };

  int64_t threads_;
  Schedule schedule_;
};

}  // namespace jax_topk::cpu
