// SystemMemoryProbe on Windows (sysmem_win.cpp, Note [Windows memory
// readings]): this machine's memory, and a job object's caps.
#include "csrc/system/sysmem.h"

#include <gtest/gtest.h>

#include <windows.h>

#include "csrc/base/size.h"

namespace pins {
namespace {

TEST(SystemMemoryProbeWindows, TheRootHasNoMeaning) {
  const MemoryInfo m = SystemMemoryProbe("C:/nonexistent").read();
  EXPECT_GT(m.total, 0u);
}

// Puts this process in a job whose limits the test sets and lifts; a process
// never leaves its job, so the last test to use it leaves it with no limit.
class ThisProcessJob {
 public:
  ThisProcessJob() {
    job_ = CreateJobObjectW(nullptr, nullptr);
    if (job_ != nullptr && !AssignProcessToJobObject(job_, GetCurrentProcess())) {
      CloseHandle(job_);
      job_ = nullptr;
    }
  }
  ~ThisProcessJob() {
    limit(0, 0);
    if (job_ != nullptr) CloseHandle(job_);
  }
  bool ok() const { return job_ != nullptr; }
  // Caps on this process's and the job's commit; 0 for none.
  bool limit(uint64_t process, uint64_t job) {
    JOBOBJECT_EXTENDED_LIMIT_INFORMATION info{};
    if (process) {
      info.BasicLimitInformation.LimitFlags |= JOB_OBJECT_LIMIT_PROCESS_MEMORY;
      info.ProcessMemoryLimit = process;
    }
    if (job) {
      info.BasicLimitInformation.LimitFlags |= JOB_OBJECT_LIMIT_JOB_MEMORY;
      info.JobMemoryLimit = job;
    }
    return SetInformationJobObject(job_, JobObjectExtendedLimitInformation, &info, sizeof info) != 0;
  }
  // Whether the system reports this process in the job, with the limits set
  // (wine 8 takes both, and reports neither).
  bool reported(uint64_t process) const {
    BOOL in = FALSE;
    JOBOBJECT_EXTENDED_LIMIT_INFORMATION info{};
    return IsProcessInJob(GetCurrentProcess(), job_, &in) && in &&
           QueryInformationJobObject(job_, JobObjectExtendedLimitInformation, &info, sizeof info, nullptr) &&
           info.ProcessMemoryLimit == process;
  }

 private:
  HANDLE job_ = nullptr;
};

TEST(SystemMemoryProbeWindows, AJobsCapBoundsTotalAndAvailable) {
  const MemoryInfo free = SystemMemoryProbe().read();
  ASSERT_GT(free.total, 1 * GiB);
  ThisProcessJob job;
  if (!job.ok()) GTEST_SKIP() << "this system refuses to put the test in a job object";
  const uint64_t cap = free.total / 2 / 4096 * 4096;  // well above what the test commits
  ASSERT_TRUE(job.limit(cap, 0));
  if (!job.reported(cap)) GTEST_SKIP() << "this system takes a job's limits but does not report them back (wine)";
  for (const auto& [process, whole_job] : {std::pair<uint64_t, uint64_t>{cap, 0}, {0, cap}, {cap + 4096, cap}}) {
    ASSERT_TRUE(job.limit(process, whole_job));
    const MemoryInfo m = SystemMemoryProbe().read();
    EXPECT_EQ(m.total, cap) << "process cap " << process << ", job cap " << whole_job;
    EXPECT_TRUE(m.cgroup_limited);
    EXPECT_LT(m.available, cap) << "what the test has committed is not counted";
    EXPECT_GT(m.available, 0u);
  }
  ASSERT_TRUE(job.limit(0, 0));
  const MemoryInfo lifted = SystemMemoryProbe().read();
  EXPECT_EQ(lifted.total, free.total);
  EXPECT_FALSE(lifted.cgroup_limited);
}

}  // namespace
}  // namespace pins
