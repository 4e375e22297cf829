// src/backends/module_loader.cpp — finds and loads the CUDA backend module
// (cuda_module.hpp), and the core's NCCL entry points, which forward to it.
#include <dlfcn.h>

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

#include "../comm/comm.hpp"
#include "../errors.hpp"
#include "build_stamp.h"
#include "cuda_module.hpp"

namespace sa {
namespace {

struct Loaded {
  const CudaModule* module = nullptr;
  std::string status;
};

#ifdef SHARDADAM_WITH_CUDA
// The directory of the shared object that holds this code (libshardadam.so, or the
// program the core is linked into), with a trailing '/'; "" when unknown.
std::string own_directory() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&cuda_module), &info) == 0 || info.dli_fname == nullptr)
    return "";
  const std::string path = info.dli_fname;
  const std::size_t slash = path.rfind('/');
  return slash == std::string::npos ? "" : path.substr(0, slash + 1);
}

// dlopen's reason, or `fallback` when it has none.
std::string dl_reason(const char* fallback) {
  const char* why = dlerror();
  return why != nullptr ? why : fallback;
}

// Opens `path` and checks that it is a module of this build; on failure returns nullptr
// and says why in `status`.
const CudaModule* open_module(const std::string& path, std::string& status) {
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    status = concat("cannot load ", path, ": ", dl_reason("dlopen failed"));
    return nullptr;
  }
  // Never closed: backends and communicators made by the module may live until exit.
  auto entry = reinterpret_cast<CudaModuleEntry>(dlsym(handle, SA_CUDA_MODULE_ENTRY));
  if (entry == nullptr) {
    status = concat(path, " has no ", SA_CUDA_MODULE_ENTRY, ": ", dl_reason("no such symbol"));
    return nullptr;
  }
  const CudaModule* module = entry();
  if (module != nullptr && module->interface_version == kCudaModuleInterface &&
      module->backend_interface != kBackendInterface) {
    status = concat(path, " implements backend interface ", module->backend_interface,
                    ", this library drives interface ", kBackendInterface,
                    "; install the library and its module together");
    return nullptr;
  }
  if (module == nullptr || module->interface_version != kCudaModuleInterface ||
      std::strcmp(module->build_stamp, SA_BUILD_STAMP) != 0) {
    status = concat(path, " is from another build of shardadam (stamp ",
                    module != nullptr ? module->build_stamp : "?", ", this library's ",
                    SA_BUILD_STAMP, "); install the library and its module together");
    return nullptr;
  }
  status = concat("module ", path, " (", module->description, ")");
  return module;
}

#endif  // SHARDADAM_WITH_CUDA

Loaded load() {
  Loaded loaded;
#ifndef SHARDADAM_WITH_CUDA
  loaded.status = "not built";
#else
  const char* forced = std::getenv("SHARDADAM_CUDA_MODULE");
  if (forced != nullptr && forced[0] != '\0') {
    loaded.module = open_module(forced, loaded.status);
    if (loaded.module == nullptr) loaded.status += " (from $SHARDADAM_CUDA_MODULE)";
    return loaded;
  }
  const std::string beside = own_directory() + SA_CUDA_MODULE_FILE;
  std::string beside_status;
  loaded.module = open_module(beside, beside_status);
  if (loaded.module != nullptr) {
    loaded.status = beside_status;
    return loaded;
  }
  // Not beside the library: the loader's search path (LD_LIBRARY_PATH, the rpath).
  std::string search_status;
  loaded.module = open_module(SA_CUDA_MODULE_FILE, search_status);
  loaded.status = loaded.module != nullptr ? search_status : beside_status;
#endif
  return loaded;
}

const Loaded& loaded() {
  static const Loaded instance = load();  // thread-safe initialisation
  return instance;
}

[[noreturn]] void no_nccl() {
  if (cuda_module() == nullptr)
    fail(SA_ERR_UNSUPPORTED,
         "NCCL communicators need the CUDA backend module (cuda: ", cuda_module_status(),
         "); use a host-callback communicator (sa_comm_create_host)");
  fail(SA_ERR_UNSUPPORTED,
       "this build of shardadam has no NCCL (see sa_build_info()); "
       "use a host-callback communicator (sa_comm_create_host)");
}

const CudaModule& nccl_module() {
  const CudaModule* module = cuda_module();
  if (module == nullptr || module->make_nccl_comm == nullptr) no_nccl();
  return *module;
}

}  // namespace

const CudaModule* cuda_module() { return loaded().module; }

const std::string& cuda_module_status() { return loaded().status; }

bool nccl_available() {
  const CudaModule* module = cuda_module();
  return module != nullptr && module->make_nccl_comm != nullptr;
}

void nccl_unique_id(sa_nccl_unique_id& out) { nccl_module().nccl_unique_id(out); }

std::shared_ptr<Comm> make_nccl_comm(const sa_nccl_unique_id& id, int32_t nranks, int32_t rank,
                                     int32_t device) {
  return nccl_module().make_nccl_comm(id, nranks, rank, device);
}

std::shared_ptr<Comm> wrap_nccl_comm(void* nccl_comm) {
  return nccl_module().wrap_nccl_comm(nccl_comm);
}

}  // namespace sa
