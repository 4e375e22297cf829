// src/api_support.hpp — what the C entry points (api.cpp, api_state_io.cpp) share: the
// opaque handle, and guarded(), which runs a core call and turns an exception into a
// status plus the last-error text (on the handle, or thread-local for handle-less calls).
#ifndef SHARDADAM_SRC_API_SUPPORT_HPP_
#define SHARDADAM_SRC_API_SUPPORT_HPP_

#include <memory>
#include <new>
#include <string>
#include <utility>

#include "comm/comm.hpp"
#include "errors.hpp"
#include "optimizer.hpp"
#include "shardadam/shardadam.h"

struct sa_optimizer {
  explicit sa_optimizer(const sa_optimizer_config& config) : core(config) {}
  sa::Optimizer core;
  mutable std::string last_error;
};

struct sa_comm {
  std::shared_ptr<sa::Comm> core;  // optimizers given this communicator share it
};

namespace sa::api {

// Records "<fn>: <what>" as the last error of `opt` (thread-local when opt is NULL) and
// returns `status`.
sa_status record(const sa_optimizer* opt, const char* fn, sa_status status, const char* what);

// Runs a core call; an exception becomes its status, and `record(status, what)` keeps
// the text (and returns the status).
template <class Record, class Body>
sa_status guarded_with(Record&& record, Body&& body) noexcept {
  try {
    body();
    return SA_OK;
  } catch (const sa::Error& e) {
    return record(e.status(), e.what());
  } catch (const std::bad_alloc&) {
    return record(SA_ERR_OUT_OF_MEMORY, "out of host memory");
  } catch (const std::exception& e) {
    return record(SA_ERR_INTERNAL, e.what());
  } catch (...) {
    return record(SA_ERR_INTERNAL, "unknown exception");
  }
}

template <class Body>
sa_status guarded(const sa_optimizer* opt, const char* fn, Body&& body) noexcept {
  return guarded_with(
      [&](sa_status status, const char* what) { return record(opt, fn, status, what); },
      std::forward<Body>(body));
}

inline void require(bool ok, const char* what) {
  if (!ok) sa::fail(SA_ERR_INVALID_ARGUMENT, what);
}

// Entry points that take a handle: a NULL handle is reported thread-locally.
template <class Body>
sa_status with_optimizer(const sa_optimizer* opt, const char* fn, Body&& body) noexcept {
  if (opt == nullptr) return record(nullptr, fn, SA_ERR_INVALID_ARGUMENT, "opt is NULL");
  return guarded(opt, fn, std::forward<Body>(body));
}

}  // namespace sa::api

#endif  // SHARDADAM_SRC_API_SUPPORT_HPP_
