// torch_pins._C: the package's CPython extension, the hot path of
// torch_pins.cast_to_device (Note [Python fast path]).
//
// Note [Python fast path]
// A hit on a small weight costs about what x.clone() costs; most of what
// torch.ops.pins.cast_to_device.default adds on top of that from Python is the
// generic call of a torch op: each argument parsed against the schema into an
// IValue stack, and the boxed call (docs/PERFORMANCE.md, "cast from Python").
// _C.cast_to_device takes the op's arguments in schema order, positionally,
// reads the common types directly and calls the op through the dispatcher's
// typed handle: the same kernels, autograd, dispatch modes and profiler as
// any other call; only the Python-side parse is skipped.
//
// It does so only where the op's own entry would do nothing more:
// - the source is exactly a torch.Tensor or an nn.Parameter (a subclass may
//   define __torch_function__) and no TorchFunctionMode is active (a mode sees
//   every torch.ops call);
// - 2 to 8 positional arguments, no keywords, each of the exact Python type
//   the schema's parse would accept without converting it: torch.device;
//   torch.dtype or None; True or False; an int within int64; a str; True or
//   False; None or an int within int64.
// Any other call is forwarded as it is to torch.ops.pins.cast_to_device.default,
// which parses it, runs __torch_function__ and raises exactly as it always has.
// The call itself releases the GIL, as torch.ops does, and its errors go through
// HANDLE_TH_ERRORS, the translation torch's bindings use (c10::ValueError ->
// ValueError, c10::Error -> RuntimeError). So results, errors and stats are
// the op's: tests/python/test_fast_path.py holds the two side by side.
//
// The module links no libpins: at import it finds the op in the dispatcher,
// where torch_pins has already loaded the one libpins.so of the process
// (torch_pins/_library.py, $PINS_LIBRARY included). It is built with torch's
// internal Python API (THPVariable, THPDevice, HANDLE_TH_ERRORS), so it loads
// only into the torch release it was built against: the import checks that and
// raises ImportError otherwise, and torch_pins then calls the op for every cast.
// torch.compile cannot trace a C function: torch_pins.cast_to_device calls the
// op while Dynamo traces it.
#include <Python.h>

#include <ATen/PythonTorchFunctionTLS.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/Device.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/version.h>

// For the op's C++ type only: nothing of libpins is linked.
#include <pins/ops/cast_to_device.h>

#include <cstdint>
#include <cstring>
#include <optional>
#include <string>

