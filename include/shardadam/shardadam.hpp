// shardadam.hpp — a header-only C++17 wrapper over the C ABI (shardadam.h).
//
// It adds RAII and exceptions and nothing else: every member calls one C function, and a
// failing call throws shardadam::Error carrying the status and the message the library
// kept for it. Semantics (ownership, threading, what a failure leaves unchanged) are those
// of the C function named in each comment; read shardadam.h for the details.
//
//   shardadam::Optimizer opt;
//   const int32_t group = opt.add_group(shardadam::default_group_config());
//   const int64_t w = opt.add_param("layers.0.w", group, shard, &layout);
//   opt.set_grad(w, grad);
//   opt.step();
#ifndef SHARDADAM_HPP_
#define SHARDADAM_HPP_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <iterator>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "shardadam/shardadam.h"

namespace shardadam {

// A failed shardadam call: the C status plus the library's message ("which function,
// which param, what was expected, what arrived"). what() is "<message> (<status name>)".
class Error : public std::runtime_error {
 public:
  Error(sa_status status, const std::string& message)
      : std::runtime_error(message + " (" + sa_status_string(status) + ")"),
        status_(status),
        message_(message) {}

  // The sa_status the C call returned (never SA_OK).
  sa_status status() const noexcept { return status_; }
  // The library's message alone, without the status name.
  const std::string& message() const noexcept { return message_; }

 private:
  sa_status status_;
  std::string message_;
};

namespace detail {

// Throws for a failed call on `opt`; the message is read right away, before any other
// call on the handle could replace it. A NULL handle reads the thread-local message.
inline void check(sa_status status, const sa_optimizer* opt) {
  if (status != SA_OK) throw Error(status, sa_optimizer_last_error(opt));
}

}  // namespace detail

// ---- version and defaults ---------------------------------------------------------------

// sa_version(): the version of the loaded library, as SA_VERSION_NUMBER.
inline int version() { return sa_version(); }

// sa_build_info(): the version and the backends compiled in.
inline const char* build_info() { return sa_build_info(); }

// The option structs initialized by their SA_*_INIT macros.
inline sa_optimizer_config default_optimizer_config() {
  sa_optimizer_config config = SA_OPTIMIZER_CONFIG_INIT;
  return config;
}
inline sa_group_config default_group_config() {
  sa_group_config config = SA_GROUP_CONFIG_INIT;
  return config;
}
inline sa_param_options default_param_options() {
  sa_param_options options = SA_PARAM_OPTIONS_INIT;
  return options;
}
inline sa_layout default_layout() {
  sa_layout layout = SA_LAYOUT_INIT;
  return layout;
}
inline sa_step_args default_step_args() {
  sa_step_args args = SA_STEP_ARGS_INIT;
  return args;
}

// ---- communicators --------------------------------------------------------------------------

// One reference to a communicator (sa_comm); the optimizers it is given keep their own.
class Comm {
 public:
  // In-place all-reduce of `count` doubles across all ranks; true on success. An
  // exception thrown from it counts as a failure (the step fails with SA_ERR_COMM).
  using AllReduce = std::function<bool(double* values, int32_t count, sa_reduce_op op)>;

  // sa_comm_create_host(): a communicator that calls `all_reduce` on the stepping thread.
  static Comm host(AllReduce all_reduce) {
    auto* fn = new AllReduce(std::move(all_reduce));
    sa_host_comm callbacks = SA_HOST_COMM_INIT;
    callbacks.ctx = fn;
    callbacks.all_reduce = [](void* ctx, double* values, int32_t count, sa_reduce_op op) -> int {
      try {
        return (*static_cast<AllReduce*>(ctx))(values, count, op) ? 0 : 1;
      } catch (...) {
        return 1;
      }
    };
    callbacks.release = [](void* ctx) { delete static_cast<AllReduce*>(ctx); };
    Comm comm;
    const sa_status status = sa_comm_create_host(&callbacks, &comm.handle_);
    if (status != SA_OK) {
      delete fn;  // not taken: release is called only for a created communicator
      detail::check(status, nullptr);
    }
    return comm;
  }
  // sa_nccl_unique_id_create(): rank 0 makes it, the others receive its bytes.
  static sa_nccl_unique_id nccl_unique_id() {
    sa_nccl_unique_id id{};
    detail::check(sa_nccl_unique_id_create(&id), nullptr);
    return id;
  }
  // sa_comm_create_nccl(): collective over `nranks` ranks.
  static Comm nccl(const sa_nccl_unique_id& id, int32_t nranks, int32_t rank, int32_t device) {
    Comm comm;
    detail::check(sa_comm_create_nccl(&id, nranks, rank, device, &comm.handle_), nullptr);
    return comm;
  }
  // sa_comm_wrap_nccl(): borrows the caller's ncclComm_t.
  static Comm wrap_nccl(void* nccl_comm) {
    Comm comm;
    detail::check(sa_comm_wrap_nccl(nccl_comm, &comm.handle_), nullptr);
    return comm;
  }

