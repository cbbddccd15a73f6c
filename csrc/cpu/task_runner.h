// A minimal "run these independent tasks" interface. Kernels split their work
// into tasks and hand them to a runner; the FFI layer adapts XLA's intra-op
// thread pool to it, so the kernels need no XLA header.
#pragma once

#include <cstdint>
#include <functional>

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

}  // namespace jax_topk::cpu
