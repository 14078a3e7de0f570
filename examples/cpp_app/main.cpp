// pins_cpp_app MODULE.pt: registers a model, casts a weight through pins twice
// (a miss, then a hit), runs a TorchScript module whose forward calls
// pins::cast_to_device, and prints what it saw. Exits non-zero on any mismatch.
#include <torch/script.h>

#include <cstring>
#include <iostream>

#include <pins/ops.h>

namespace {
const char* kUsage =
    "usage: pins_cpp_app MODULE.pt\n"
    "Casts a weight through pins twice, then runs MODULE.pt (a TorchScript module whose\n"
    "forward(x, model) calls pins::cast_to_device) twice, and prints the hits and misses.\n";
}  // namespace

int main(int argc, char** argv) {
  if (argc == 2 && (std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0)) {
    std::cout << kUsage;
    return 0;
  }
  if (argc != 2) {
    std::cerr << kUsage;
    return 2;
  }
  try {
    const c10::Device cpu(c10::kCPU);
    const int64_t model = pins::ops::register_model("cpp-app", cpu);
    pins::ops::mark_prompt({model});
    const at::Tensor w = torch::randn({64, 32});
    const at::Tensor a = pins::ops::cast_to_device(w, cpu, at::kHalf, false, model);
    const at::Tensor b = pins::ops::cast_to_device(w, cpu, at::kHalf, false, model);
    if (!a.equal(w.to(at::kHalf)) || !b.equal(a)) {
      std::cerr << "cast_to_device returned wrong values\n";
      return 1;
    }
    torch::jit::Module m = torch::jit::load(argv[1]);
    const at::Tensor x = torch::ones({3, 16});
    const at::Tensor y1 = m.forward({x, model}).toTensor();
    const at::Tensor y2 = m.forward({x, model}).toTensor();
    const at::Tensor want = x.matmul(m.attr("w").toTensor());
    if (!y1.equal(want) || !y2.equal(want)) {
      std::cerr << "the TorchScript module returned wrong values\n";
      return 1;
    }
    pins::ops::end_prompt();
    const auto s = pins::ops::stats();
    std::cout << "pins_cpp_app: ok hits=" << s.at("hits") << " misses=" << s.at("misses")
              << " pins=" << s.at("pins") << "\n";
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "pins_cpp_app: " << e.what() << "\n";
    return 1;
  }
}
