// src/comm/host_comm.cpp — a communicator made of the caller's host callbacks.
#include "../errors.hpp"
#include "comm.hpp"

namespace sa {
namespace {

class HostComm final : public Comm {
 public:
  explicit HostComm(const sa_host_comm& callbacks) : callbacks_(callbacks) {}
  ~HostComm() override {
    if (callbacks_.release != nullptr) callbacks_.release(callbacks_.ctx);
  }
  HostComm(const HostComm&) = delete;
  HostComm& operator=(const HostComm&) = delete;

  std::string describe() const override { return "host-callback communicator"; }
  bool reduces_device_memory() const override { return false; }
  int device() const override { return -1; }
  int32_t rank() const override { return callbacks_.nranks > 0 ? callbacks_.rank : -1; }
  int32_t nranks() const override { return callbacks_.nranks > 0 ? callbacks_.nranks : -1; }

  void all_reduce(double* values, int32_t count, ReduceOp op, void*) override {
    const int rc = callbacks_.all_reduce(callbacks_.ctx, values, count,
                                         op == ReduceOp::sum ? SA_REDUCE_SUM : SA_REDUCE_MAX);
    if (rc != 0)
      fail(SA_ERR_COMM, "the host communicator's all_reduce (", count, " doubles, ",
           op == ReduceOp::sum ? "sum" : "max", ") returned ", rc);
  }

  // The core does these with all_reduce (comm.hpp).
  void reduce_scatter(double*, int64_t, void*) override {
    fail(SA_ERR_INTERNAL, "reduce_scatter on a host communicator");
  }
  void all_gather(double*, int64_t, void*) override {
    fail(SA_ERR_INTERNAL, "all_gather on a host communicator");
  }

 private:
  sa_host_comm callbacks_;
};

}  // namespace

std::shared_ptr<Comm> make_host_comm(const sa_host_comm& callbacks) {
  if (callbacks.all_reduce == nullptr)
    fail(SA_ERR_INVALID_ARGUMENT, "callbacks->all_reduce is NULL; a host communicator needs one");
  if (callbacks.nranks < 0 || (callbacks.nranks == 0 && callbacks.rank != 0) ||
      (callbacks.nranks > 0 && (callbacks.rank < 0 || callbacks.rank >= callbacks.nranks)))
    fail(SA_ERR_INVALID_ARGUMENT, "callbacks->rank is ", callbacks.rank, " and ->nranks ",
         callbacks.nranks, "; give 0 <= rank < nranks, or 0 for both (not said)");
  return std::make_shared<HostComm>(callbacks);
}

}  // namespace sa
