// What the libraries the CUDA back-end loads at run time with dlopen share (cuDNN: cudnn_api.h;
// cuBLASLt: cublaslt_library.h): a just-opened library is closed again when its loader refuses it
// (a missing entry point, too old a version), unless the loader keeps it for the process.
#pragma once

#include <dlfcn.h>

namespace kiln::cuda {

class LibraryCloser {
 public:
  explicit LibraryCloser(void* handle) : handle_(handle) {}
  LibraryCloser(const LibraryCloser&) = delete;
  LibraryCloser& operator=(const LibraryCloser&) = delete;
  ~LibraryCloser() {
    if (!kept_) dlclose(handle_);
  }
  void keep() { kept_ = true; }  // the library stays loaded for the process

 private:
  void* handle_;
  bool kept_ = false;
};

}  // namespace kiln::cuda
