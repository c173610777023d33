// The two status-propagation macros (Abseil 20220623 ships none). Private to client/ .cc files:
// public headers never include this, so a server-side pair of the same names cannot collide
// through them.
#pragma once

#include "absl/status/status.h"

#ifndef RETURN_IF_ERROR
#define RETURN_IF_ERROR(expr)              \
  do {                                     \
    const ::absl::Status _status = (expr); \
    if (!_status.ok()) return _status;     \
  } while (0)
#endif

#ifndef ASSIGN_OR_RETURN
#define OPSERVE_STATUS_CONCAT_INNER(a, b) a##b
#define OPSERVE_STATUS_CONCAT(a, b) OPSERVE_STATUS_CONCAT_INNER(a, b)
#define ASSIGN_OR_RETURN(lhs, rexpr) \
  ASSIGN_OR_RETURN_IMPL(OPSERVE_STATUS_CONCAT(_statusor_, __LINE__), lhs, rexpr)
#define ASSIGN_OR_RETURN_IMPL(statusor, lhs, rexpr) \
  auto statusor = (rexpr);                          \
  if (!statusor.ok()) return statusor.status();     \
  lhs = std::move(statusor).value()
#endif
