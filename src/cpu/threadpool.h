// A small persistent thread pool: parallel_for over an index range, the calling thread
// taking part. Workers stay alive between steps so decode pays no thread start-up.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
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
    // `grain` is the smallest slice worth a thread.
    void parallel_for(uint64_t n, const std::function<void(uint64_t, uint64_t)>& fn, uint64_t grain = 1);

private:
    void worker(unsigned id);
    std::vector<std::thread> workers_;
    std::mutex mu_;
    std::condition_variable cv_, done_cv_;
    const std::function<void(uint64_t, uint64_t)>* job_ = nullptr;
    uint64_t job_n_ = 0, job_chunk_ = 0;
    unsigned job_parts_ = 0;
    uint64_t generation_ = 0;
    unsigned pending_ = 0;
    bool stop_ = false;
};

}  // namespace dsv4::cpu
