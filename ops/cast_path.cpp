#include "ops/cast_path.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <algorithm>
#include <cstring>

#include "allocator/host_allocator.h"
#include "csrc/balancer/content_check.h"
#include "csrc/base/nvtx.h"
#include "csrc/files/mapped.h"
#include "csrc/files/os_files.h"
#include "ops/common.h"

namespace pins::ops {

// ------------------------------------------------------------------ 1. validate

void check_source(const at::Tensor& t, const char* op, const std::string& argument) {
  TORCH_CHECK_VALUE(t.defined(), op, ": ", argument, " is an undefined tensor");
  TORCH_CHECK_VALUE(t.layout() == c10::kStrided, op, ": ", argument, " must be a dense (strided) tensor, got layout ",
                    t.layout());
  TORCH_CHECK_VALUE(!t.is_quantized(), op, ": ", argument, " must not be quantized, got dtype ", t.scalar_type());
  TORCH_CHECK_VALUE(t.device().is_cpu(), op, ": ", argument, " must be a CPU tensor, got device ", t.device());
  TORCH_CHECK_VALUE(t.has_storage(), op, ": ", argument,
                    " has no storage (a tensor wrapper subclass? torch_pins casts those through their inner "
                    "tensors), got ",
                    t.toString());
}

Kind check_cast_args(const char* op, int64_t model, c10::string_view kind) {
  TORCH_CHECK_VALUE(model >= -1, op, ": model must be a registered model id or -1, got ", model);
  TORCH_CHECK_VALUE(kind == "weights" || kind == "patches", op, ": kind must be 'weights' or 'patches', got '", kind,
                    "'");
  return kind == "weights" ? Kind::Weights : Kind::Patches;
}

// ------------------------------------------------------------------ 2. identify, lease

namespace {

uint64_t layout_hash(const at::Tensor& t) {
  if (t.is_contiguous()) return 0;
  uint64_t h = 1469598103934665603ull;
  auto mix = [&](int64_t v) { h = (h ^ static_cast<uint64_t>(v)) * 1099511628211ull; };
  for (int64_t s : t.sizes()) mix(s);
  for (int64_t s : t.strides()) mix(s);
  return h | 1;  // odd: a gathered pin's key is even (cast_many_to_device.cpp)
}

// The bytes of its storage `t` reaches from its first element (strides of a
// CPU strided tensor are never negative).
uint64_t span_bytes(const at::Tensor& t) {
  if (t.numel() == 0) return 0;
  int64_t last = 0;
  for (int64_t d = 0; d < t.dim(); ++d) last += (t.size(d) - 1) * t.stride(d);
  return static_cast<uint64_t>(last + 1) * t.element_size();
}

// Note [Content check] for one source: where it lies (its storage, held
// weakly by the guard, and the byte offset of its first element there) and
// the windows sampled from it.
struct SampledSource {
  const c10::StorageImpl* storage = nullptr;
  uint64_t offset = 0;
  ContentSample sample;

