// The cuDNN a CUDA build loads (src/kiln/backend/cuda/cudnn_api.h), where one is installed: it
// keeps the NVRTC of its runtime-compiled engines loaded, so that building plans does not load and
// unload it each time. Skipped, saying why, where cuDNN or that NVRTC is absent.
#if defined(KILN_WITH_CUDA)

#include <dlfcn.h>
#include <gtest/gtest.h>

#include <string>

#include "kiln/backend/cuda/cudnn_api.h"
#include "kiln/core/error.h"

namespace {

TEST(CudnnLibrary, NamesTheNvrtcOfTheCudaMajorItWasBuiltFor) {
  EXPECT_EQ(kiln::cudnn::nvrtc_library_name(13000), "libnvrtc.so.13");
  EXPECT_EQ(kiln::cudnn::nvrtc_library_name(12080), "libnvrtc.so.12");
}

TEST(CudnnLibrary, KeepsTheNvrtcOfItsRuntimeCompiledEnginesLoaded) {
  std::string nvrtc;
  try {
    const kiln::cudnn::Library& library = kiln::cudnn::library();
    if (library.cudart_version == 0) GTEST_SKIP() << library.path << " does not say its CUDA runtime";
    nvrtc = kiln::cudnn::nvrtc_library_name(library.cudart_version);
  } catch (const kiln::Error& error) {
    GTEST_SKIP() << error.what();
  }
  if (dlopen(nvrtc.c_str(), RTLD_LAZY | RTLD_NOLOAD)) return;  // held (the count this adds is harmless)
  void* present = dlopen(nvrtc.c_str(), RTLD_LAZY | RTLD_LOCAL);
  if (!present) GTEST_SKIP() << nvrtc << " is not installed: " << dlerror();
  dlclose(present);
  ADD_FAILURE() << nvrtc << " is installed but was not loaded with cuDNN";
}

}  // namespace

#endif  // KILN_WITH_CUDA
