#include "blob.hpp"

#include "../errors.hpp"
#include "../options.hpp"

namespace sa {

BlobReader::BlobReader(const sa_reader* reader, int32_t index) {
  name_ = concat("blob ", index);
  if (reader == nullptr) fail(SA_ERR_INVALID_ARGUMENT, name_, ": the reader is NULL");
  const sa_reader defaults = SA_READER_INIT;
  reader_ = read_options(reader, defaults, name_.c_str());
  if (reader_.read_at == nullptr)
    fail(SA_ERR_INVALID_ARGUMENT, name_, ": read_at is NULL (released reader?)");
  if (reader_.concurrent != 0 && reader_.concurrent != 1)
    fail(SA_ERR_INVALID_ARGUMENT, name_, ": concurrent is ", reader_.concurrent,
         "; it must be 0 or 1");
  if (reader_.name != nullptr) name_ += concat(" ('", reader_.name, "')");
}

BlobReader::ReadResult BlobReader::try_read(uint64_t offset, void* dst, std::size_t bytes) const {
  if (bytes == 0) return ReadResult::ok;
  if (offset > reader_.size || bytes > reader_.size - offset) return ReadResult::outside;
  return reader_.read_at(reader_.ctx, offset, dst, bytes) == 0 ? ReadResult::ok
                                                               : ReadResult::failed;
}

void BlobReader::read_failed(ReadResult result, uint64_t offset, std::size_t bytes,
                             const char* what) const {
  if (result == ReadResult::outside)
    fail(SA_ERR_FORMAT, name_, ": ", what, " would be bytes [", offset, ", ", offset + bytes,
         ") but the blob has only ", reader_.size, " bytes (truncated?)");
  fail(SA_ERR_IO, name_, ": reading ", what, " (", bytes, " bytes at offset ", offset, ") failed");
}

void BlobReader::read(uint64_t offset, void* dst, std::size_t bytes, const char* what) const {
  const ReadResult result = try_read(offset, dst, bytes);
  if (result != ReadResult::ok) read_failed(result, offset, bytes, what);
}

BlobWriter::BlobWriter(const sa_writer* writer) {
  if (writer == nullptr) fail(SA_ERR_INVALID_ARGUMENT, "writer is NULL");
  const sa_writer defaults = SA_WRITER_INIT;
  writer_ = read_options(writer, defaults, "writer");
  if (writer_.write == nullptr)
    fail(SA_ERR_INVALID_ARGUMENT, "writer->write is NULL (released writer?)");
}

void BlobWriter::reserve(uint64_t bytes) {
  if (writer_.reserve != nullptr && writer_.reserve(writer_.ctx, bytes) != 0)
    fail(SA_ERR_IO, "the writer could not make room for the blob's ", bytes,
         " bytes (for a file writer: disk full, quota or an I/O error)");
  if (positional()) written_ = bytes;
}

void BlobWriter::write_at_failed(uint64_t offset, std::size_t bytes) {
  fail(SA_ERR_IO, "the writer failed to write ", bytes, " bytes at offset ", offset,
       " (for a file writer: disk full, quota or an I/O error)");
}

void BlobWriter::write(const void* data, std::size_t bytes) {
  if (bytes == 0) return;
  if (writer_.write(writer_.ctx, data, bytes) != 0)
    fail(SA_ERR_IO, "the writer failed to write ", bytes, " bytes at offset ", written_,
         " (for a file writer: disk full, quota or an I/O error)");
  written_ += bytes;
}

void BlobWriter::commit() {
  if (writer_.commit != nullptr && writer_.commit(writer_.ctx) != 0)
    fail(SA_ERR_IO, "the writer failed to commit the blob of ", written_, " bytes");
}

}  // namespace sa