  // Asked on a hit, while the caller holds the source: the key matched, so
  // its storage is this one, and alive.
  bool holds() const {
    if (storage->nbytes() < offset + sample.reach()) return false;  // resized under the pin
    const char* data = static_cast<const char*>(storage->data());
    return data != nullptr && sample.matches(data + offset);
  }
};

// The windows of `t` (content_windows over its elements in order, fixed by
// its key) as byte ranges from its first element: a contiguous source's as
// they are; a strided one's each cut to the run of elements that lies
// contiguous in its storage from the window's first element.
std::vector<Window> source_windows(const at::Tensor& t, const PinKey& key) {
  const uint64_t el = t.element_size();
  std::vector<Window> windows = content_windows(static_cast<uint64_t>(t.numel()) * el, PinKeyHash{}(key));
  if (t.is_contiguous()) return windows;
  const int64_t dims = t.dim();
  const int64_t inner = t.size(dims - 1);  // a non-contiguous tensor has at least one dimension
  const bool rows = t.stride(dims - 1) == 1;
  for (Window& w : windows) {
    int64_t index = static_cast<int64_t>(w.offset / el), at = 0;
    const int64_t first = index;
    for (int64_t d = dims - 1; d >= 0; --d) {
      at += (index % t.size(d)) * t.stride(d);
      index /= t.size(d);
    }
    const int64_t run = rows ? std::min<int64_t>(static_cast<int64_t>(w.bytes / el), inner - first % inner) : 1;
    w = Window{static_cast<uint64_t>(at) * el, static_cast<uint64_t>(run) * el};
  }
  return windows;
}

// Whether `t`'s storage came from torch's CPU allocator (malloc'd): anonymous
// memory, no file behind it, so reading it reads no disk (but swap).
bool from_cpu_allocator(const at::Tensor& t) {
  const c10::DeleterFnPtr d = t.storage().data_ptr().get_deleter();
  return d != nullptr &&
         (d == c10::GetCPUAllocator()->raw_deleter() || d == c10::GetDefaultCPUAllocator()->raw_deleter());
}

// Note [Content check]: the windows of each source whose memory reads no
// file, with their bytes: a source torch's CPU allocator made, or else one
// whose window's pages are private anonymous memory in RAM now (one look at
// pagemap for all of those).
std::vector<SampledSource> sample_sources(c10::ArrayRef<at::Tensor> sources) {
  struct Planned {
    size_t source;
    Window window;
    bool known;  // in memory torch's allocator made: no need to ask pagemap
  };
  std::vector<Planned> planned;
  std::vector<files::MemoryRange> ask;
  for (size_t i = 0; i < sources.size(); ++i) {
    const at::Tensor& t = sources[i];
    if (t.numel() == 0) continue;
    const bool known = from_cpu_allocator(t);
    const char* base = static_cast<const char*>(t.const_data_ptr());
    for (const Window& w : source_windows(t, source_part(t).key)) {
      planned.push_back({i, w, known});
      if (!known) ask.push_back({base + w.offset, w.bytes});
    }
  }
  const std::vector<bool> anonymous = files::pages_in_anonymous_ram(ask);
  std::vector<SampledSource> out;
  size_t last = SIZE_MAX, asked = 0;
  for (size_t k = 0; k < planned.size(); ++k) {
    if (!planned[k].known && !anonymous[asked++]) continue;
    const at::Tensor& t = sources[planned[k].source];
    if (planned[k].source != last) {
      last = planned[k].source;
      out.push_back({t.storage().unsafeGetStorageImpl(), static_cast<uint64_t>(t.storage_offset()) * t.element_size(),
                     ContentSample()});
    }
    out.back().sample.add(static_cast<const char*>(t.const_data_ptr()), planned[k].window.offset,
                          planned[k].window.bytes);
  }
  return out;
}

// A pin's hold on its sources: a weak reference to each storage (a dead one
// never matches, Note [Pin validity]), for a source in a file pins mapped the
// file's change count when the pin was made (Note [Changed files] in
// csrc/files/mapped.h), and the sampled windows of Note [Content check].
class StorageGuard final : public SourceGuard {
 public:
  struct File {
    std::shared_ptr<files::FileWatch> watch;
    uint64_t changes = 0;
  };
  StorageGuard(std::vector<c10::weak_intrusive_ptr<c10::StorageImpl>> weak, std::vector<File> files,
               std::vector<SampledSource> sampled)
      : weak_(std::move(weak)), files_(std::move(files)), sampled_(std::move(sampled)) {}
  bool alive() const override {
    return std::none_of(weak_.begin(), weak_.end(), [](const auto& w) { return w.expired(); }) &&
           std::all_of(files_.begin(), files_.end(), [](const File& f) { return same(f, /*look=*/false); });
  }
  SourceChange current(bool content) override {
    for (const File& f : files_)
      if (!same(f, /*look=*/true)) return SourceChange::File;
    if (content)
      for (const SampledSource& s : sampled_)
        if (!s.holds()) return SourceChange::Content;
    return SourceChange::None;
  }

