// Shared vocabulary of every layer: the error type and message formatting.
#pragma once

#include <cstdint>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace dsv4 {

// Every failure that a user can cause (bad file, bad flag, budget exhausted) is reported
// as an Error whose message names the thing, what was expected and what was found.
// Front ends print what() on one line and exit non-zero; nothing aborts.
class Error : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};

// cat("tensor ", name, ": expected ", a, ", found ", b) — stream-formats its arguments.
template <typename... Args>
std::string cat(Args&&... args) {
    std::ostringstream os;
    (os << ... << std::forward<Args>(args));
    return os.str();
}

template <typename... Args>
[[noreturn]] void fail(Args&&... args) {
    throw Error(cat(std::forward<Args>(args)...));
}

// Human units for byte counts: "1.50 GiB".
std::string human_bytes(uint64_t bytes);

}  // namespace dsv4