  Comm(Comm&& other) noexcept : handle_(std::exchange(other.handle_, nullptr)) {}
  Comm& operator=(Comm&& other) noexcept {
    if (this != &other) {
      sa_comm_destroy(handle_);
      handle_ = std::exchange(other.handle_, nullptr);
    }
    return *this;
  }
  Comm(const Comm&) = delete;
  Comm& operator=(const Comm&) = delete;
  ~Comm() { sa_comm_destroy(handle_); }

  sa_comm* get() const noexcept { return handle_; }

 private:
  Comm() = default;
  sa_comm* handle_ = nullptr;
};

// ---- shard files ---------------------------------------------------------------------------

// Where an export's bytes go (sa_writer), released with this object.
class Writer {
 public:
  // sa_file_writer(): a temporary file beside `path`, renamed over it at commit.
  static Writer file(const std::string& path) {
    Writer w;
    detail::check(sa_file_writer(path.c_str(), &w.writer_), nullptr);
    return w;
  }
  // sa_memory_writer(): a growing buffer, read with data().
  static Writer memory() {
    Writer w;
    detail::check(sa_memory_writer(&w.writer_), nullptr);
    return w;
  }
  // A writer you filled yourself (your callbacks); this object releases it.
  explicit Writer(const sa_writer& callbacks) : writer_(callbacks) {}

  Writer(Writer&& other) noexcept : writer_(std::exchange(other.writer_, empty())) {}
  Writer& operator=(Writer&& other) noexcept {
    if (this != &other) {
      sa_writer_release(&writer_);
      writer_ = std::exchange(other.writer_, empty());
    }
    return *this;
  }
  Writer(const Writer&) = delete;
  Writer& operator=(const Writer&) = delete;
  ~Writer() { sa_writer_release(&writer_); }

  // sa_memory_writer_data(): the bytes a memory writer holds (a copy).
  std::vector<unsigned char> data() const {
    const void* bytes = nullptr;
    std::size_t size = 0;
    detail::check(sa_memory_writer_data(&writer_, &bytes, &size), nullptr);
    const auto* begin = static_cast<const unsigned char*>(bytes);
    return std::vector<unsigned char>(begin, begin + size);
  }
  const sa_writer* get() const noexcept { return &writer_; }

 private:
  Writer() : writer_(empty()) {}
  static sa_writer empty() {
    sa_writer w = SA_WRITER_INIT;
    return w;
  }
  sa_writer writer_;
};

// Where an import's bytes come from (sa_reader), released with this object.
class Reader {
 public:
  // sa_file_reader(): opens `path` now.
  static Reader file(const std::string& path) {
    Reader r;
    detail::check(sa_file_reader(path.c_str(), &r.reader_), nullptr);
    return r;
  }
  // sa_memory_reader(): `size` bytes at `data`, borrowed (they must outlive the reader).
  static Reader memory(const void* data, std::size_t size) {
    Reader r;
    detail::check(sa_memory_reader(data, size, &r.reader_), nullptr);
    return r;
  }
  // A reader you filled yourself (your callbacks); this object releases it.
  explicit Reader(const sa_reader& callbacks) : reader_(callbacks) {}

  Reader(Reader&& other) noexcept : reader_(std::exchange(other.reader_, empty())) {}
  Reader& operator=(Reader&& other) noexcept {
    if (this != &other) {
      sa_reader_release(&reader_);
      reader_ = std::exchange(other.reader_, empty());
    }
    return *this;
  }
  Reader(const Reader&) = delete;
  Reader& operator=(const Reader&) = delete;
  ~Reader() { sa_reader_release(&reader_); }

  const sa_reader* get() const noexcept { return &reader_; }

