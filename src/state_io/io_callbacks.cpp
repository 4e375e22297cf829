// src/state_io/io_callbacks.cpp — the ready sa_writer / sa_reader implementations: a file
// (written atomically) and a memory buffer.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "../errors.hpp"
#include "state_io.hpp"

namespace sa {
namespace {

std::string errno_text() { return std::strerror(errno); }

// ---- file writer ----------------------------------------------------------------------------
// Bytes go to "<path>.tmp.<pid>.<n>" beside the target. Commit makes them durable and then
// visible under the final name: fsync the file, rename it over the target, fsync the
// directory (so the rename itself survives a crash). Until then the target is untouched;
// a writer released without a commit removes its temporary file.

struct FileWriter {
  std::string path;
  std::string temp;
  int fd = -1;
  bool renamed = false;
};

int file_write(void* ctx, const void* data, std::size_t bytes) {
  auto* w = static_cast<FileWriter*>(ctx);
  const auto* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::write(w->fd, p, bytes);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return 1;
    p += n;
    bytes -= static_cast<std::size_t>(n);
  }
  return 0;
}

int file_write_at(void* ctx, uint64_t offset, const void* data, std::size_t bytes) {
  const auto* w = static_cast<const FileWriter*>(ctx);
  const auto* p = static_cast<const char*>(data);
  while (bytes > 0) {  // pwrite: safe from several threads at once
    const ssize_t n = ::pwrite(w->fd, p, bytes, static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return 1;
    p += n;
    offset += static_cast<uint64_t>(n);
    bytes -= static_cast<std::size_t>(n);
  }
  return 0;
}

// The blob's disk space up front, so that a full disk fails before anything is written;
// a file system without fallocate gets the file's size only.
int file_reserve(void* ctx, uint64_t bytes) {
  const auto* w = static_cast<const FileWriter*>(ctx);
  if (bytes == 0) return 0;
  int rc = 0;
  do {
    rc = ::fallocate(w->fd, 0, 0, static_cast<off_t>(bytes));
  } while (rc != 0 && errno == EINTR);
  if (rc == 0) return 0;
  if (errno != EOPNOTSUPP && errno != ENOSYS) return 1;
  return ::ftruncate(w->fd, static_cast<off_t>(bytes)) == 0 ? 0 : 1;
}

int fsync_directory_of(const std::string& path) {
  const std::size_t slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "."
                          : slash == 0               ? "/"
                                                     : path.substr(0, slash);
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return 1;
  const int rc = ::fsync(fd);
  ::close(fd);
  return rc == 0 ? 0 : 1;
}

int file_commit(void* ctx) {
  auto* w = static_cast<FileWriter*>(ctx);
  if (w->fd < 0) return w->renamed ? 0 : 1;
  const bool synced = ::fsync(w->fd) == 0;
  const bool closed = ::close(w->fd) == 0;
  w->fd = -1;
  if (!synced || !closed || ::rename(w->temp.c_str(), w->path.c_str()) != 0) return 1;
  w->renamed = true;
  return fsync_directory_of(w->path);
}

void file_release(void* ctx) {
  auto* w = static_cast<FileWriter*>(ctx);
  if (w->fd >= 0) ::close(w->fd);
  if (!w->renamed) ::unlink(w->temp.c_str());
  delete w;
}

// ---- memory writer ----------------------------------------------------------------------------

// Plain malloc'd bytes: a reservation allocates the blob once without zero-filling it (an
// export then writes every byte exactly once); appends without one grow geometrically.
struct MemoryBlob {
  unsigned char* data = nullptr;
  std::size_t size = 0;      // bytes the blob holds
  std::size_t capacity = 0;  // bytes allocated
  ~MemoryBlob() { std::free(data); }
  bool grow_to(std::size_t bytes) {
    if (bytes <= capacity) return true;
    void* grown = std::realloc(data, bytes);
    if (grown == nullptr) return false;
    data = static_cast<unsigned char*>(grown);
    capacity = bytes;
    return true;
  }
};

int memory_write(void* ctx, const void* data, std::size_t bytes) {
  auto* blob = static_cast<MemoryBlob*>(ctx);
  if (bytes > SIZE_MAX - blob->size) return 1;
  const std::size_t needed = blob->size + bytes;
  if (needed > blob->capacity &&
      !blob->grow_to(std::max(needed, blob->capacity > SIZE_MAX / 2 ? needed : 2 * blob->capacity)))
    return 1;
  std::memcpy(blob->data + blob->size, data, bytes);
  blob->size = needed;
  return 0;
}

// Within the reserved blob only (a reservation sets its size): concurrent calls for
// disjoint ranges touch disjoint bytes and nothing else.
int memory_write_at(void* ctx, uint64_t offset, const void* data, std::size_t bytes) {
  const auto* blob = static_cast<const MemoryBlob*>(ctx);
  if (offset > blob->size || bytes > blob->size - offset) return 1;
  std::memcpy(blob->data + offset, data, bytes);
  return 0;
}

int memory_reserve(void* ctx, uint64_t bytes) {
  auto* blob = static_cast<MemoryBlob*>(ctx);
  if (bytes > SIZE_MAX - blob->size || !blob->grow_to(blob->size + static_cast<std::size_t>(bytes)))
    return 1;
  blob->size += static_cast<std::size_t>(bytes);  // the caller writes them (write_at)
  return 0;
}

void memory_writer_release(void* ctx) { delete static_cast<MemoryBlob*>(ctx); }

// ---- file reader ------------------------------------------------------------------------------

struct FileReader {
  std::string path;
  int fd = -1;
};

int file_read_at(void* ctx, uint64_t offset, void* dst, std::size_t bytes) {
  auto* r = static_cast<FileReader*>(ctx);
  auto* p = static_cast<char*>(dst);
  while (bytes > 0) {
    const ssize_t n = ::pread(r->fd, p, bytes, static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return 1;  // error, or the file shrank under us
    p += n;
    offset += static_cast<uint64_t>(n);
    bytes -= static_cast<std::size_t>(n);
  }
  return 0;
}

void file_reader_release(void* ctx) {
  auto* r = static_cast<FileReader*>(ctx);
  if (r->fd >= 0) ::close(r->fd);
  delete r;
}

// ---- memory reader ----------------------------------------------------------------------------

struct MemoryReader {
  const unsigned char* data;
  std::size_t size;
};

int memory_read_at(void* ctx, uint64_t offset, void* dst, std::size_t bytes) {
  const auto* r = static_cast<const MemoryReader*>(ctx);
  if (offset > r->size || bytes > r->size - offset) return 1;
  if (bytes > 0) std::memcpy(dst, r->data + offset, bytes);
  return 0;
}

void memory_reader_release(void* ctx) { delete static_cast<MemoryReader*>(ctx); }

std::atomic<uint64_t> g_temp_counter{0};

}  // namespace

sa_writer make_file_writer(const char* path) {
  if (path == nullptr || path[0] == '\0') fail(SA_ERR_INVALID_ARGUMENT, "path is NULL or empty");
  auto w = std::make_unique<FileWriter>();
  w->path = path;
  w->temp = concat(path, ".tmp.", ::getpid(), ".", g_temp_counter.fetch_add(1));
  w->fd = ::open(w->temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
  if (w->fd < 0)
    fail(SA_ERR_IO, "cannot create '", w->temp, "' (beside '", path, "'): ", errno_text());
  sa_writer out = SA_WRITER_INIT;
  out.ctx = w.release();
  out.write = file_write;
  out.write_at = file_write_at;
  out.reserve = file_reserve;
  out.commit = file_commit;
  out.release = file_release;
  return out;
}

sa_writer make_memory_writer() {
  sa_writer out = SA_WRITER_INIT;
  out.ctx = new MemoryBlob();
  out.write = memory_write;
  out.write_at = memory_write_at;
  out.reserve = memory_reserve;
  out.release = memory_writer_release;
  return out;
}

void memory_writer_data(const sa_writer& writer, const void** data, std::size_t* size) {
  if (writer.write != memory_write || writer.ctx == nullptr)
    fail(SA_ERR_INVALID_ARGUMENT,
         "writer is not a memory writer made by sa_memory_writer (or was released)");
  const auto* blob = static_cast<const MemoryBlob*>(writer.ctx);
  *data = blob->data;
  *size = blob->size;
}

sa_reader make_file_reader(const char* path) {
  if (path == nullptr || path[0] == '\0') fail(SA_ERR_INVALID_ARGUMENT, "path is NULL or empty");
  auto r = std::make_unique<FileReader>();
  r->path = path;
  r->fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (r->fd < 0) fail(SA_ERR_IO, "cannot open '", path, "': ", errno_text());
  struct stat st {};
  if (::fstat(r->fd, &st) != 0) {
    const std::string why = errno_text();
    ::close(r->fd);
    fail(SA_ERR_IO, "cannot stat '", path, "': ", why);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(r->fd);
    fail(SA_ERR_IO, "'", path, "' is not a regular file");
  }
  sa_reader out = SA_READER_INIT;
  out.size = static_cast<uint64_t>(st.st_size);
  out.read_at = file_read_at;
  out.concurrent = 1;  // pread
  out.release = file_reader_release;
  out.name = r->path.c_str();
  out.ctx = r.release();
  return out;
}

sa_reader make_memory_reader(const void* data, std::size_t size) {
  if (data == nullptr && size > 0) fail(SA_ERR_INVALID_ARGUMENT, "data is NULL but size is ", size);
  sa_reader out = SA_READER_INIT;
  out.ctx = new MemoryReader{static_cast<const unsigned char*>(data), size};
  out.size = size;
  out.read_at = memory_read_at;
  out.concurrent = 1;
  out.release = memory_reader_release;
  return out;
}

}  // namespace sa
