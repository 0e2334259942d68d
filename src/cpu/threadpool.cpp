#include "cpu/threadpool.h"

#include <algorithm>

namespace dsv4::cpu {

ThreadPool::ThreadPool(unsigned n_threads) {
    if (n_threads == 0) n_threads = std::max(1u, std::thread::hardware_concurrency());
    for (unsigned i = 1; i < n_threads; ++i) workers_.emplace_back([this, i] { worker(i); });
}

ThreadPool::~ThreadPool() {
    {
        std::lock_guard<std::mutex> lk(mu_);
        stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : workers_) t.join();
}

void ThreadPool::worker(unsigned id) {
    uint64_t seen = 0;
    for (;;) {
        std::unique_lock<std::mutex> lk(mu_);
        cv_.wait(lk, [&] { return stop_ || generation_ != seen; });
        if (stop_) return;
        seen = generation_;
        void* job = job_;
        const Trampoline call = call_;
        const uint64_t n = job_n_, chunk = job_chunk_;
        const bool has_part = id < job_parts_;
        lk.unlock();
        if (has_part) {
            const uint64_t a = id * chunk, b = std::min(n, a + chunk);
            if (a < b) call(job, a, b);
        }
        lk.lock();
        if (--pending_ == 0) done_cv_.notify_one();
    }
}

void ThreadPool::run(uint64_t n, uint64_t grain, void* fn, Trampoline call) {
    if (n == 0) return;
    const unsigned parts = unsigned(std::min<uint64_t>(size(), std::max<uint64_t>(1, n / std::max<uint64_t>(1, grain))));
    if (parts <= 1 || workers_.empty()) {
        call(fn, 0, n);
        return;
    }
    const uint64_t chunk = (n + parts - 1) / parts;
    {
        std::lock_guard<std::mutex> lk(mu_);
        job_ = fn;
        call_ = call;
        job_n_ = n;
        job_chunk_ = chunk;
        job_parts_ = parts;
        pending_ = unsigned(workers_.size());
        ++generation_;
    }
    cv_.notify_all();
    call(fn, 0, std::min(n, chunk));
    std::unique_lock<std::mutex> lk(mu_);
    done_cv_.wait(lk, [&] { return pending_ == 0; });
}

}  // namespace dsv4::cpu
