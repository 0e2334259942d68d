// A small persistent thread pool: parallel_for over an index range, the calling thread
// taking part. Workers stay alive between steps so decode pays no thread start-up.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <type_traits>
#include <mutex>
#include <thread>
#include <vector>

namespace dsv4::cpu {

class ThreadPool {
public:
    explicit ThreadPool(unsigned n_threads);
    ~ThreadPool();
    unsigned size() const { return unsigned(workers_.size()) + 1; }
    // Calls fn(begin, end) on disjoint slices of [0, n) covering it; returns when all are done.
    // `grain` is the smallest slice worth a thread. The callable is passed by reference
    // (no std::function, so no allocation per call in the decode loop).
    template <typename F>
    void parallel_for(uint64_t n, F&& fn, uint64_t grain = 1) {
        run(n, grain, &fn, [](void* f, uint64_t a, uint64_t b) { (*static_cast<std::remove_reference_t<F>*>(f))(a, b); });
    }

private:
    using Trampoline = void (*)(void*, uint64_t, uint64_t);
    void run(uint64_t n, uint64_t grain, void* fn, Trampoline call);
    void worker(unsigned id);
    std::vector<std::thread> workers_;
    std::mutex mu_;
    std::condition_variable cv_, done_cv_;
    void* job_ = nullptr;
    Trampoline call_ = nullptr;
    uint64_t job_n_ = 0, job_chunk_ = 0;
    unsigned job_parts_ = 0;
    uint64_t generation_ = 0;
    unsigned pending_ = 0;
    bool stop_ = false;
};

}  // namespace dsv4::cpu
