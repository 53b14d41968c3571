#include "fluxon/runtime/segment.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <algorithm>
#include <atomic>
#include <fstream>
#include <sstream>
#include <vector>

namespace fluxon {

std::string segment_name(const std::string& cluster, uint32_t node_id, uint64_t generation) {
  return "/fluxon." + cluster + "." + std::to_string(node_id) + "." + std::to_string(generation);
}

// The liveness lock: an open-file-description lock (F_OFD_SETLK), so it conflicts even with a
// check made from the owner's own process (a POSIX record lock would not), and it goes with the
// owner's last descriptor however the owner ends.
static bool try_lock(int fd, bool wait) {
  struct flock fl {};
  fl.l_type = F_WRLCK;
  fl.l_whence = SEEK_SET;
  for (;;) {
    if (fcntl(fd, wait ? F_OFD_SETLKW : F_OFD_SETLK, &fl) == 0) return true;
    if (errno != EINTR) return false;
  }
}

// "fluxon.<cluster>.<node>.<generation>" of exactly this cluster: the rest after the prefix is two
// decimal numbers (cluster "a" never matches a segment of cluster "a.b").
static bool of_cluster(const std::string& file, const std::string& cluster) {
  const std::string prefix = "fluxon." + cluster + ".";
  if (file.size() <= prefix.size() || file.compare(0, prefix.size(), prefix) != 0) return false;
  const std::string rest = file.substr(prefix.size());
  const size_t dot = rest.find('.');
  auto digits = [](const std::string& d) {
    return !d.empty() && d.size() <= 20 && std::all_of(d.begin(), d.end(), [](char c) { return c >= '0' && c <= '9'; });
  };
  return dot != std::string::npos && digits(rest.substr(0, dot)) && digits(rest.substr(dot + 1));
}

SegmentSweep sweep_dead_segments(const std::string& cluster, bool remove) {
  SegmentSweep out;
  DIR* d = opendir("/dev/shm");
  if (!d) return out;
  std::vector<std::string> names;
  while (dirent* e = readdir(d))
    if (of_cluster(e->d_name, cluster)) names.push_back(e->d_name);
  closedir(d);
  std::sort(names.begin(), names.end());
  for (const std::string& n : names) {
    const std::string path = "/" + n;
    int fd = shm_open(path.c_str(), O_RDWR, 0600);
    if (fd < 0) continue;  // gone meanwhile, or not ours to open
    struct stat st {};
    const uint64_t bytes = fstat(fd, &st) == 0 ? uint64_t(st.st_size) : 0;
    // A live owner holds the lock for its whole life; a free lock means its creator is gone. The
    // name is unlinked while the lock is held: an owner that has just created it (and waits for
    // the lock) finds its name gone and creates it again.
    if (try_lock(fd, false)) {
      if (!remove || shm_unlink(path.c_str()) == 0) out.dead.push_back({path, bytes});
    } else {
      out.live.push_back({path, bytes});
    }
    close(fd);
  }
  return out;
}

// An owner killed by SIGKILL cannot unlink its segment, and nobody else would until that node's
// next owner starts: its memory stays taken in /dev/shm. So the owner leaves a guardian: a process
// (forked twice: init reaps it, and it is in no process group of ours) that waits on a pipe whose
// write end only the owner holds, and unlinks the segment's name when the owner is gone, however
// it went (after a clean stop the name is gone already). Returns the write end (-1: no guardian;
// the next owner of the node still removes the stale segment).
static int start_guardian(const std::string& name) {
  int p[2];
  if (pipe2(p, O_CLOEXEC) != 0) return -1;
  const char* path = name.c_str();  // computed before fork: the child may only make system calls
  const pid_t child = fork();
  if (child < 0) {
    close(p[0]);
    close(p[1]);
    return -1;
  }
  if (child == 0) {
    if (fork() != 0) _exit(0);  // the middle process ends at once; the guardian goes to init
    setsid();
    signal(SIGINT, SIG_IGN);
    signal(SIGTERM, SIG_IGN);
    signal(SIGHUP, SIG_IGN);
    for (int fd = 0; fd < 4096; ++fd)
      if (fd != p[0]) close(fd);
    char b;
    for (;;) {  // nobody writes: the read ends when the last write end closes (the owner is gone)
      const ssize_t r = read(p[0], &b, 1);
      if (r == 0 || (r < 0 && errno != EINTR)) break;
    }
    shm_unlink(path);
    _exit(0);
  }
  close(p[0]);
  int st = 0;
  while (waitpid(child, &st, 0) < 0 && errno == EINTR) {
  }
  return p[1];
}

Result<std::unique_ptr<Segment>> Segment::create(const std::string& cluster, uint32_t node_id,
                                                 uint64_t generation, uint64_t bytes) {
  std::string name = segment_name(cluster, node_id, generation);
  int fd = -1;
  for (int attempt = 0; fd < 0; ++attempt) {
    fd = shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
    if (fd < 0) return Status(Code::kInternal, "shm_open(" + name + "): " + strerror(errno));
    // The owner holds the liveness lock for its whole life: a sweep tells a dead owner's segment
    // (lock free) from a live one. A sweep may lock and unlink the name in the instant between the
    // creation and this lock: then the name is gone (no links) and it is created again.
    struct stat st {};
    if (!try_lock(fd, true) || fstat(fd, &st) != 0) {
      const int e = errno;
      close(fd);
      shm_unlink(name.c_str());
      return Status(Code::kInternal, "segment " + name + ": " + strerror(e));
    }
    if (st.st_nlink == 0) {
      close(fd);
      fd = -1;
      if (attempt >= 8) return Status(Code::kInternal, "segment " + name + ": removed by a sweep 8 times in a row");
    }
  }
  fchmod(fd, 0600);  // umask must not widen or narrow it
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    int e = errno;
    close(fd);
    shm_unlink(name.c_str());
    return Status(Code::kInternal, "segment " + name + ": " + strerror(e));
  }
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    int e = errno;
    close(fd);
    shm_unlink(name.c_str());
    return Status(Code::kInternal, "mmap(" + name + "): " + strerror(e));
  }
  (void)madvise(p, bytes, MADV_HUGEPAGE);  // huge pages where the system's shmem THP mode allows
  auto seg = std::unique_ptr<Segment>(new Segment(name, static_cast<uint8_t*>(p), bytes, fd));
  seg->guardian_fd_ = start_guardian(name);
  return seg;
}

