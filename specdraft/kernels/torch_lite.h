// What the kernel files take from torch: at::Tensor, the few factories they call, parallel_for and
// TORCH_CHECK. Not <torch/extension.h>: that header (pybind11 and torch's whole C++ API) cost ~22 s
// of compiling per file (g++ 13, Zen 4 EPYC), most of a first run's kernel build; bindings.cpp,
// the one file that binds to Python, includes pybind11 and torch's tensor casters alone.
#pragma once
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/constant_pad_nd.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <c10/util/Exception.h>