namespace pins::python {
namespace {

using CastToDevice = decltype(pins::ops::cast_to_device);

// The op through the dispatcher, found once (at import, by PyInit__C).
const c10::TypedOperatorHandle<CastToDevice>& cast_op() {
  static const auto op =
      c10::Dispatcher::singleton().findSchemaOrThrow("pins::cast_to_device", "").typed<CastToDevice>();
  return op;
}

// torch.ops.pins.cast_to_device.default, where the calls this module does not
// take are forwarded; set at import, held for the life of the process.
PyObject* forward_to = nullptr;

// Calls of _C.cast_to_device by the path they took (_C.path_counts(): tests
// check that the fast path is taken, and left where it must be).
struct PathCounts {
  uint64_t fast = 0;       // COUNT: calls made through the typed handle
  uint64_t forwarded = 0;  // COUNT: calls forwarded to torch.ops
};
PathCounts calls_by_path;  // LOCK: the GIL

// The arguments of the op, in schema order, with the schema's defaults.
struct CastArgs {
  at::Tensor source;
  c10::Device device{c10::kCPU};
  std::optional<c10::ScalarType> dtype;
  bool non_blocking = false;
  int64_t model = -1;
  c10::string_view kind = "weights";
  bool resident = false;
  std::optional<int64_t> signature;
};

// The readers below return false, with no Python error set, for a value of any
// other type: the call is then forwarded, and the op's parse has the last word
// (its error, or its conversion).
bool read_bool(PyObject* obj, bool& out) {
  if (obj != Py_True && obj != Py_False) return false;
  out = obj == Py_True;
  return true;
}

bool read_int64(PyObject* obj, int64_t& out) {
  static_assert(sizeof(long long) == sizeof(int64_t));
  if (!PyLong_CheckExact(obj)) return false;  // not a bool, a numpy integer, a SymInt
  int overflow = 0;
  const long long value = PyLong_AsLongLongAndOverflow(obj, &overflow);
  if (overflow != 0) return false;
  out = value;
  return true;
}

bool read_args(PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames, CastArgs& a) {
  if ((kwnames != nullptr && PyTuple_GET_SIZE(kwnames) > 0) || nargs < 2 || nargs > 8) return false;
  if (!THPVariable_CheckExact(args[0]) || at::impl::torch_function_mode_enabled()) return false;
  if (!THPDevice_Check(args[1])) return false;
  a.device = reinterpret_cast<THPDevice*>(args[1])->device;
  if (nargs > 2 && args[2] != Py_None) {
    if (!THPDtype_Check(args[2])) return false;
    a.dtype = reinterpret_cast<THPDtype*>(args[2])->scalar_type;
  }
  if (nargs > 3 && !read_bool(args[3], a.non_blocking)) return false;
  if (nargs > 4 && !read_int64(args[4], a.model)) return false;
  if (nargs > 5) {
    if (!PyUnicode_CheckExact(args[5])) return false;
    Py_ssize_t size = 0;
    // Cached in the str, which the caller holds for the whole call.
    const char* text = PyUnicode_AsUTF8AndSize(args[5], &size);
    if (text == nullptr) {  // not encodable (a lone surrogate): the op's parse says what it says
      PyErr_Clear();
      return false;
    }
    a.kind = c10::string_view(text, static_cast<size_t>(size));
  }
  if (nargs > 6 && !read_bool(args[6], a.resident)) return false;
  if (nargs > 7 && args[7] != Py_None) {
    int64_t signature = 0;
    if (!read_int64(args[7], signature)) return false;
    a.signature = signature;
  }
  // A new reference to the tensor, not a reference into the Python object:
  // with the GIL released another thread may swap what that object holds
  // (torch.utils.swap_tensors), as torch.ops' own stack holds its copy.
  a.source = THPVariable_Unpack(args[0]);
  return true;
}

// cast_to_device(source, device, dtype=None, non_blocking=False, model=-1,
//                kind="weights", resident=False, signature=None)
PyObject* cast_to_device(PyObject* /*module*/, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
  CastArgs a;
  if (!read_args(args, nargs, kwnames, a)) {
    ++calls_by_path.forwarded;
    return PyObject_Vectorcall(forward_to, args, static_cast<size_t>(nargs), kwnames);
  }
  ++calls_by_path.fast;
  HANDLE_TH_ERRORS
  at::Tensor out;
  {
    pybind11::gil_scoped_release no_gil;
    out = cast_op().call(a.source, a.device, a.dtype, a.non_blocking, a.model, a.kind, a.resident, a.signature);
  }
  return THPVariable_Wrap(std::move(out));
  END_HANDLE_TH_ERRORS
}

PyObject* path_counts(PyObject* /*module*/, PyObject* /*unused*/) {
  return Py_BuildValue("{sKsK}", "fast", static_cast<unsigned long long>(calls_by_path.fast), "forwarded",
                       static_cast<unsigned long long>(calls_by_path.forwarded));
}

// ImportError unless the torch of this process is the MAJOR.MINOR release the
// module was built against (the wheel requires torch==X.Y.*; a build tree may
// be older than the venv's torch).
bool check_torch_release() {
  const std::string built = std::to_string(TORCH_VERSION_MAJOR) + "." + std::to_string(TORCH_VERSION_MINOR) + ".";
  PyObject* torch = PyImport_ImportModule("torch");
  if (torch == nullptr) return false;
  PyObject* version = PyObject_GetAttrString(torch, "__version__");
  Py_DECREF(torch);
  if (version == nullptr) return false;
  const char* running = PyUnicode_Check(version) ? PyUnicode_AsUTF8(version) : nullptr;
  const bool same = running != nullptr && std::strncmp(running, built.c_str(), built.size()) == 0;
  if (!same && !PyErr_Occurred()) {
    PyErr_Format(PyExc_ImportError,
                 "torch_pins._C was built against torch %d.%d, but this is torch %s; rebuild it (make build, or "
                 "reinstall the wheel) against this torch",
                 TORCH_VERSION_MAJOR, TORCH_VERSION_MINOR, running != nullptr ? running : "(unknown)");
  }
  Py_DECREF(version);
  return same;
}

// torch.ops.pins.cast_to_device.default, a new reference, or nullptr with an error set.
PyObject* find_forward_to() {
  PyObject* at = PyImport_ImportModule("torch");
  for (const char* name : {"ops", "pins", "cast_to_device", "default"}) {
    if (at == nullptr) return nullptr;
    PyObject* next = PyObject_GetAttrString(at, name);
    Py_DECREF(at);
    at = next;
  }
  return at;
}

PyMethodDef methods[] = {
    {"cast_to_device", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&cast_to_device)),
     METH_FASTCALL | METH_KEYWORDS,
     "cast_to_device(source, device, dtype=None, non_blocking=False, model=-1, kind='weights', resident=False, "
     "signature=None)\n\ntorch.ops.pins.cast_to_device.default without the generic op call where the arguments "
     "allow (Note [Python fast path], python_bindings/csrc/module.cpp); any other call is forwarded to it."},
    {"path_counts", &path_counts, METH_NOARGS,
     "{'fast': calls made through the dispatcher's typed handle, 'forwarded': calls forwarded to torch.ops}"},
    {nullptr, nullptr, 0, nullptr}};

PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    "torch_pins._C",
    "The CPython extension of torch_pins: the hot path of cast_to_device (Note [Python fast path]).",
    -1,
    methods,
    nullptr,
    nullptr,
    nullptr,
    nullptr,
};

}  // namespace
}  // namespace pins::python

PyMODINIT_FUNC PyInit__C() {
  using namespace pins::python;
  if (!check_torch_release()) return nullptr;
  try {
    cast_op();
  } catch (const c10::Error& e) {
    PyErr_Format(PyExc_ImportError,
                 "torch_pins._C: the op pins::cast_to_device is not registered; import torch_pins, which loads "
                 "libpins.so first (%s)",
                 e.what_without_backtrace());
    return nullptr;
  }
  if (forward_to == nullptr) {
    forward_to = find_forward_to();
    if (forward_to == nullptr) return nullptr;
  }
  return PyModule_Create(&module_def);
}
