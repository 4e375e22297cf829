// src/state_io/blob.hpp — the caller's sa_reader / sa_writer callback tables, checked once
// and wrapped so that every failure becomes an sa::Error naming the blob.
#ifndef SHARDADAM_SRC_STATE_IO_BLOB_HPP_
#define SHARDADAM_SRC_STATE_IO_BLOB_HPP_

#include <cstddef>
#include <cstdint>
#include <string>

#include "shardadam/shardadam.h"

namespace sa {

class BlobReader {
 public:
  // Validates `reader` (struct_size, read_at); `index` is its position in the caller's
  // list and names it in messages together with reader.name.
  BlobReader(const sa_reader* reader, int32_t index);

  // "blob 2 ('ckpt/rank2.safetensors')", or "blob 2" for a reader without a name.
  const std::string& name() const { return name_; }
  uint64_t size() const { return reader_.size; }

  // Reads exactly `bytes` bytes at `offset`; SA_ERR_FORMAT if the range is outside the
  // blob, SA_ERR_IO if the callback fails. `what` says what was being read, for the message.
  void read(uint64_t offset, void* dst, std::size_t bytes, const char* what) const;

  // Whether read_at may be called from several threads at once (sa_reader.concurrent).
  bool concurrent() const { return reader_.concurrent == 1; }
  // What try_read found.
  enum class ReadResult { ok, outside, failed };
  // read() for pool workers: returns instead of throwing; read_failed reports the result.
  ReadResult try_read(uint64_t offset, void* dst, std::size_t bytes) const;
  [[noreturn]] void read_failed(ReadResult result, uint64_t offset, std::size_t bytes,
                                const char* what) const;

 private:
  sa_reader reader_;
  std::string name_;
};

class BlobWriter {
 public:
  explicit BlobWriter(const sa_writer* writer);

  // Calls reserve (if any) with the blob's size; SA_ERR_IO when it fails.
  void reserve(uint64_t bytes);
  // Whether the writer takes positioned writes (write_at): then write() is never called.
  bool positional() const { return writer_.write_at != nullptr; }
  // Appends; SA_ERR_IO when the callback fails.
  void write(const void* data, std::size_t bytes);
  // Writes at `offset` (positional() only). Safe to call from several threads at once for
  // disjoint ranges; returns the callback's status instead of throwing (pool workers call
  // it), so the caller reports a failure with write_at_failed().
  int write_at(uint64_t offset, const void* data, std::size_t bytes) const {
    return bytes == 0 ? 0 : writer_.write_at(writer_.ctx, offset, data, bytes);
  }
  [[noreturn]] static void write_at_failed(uint64_t offset, std::size_t bytes);
  // Calls commit (if any); SA_ERR_IO when it fails.
  void commit();

 private:
  sa_writer writer_;
  uint64_t written_ = 0;  // appended so far, or the reserved size of a positional blob
};

}  // namespace sa

#endif  // SHARDADAM_SRC_STATE_IO_BLOB_HPP_
