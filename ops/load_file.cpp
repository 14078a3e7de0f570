// pins::load_file: a safetensors file's tensors over a mapping pins knows
// (Note [Safetensors layout] in csrc/safetensors/header.h, Note [File-backed
// pins] in csrc/files/mapped.h).
#include <pins/ops/load_file.h>

#include <ATen/core/Tensor.h>
#include <ATen/ops/from_blob.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string_view>
#include <type_traits>
#include <vector>

#include "csrc/files/mapped.h"
#include "csrc/safetensors/header.h"
#include "ops/common.h"

namespace pins::ops {
namespace {

c10::ScalarType scalar_type(safetensors::Dtype d, const std::string& file, const std::string& name) {
  using safetensors::Dtype;
  switch (d) {
    case Dtype::Bool: return at::kBool;
    case Dtype::U8: return at::kByte;
    case Dtype::I8: return at::kChar;
    case Dtype::F8_E4M3: return at::kFloat8_e4m3fn;
    case Dtype::F8_E5M2: return at::kFloat8_e5m2;
    case Dtype::F8_E8M0: return at::kFloat8_e8m0fnu;
    case Dtype::I16: return at::kShort;
    case Dtype::U16: return at::kUInt16;
    case Dtype::F16: return at::kHalf;
    case Dtype::BF16: return at::kBFloat16;
    case Dtype::I32: return at::kInt;
    case Dtype::U32: return at::kUInt32;
    case Dtype::F32: return at::kFloat;
    case Dtype::I64: return at::kLong;
    case Dtype::U64: return at::kUInt64;
    case Dtype::F64: return at::kDouble;
    case Dtype::C64: return at::kComplexFloat;
    default: break;
  }
  TORCH_CHECK_VALUE(false, file, ": tensor \"", name, "\": dtype ", safetensors::to_string(d),
                    " has no torch dtype to load it as");
}

// Row-major strides of `sizes`. The header bounds a tensor's bytes, so they
// fit in int64 for any tensor with elements; an empty one may have a shape
// whose strides do not ([0, 2^32, 2^32, 2^32]: torch's own stride computation
// refuses it). Its outer strides are then 0, as safetensors' reader makes
// them: no element is ever addressed through them.
std::vector<int64_t> contiguous_strides(const std::vector<int64_t>& sizes) {
  std::vector<int64_t> strides(sizes.size());
  int64_t stride = 1;
  bool past = false;
  for (size_t d = sizes.size(); d-- > 0;) {
    strides[d] = past ? 0 : stride;
    const int64_t n = std::max<int64_t>(sizes[d], 1);
    if (!past && stride > INT64_MAX / n) past = true;
    if (!past) stride *= n;
  }
  return strides;
}

c10::Dict<std::string, at::Tensor> load_file_kernel(c10::string_view path_view) {
  const std::string path(path_view);
  TORCH_CHECK_VALUE(!path.empty(), "load_file: path must name a file, got ''");
  const safetensors::Header h = translate([&] { return safetensors::read_header(path); });
  const std::shared_ptr<files::MappedFile> file = translate([&] { return files::MappedFile::open(path); });
  // The file may have changed between the two opens: the mapping must be the
  // size the header was checked against.
  TORCH_CHECK(file->size() == h.file_size, path, ": the file changed size while it was loaded (", h.file_size,
              " bytes, then ", file->size(), ")");
  c10::Dict<std::string, at::Tensor> out;
  for (const safetensors::TensorInfo& t : h.tensors) {
    std::vector<int64_t> sizes;
    for (const uint64_t n : t.shape) {
      TORCH_CHECK_VALUE(n <= static_cast<uint64_t>(INT64_MAX), path, ": tensor \"", t.name, "\": dimension ", n,
                        " exceeds torch's int64 sizes");
      sizes.push_back(static_cast<int64_t>(n));
    }
    const c10::ScalarType st = scalar_type(t.dtype, path, t.name);
    char* data = file->data() + h.data_start + t.begin;
    // Each tensor holds the mapping: it is unmapped with the last of them.
    at::Tensor x = at::from_blob(data, sizes, contiguous_strides(sizes), [file](void*) {},
                                 at::TensorOptions().dtype(st).device(at::kCPU));
    out.insert(t.name, std::move(x));
  }
  return out;
}

static_assert(std::is_same_v<decltype(load_file_kernel), decltype(load_file)>);

}  // namespace

c10::Dict<std::string, at::Tensor> load_file(c10::string_view path) {
  static auto op = c10::Dispatcher::singleton().findSchemaOrThrow("pins::load_file", "").typed<decltype(load_file)>();
  return op.call(path);
}

}  // namespace pins::ops

TORCH_LIBRARY_FRAGMENT(pins, m) {
  m.def("load_file(str path) -> Dict(str, Tensor)", &pins::ops::load_file_kernel);
}
