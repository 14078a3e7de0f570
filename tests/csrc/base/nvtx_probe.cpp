// A minimal NVTX tool for tests: loaded through NVTX_INJECTION64_PATH, it
// records domain creation and range pushes/pops, so a test can check what a
// profiler such as Nsight Systems would show. Dump with pins_nvtx_probe_dump().
#include <nvtx3/nvToolsExt.h>

#include <mutex>
#include <string>
#include <vector>

namespace {

std::mutex mu;
std::vector<std::string>* events = new std::vector<std::string>;  // leaked: outlives static destruction
std::string dump;

struct Domain {
  std::string name;
};

std::string name_of(nvtxDomainHandle_t d) { return d ? reinterpret_cast<Domain*>(d)->name : "(default)"; }

nvtxDomainHandle_t NVTX_API domain_create(const char* name) {
  std::lock_guard<std::mutex> g(mu);
  events->push_back(std::string("domain:") + name);
  return reinterpret_cast<nvtxDomainHandle_t>(new Domain{name});
}

int NVTX_API range_push(nvtxDomainHandle_t d, const nvtxEventAttributes_t* a) {
  std::lock_guard<std::mutex> g(mu);
  const char* msg = a && a->messageType == NVTX_MESSAGE_TYPE_ASCII ? a->message.ascii : "?";
  events->push_back("push:" + name_of(d) + ":" + msg);
  return 0;
}

int NVTX_API range_pop(nvtxDomainHandle_t d) {
  std::lock_guard<std::mutex> g(mu);
  events->push_back("pop:" + name_of(d));
  return 0;
}

}  // namespace

extern "C" {

NVTX_DYNAMIC_EXPORT int InitializeInjectionNvtx2(NvtxGetExportTableFunc_t get_export_table) {
  const auto* callbacks = static_cast<const NvtxExportTableCallbacks*>(get_export_table(NVTX_ETID_CALLBACKS));
  if (callbacks == nullptr) return 0;
  NvtxFunctionTable table = nullptr;
  unsigned int size = 0;
  if (!callbacks->GetModuleFunctionTable(NVTX_CB_MODULE_CORE2, &table, &size) || table == nullptr) return 0;
  if (size <= NVTX_CBID_CORE2_DomainCreateA) return 0;
  *table[NVTX_CBID_CORE2_DomainCreateA] = reinterpret_cast<NvtxFunctionPointer>(&domain_create);
  *table[NVTX_CBID_CORE2_DomainRangePushEx] = reinterpret_cast<NvtxFunctionPointer>(&range_push);
  *table[NVTX_CBID_CORE2_DomainRangePop] = reinterpret_cast<NvtxFunctionPointer>(&range_pop);
  return 1;
}

// Every recorded event, one per line.
NVTX_DYNAMIC_EXPORT const char* pins_nvtx_probe_dump() {
  std::lock_guard<std::mutex> g(mu);
  dump.clear();
  for (const std::string& e : *events) dump += e + "\n";
  return dump.c_str();
}

}  // extern "C"