 private:
  Reader() : reader_(empty()) {}
  static sa_reader empty() {
    sa_reader r = SA_READER_INIT;
    return r;
  }
  sa_reader reader_;
};

inline sa_import_options default_import_options() {
  sa_import_options options = SA_IMPORT_OPTIONS_INIT;
  return options;
}

// An async export in flight (sa_optimizer_export_async): owns the job and its writer,
// and releases the job (waiting for it) before the writer.
class ExportJob {
 public:
  ExportJob(ExportJob&& other) noexcept
      : job_(std::exchange(other.job_, nullptr)), writer_(std::move(other.writer_)) {}
  ExportJob& operator=(ExportJob&& other) noexcept {
    if (this != &other) {
      sa_export_job_release(job_);
      job_ = std::exchange(other.job_, nullptr);
      writer_ = std::move(other.writer_);
    }
    return *this;
  }
  ExportJob(const ExportJob&) = delete;
  ExportJob& operator=(const ExportJob&) = delete;
  ~ExportJob() { sa_export_job_release(job_); }

  // sa_export_job_wait(): blocks until the blob is committed; throws Error when the export
  // failed.
  void wait() {
    const sa_status status = sa_export_job_wait(job_);
    if (status != SA_OK) throw Error(status, sa_export_job_last_error(job_));
  }
  // sa_export_job_poll(): whether it has ended; throws Error when it ended in failure.
  bool done() {
    int32_t ended = 0;
    const sa_status status = sa_export_job_poll(job_, &ended);
    if (status != SA_OK) throw Error(status, sa_export_job_last_error(job_));
    return ended != 0;
  }
  // The writer the bytes went to (e.g. a memory writer's data(), once wait() returned).
  const Writer& writer() const noexcept { return writer_; }

 private:
  friend class Optimizer;
  ExportJob(sa_export_job* job, Writer writer) : job_(job), writer_(std::move(writer)) {}
  sa_export_job* job_;
  Writer writer_;
};

namespace detail {
inline std::vector<const sa_reader*> reader_list(const std::vector<Reader>& readers) {
  std::vector<const sa_reader*> list;
  list.reserve(readers.size());
  for (const Reader& r : readers) list.push_back(r.get());
  return list;
}
}  // namespace detail

// sa_inspect(): the JSON report of what a set of shard files holds.
inline std::string inspect(const std::vector<Reader>& readers, bool verify_data = true) {
  const std::vector<const sa_reader*> list = detail::reader_list(readers);
  char* report = nullptr;
  detail::check(
      sa_inspect(static_cast<int32_t>(list.size()), list.data(), verify_data ? 1 : 0, &report),
      nullptr);
  std::string out(report != nullptr ? report : "");
  sa_free(report);
  return out;
}

// ---- layouts ------------------------------------------------------------------------------

// This rank's box in a mesh-form layout.
struct Box {
  std::vector<int64_t> local_shape;
  std::vector<int64_t> global_offset;
};

// sa_layout_local_box(): resolves a mesh-form layout to this rank's box.
inline Box local_box(const sa_layout& layout) {
  const std::size_t ndim = layout.ndim > 0 ? static_cast<std::size_t>(layout.ndim) : 0;
  Box box{std::vector<int64_t>(ndim), std::vector<int64_t>(ndim)};
  detail::check(sa_layout_local_box(&layout, box.local_shape.data(), box.global_offset.data()),
                nullptr);
  return box;
}

// ---- state views --------------------------------------------------------------------------

// Owns a DLManagedTensorVersioned handed out by sa_optimizer_state_view and calls its
// deleter when destroyed. The memory stays valid while the view lives, even after the
// optimizer is gone. Writes through it change the optimizer's state. Move-only.
class StateView {
 public:
  StateView() = default;
  explicit StateView(DLManagedTensorVersioned* managed) noexcept : managed_(managed) {}
  StateView(StateView&& other) noexcept : managed_(std::exchange(other.managed_, nullptr)) {}
  StateView& operator=(StateView&& other) noexcept {
    if (this != &other) {
      reset();
      managed_ = std::exchange(other.managed_, nullptr);
    }
    return *this;
  }
  StateView(const StateView&) = delete;
  StateView& operator=(const StateView&) = delete;
  ~StateView() { reset(); }

