// src/state_io/export.cpp — one rank's state as a shard file. The header (which holds
// every block's checksum) precedes the data and the writer only appends, so the state is
// streamed twice: once to checksum it, once to write it. Device state goes through one
// bounded staging buffer both times; host state is read in place. Every named state is a
// tensor: a block moment's codes, and its blocks' absmax beside them.
#include <algorithm>
#include <numeric>

#include "../../kernels/block_moment.h"
#include "../dtype.hpp"
#include "../errors.hpp"
#include "../state_kinds.hpp"
#include "crc32c.hpp"
#include "metadata.hpp"
#include "state_io.hpp"

namespace sa {
namespace {

std::vector<WriterMesh> meshes_of(const std::vector<std::unique_ptr<Param>>& params) {
  std::vector<WriterMesh> meshes;
  for (const auto& p : params) {
    if (p->layout.mesh_shape.empty()) continue;
    WriterMesh m{p->layout.mesh_shape, p->layout.mesh_coord};
    if (std::none_of(meshes.begin(), meshes.end(), [&](const WriterMesh& seen) {
          return seen.shape == m.shape && seen.coord == m.coord;
        }))
      meshes.push_back(std::move(m));
  }
  return meshes;
}

// Host-visible chunks of backend memory: the memory itself on a host backend, else a copy
// in a staging buffer of at most `limit` bytes (a multiple of the checksum block).
class HostChunks {
 public:
  HostChunks(Backend* backend, uint64_t largest, uint64_t limit) : backend_(backend) {
    chunk_ =
        std::max<uint64_t>(kChecksumBlockBytes, limit / kChecksumBlockBytes * kChecksumBlockBytes);
    if (backend_ != nullptr && !backend_->host_memory() && largest > 0)
      staging_ = backend_->allocate_staging(static_cast<std::size_t>(std::min(chunk_, largest)));
  }
  uint64_t chunk() const { return chunk_; }
  // `bytes` (<= chunk()) bytes of backend memory at `src` + offset, readable on the host.
  const unsigned char* view(const void* src, uint64_t offset, uint64_t bytes) {
    const auto* at = static_cast<const unsigned char*>(src) + offset;
    if (!staging_) return at;
    backend_->copy_to_host(staging_->data(), at, static_cast<std::size_t>(bytes));
    return static_cast<const unsigned char*>(staging_->data());
  }

 private:
  Backend* backend_;
  uint64_t chunk_;
  std::shared_ptr<Buffer> staging_;
};

}  // namespace

void export_state(Optimizer& opt, const sa_writer* writer_table) {
  BlobWriter writer(writer_table);
  opt.require_usable("an export");
  Backend* backend = opt.backend();
  if (backend != nullptr) backend->synchronize();  // no step in flight may still write state

  ShardHeader header;
  header.library =
      concat("shardadam ", SA_VERSION_MAJOR, ".", SA_VERSION_MINOR, ".", SA_VERSION_PATCH);
  for (int32_t g = 0; g < opt.num_groups(); ++g)
    header.groups.push_back({opt.group(g, "group").config, opt.get_step(g)});
  header.meshes = meshes_of(opt.params());

  std::vector<int64_t> param_steps(opt.params().size());
  opt.get_param_steps(0, opt.num_params(), param_steps.data());

  std::vector<SavedTensor> tensors;
  std::vector<const void*> sources;  // each tensor's backend memory (null when empty)
  for (std::size_t i = 0; i < opt.params().size(); ++i) {
    const auto& p = opt.params()[i];
    if (!primary_replica(p->layout)) continue;
    header.param_steps[p->name] = param_steps[i];
    for (const NamedState& state : named_states(*p)) {
      SavedTensor t;
      t.param = p->name;
      t.key = state.key;
      t.dtype = state.dtype;
      t.shape = state_shape(*p, state.kind);
      if (state_kind_info(state.kind).per_block) {
        t.block_elems = kernels::kQuant8Block;  // a block moment's absmax: no box of its own
      } else {
        t.global_shape = p->layout.global_shape;
        t.global_offset = p->layout.global_offset;
      }
      int64_t numel = 1;
      for (int64_t d : t.shape) numel *= d;
      t.bytes = static_cast<uint64_t>(numel) * dtype_size(t.dtype);
      sources.push_back(t.bytes > 0 ? state.buffer->data() : nullptr);
      tensors.push_back(std::move(t));
    }
  }
  // Wider dtypes first: with the data section 8-byte aligned, every tensor then starts at
  // a multiple of its element size (what the safetensors package's own writer does).
  std::vector<std::size_t> order(tensors.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return dtype_size(tensors[a].dtype) > dtype_size(tensors[b].dtype);
  });
  uint64_t largest = 0;
  uint64_t data_bytes = 0;
  for (std::size_t i : order) {
    SavedTensor& t = tensors[i];
    t.data_begin = data_bytes;
    data_bytes += t.bytes;
    largest = std::max(largest, t.bytes);
    header.tensors.push_back(t);
  }

  HostChunks chunks(backend, largest, kDefaultStagingBytes);
  auto stream = [&](std::size_t i, auto&& consume) {
    const SavedTensor& t = tensors[i];
    for (uint64_t offset = 0; offset < t.bytes; offset += chunks.chunk()) {
      const uint64_t n = std::min(chunks.chunk(), t.bytes - offset);
      consume(offset, chunks.view(sources[i], offset, n), n);
    }
  };

  // Pass 1: the checksums, which the header carries.
  for (std::size_t k = 0; k < order.size(); ++k) {
    SavedTensor& out = header.tensors[k];
    out.crc32c.resize(static_cast<std::size_t>(block_count(out.bytes, header.block_bytes)));
    stream(order[k], [&](uint64_t offset, const unsigned char* data, uint64_t n) {
      crc32c_blocks(data, static_cast<std::size_t>(n), static_cast<std::size_t>(header.block_bytes),
                    out.crc32c.data() + offset / header.block_bytes);
    });
  }

  // Pass 2: header, then data in header order.
  const std::string prefix = encode_shard_header(header);
  writer.write(prefix.data(), prefix.size());
  for (std::size_t i : order)
    stream(i, [&](uint64_t, const unsigned char* data, uint64_t n) {
      writer.write(data, static_cast<std::size_t>(n));
    });
  writer.commit();
}

}  // namespace sa
