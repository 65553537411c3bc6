// mlakv error policy (docs/design.md, "Errors"):
//  - every public function that can fail returns Status or StatusOr<T>;
//  - the message names the offending argument, file, tensor, token or layer;
//  - the library never calls exit/abort on bad input and never throws across the API.
#pragma once

#include <cassert>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace mlakv {

enum class StatusCode : int {
  kOk = 0,
  kInvalidArgument,     // an argument is malformed (shape, dtype, value, option)
  kOutOfRange,          // an index, slot or size is outside what exists
  kNotFound,            // a file, tensor, preset or key does not exist
  kResourceExhausted,   // out of blocks, out of memory
  kFailedPrecondition,  // the object is not in a state that allows the call
  kDataLoss,            // input data is corrupt (bad header, NaN in a record)
  kUnimplemented,       // valid request this build cannot serve (e.g. no CUDA)
  kIoError,             // the operating system refused a read/write
  kInternal,            // a bug in mlakv
};

std::string_view status_code_name(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;  // OK
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "invalid_argument: q: expected dtype f32 or bf16, got i32"
  std::string to_string() const;

  // Prepends context: "while loading layer 3: <message>".
  Status with_context(std::string_view context) const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status invalid_argument(std::string m) { return {StatusCode::kInvalidArgument, std::move(m)}; }
inline Status out_of_range(std::string m) { return {StatusCode::kOutOfRange, std::move(m)}; }
inline Status not_found(std::string m) { return {StatusCode::kNotFound, std::move(m)}; }
inline Status resource_exhausted(std::string m) { return {StatusCode::kResourceExhausted, std::move(m)}; }
inline Status failed_precondition(std::string m) { return {StatusCode::kFailedPrecondition, std::move(m)}; }
inline Status data_loss(std::string m) { return {StatusCode::kDataLoss, std::move(m)}; }
inline Status unimplemented(std::string m) { return {StatusCode::kUnimplemented, std::move(m)}; }
inline Status io_error(std::string m) { return {StatusCode::kIoError, std::move(m)}; }
inline Status internal_error(std::string m) { return {StatusCode::kInternal, std::move(m)}; }

// A value or the Status explaining why there is none.
template <class T>
class [[nodiscard]] StatusOr {
 public:
  StatusOr(Status status) : v_(std::move(status)) {  // NOLINT: implicit by design
    assert(!std::get<Status>(v_).ok() && "StatusOr constructed from an OK Status");
  }
  StatusOr(T value) : v_(std::move(value)) {}  // NOLINT: implicit by design

  bool ok() const { return std::holds_alternative<T>(v_); }
  Status status() const { return ok() ? Status() : std::get<Status>(v_); }

  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

 private:
  std::variant<Status, T> v_;
};

}  // namespace mlakv

#define MLAKV_CONCAT_INNER_(a, b) a##b
#define MLAKV_CONCAT_(a, b) MLAKV_CONCAT_INNER_(a, b)

// Returns the Status from the enclosing function when `expr` is not OK.
#define MLAKV_RETURN_IF_ERROR(expr)                 \
  do {                                              \
    ::mlakv::Status mlakv_status_ = (expr);         \
    if (!mlakv_status_.ok()) return mlakv_status_;  \
  } while (0)

// `MLAKV_ASSIGN_OR_RETURN(auto x, f());` unwraps a StatusOr or returns its Status.
#define MLAKV_ASSIGN_OR_RETURN(lhs, expr) \
  MLAKV_ASSIGN_OR_RETURN_IMPL_(MLAKV_CONCAT_(mlakv_statusor_, __LINE__), lhs, expr)
#define MLAKV_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                 \
  if (!tmp.ok()) return tmp.status();                \
  lhs = std::move(tmp).value()
