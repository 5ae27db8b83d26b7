// Status / Result<T>: errors a user or the environment can cause (bad file, bad flag, bad request).
// DS_CHECK is for broken invariants (bugs): it aborts with file:line.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <optional>
#include <source_location>
#include <sstream>
#include <string>
#include <utility>
#include <variant>

namespace deltaserve {

class Status {
 public:
  Status() = default;
  static Status ok() { return Status(); }
  static Status error(std::string message) {
    Status s;
    s.message_ = std::move(message);
    s.failed_ = true;
    return s;
  }
  bool is_ok() const { return !failed_; }
  explicit operator bool() const { return !failed_; }
  const std::string& message() const { return message_; }

 private:
  std::string message_;
  bool failed_ = false;
};

template <typename... Args>
std::string str_cat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}

template <typename... Args>
Status error(const Args&... args) {
  return Status::error(str_cat(args...));
}

// Result<T>: a value or an error Status.
template <typename T>
class Result {
 public:
  Result(T value) : value_(std::move(value)) {}  // NOLINT: implicit by design
  Result(Status status) : status_(std::move(status)) {
    if (status_.is_ok()) status_ = Status::error("Result built from an ok Status");
  }
  bool is_ok() const { return value_.has_value(); }
  explicit operator bool() const { return is_ok(); }
  const Status& status() const { return status_; }
  T& value() & { return *value_; }
  const T& value() const& { return *value_; }
  T&& value() && { return std::move(*value_); }
  T& operator*() & { return *value_; }
  const T& operator*() const& { return *value_; }
  T* operator->() { return &*value_; }
  const T* operator->() const { return &*value_; }

 private:
  std::optional<T> value_;
  Status status_;
};

[[noreturn]] inline void check_failed(const std::string& message, std::source_location loc) {
  std::fprintf(stderr, "deltaserve: internal error at %s:%u: %s\n", loc.file_name(),
               static_cast<unsigned>(loc.line()), message.c_str());
  std::fflush(stderr);
  std::abort();
}

}  // namespace deltaserve

#define DS_CHECK(cond, ...)                                                              \
  do {                                                                                   \
    if (!(cond)) [[unlikely]]                                                            \
      ::deltaserve::check_failed(::deltaserve::str_cat("check failed: " #cond " ",       \
                                                       ##__VA_ARGS__),                   \
                                 std::source_location::current());                       \
  } while (0)

// Propagate an error Status from an expression returning Status.
#define DS_RETURN_IF_ERROR(expr)              \
  do {                                        \
    ::deltaserve::Status _ds_s = (expr);      \
    if (!_ds_s.is_ok()) return _ds_s;         \
  } while (0)

#define DS_CONCAT_INNER(a, b) a##b
#define DS_CONCAT(a, b) DS_CONCAT_INNER(a, b)
// DS_ASSIGN_OR_RETURN(auto x, expr_returning_result);
#define DS_ASSIGN_OR_RETURN(lhs, expr)                                   \
  auto DS_CONCAT(_ds_r_, __LINE__) = (expr);                             \
  if (!DS_CONCAT(_ds_r_, __LINE__).is_ok())                              \
    return DS_CONCAT(_ds_r_, __LINE__).status();                         \
  lhs = std::move(DS_CONCAT(_ds_r_, __LINE__)).value()
