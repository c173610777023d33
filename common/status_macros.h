// The two status-propagation macros (Abseil 20220623 in Debian has none of its own).
#pragma once

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define OPSERVE_CONCAT_INNER(a, b) a##b
#define OPSERVE_CONCAT(a, b) OPSERVE_CONCAT_INNER(a, b)

// Returns from the enclosing function with the status of `expr` when it is not OK.
#define RETURN_IF_ERROR(expr)                                \
  do {                                                       \
    ::absl::Status opserve_status_ = (expr);                 \
    if (!opserve_status_.ok()) return opserve_status_;       \
  } while (0)

// `lhs = value of expr`, or return its error status. `lhs` may declare a variable.
#define ASSIGN_OR_RETURN(lhs, expr) \
  ASSIGN_OR_RETURN_IMPL(OPSERVE_CONCAT(opserve_statusor_, __LINE__), lhs, expr)
#define ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                          \
  if (!tmp.ok()) return tmp.status();         \
  lhs = std::move(tmp).value()
