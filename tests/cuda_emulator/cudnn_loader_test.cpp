// cuDNN's loader (src/kiln/backend/cuda/cudnn_api.h): a file that is not there, or a library that is
// not cuDNN, is refused with an error that names it; this program's own entry points (the
// emulator's stand-in, cudnn_stand_in.cpp) load.
#include <gtest/gtest.h>

#include <string>

#include "kiln/backend/cuda/cudnn_api.h"
#include "kiln/core/error.h"

namespace {

std::string error_opening(const std::string& path) {
  try {
    kiln::cudnn::open_library(path);
  } catch (const kiln::Error& error) {
    return error.what();
  }
  return "";
}

TEST(CudaCudnnLoader, AMissingFileIsNamedWithTheWayToChooseAnother) {
  const std::string message = error_opening("/nonexistent/libcudnn.so.9");
  EXPECT_NE(message.find("cannot load cuDNN (/nonexistent/libcudnn.so.9)"), std::string::npos) << message;
  EXPECT_NE(message.find("KILN_CUDNN_LIBRARY"), std::string::npos) << message;
}

TEST(CudaCudnnLoader, ALibraryThatIsNotCudnnIsNamedWithWhatItLacks) {
  const std::string message = error_opening("libm.so.6");
  EXPECT_NE(message.find("cuDNN library libm.so.6 has no cudnnGetVersion"), std::string::npos) << message;
}

TEST(CudaCudnnLoader, ThisProgramsOwnEntryPointsLoad) {
  const kiln::cudnn::Library lib = kiln::cudnn::open_library("");
  EXPECT_GE(lib.version, 90000u);
  EXPECT_EQ(lib.path, "this program's own cuDNN entry points");
}

}  // namespace
