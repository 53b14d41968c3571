#pragma once
#include <csignal>

namespace fluxon::actors {

// Block SIGINT/SIGTERM in every thread (call before any thread starts), then wait for one.
inline void block_stop_signals() {
  sigset_t s;
  sigemptyset(&s);
  sigaddset(&s, SIGINT);
  sigaddset(&s, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &s, nullptr);
}

inline int wait_stop_signal() {
  sigset_t s;
  sigemptyset(&s);
  sigaddset(&s, SIGINT);
  sigaddset(&s, SIGTERM);
  int sig = 0;
  sigwait(&s, &sig);
  return sig;
}

}  // namespace fluxon::actors