  // The tensor: local shape of the param, storage dtype of the state, C-contiguous.
  const DLTensor& tensor() const noexcept { return managed_->dl_tensor; }
  // The first element, typed by the caller (float for fp32 states, uint16_t for bfloat16,
  // int16_t for the remainder).
  template <class T>
  T* data() const noexcept {
    return reinterpret_cast<T*>(static_cast<char*>(managed_->dl_tensor.data) +
                                managed_->dl_tensor.byte_offset);
  }
  // Number of elements.
  int64_t numel() const noexcept {
    int64_t n = 1;
    for (int32_t d = 0; d < managed_->dl_tensor.ndim; ++d) n *= managed_->dl_tensor.shape[d];
    return n;
  }
  // The managed tensor, still owned by this view.
  DLManagedTensorVersioned* get() const noexcept { return managed_; }
  // Gives up ownership (e.g. to hand the tensor to another DLPack consumer, which must
  // then call its deleter).
  DLManagedTensorVersioned* release() noexcept { return std::exchange(managed_, nullptr); }
  explicit operator bool() const noexcept { return managed_ != nullptr; }

  // Calls the deleter now; the view becomes empty.
  void reset() noexcept {
    DLManagedTensorVersioned* managed = std::exchange(managed_, nullptr);
    if (managed != nullptr && managed->deleter != nullptr) managed->deleter(managed);
  }

 private:
  DLManagedTensorVersioned* managed_ = nullptr;
};

// ---- the optimizer --------------------------------------------------------------------------

// Owns an sa_optimizer (sa_optimizer_destroy in the destructor). Move-only; a moved-from
// Optimizer holds no handle and may only be destroyed or assigned to. Like the handle,
// one Optimizer must not be used by two threads at once.
class Optimizer {
 public:
  // sa_optimizer_create() with the default config.
  Optimizer() : Optimizer(default_optimizer_config()) {}
  // sa_optimizer_create() with `config` (start from default_optimizer_config()).
  explicit Optimizer(const sa_optimizer_config& config) {
    detail::check(sa_optimizer_create(&config, &handle_), nullptr);
  }
  Optimizer(Optimizer&& other) noexcept : handle_(std::exchange(other.handle_, nullptr)) {}
  Optimizer& operator=(Optimizer&& other) noexcept {
    if (this != &other) {
      sa_optimizer_destroy(handle_);
      handle_ = std::exchange(other.handle_, nullptr);
    }
    return *this;
  }
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;
  // sa_optimizer_destroy(): frees the state and calls the deleters of owned shards.
  ~Optimizer() { sa_optimizer_destroy(handle_); }

  // The C handle, still owned by this object (for calls the wrapper does not cover).
  sa_optimizer* get() const noexcept { return handle_; }
  // sa_optimizer_last_error(): the message of the last failed call ("" if none).
  const char* last_error() const { return sa_optimizer_last_error(handle_); }

  // -- groups --

  // sa_optimizer_add_group(): appends a group, returns its index.
  int32_t add_group(const sa_group_config& config) {
    int32_t group = -1;
    detail::check(sa_optimizer_add_group(handle_, &config, &group), handle_);
    return group;
  }
  // sa_optimizer_num_groups().
  int32_t num_groups() const { return sa_optimizer_num_groups(handle_); }
  // sa_optimizer_get_group(): the group's hyperparameters.
  sa_group_config group(int32_t group) const {
    sa_group_config config = SA_GROUP_CONFIG_INIT;
    detail::check(sa_optimizer_get_group(handle_, group, &config), handle_);
    return config;
  }
  // sa_optimizer_set_group(): replaces the group's hyperparameters.
  void set_group(int32_t group, const sa_group_config& config) {
    detail::check(sa_optimizer_set_group(handle_, group, &config), handle_);
  }
  // sa_optimizer_set_lr(): sets only the group's learning rate.
  void set_lr(int32_t group, double lr) {
    detail::check(sa_optimizer_set_lr(handle_, group, lr), handle_);
  }
  // sa_optimizer_get_step(): the group's step count.
  int64_t step_count(int32_t group) const {
    int64_t step = 0;
    detail::check(sa_optimizer_get_step(handle_, group, &step), handle_);
    return step;
  }
  // sa_optimizer_set_step(): sets the group's step count and those of its params.
  void set_step_count(int32_t group, int64_t step) {
    detail::check(sa_optimizer_set_step(handle_, group, step), handle_);
  }

