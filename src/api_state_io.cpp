// src/api_state_io.cpp — the C ABI of shard files (export, import, inspection, readers and
// writers). Thin, as api.cpp: argument checks, then the core in src/state_io/.
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "api_support.hpp"
#include "options.hpp"
#include "state_io/blob.hpp"
#include "state_io/state_io.hpp"

namespace {

using sa::api::guarded;
using sa::api::require;
using sa::api::with_optimizer;

std::vector<sa::BlobReader> blob_readers(int32_t n, const sa_reader* const* readers) {
  require(n >= 0, "n is negative");
  require(n == 0 || readers != nullptr, "readers is NULL");
  std::vector<sa::BlobReader> out;
  out.reserve(static_cast<std::size_t>(n));
  for (int32_t i = 0; i < n; ++i) out.emplace_back(readers[i], i);
  return out;
}

}  // namespace

// An async export's handle: the job, and its failure's text once wait or poll saw it.
struct sa_export_job {
  std::shared_ptr<sa::ExportJob> core;
  std::string last_error;
  sa_status status = SA_OK;
  bool ended = false;  // status and last_error hold the job's outcome
  std::mutex mutex;    // wait and poll may come from several threads
};

namespace {

// The job's outcome (it has ended), kept on the handle the first time it is asked.
sa_status job_outcome(sa_export_job* job) {
  std::lock_guard<std::mutex> lock(job->mutex);
  if (!job->ended) {
    job->status = sa::api::guarded_with(
        [&](sa_status status, const char* what) {
          job->last_error = std::string("sa_optimizer_export_async: ") + what;
          return status;
        },
        [&] { job->core->wait(); });
    job->ended = true;
  }
  return job->status;
}

}  // namespace

extern "C" {

sa_status sa_file_writer(const char* path, sa_writer* out) {
  return guarded(nullptr, "sa_file_writer", [&] {
    require(out != nullptr, "out is NULL");
    *out = sa::make_file_writer(path);
  });
}

sa_status sa_memory_writer(sa_writer* out) {
  return guarded(nullptr, "sa_memory_writer", [&] {
    require(out != nullptr, "out is NULL");
    *out = sa::make_memory_writer();
  });
}

sa_status sa_memory_writer_data(const sa_writer* writer, const void** data, size_t* size) {
  return guarded(nullptr, "sa_memory_writer_data", [&] {
    require(writer != nullptr && data != nullptr && size != nullptr,
            "writer, data or size is NULL");
    sa::memory_writer_data(*writer, data, size);
  });
}

sa_status sa_file_reader(const char* path, sa_reader* out) {
  return guarded(nullptr, "sa_file_reader", [&] {
    require(out != nullptr, "out is NULL");
    *out = sa::make_file_reader(path);
  });
}

sa_status sa_memory_reader(const void* data, size_t size, sa_reader* out) {
  return guarded(nullptr, "sa_memory_reader", [&] {
    require(out != nullptr, "out is NULL");
    *out = sa::make_memory_reader(data, size);
  });
}

void sa_writer_release(sa_writer* writer) {
  if (writer == nullptr) return;
  if (writer->release != nullptr) writer->release(writer->ctx);
  writer->ctx = nullptr;
  writer->write = nullptr;
  writer->commit = nullptr;
  writer->release = nullptr;
  writer->write_at = nullptr;
  writer->reserve = nullptr;
}

void sa_reader_release(sa_reader* reader) {
  if (reader == nullptr) return;
  if (reader->release != nullptr) reader->release(reader->ctx);
  reader->ctx = nullptr;
  reader->size = 0;
  reader->read_at = nullptr;
  reader->release = nullptr;
  reader->name = nullptr;
  reader->concurrent = 0;
}

sa_status sa_optimizer_export(sa_optimizer* opt, const sa_writer* writer) {
  return with_optimizer(opt, "sa_optimizer_export", [&] { sa::export_state(opt->core, writer); });
}

sa_status sa_optimizer_export_async(sa_optimizer* opt, const sa_writer* writer,
                                    sa_export_job** job) {
  if (job != nullptr) *job = nullptr;
  return with_optimizer(opt, "sa_optimizer_export_async", [&] {
    require(job != nullptr, "job is NULL");
    auto handle = std::make_unique<sa_export_job>();
    handle->core = sa::export_state_async(opt->core, writer);
    *job = handle.release();
  });
}

sa_status sa_export_job_wait(sa_export_job* job) {
  if (job == nullptr)
    return sa::api::record(nullptr, "sa_export_job_wait", SA_ERR_INVALID_ARGUMENT, "job is NULL");
  return job_outcome(job);
}

sa_status sa_export_job_poll(sa_export_job* job, int32_t* done) {
  if (done != nullptr) *done = 0;
  if (job == nullptr || done == nullptr)
    return sa::api::record(nullptr, "sa_export_job_poll", SA_ERR_INVALID_ARGUMENT,
                           "job or done is NULL");
  if (!job->core->done()) return SA_OK;
  *done = 1;
  return job_outcome(job);
}

const char* sa_export_job_last_error(const sa_export_job* job) {
  return job == nullptr ? "" : job->last_error.c_str();
}

void sa_export_job_release(sa_export_job* job) {
  if (job == nullptr) return;
  job->core->join();
  delete job;
}

sa_status sa_optimizer_import(sa_optimizer* opt, int32_t n, const sa_reader* const* readers,
                              const sa_import_options* options) {
  return with_optimizer(opt, "sa_optimizer_import", [&] {
    const sa_import_options defaults = SA_IMPORT_OPTIONS_INIT;
    const sa_import_options o = sa::read_options(options, defaults, "options");
    sa::import_state(opt->core, blob_readers(n, readers), o);
  });
}

sa_status sa_inspect(int32_t n, const sa_reader* const* readers, int32_t verify_data,
                     char** report_json) {
  if (report_json != nullptr) *report_json = nullptr;
  return guarded(nullptr, "sa_inspect", [&] {
    require(report_json != nullptr, "report_json is NULL");
    require(verify_data == 0 || verify_data == 1, "verify_data must be 0 or 1");
    // A report on nothing would say "ok": a glob that matched no file must not pass.
    require(n != 0, "n is 0: there are no shard files to inspect");
    const std::string report = sa::inspect_shards(blob_readers(n, readers), verify_data != 0);
    char* out = static_cast<char*>(std::malloc(report.size() + 1));
    if (out == nullptr) throw std::bad_alloc();
    std::memcpy(out, report.c_str(), report.size() + 1);
    *report_json = out;
  });
}

void sa_free(void* p) { std::free(p); }

}  // extern "C"
