// Loading cuBLASLt at run time (cublaslt_library.h).
#include "kiln/backend/cuda/cublaslt_library.h"

#include <dlfcn.h>

#include <variant>

#include "kiln/backend/cuda/run_time_library.h"
#include "kiln/core/error.h"

namespace kiln::cuda {
namespace {

template <typename Function>
void resolve(void* handle, const char* name, Function& function, const std::string& file) {
  void* symbol = dlsym(handle, name);
  if (!symbol) fail("cuBLASLt library {} has no {} (not the cuBLASLt kiln was built with?)", file, name);
  function = reinterpret_cast<Function>(symbol);
}

}  // namespace

std::string cublaslt_library_name() { return "libcublasLt.so." + std::to_string(CUBLAS_VER_MAJOR); }

#if defined(KILN_CUBLASLT_IN_PROCESS)
// The emulator's stand-ins, linked into this program.
#define KILN_CUBLASLT_ENTRY(name) lib.name = &::name
#else
#define KILN_CUBLASLT_ENTRY(name) resolve(handle, #name, lib.name, lib.path)
#endif

CublasLt open_cublaslt(const std::string& file) {
  CublasLt lib{};
#if defined(KILN_CUBLASLT_IN_PROCESS)
  (void)file;
  lib.path = kCublasLtStandIn;
#else
  void* handle = dlopen(file.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle)
    fail("the CUDA back-end cannot load cuBLASLt ({}): {}; install the CUDA toolkit's cuBLAS, or put the folder "
         "that holds {} on LD_LIBRARY_PATH",
         file, dlerror(), file);
  lib.path = file;
  LibraryCloser closer(handle);  // a library refused below is closed again
#endif
  KILN_CUBLASLT_ENTRY(cublasLtCreate);
  KILN_CUBLASLT_ENTRY(cublasLtDestroy);
  KILN_CUBLASLT_ENTRY(cublasLtGetStatusString);
  KILN_CUBLASLT_ENTRY(cublasLtMatmul);
  KILN_CUBLASLT_ENTRY(cublasLtMatmulDescCreate);
  KILN_CUBLASLT_ENTRY(cublasLtMatmulDescDestroy);
  KILN_CUBLASLT_ENTRY(cublasLtMatmulDescSetAttribute);
  KILN_CUBLASLT_ENTRY(cublasLtMatrixLayoutCreate);
  KILN_CUBLASLT_ENTRY(cublasLtMatrixLayoutDestroy);
  KILN_CUBLASLT_ENTRY(cublasLtMatrixLayoutSetAttribute);
  KILN_CUBLASLT_ENTRY(cublasLtMatmulPreferenceCreate);
  KILN_CUBLASLT_ENTRY(cublasLtMatmulPreferenceDestroy);
  KILN_CUBLASLT_ENTRY(cublasLtMatmulPreferenceSetAttribute);
  KILN_CUBLASLT_ENTRY(cublasLtMatmulAlgoGetHeuristic);
#if !defined(KILN_CUBLASLT_IN_PROCESS)
  Dl_info loaded{};  // the file the loader found, for errors
  if (dladdr(reinterpret_cast<void*>(lib.cublasLtCreate), &loaded) && loaded.dli_fname) lib.path = loaded.dli_fname;
  closer.keep();
#endif
  return lib;
}

#undef KILN_CUBLASLT_ENTRY

namespace {

using Loaded = std::variant<CublasLt, std::string>;  // the library, or why it could not be loaded

Loaded load() {
  try {
    return open_cublaslt(cublaslt_library_name());
  } catch (const Error& e) {
    return std::string(e.what());
  }
}

}  // namespace

const CublasLt& cublaslt() {
  // Loaded once (a function-local static: no lock on the products' path); a failure is kept and
  // thrown again at every call. Never destroyed, as the library is never closed: a back-end
  // destroyed during the program's exit still finds it.
  static const Loaded* const loaded = new Loaded(load());
  if (const auto* error = std::get_if<std::string>(loaded)) throw Error(*error);
  return std::get<CublasLt>(*loaded);
}

}  // namespace kiln::cuda