  // -- params --

  // sa_optimizer_add_param(): registers a local shard; returns the param's index. On
  // success the optimizer owns `local_shard` (it calls the deleter); when this throws the
  // caller still owns it. `layout` NULL: not sharded; `options` NULL: defaults.
  int64_t add_param(const std::string& name, int32_t group, DLManagedTensorVersioned* local_shard,
                    const sa_layout* layout = nullptr, const sa_param_options* options = nullptr) {
    int64_t param = -1;
    detail::check(
        sa_optimizer_add_param(handle_, name.c_str(), group, local_shard, layout, options, &param),
        handle_);
    return param;
  }
  // sa_optimizer_add_param_legacy(): the same for a pre-1.0 DLManagedTensor.
  int64_t add_param(const std::string& name, int32_t group, DLManagedTensor* local_shard,
                    const sa_layout* layout = nullptr, const sa_param_options* options = nullptr) {
    int64_t param = -1;
    detail::check(sa_optimizer_add_param_legacy(handle_, name.c_str(), group, local_shard, layout,
                                                options, &param),
                  handle_);
    return param;
  }
  // sa_optimizer_num_params().
  int64_t num_params() const { return sa_optimizer_num_params(handle_); }
  // sa_optimizer_find_param(): the index of the param called `name`.
  int64_t find_param(const std::string& name) const {
    int64_t param = -1;
    detail::check(sa_optimizer_find_param(handle_, name.c_str(), &param), handle_);
    return param;
  }
  // sa_optimizer_param_info(): its pointers stay valid until the optimizer is destroyed.
  sa_param_info param_info(int64_t param) const {
    sa_param_info info = SA_PARAM_INFO_INIT;
    detail::check(sa_optimizer_param_info(handle_, param, &info), handle_);
    return info;
  }

  // -- grads --
  //
  // A param either has a grad at the next steps or has none (steps skip it: its values,
  // state and step count stay, as torch skips a param whose .grad is None). A param never
  // given either since it was added makes step() throw (SA_ERR_STATE). Every call below
  // except set_grad_ptrs_unchecked has the library check each grad it binds.

  // sa_optimizer_set_grad(): binds one param's grad, checked (dtype, local shape, device,
  // C-contiguous strides, alignment); only the data pointer is kept.
  void set_grad(int64_t param, const DLTensor& grad) {
    detail::check(sa_optimizer_set_grad(handle_, param, &grad), handle_);
  }
  // sa_optimizer_set_grads(): binds every param's grad in one call, grads[i] for param i,
  // n == num_params(); nullptr means "param i has no grad". Each is checked as set_grad
  // checks it; all-or-nothing (on a throw no binding changed, and the message names the
  // first param that failed).
  void set_grads(const DLTensor* const* grads, int64_t n) {
    detail::check(sa_optimizer_set_grads(handle_, n, grads), handle_);
  }
  // The same from any contiguous container of `const DLTensor*` (std::vector, std::array).
  template <class Container>
  void set_grads(const Container& grads) {
    const DLTensor* const* data = std::data(grads);
    set_grads(data, static_cast<int64_t>(std::size(grads)));
  }
  // sa_optimizer_clear_grad(): param has no grad; later steps skip it until one is bound.
  void clear_grad(int64_t param) {
    detail::check(sa_optimizer_clear_grad(handle_, param), handle_);
  }
  // sa_optimizer_set_grad_ptrs(): UNCHECKED. Binds every param's grad from raw data
  // pointers, ptrs[i] for param i (SA_NO_GRAD: no grad). It trusts the caller: a pointer
  // to anything but a C-contiguous tensor of the param's grad dtype and local shape makes
  // the step read outside it. For engines whose grads live in buffers they laid out
  // themselves; hand user tensors to set_grad / set_grads instead.
  void set_grad_ptrs_unchecked(const void* const* ptrs, int64_t n) {
    detail::check(sa_optimizer_set_grad_ptrs(handle_, n, ptrs), handle_);
  }

  // -- per-param step counts --

