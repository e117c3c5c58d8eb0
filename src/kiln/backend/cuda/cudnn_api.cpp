// Loading cuDNN at run time (cudnn_api.h).
#include "kiln/backend/cuda/cudnn_api.h"

#include <dlfcn.h>

#include <cstdlib>
#include <mutex>
#include <optional>

#include "kiln/backend/cuda/run_time_library.h"
#include "kiln/core/error.h"

namespace kiln::cudnn {
namespace {

constexpr size_t kFirstSupportedVersion = 90000;  // the backend API as cudnn_api.h declares it

template <typename Function>
void resolve(void* handle, const char* name, Function& function, const std::string& path) {
  void* symbol = dlsym(handle, name);
  if (!symbol) fail("cuDNN library {} has no {} (not cuDNN 9?)", path, name);
  function = reinterpret_cast<Function>(symbol);
}

// The library for this process: this program's own entry points where it defines them (the
// emulator's stand-in, CMakeLists.txt), else KILN_CUDNN_LIBRARY's file or libcudnn.so.9.
std::string chosen_library() {
#if defined(KILN_CUDNN_IN_PROCESS)
  return "";
#else
  const char* chosen = std::getenv("KILN_CUDNN_LIBRARY");
  return chosen && *chosen ? chosen : "libcudnn.so.9";
#endif
}

// cuDNN's runtime-compiled engines (its fused attention ones among them) load NVRTC for each plan
// they build and unload it after: CudnnGraphCheck.SomeEngineTakesTheBenchmarkShapes loads and
// unloads libnvrtc.so.13, a 109 MB library, 15 times here (LD_DEBUG=files). Each unload also drops
// the emergency exception pool of the libstdc++ that NVRTC links statically (72,704 bytes), which
// LeakSanitizer reports as leaked from an unknown module in -DKILN_SANITIZE builds. Holding that
// NVRTC loaded for the process turns those loads into reference counts. Where it is absent nothing
// is held: cuDNN names it when an engine needs it.
void keep_nvrtc_loaded(const Library& lib) {
  if (lib.cudart_version == 0) return;
  dlopen(nvrtc_library_name(lib.cudart_version).c_str(), RTLD_LAZY | RTLD_LOCAL);  // never closed, as cuDNN
}

}  // namespace

std::string nvrtc_library_name(size_t cudart_version) {
  return "libnvrtc.so." + std::to_string(cudart_version / 1000);
}

Library open_library(const std::string& path) {
  Library lib{};
  lib.path = path;
  void* handle = dlopen(path.empty() ? nullptr : path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle)
    fail("--cudnn-attention: cannot load cuDNN ({}): {}; install cuDNN 9, or set KILN_CUDNN_LIBRARY to its "
         "libcudnn.so.9",
         path, dlerror());
  if (path.empty()) lib.path = "this program's own cuDNN entry points";
  cuda::LibraryCloser closer(handle);  // a library refused below is closed again
  resolve(handle, "cudnnGetVersion", lib.get_version, lib.path);
  resolve(handle, "cudnnGetErrorString", lib.get_error_string, lib.path);
  resolve(handle, "cudnnGetLastErrorString", lib.get_last_error_string, lib.path);
  resolve(handle, "cudnnCreate", lib.create, lib.path);
  resolve(handle, "cudnnDestroy", lib.destroy, lib.path);
  resolve(handle, "cudnnSetStream", lib.set_stream, lib.path);
  resolve(handle, "cudnnBackendCreateDescriptor", lib.create_descriptor, lib.path);
  resolve(handle, "cudnnBackendDestroyDescriptor", lib.destroy_descriptor, lib.path);
  resolve(handle, "cudnnBackendFinalize", lib.finalize, lib.path);
  resolve(handle, "cudnnBackendSetAttribute", lib.set_attribute, lib.path);
  resolve(handle, "cudnnBackendGetAttribute", lib.get_attribute, lib.path);
  resolve(handle, "cudnnBackendExecute", lib.execute, lib.path);
  Dl_info loaded{};  // the file the loader found, for the run notes
  if (!path.empty() && dladdr(reinterpret_cast<void*>(lib.get_version), &loaded) && loaded.dli_fname)
    lib.path = loaded.dli_fname;
  lib.version = lib.get_version();
  if (lib.version < kFirstSupportedVersion)
    fail("--cudnn-attention: {} is cuDNN {}; kiln needs cuDNN 9", lib.path, lib.version_text());
  closer.keep();
  if (void* cudart_version = dlsym(handle, "cudnnGetCudartVersion"))
    lib.cudart_version = reinterpret_cast<size_t (*)()>(cudart_version)();
  if (!path.empty()) keep_nvrtc_loaded(lib);
  return lib;
}

const Library& library() {
  static std::mutex mutex;
  static std::optional<Library> loaded;
  static std::string error;
  const std::lock_guard lock(mutex);
  if (!loaded && error.empty()) {
    try {
      loaded = open_library(chosen_library());
    } catch (const Error& e) {
      error = e.what();
    }
  }
  if (!loaded) throw Error(error);
  return *loaded;
}

std::string Library::version_text() const {
  return std::to_string(version / 10000) + "." + std::to_string(version / 100 % 100) + "." +
         std::to_string(version % 100);
}

std::string last_error() {
  char detail[1024] = {};
  library().get_last_error_string(detail, sizeof(detail));
  return detail;
}

void check(Status status, const std::string& what) {
  if (status == 0) return;
  const std::string detail = last_error();
  fail("cuDNN error in {}: {}{}", what, library().get_error_string(status), detail.empty() ? "" : " (" + detail + ")");
}

}  // namespace kiln::cudnn