Result<std::unique_ptr<Segment>> Segment::open(const std::string& name, uint64_t bytes) {
  int fd = shm_open(name.c_str(), O_RDWR, 0600);
  if (fd < 0) return Status(Code::kGenerationMismatch, "segment " + name + " is gone: " + strerror(errno));
  struct stat st {};
  if (fstat(fd, &st) != 0 || static_cast<uint64_t>(st.st_size) < bytes) {
    close(fd);
    return Status(Code::kGenerationMismatch, "segment " + name + " is smaller than announced");
  }
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) return Status(Code::kInternal, "mmap(" + name + "): " + strerror(errno));
  (void)madvise(p, bytes, MADV_HUGEPAGE);
  return std::unique_ptr<Segment>(new Segment(name, static_cast<uint8_t*>(p), bytes, -1));
}

void Segment::release(uint64_t offset, uint64_t len) const {
  if (offset >= size_) return;
  len = std::min(len, size_ - offset);
  const uint64_t page = 4096;
  const uint64_t start = (offset + page - 1) / page * page, end = (offset + len) / page * page;
  if (end > start) (void)madvise(base_ + start, end - start, MADV_REMOVE);
}

void Segment::populate(uint64_t offset, uint64_t len) const {
  if (offset >= size_) return;
  len = std::min(len, size_ - offset);
  const uint64_t page = 4096;
  uint64_t start = offset / page * page;
#ifdef MADV_POPULATE_WRITE
  if (madvise(base_ + start, offset + len - start, MADV_POPULATE_WRITE) == 0) return;
#endif
  for (uint64_t o = start; o < offset + len; o += page) {
    volatile uint8_t* p = base_ + o;
    *p = *p;
  }
}

Segment::~Segment() {
  munmap(base_, size_);
  if (owner_fd_ >= 0) {
    shm_unlink(name_.c_str());
    close(owner_fd_);
  }
  if (guardian_fd_ >= 0) close(guardian_fd_);  // the guardian finds the name gone and ends
}

uint64_t new_generation() {
  // Wall-clock nanoseconds: a restarted owner's generation is larger than its predecessor's, which
  // is how the master tells the new owner from a late message of the old one.
  static std::atomic<uint64_t> last{0};
  uint64_t g = uint64_t(std::chrono::system_clock::now().time_since_epoch().count());
  uint64_t prev = last.load();
  while (true) {
    const uint64_t next = std::max(g, prev + 1);
    if (last.compare_exchange_weak(prev, next)) return next;
  }
}

MappingPages mapping_pages(const void* addr) {
  MappingPages m;
  {
    std::ifstream f("/sys/kernel/mm/transparent_hugepage/shmem_enabled");
    std::string line;
    if (std::getline(f, line)) {
      const auto a = line.find('['), b = line.find(']');
      if (a != std::string::npos && b != std::string::npos && b > a) m.shmem_thp = line.substr(a + 1, b - a - 1);
    }
  }
  std::ifstream f("/proc/self/smaps");
  std::string line;
  bool in = false;
  const auto want = reinterpret_cast<uintptr_t>(addr);
  auto kb = [](const std::string& l, size_t skip) {
    std::istringstream is(l.substr(skip));
    uint64_t v = 0;
    is >> v;
    return v * 1024;
  };
  while (std::getline(f, line)) {
    unsigned long lo = 0, hi = 0;
    char dash = 0;
    std::istringstream head(line);
    if (head >> std::hex >> lo >> dash >> hi && dash == '-' && line.find(':') > line.find(' ')) {
      if (in) break;  // past the mapping
      in = want >= lo && want < hi;
      continue;
    }
    if (!in) continue;
    if (line.rfind("KernelPageSize:", 0) == 0) m.page_bytes = kb(line, 15);
    else if (line.rfind("ShmemPmdMapped:", 0) == 0) m.huge_bytes += kb(line, 15);
    else if (line.rfind("AnonHugePages:", 0) == 0) m.huge_bytes += kb(line, 14);
    else if (line.rfind("FilePmdMapped:", 0) == 0) m.huge_bytes += kb(line, 14);
  }
  return m;
}

}  // namespace fluxon