  // sa_optimizer_get_param_steps(): the step counts of params [first, first + n), the
  // counts their bias correction uses (torch's state[p]["step"]).
  std::vector<int64_t> param_steps(int64_t first, int64_t n) const {
    // Never an empty buffer: a bad n must reach the library's range check, not "NULL".
    std::vector<int64_t> steps(n > 0 ? static_cast<std::size_t>(n) : 1);
    detail::check(sa_optimizer_get_param_steps(handle_, first, n, steps.data()), handle_);
    steps.resize(static_cast<std::size_t>(n));
    return steps;
  }
  // Every param's step count, in param order.
  std::vector<int64_t> param_steps() const { return param_steps(0, num_params()); }
  // sa_optimizer_set_param_steps(): replaces the counts of params
  // [first, first + steps.size()) (all checked first; nothing changes on a throw).
  void set_param_steps(int64_t first, const std::vector<int64_t>& steps) {
    detail::check(sa_optimizer_set_param_steps(handle_, first, static_cast<int64_t>(steps.size()),
                                               steps.data()),
                  handle_);
  }

  // -- step --

  // sa_optimizer_step(): one step over every param. `args` NULL: no loss scale, no
  // found-inf flag, no clipping (set args.max_grad_norm to clip). The CPU backend ignores `stream`
  // and returns when the step is done.
  void step(const sa_step_args* args = nullptr, void* stream = nullptr) {
    detail::check(sa_optimizer_step(handle_, args, stream), handle_);
  }

  // sa_optimizer_step_params(): a partial step of `params` (indices) only; the others stay
  // as they are. Per-param counts advance, group counts do not; no clipping.
  void step_params(const std::vector<int64_t>& params, const sa_step_args* args = nullptr,
                   void* stream = nullptr) {
    detail::check(sa_optimizer_step_params(handle_, static_cast<int64_t>(params.size()),
                                           params.data(), args, stream),
                  handle_);
  }

  // -- shard files --

  // sa_optimizer_export(): this rank's state as one shard file, through `writer`.
  void export_state(const Writer& writer) {
    detail::check(sa_optimizer_export(handle_, writer.get()), handle_);
  }
  // sa_optimizer_export() to the file at `path` (written atomically).
  void export_state(const std::string& path) { export_state(Writer::file(path)); }
  // sa_optimizer_export_async(): returns once the state is snapshotted; the job writes it
  // through `writer` (which it keeps) on a thread of the library's. Steps may follow at once.
  ExportJob export_async(Writer writer) {
    sa_export_job* job = nullptr;
    detail::check(sa_optimizer_export_async(handle_, writer.get(), &job), handle_);
    return ExportJob(job, std::move(writer));
  }
  // sa_optimizer_export_async() to the file at `path` (renamed into place when it ends).
  ExportJob export_async(const std::string& path) { return export_async(Writer::file(path)); }

  // sa_optimizer_import(): loads the shard files of every rank of a checkpoint into this
  // optimizer's layout (start `options` from default_import_options()).
  void import_state(const std::vector<Reader>& readers,
                    const sa_import_options& options = default_import_options()) {
    const std::vector<const sa_reader*> list = detail::reader_list(readers);
    detail::check(
        sa_optimizer_import(handle_, static_cast<int32_t>(list.size()), list.data(), &options),
        handle_);
  }
  // sa_optimizer_import() from files.
  void import_state(const std::vector<std::string>& paths,
                    const sa_import_options& options = default_import_options()) {
    std::vector<Reader> readers;
    readers.reserve(paths.size());
    for (const std::string& path : paths) readers.push_back(Reader::file(path));
    import_state(readers, options);
  }

  // sa_optimizer_set_comm(): the communicator of later steps (the optimizer keeps a
  // reference, so `comm` may be destroyed first).
  void set_comm(const Comm& comm) {
    detail::check(sa_optimizer_set_comm(handle_, comm.get()), handle_);
  }
  // sa_optimizer_set_comm(opt, NULL): steps become rank-local again.
  void clear_comm() { detail::check(sa_optimizer_set_comm(handle_, nullptr), handle_); }

  // -- state --

  // sa_optimizer_state_view(): a zero-copy, writable view of a state ("exp_avg",
  // "exp_avg_sq", "max_exp_avg_sq", "master", "remainder").
  StateView state_view(int64_t param, const std::string& key) {
    DLManagedTensorVersioned* managed = nullptr;
    detail::check(sa_optimizer_state_view(handle_, param, key.c_str(), &managed), handle_);
    return StateView(managed);
  }

 private:
  sa_optimizer* handle_ = nullptr;
};

}  // namespace shardadam

#endif  // SHARDADAM_HPP_
