// The cuBLASLt a CUDA build loads at run time (src/kiln/backend/cuda/cublaslt_library.h): from the
// toolkit kiln was built with, every entry point resolved, and bad files named; and no kiln process
// loads it before its first GPU product (a process that never makes one never pays for it). No GPU
// is needed: loading the library and asking it for a status string touch no device.
#if defined(KILN_WITH_CUDA)

#include <gtest/gtest.h>

#include <string>

#include "kiln/backend/cuda/cublaslt_library.h"
#include "kiln/core/error.h"
#include "support/kiln_process.h"

namespace kiln::cuda {
namespace {

// The emulator's programs link these tests too, with its stand-in in place of the library.
bool on_the_emulator() { return cublaslt().path == kCublasLtStandIn; }

TEST(CublasLtLibrary, LoadsFromTheToolkitWithEveryEntryPoint) {
  if (on_the_emulator()) GTEST_SKIP() << "the emulator's programs load no cuBLASLt";
  const CublasLt& library = cublaslt();
  EXPECT_NE(library.path.find(cublaslt_library_name()), std::string::npos) << library.path;
  // The library answers (its texts are its own: CUDA 13's success is "success").
  const std::string success = library.cublasLtGetStatusString(CUBLAS_STATUS_SUCCESS);
  EXPECT_FALSE(success.empty());
  EXPECT_NE(success, library.cublasLtGetStatusString(CUBLAS_STATUS_NOT_INITIALIZED));
  for (const void* entry :
       {reinterpret_cast<const void*>(library.cublasLtCreate), reinterpret_cast<const void*>(library.cublasLtDestroy),
        reinterpret_cast<const void*>(library.cublasLtMatmul),
        reinterpret_cast<const void*>(library.cublasLtMatmulDescCreate),
        reinterpret_cast<const void*>(library.cublasLtMatmulDescDestroy),
        reinterpret_cast<const void*>(library.cublasLtMatmulDescSetAttribute),
        reinterpret_cast<const void*>(library.cublasLtMatrixLayoutCreate),
        reinterpret_cast<const void*>(library.cublasLtMatrixLayoutDestroy),
        reinterpret_cast<const void*>(library.cublasLtMatrixLayoutSetAttribute),
        reinterpret_cast<const void*>(library.cublasLtMatmulPreferenceCreate),
        reinterpret_cast<const void*>(library.cublasLtMatmulPreferenceDestroy),
        reinterpret_cast<const void*>(library.cublasLtMatmulPreferenceSetAttribute),
        reinterpret_cast<const void*>(library.cublasLtMatmulAlgoGetHeuristic)})
    EXPECT_NE(entry, nullptr);
}

TEST(CublasLtLibrary, AFileThatIsMissingOrNotCublasLtIsNamed) {
  if (on_the_emulator()) GTEST_SKIP() << "the emulator's programs load no cuBLASLt";
  try {
    open_cublaslt("libkiln-no-such-cublasLt.so.13");
    ADD_FAILURE() << "a missing library loaded";
  } catch (const Error& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find("cannot load cuBLASLt (libkiln-no-such-cublasLt.so.13)"), std::string::npos) << message;
    EXPECT_NE(message.find("LD_LIBRARY_PATH"), std::string::npos) << message;  // what to do
  }
  try {
    open_cublaslt("libm.so.6");
    ADD_FAILURE() << "libm loaded as cuBLASLt";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("has no cublasLtCreate"), std::string::npos) << error.what();
  }
}

TEST(CublasLtLibrary, KilnStartsWithoutLoadingIt) {
  // The loader's own account of every file it opens: cuBLASLt is not among them.
  const testing::CommandResult result =
      testing::run_command("LD_DEBUG=files " + testing::kiln_binary() + " --version 2>&1");
  ASSERT_EQ(result.exit_code, 0) << result.output;
  ASSERT_NE(result.output.find("file=libcudart"), std::string::npos) << "LD_DEBUG said nothing:\n" << result.output;
  EXPECT_EQ(result.output.find("libcublasLt"), std::string::npos) << result.output;
}

}  // namespace
}  // namespace kiln::cuda

#endif  // KILN_WITH_CUDA