 private:
  static bool same(const File& f, bool look) { return f.watch->changes(look) == f.changes; }
  std::vector<c10::weak_intrusive_ptr<c10::StorageImpl>> weak_;
  std::vector<File> files_;
  std::vector<SampledSource> sampled_;
};

// A weak hold on the storages of a pin's sources: alive while every one is,
// and current while the files they lie in are unchanged and, when `content`,
// their sampled windows too.
std::unique_ptr<SourceGuard> storage_guard(c10::ArrayRef<at::Tensor> sources, bool content) {
  std::vector<c10::weak_intrusive_ptr<c10::StorageImpl>> weak;
  std::vector<const c10::StorageImpl*> seen;
  std::vector<StorageGuard::File> in_files;
  for (const at::Tensor& t : sources) {
    files::FileRange where;
    const uint64_t span = span_bytes(t);
    if (files::any_mapped() && span != 0 && files::find_mapped(t.const_data_ptr(), span, where))
      in_files.push_back({where.file->watch(), where.file->watch()->changes(/*look=*/false)});
    const c10::StorageImpl* impl = t.storage().unsafeGetStorageImpl();
    if (std::find(seen.begin(), seen.end(), impl) != seen.end()) continue;
    seen.push_back(impl);
    weak.push_back(t.storage().getWeakStorageImpl());
  }
  return std::make_unique<StorageGuard>(std::move(weak), std::move(in_files),
                                        content ? sample_sources(sources) : std::vector<SampledSource>());
}

}  // namespace

SourcePart source_part(const at::Tensor& t) {
  SourcePart p;
  const uint64_t el = t.element_size();
  p.key = PinKey{reinterpret_cast<uint64_t>(t.storage().unsafeGetStorageImpl()),
                 static_cast<uint64_t>(t.storage_offset()) * el, static_cast<uint64_t>(t.numel()) * el, layout_hash(t)};
  p.span = span_bytes(t);
  // An inference tensor has no version counter: Note [Pin validity].
  if (!t.is_inference()) p.version = static_cast<uint64_t>(t._version());
  return p;
}

Request source_request(const at::Tensor& source, int64_t model, Kind kind, bool resident,
                       std::optional<int64_t> signature, const char* op) {
  const SourcePart part = source_part(source);
  Request r;
  r.model = model;
  r.key = part.key;
  r.bytes = part.key.nbytes;  // 0: counted as Bypass::Empty
  r.kind = kind;
  r.resident = resident;
  r.signature = signature;
  r.version = part.version;
  r.span = part.span;
  r.op = op;
  // Note [Shared pins]: the balancer asks whether it lies in a mapped file on a miss only.
  if (source.is_contiguous()) r.data = source.const_data_ptr();
  return r;
}

Lease lease_pin(const Request& r, c10::ArrayRef<at::Tensor> sources) {
  Balancer& bal = balancer();
  if (r.model == -1) {
    for (size_t i = 0; i < sources.size(); ++i) bal.count_plain_copy();
    return {};
  }
  // acquire() refuses a model that is not registered, naming r.op: one lock
  // round trip for the lookup, the check and the lease.
  return translate([&] { return bal.acquire(r, [&](bool content) { return storage_guard(sources, content); }); });
}

Lease lease_source(const at::Tensor& source, int64_t model, Kind kind, bool resident,
                   std::optional<int64_t> signature, const char* op) {
  if (model == -1) return lease_pin(Request{}, source);  // Request's model is -1
  return lease_pin(source_request(source, model, kind, resident, signature, op), source);
}

void check_source_readable(const at::Tensor& source) {
  if (!files::any_mapped()) return;
  const uint64_t span = span_bytes(source);
  files::FileRange where;
  if (span == 0 || !files::find_mapped(source.const_data_ptr(), span, where)) return;
  translate([&] { files::check_file_covers(where, span); });
}

// ------------------------------------------------------------------ 3. fill

at::Tensor pin_view(const Lease& lease, uint64_t offset, const at::Tensor& like) {
  return at::from_blob(static_cast<char*>(lease.data()) + offset, like.sizes(),
                       like.options().memory_format(at::MemoryFormat::Contiguous));
}

// Note [Shared pins]: whether the file of a shared pin's source is as it was
// when mapped, after the fill: a fill that may hold bytes of a rewrite is not
// published (the pin is this process's, stale as Note [Changed files] says).
bool fill_is_current(const at::Tensor& source) {
  return translate([&] { return files::unchanged_since_mapped(source.const_data_ptr(), source.nbytes()); });
}

bool fill_shared_pin(const Lease& lease, const at::Tensor& pin, const at::Tensor& source) {
  if (!lease.shared_fill()) return false;
  // Note [Shared pins]: the segment is keyed by the file, so it holds the
  // file's bytes, read from the file whatever the mapping says now. The key
  // was taken from this source's mapping, which the source keeps alive.
  const uint64_t n = source.numel() * source.element_size();
  const bool read = translate([&] {
    return files::fill_from_file(source.const_data_ptr(), n, pin.mutable_data_ptr(), files::kReadThreads,
                                 /*file_only=*/true);
  });
  TORCH_INTERNAL_ASSERT(read, "a shared pin's source left its mapped file");
  return true;
}

void fill_pin(const at::Tensor& pin, const at::Tensor& source) {
  if (source.is_contiguous()) {
    const uint64_t n = source.numel() * source.element_size();
    if (translate([&] { return files::fill_from_file(source.const_data_ptr(), n, pin.mutable_data_ptr()); })) return;
  }
  check_source_readable(source);
  pin.copy_(source);
}

namespace {

// Note [Chunked fill]: a chunk is large enough that a transfer's launch is
// small beside it, small enough that the eight of a 32 MiB layer overlap.
constexpr int64_t kChunkBytes = int64_t{4} << 20;

// Whether a miss of `source` to `device` goes in chunks: to a device (on the
// CPU the whole copy, on torch's threads, measured faster), from a source in
// memory (a mapped file's source is read from the file, whole), contiguous (a
// strided one is gathered by copy_), of at least two chunks.
bool chunked_fill(const at::Tensor& source, c10::Device device) {
  if (device.is_cpu() || !source.is_contiguous()) return false;
  const int64_t bytes = static_cast<int64_t>(source.nbytes());
  if (bytes < 2 * kChunkBytes) return false;
  files::FileRange range;
  return !files::find_mapped(source.const_data_ptr(), static_cast<uint64_t>(bytes), range);
}

}  // namespace

void fill_in_chunks(const at::Tensor& pin, const at::Tensor& source, const at::Tensor& staged, bool non_blocking,
                    int64_t chunk_bytes) {
  const int64_t n = source.numel(), size = source.element_size();
  const int64_t step = std::max<int64_t>(1, chunk_bytes / size);
  const auto* from = static_cast<const char*>(source.const_data_ptr());
  auto* to = static_cast<char*>(pin.mutable_data_ptr());
  const at::Tensor flat_pin = pin.view({-1}), flat_staged = staged.view({-1});
  for (int64_t i = 0; i < n; i += step) {
    const int64_t len = std::min(step, n - i);
    std::memcpy(to + i * size, from + i * size, static_cast<size_t>(len * size));
    flat_staged.narrow(0, i, len).copy_(flat_pin.narrow(0, i, len), /*non_blocking=*/true);
  }
  if (!non_blocking && !staged.is_cpu())
    c10::impl::VirtualGuardImpl(staged.device().type()).getStream(staged.device()).synchronize();
}

// ------------------------------------------------------------------ 4. transfer

at::Tensor plain_copy(const at::Tensor& source, c10::Device device, std::optional<c10::ScalarType> dtype,
                      bool non_blocking) {
  const c10::ScalarType want = dtype.value_or(source.scalar_type());
  const at::TensorOptions options = source.options().device(device).memory_format(at::MemoryFormat::Contiguous);
  if (want == source.scalar_type() || device.is_cpu()) {
    // One pass straight into the result: on the CPU copy_ converts as it goes
    // (the same conversion kernel .to(dtype) runs, so the same bits).
    at::Tensor out = at::empty(source.sizes(), options.dtype(want));
    out.copy_(source, non_blocking);
    return out;
  }
  // To a device with a conversion: copy_ across device and dtype would convert
  // on the host into a pageable temporary and copy from that, not from the pin.
  // So the pin's bytes go over as they are and the device converts them.
  at::Tensor staged = at::empty(source.sizes(), options);
  staged.copy_(source, non_blocking);
  at::Tensor out = at::empty(source.sizes(), options.dtype(want));
  out.copy_(staged);  // on the device's current stream, after the transfer
  return out;
}

namespace {

// `source` into `pin` (a pin_view of a new lease), and the result as
// plain_copy(pin, device, dtype, non_blocking) would return it (Note [Chunked fill]).
at::Tensor fill_and_copy(const at::Tensor& pin, const at::Tensor& source, c10::Device device,
                         std::optional<c10::ScalarType> dtype, bool non_blocking) {
  PINS_RANGE("pins::fill");
  if (!chunked_fill(source, device)) {
    fill_pin(pin, source);
    return plain_copy(pin, device, dtype, non_blocking);
  }
  // As plain_copy() to a device: the bytes as they are, then the conversion there.
  const at::TensorOptions options = source.options().device(device).memory_format(at::MemoryFormat::Contiguous);
  at::Tensor staged = at::empty(source.sizes(), options);
  fill_in_chunks(pin, source, staged, non_blocking, kChunkBytes);
  const c10::ScalarType want = dtype.value_or(source.scalar_type());
  if (want == source.scalar_type()) return staged;
  at::Tensor out = at::empty(source.sizes(), options.dtype(want));
  out.copy_(staged);  // on the device's current stream, after the transfers
  return out;
}

// The same into `out` (the source's shape; on a device the source's dtype, on
// the CPU any: the copy converts), as the out= overload copies from a pin.
void fill_and_copy_into(const at::Tensor& pin, const at::Tensor& source, const at::Tensor& out, bool non_blocking) {
  PINS_RANGE("pins::fill");
  // On a device `out` has the source's dtype (the caller's precondition).
  if (out.is_contiguous() && chunked_fill(source, out.device())) {
    fill_in_chunks(pin, source, out, non_blocking, kChunkBytes);
    return;
  }
  fill_pin(pin, source);
  out.copy_(pin, non_blocking);
}

}  // namespace

at::Tensor cast_through(Lease& lease, const at::Tensor& source, c10::Device device,
                        std::optional<c10::ScalarType> dtype, bool non_blocking) {
  if (!lease) check_source_readable(source);
  const bool fill = lease && lease.needs_fill();
  const at::Tensor from = lease ? pin_view(lease, 0, source) : source;
  const bool shared = fill && fill_shared_pin(lease, from, source);
  const bool fill_here = fill && !shared;
  at::Tensor out = fill_here ? fill_and_copy(from, source, device, dtype, non_blocking)
                             : plain_copy(from, device, dtype, non_blocking);
  if (fill) lease.filled(/*publish=*/!shared || fill_is_current(source));
  if (lease) fence(lease, out.device(), non_blocking);
  return out;
}

void cast_through_into(Lease& lease, const at::Tensor& source, const at::Tensor& out, bool non_blocking) {
  if (!lease) check_source_readable(source);
  const bool fill = lease && lease.needs_fill();
  const at::Tensor from = lease ? pin_view(lease, 0, source) : source;
  const bool shared = fill && fill_shared_pin(lease, from, source);
  const bool fill_here = fill && !shared;
  if (from.scalar_type() == out.scalar_type() || out.device().is_cpu()) {
    // One pass; on the CPU the copy converts as it goes.
    if (fill_here) {
      fill_and_copy_into(from, source, out, non_blocking);
    } else {
      out.copy_(from, non_blocking);
    }
  } else {
    // As cast_through: the copy in the source's dtype, then the conversion on the device.
    out.copy_(fill_here ? fill_and_copy(from, source, out.device(), std::nullopt, non_blocking)
                   : plain_copy(from, out.device(), std::nullopt, non_blocking));
  }
  if (fill) lease.filled(/*publish=*/!shared || fill_is_current(source));
  if (lease) fence(lease, out.device(), non_blocking);
}

// ------------------------------------------------------------------ 5. fence

void fence(const Lease& lease, c10::Device device, bool non_blocking) {
  if (!non_blocking || device.is_cpu()) return;
  // The copy (and the conversion after it, on the same stream) may still be
  // reading the pin when the op returns.
  const c10::Stream stream = c10::impl::VirtualGuardImpl(device.type()).getStream(device);
  record_stream(lease.data(), stream);
}

}  // namespace pins::ops
