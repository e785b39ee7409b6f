// Status propagation helpers. Debian's Abseil (20220623) ships no
// RETURN_IF_ERROR / ASSIGN_OR_RETURN, so Tally keeps this one small copy.
#ifndef TALLY_COMMON_STATUS_MACROS_H_
#define TALLY_COMMON_STATUS_MACROS_H_

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

// Evaluates `expr` (an absl::Status); returns it from the enclosing function
// when it is not OK.
#define TALLY_RETURN_IF_ERROR(expr)                \
  do {                                             \
    ::absl::Status tally_status_ = (expr);         \
    if (!tally_status_.ok()) return tally_status_; \
  } while (0)

#define TALLY_CONCAT_INNER_(a, b) a##b
#define TALLY_CONCAT_(a, b) TALLY_CONCAT_INNER_(a, b)

// Evaluates `rexpr` (an absl::StatusOr<T>); on error returns its status,
// otherwise moves the value into `lhs` (which may be a declaration).
#define TALLY_ASSIGN_OR_RETURN(lhs, rexpr)                                    \
  TALLY_ASSIGN_OR_RETURN_IMPL_(TALLY_CONCAT_(tally_statusor_, __LINE__), lhs, \
                               rexpr)

#define TALLY_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, rexpr) \
  auto statusor = (rexpr);                                 \
  if (!statusor.ok()) return std::move(statusor).status(); \
  lhs = std::move(statusor).value()

#endif  // TALLY_COMMON_STATUS_MACROS_H_
