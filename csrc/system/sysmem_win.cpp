// System memory on Windows (the Linux reading is sysmem_linux.cpp).
//
// Note [Windows memory readings]
// R and A are GlobalMemoryStatusEx's physical memory: ullTotalPhys, and
// ullAvailPhys, which like MemAvailable counts the standby list (the file cache
// the system gives back first) as available. Windows reports commit rather than
// swap: ullTotalPageFile is the commit limit, RAM plus the paging files, so
// swap_total is the paging files' size (that limit less RAM) and swap_free the
// commit still free beyond the available RAM, at most swap_total.
// A job object takes the place of the cgroup. When the process runs in a job
// whose limits (JOBOBJECT_EXTENDED_LIMIT_INFORMATION) cap committed memory,
// JOB_OBJECT_LIMIT_PROCESS_MEMORY for this process or JOB_OBJECT_LIMIT_JOB_MEMORY
// for all of the job's processes together, the tightest cap bounds R, and the
// cap less what is committed under it (this process's private bytes, or those
// of every process in the job) bounds A. A job's caps count commit, not RAM: a
// page in the paging file counts and the file cache does not, where a cgroup's
// memory.max counts the reverse. Only the job the process is directly in is
// read; the caps of a job that one is nested in are not.
#include "csrc/system/sysmem.h"

#include <windows.h>
#include <psapi.h>

#include <algorithm>
#include <limits>
#include <memory>
#include <vector>

#include "csrc/base/check.h"
#include "csrc/base/saturate.h"
#include "csrc/base/win32.h"

namespace pins {
namespace {

constexpr uint64_t kNoLimit = std::numeric_limits<uint64_t>::max();

// A process's private bytes (its commit); 0 when it cannot be asked (gone, or
// not ours to open).
uint64_t private_bytes(HANDLE process) {
  PROCESS_MEMORY_COUNTERS_EX pmc{};
  if (!K32GetProcessMemoryInfo(process, reinterpret_cast<PROCESS_MEMORY_COUNTERS*>(&pmc), sizeof pmc)) return 0;
  return pmc.PrivateUsage;
}

// The ids of the processes in this process's job.
std::vector<DWORD> job_process_ids() {
  std::vector<char> buf(sizeof(JOBOBJECT_BASIC_PROCESS_ID_LIST) + 64 * sizeof(ULONG_PTR));
  for (;;) {
    auto* list = reinterpret_cast<JOBOBJECT_BASIC_PROCESS_ID_LIST*>(buf.data());
    const DWORD size = static_cast<DWORD>(buf.size());
    if (!QueryInformationJobObject(nullptr, JobObjectBasicProcessIdList, list, size, nullptr) &&
        GetLastError() != ERROR_MORE_DATA)
      throw ResourceError(detail::cat("cannot list the processes of this process's job: ",
                                      win32::error_text(GetLastError())));
    if (list->NumberOfProcessIdsInList >= list->NumberOfAssignedProcesses)
      return std::vector<DWORD>(list->ProcessIdList, list->ProcessIdList + list->NumberOfProcessIdsInList);
    // More than the buffer holds (or than it did a moment ago): ask again, with room to spare.
    buf.resize(sizeof(JOBOBJECT_BASIC_PROCESS_ID_LIST) + (list->NumberOfAssignedProcesses + 16) * sizeof(ULONG_PTR));
  }
}

// The private bytes of every process in this process's job.
uint64_t job_private_bytes() {
  uint64_t sum = 0;
  for (const DWORD id : job_process_ids()) {
    const HANDLE p = OpenProcess(PROCESS_QUERY_LIMITED_INFORMATION, FALSE, id);
    if (p == nullptr) continue;  // gone since, or not ours to ask
    sum = add_sat(sum, private_bytes(p));
    CloseHandle(p);
  }
  return sum;
}

// Note [Windows memory readings]: bounds `m` by the caps of the job this
// process runs in, if any.
void bound_by_job(MemoryInfo& m) {
  BOOL in_job = FALSE;
  if (!IsProcessInJob(GetCurrentProcess(), nullptr, &in_job) || !in_job) return;
  JOBOBJECT_EXTENDED_LIMIT_INFORMATION job{};
  if (!QueryInformationJobObject(nullptr, JobObjectExtendedLimitInformation, &job, sizeof job, nullptr))
    throw ResourceError(
        detail::cat("cannot read the limits of this process's job: ", win32::error_text(GetLastError())));
  const DWORD flags = job.BasicLimitInformation.LimitFlags;
  uint64_t limit = kNoLimit, room = kNoLimit;
  if (flags & JOB_OBJECT_LIMIT_PROCESS_MEMORY) {
    limit = job.ProcessMemoryLimit;
    room = sub_sat(job.ProcessMemoryLimit, private_bytes(GetCurrentProcess()));
  }
  if (flags & JOB_OBJECT_LIMIT_JOB_MEMORY) {
    limit = std::min<uint64_t>(limit, job.JobMemoryLimit);
    room = std::min(room, sub_sat(job.JobMemoryLimit, job_private_bytes()));
  }
  m.cgroup_limited = limit < m.total;
  m.total = std::min(m.total, limit);
  m.available = std::min({m.available, room, m.total});
}

}  // namespace

// Nothing to keep between readings: each asks the system afresh.
class SystemMemoryProbe::Source {
 public:
  MemoryInfo read();
};

// `root` names where Linux's /proc is; Windows has no such files to stand in for.
SystemMemoryProbe::SystemMemoryProbe(std::string, int64_t max_age_ns)
    : source_(std::make_unique<Source>()), max_age_ns_(max_age_ns) {}

SystemMemoryProbe::~SystemMemoryProbe() = default;

MemoryInfo SystemMemoryProbe::read() { return source_->read(); }

MemoryInfo SystemMemoryProbe::Source::read() {
  MEMORYSTATUSEX s{};
  s.dwLength = sizeof s;
  if (!GlobalMemoryStatusEx(&s))
    throw ResourceError(detail::cat("GlobalMemoryStatusEx failed: ", win32::error_text(GetLastError())));
  MemoryInfo m;
  m.total = s.ullTotalPhys;
  m.available = std::min(s.ullAvailPhys, s.ullTotalPhys);
  m.swap_total = sub_sat(s.ullTotalPageFile, s.ullTotalPhys);
  m.swap_free = std::min(m.swap_total, sub_sat(s.ullAvailPageFile, s.ullAvailPhys));
  bound_by_job(m);
  return m;
}

}  // namespace pins
