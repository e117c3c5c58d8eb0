// cuBLASLt, loaded at run time with dlopen when the CUDA back-end makes its first product handle,
// not linked. Its static initializers run at the start of every process linked to it: a CUDA
// build's `kiln --version` took 0.5 s and 228 MB linked, against 0.06 s and 17 MB for a build
// without CUDA, and every CPU rank, `kiln launch` and test process paid that for nothing.
//
// The library is libcublasLt.so.<the major version of the cublasLt.h kiln was compiled with>,
// found by the loader's search (kiln's RUNPATH, which names the toolkit's library folder, or
// ldconfig's cache). The CPU emulator's programs (CMakeLists.txt, KILN_CUBLASLT_IN_PROCESS) take
// the entry points of its stand-in, tests/cuda_emulator/cublaslt_stand_in.cpp, linked in.
#pragma once

#include <cublasLt.h>

#include <string>

namespace kiln::cuda {

// The entry points kiln calls (lt_matmul.cpp), each member named and typed as cublasLt.h declares it.
struct CublasLt {
  decltype(&::cublasLtCreate) cublasLtCreate;
  decltype(&::cublasLtDestroy) cublasLtDestroy;
  decltype(&::cublasLtGetStatusString) cublasLtGetStatusString;
  decltype(&::cublasLtMatmul) cublasLtMatmul;
  decltype(&::cublasLtMatmulDescCreate) cublasLtMatmulDescCreate;
  decltype(&::cublasLtMatmulDescDestroy) cublasLtMatmulDescDestroy;
  decltype(&::cublasLtMatmulDescSetAttribute) cublasLtMatmulDescSetAttribute;
  decltype(&::cublasLtMatrixLayoutCreate) cublasLtMatrixLayoutCreate;
  decltype(&::cublasLtMatrixLayoutDestroy) cublasLtMatrixLayoutDestroy;
  decltype(&::cublasLtMatrixLayoutSetAttribute) cublasLtMatrixLayoutSetAttribute;
  decltype(&::cublasLtMatmulPreferenceCreate) cublasLtMatmulPreferenceCreate;
  decltype(&::cublasLtMatmulPreferenceDestroy) cublasLtMatmulPreferenceDestroy;
  decltype(&::cublasLtMatmulPreferenceSetAttribute) cublasLtMatmulPreferenceSetAttribute;
  decltype(&::cublasLtMatmulAlgoGetHeuristic) cublasLtMatmulAlgoGetHeuristic;
  std::string path;  // the file loaded, or where the emulator's entry points come from
};

// CublasLt::path in the emulator's programs.
inline constexpr const char* kCublasLtStandIn = "the CPU emulator's stand-in";

// The library, loaded on the first call. A kiln::Error names the file and dlopen's reason when it
// cannot be loaded or lacks an entry point; each later call repeats it.
const CublasLt& cublaslt();

// What cublaslt() does once, from `file` (ignored in the emulator's programs).
CublasLt open_cublaslt(const std::string& file);

// "libcublasLt.so.13" for the cublasLt.h of CUDA 13.
std::string cublaslt_library_name();

}  // namespace kiln::cuda
