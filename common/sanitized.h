// OPSERVE_SANITIZED: 1 in an AddressSanitizer or ThreadSanitizer build (GCC's and Clang's ways of
// saying so), else 0. Such builds bring their own allocator and signal handlers.
#pragma once

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define OPSERVE_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define OPSERVE_SANITIZED 1
#endif
#endif
#ifndef OPSERVE_SANITIZED
#define OPSERVE_SANITIZED 0
#endif
