// pins::load_file (ops/load_file.cpp): a safetensors file's tensors,
// backed by a mapping of the file that pins knows (Note [File-backed pins]).
#pragma once

#include <ATen/core/Dict.h>
#include <ATen/core/Tensor.h>
#include <c10/util/string_view.h>

#include <string>

#include <pins/export.h>

namespace pins::ops {

// Every tensor of the safetensors file at `path`, by name, in the order of
// their bytes in the file: CPU tensors over a private, copy-on-write mapping
// of the file (writes to them never reach the file), each with a storage of
// its own. The mapping lives until the last of them is gone. A new pin of one
// of them is filled from the file rather than through the mapping while its
// pages are unwritten. A malformed file is a c10::ValueError naming the file
// and the field; a file that cannot be opened or mapped, a c10::Error naming
// the path.
PINS_API c10::Dict<std::string, at::Tensor> load_file(c10::string_view path);

}  // namespace pins::ops
