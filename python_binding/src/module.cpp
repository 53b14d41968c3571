// pybind11 module `fluxon._fluxon`: the C++ KvClient, with every failure raised as the matching
// exception class of `fluxon.errors` (one hierarchy rooted at fluxon.Error). Calls release the
// GIL while they wait on the owner.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstring>
#include <thread>

#include "fluxon/client/cuda_registration.hpp"
#include "fluxon/actors/client.hpp"
#include "fluxon/client/kv_client.hpp"
#include "fluxon/kv/kv_layout.hpp"
#ifdef FLUXON_HAVE_CUDA
#include "fluxon/kv/kv_cuda.hpp"
#endif

namespace py = pybind11;
using namespace fluxon;

namespace {

[[noreturn]] void raise_status(const Status& s) {
  py::module_ errors = py::module_::import("fluxon.errors");
  py::object cls = errors.attr("error_class")(std::string(code_name(s.code())));
  py::list reasons;
  for (auto r : s.reasons) reasons.append(r == ConflictReason::kExists ? "exists" : "inflight");
  py::object exc = cls(s.message(), py::arg("indices") = s.indices, py::arg("reasons") = reasons,
                       py::arg("stage") = s.stage.empty() ? py::object(py::none()) : py::str(s.stage));
  PyErr_SetObject(cls.ptr(), exc.ptr());
  throw py::error_already_set();
}

template <class F>
auto released(F&& f) {
  py::gil_scoped_release nogil;
  return f();
}

template <class T>
T unwrap(Result<T> r) {
  if (!r.ok()) raise_status(r.status());
  return std::move(r.value());
}

void check(const Status& s) {
  if (!s.is_ok()) raise_status(s);
}

class PyClient {
 public:
  PyClient(const std::string& config_text, bool from_file, uint32_t max_wait_ms) {
    auto cfg = from_file ? load_config_file(config_text) : parse_config_text(config_text);
    if (!cfg.ok()) raise_status(cfg.status());
    if (max_wait_ms) cfg->client.max_wait_ms = max_wait_ms;
    auto c = released([&] { return open_client(*cfg); });
    client_ = unwrap(std::move(c));
  }
  // Called with the GIL held, before a call releases it: the call keeps the client alive even if
  // another thread closes it meanwhile.
  std::shared_ptr<KvClient> c() {
    if (!client_) raise_status(Status(Code::kClosed, "client is closed"));
    return client_;
  }
  std::shared_ptr<KvClient> client_;
};

PutOptionalArgs to_opts(const py::object& o) {
  PutOptionalArgs a;
  if (o.is_none()) return a;
  a.reject_if_inflight_same_key = o.attr("reject_if_inflight_same_key").cast<bool>();
  a.reject_if_exist_same_key = o.attr("reject_if_exist_same_key").cast<bool>();
  a.write_through = o.attr("write_through").cast<bool>();
  a.make_replica_task = o.attr("make_replica_task").cast<bool>();
  auto mask = o.attr("make_replica_task_mask");
  if (!mask.is_none()) a.make_replica_task_mask = mask.cast<std::vector<bool>>();
  auto groups = o.attr("atomic_group_lens");
  if (!groups.is_none()) a.atomic_group_lens = groups.cast<std::vector<uint32_t>>();
  auto lease = o.attr("lease_id");
  if (!lease.is_none()) a.lease_id = lease.cast<uint64_t>();
  auto parents = o.attr("radix_parent_keys");
  if (!parents.is_none()) a.radix_parent_keys = parents.cast<std::vector<std::string>>();
  auto depths = o.attr("content_depths");
  if (!depths.is_none()) a.content_depths = depths.cast<std::vector<uint32_t>>();
  auto pages = o.attr("replica_budget_pages"), prio = o.attr("replica_group_priorities"),
       ids = o.attr("replica_group_ids");
  if (!pages.is_none() || !prio.is_none() || !ids.is_none()) {
    ReplicaBudgetArgs b;
    b.pages = pages.is_none() ? 0 : pages.cast<uint32_t>();
    if (!prio.is_none()) b.priorities = prio.cast<std::vector<float>>();
    if (!ids.is_none()) b.group_ids = ids.cast<std::vector<uint64_t>>();
    b.shares = o.attr("replica_decision_shares").cast<uint32_t>();
    a.replica_budget = std::move(b);
  }
  return a;
}

// An int64/uint64 sequence from a list or any buffer (array.array('q'), numpy, memoryview).
template <class T>
std::vector<T> int_array(const py::object& o, const char* name) {
  if (py::isinstance<py::buffer>(o)) {
    py::buffer_info b = py::cast<py::buffer>(o).request();
    if (b.itemsize != 8 || b.ndim != 1) raise_status(invalid_argument(std::string(name) + ": need a 1-D buffer of 8-byte ints"));
    if (b.strides[0] != 8) raise_status(invalid_argument(std::string(name) + ": buffer must be contiguous"));
    const T* p = static_cast<const T*>(b.ptr);
    return std::vector<T>(p, p + b.shape[0]);
  }
  return o.cast<std::vector<T>>();
}

kv::KvLayout to_layout(const std::string& name, uint32_t layers, uint32_t page_size, uint64_t item_bytes) {
  kv::KvLayout L;
  if (name == "page_first") L.layout = kv::ValueLayout::kPageFirst;
  else if (name == "layer_first") L.layout = kv::ValueLayout::kLayerFirst;
  else if (name == "mla") L.layout = kv::ValueLayout::kMla;
  else raise_status(invalid_argument("layout: expected page_first, layer_first or mla, got '" + name + "'"));
  L.layer_num = layers;
  L.page_size = page_size;
  L.item_bytes = item_bytes;
  return L;
}

struct KvArgs {
  kv::PageCopy copy;
  std::vector<uint64_t> k, v;
  std::vector<int64_t> pages;
};

KvArgs kv_args(uint64_t plan, const std::string& layout, uint32_t layers, uint32_t page_size, uint64_t item_bytes,
               const py::object& k_ptrs, const py::object& v_ptrs, const py::object& page_indices, int layer) {
  KvArgs a;
  a.k = int_array<uint64_t>(k_ptrs, "k_ptrs");
  if (!v_ptrs.is_none()) a.v = int_array<uint64_t>(v_ptrs, "v_ptrs");
  a.pages = int_array<int64_t>(page_indices, "page_indices");
  a.copy.plan_ptr = plan;
  a.copy.layout = to_layout(layout, layers, page_size, item_bytes);
  if (a.k.size() != layers || (a.copy.layout.kv_count() == 2 && a.v.size() != layers))
    raise_status(invalid_argument("k_ptrs/v_ptrs: need one base pointer per layer"));
  a.copy.k_ptrs = a.k.data();
  a.copy.v_ptrs = a.v.empty() ? nullptr : a.v.data();
  a.copy.page_indices = a.pages.data();
  a.copy.page_count = a.pages.size();
  a.copy.layer = layer;
  return a;
}

// Page objects <-> plan values: page i's `per_page` objects (ptrs[i*per_page + j], sizes[j]) are
// the consecutive pieces of value i. One call per batch, on several threads for large batches:
// no Python loop touches a page.
Status plan_copy(uint64_t plan, const std::vector<uint64_t>& ptrs, const std::vector<uint64_t>& sizes, size_t pages,
                 bool into_plan, unsigned threads) {
  auto* blob = reinterpret_cast<const uint64_t*>(plan);
  if (plan == 0 || blob[0] != kPlanMagic) return invalid_argument("plan_ptr: not a Fluxon plan blob");
  if (blob[1] < pages) return invalid_argument("plan_ptr: plan holds fewer values than pages");
  if (pages == 0) return Status::ok();
  if (sizes.empty() || ptrs.size() != pages * sizes.size())
    return invalid_argument("ptrs: expected pages x objects-per-page pointers");
  const size_t per_page = sizes.size();
  uint64_t page_bytes = 0;
  for (auto s : sizes) page_bytes += s;
  // The value lengths follow the pointers: never a partial or an overlong copy.
  const uint64_t* lens = blob + 2 + blob[1];
  for (size_t i = 0; i < pages; ++i)
    if (lens[i] != page_bytes)
      return invalid_argument("plan value " + std::to_string(i) + " holds " + std::to_string(lens[i]) +
                              " bytes, the page has " + std::to_string(page_bytes));
  auto work = [&](size_t begin, size_t end) {
    for (size_t i = begin; i < end; ++i) {
      auto* value = reinterpret_cast<uint8_t*>(blob[2 + i]);
      for (size_t j = 0; j < per_page; ++j) {
        auto* obj = reinterpret_cast<uint8_t*>(ptrs[i * per_page + j]);
        if (into_plan) std::memcpy(value, obj, sizes[j]);
        else std::memcpy(obj, value, sizes[j]);
        value += sizes[j];
      }
    }
  };
  const uint64_t total = page_bytes * pages;
  unsigned n = std::min<unsigned>(threads ? threads : std::max(1u, std::thread::hardware_concurrency()),
                                  unsigned(std::min<size_t>(pages, 16)));
  if (total < (8u << 20)) n = 1;  // small batches: thread start-up would dominate
  if (n <= 1) {
    work(0, pages);
    return Status::ok();
  }
  std::vector<std::thread> ts;
  for (unsigned t = 0; t < n; ++t) ts.emplace_back(work, pages * t / n, pages * (t + 1) / n);
  for (auto& t : ts) t.join();
  return Status::ok();
}

py::object opt_int(const std::optional<uint32_t>& v) { return v ? py::object(py::int_(*v)) : py::object(py::none()); }

}  // namespace

PYBIND11_MODULE(_fluxon, m) {
  m.doc() = "Fluxon native client";
  m.attr("PLAN_MAGIC") = py::int_(kPlanMagic);
  // (name, doc) of every failure code, from the one list in status.hpp: fluxon.errors makes its classes.
  py::list codes;
#define FLUXON_PY_CODE(name, value, doc) \
  if (value != 0) codes.append(py::make_tuple(#name, doc));
  FLUXON_STATUS_CODES(FLUXON_PY_CODE)
#undef FLUXON_PY_CODE
  m.attr("ERROR_CODES") = codes;

  // KV page copies (cuda_kernels/): the CPU reference everywhere, the GPU paths where built.
  m.def("kv_value_bytes", [](const std::string& layout, uint32_t layers, uint32_t page_size, uint64_t item_bytes) {
    return to_layout(layout, layers, page_size, item_bytes).value_bytes();
  });
  m.def(
      "kv_copy_pages_cpu",
      [](const std::string& direction, uint64_t plan, const std::string& layout, uint32_t layers, uint32_t page_size,
         uint64_t item_bytes, py::object k_ptrs, py::object v_ptrs, py::object page_indices, int layer) {
        if (direction != "backup" && direction != "restore")
          raise_status(invalid_argument("direction: expected backup or restore"));
        KvArgs a = kv_args(plan, layout, layers, page_size, item_bytes, k_ptrs, v_ptrs, page_indices, layer);
        const auto dir = direction == "backup" ? kv::Direction::kBackup : kv::Direction::kRestore;
        check(released([&] { return kv::copy_pages_cpu(dir, a.copy); }));
      },
      py::arg("direction"), py::arg("plan_ptr"), py::arg("layout"), py::arg("layer_num"), py::arg("page_size"),
      py::arg("item_bytes"), py::arg("k_ptrs"), py::arg("v_ptrs"), py::arg("page_indices"), py::arg("layer") = -1);
#ifdef FLUXON_HAVE_CUDA
  m.attr("HAVE_CUDA") = true;
  py::class_<kv::GpuCopier>(m, "_GpuCopier")
      .def(py::init<>())
      .def(
          "copy",
          [](kv::GpuCopier& g, const std::string& direction, uint64_t plan, const std::string& layout, uint32_t layers,
             uint32_t page_size, uint64_t item_bytes, py::object k_ptrs, py::object v_ptrs, py::object page_indices,
             int layer, uint64_t stream, const std::string& path) {
            if (direction != "backup" && direction != "restore")
              raise_status(invalid_argument("direction: expected backup or restore"));
            if (path != "sm" && path != "copy_engine" && path != "few_sm")
              raise_status(invalid_argument("path: expected sm, copy_engine or few_sm"));
            KvArgs a = kv_args(plan, layout, layers, page_size, item_bytes, k_ptrs, v_ptrs, page_indices, layer);
            std::string why;
            if (!kv::cuda_device_available(&why)) raise_status(Status(Code::kInternal, "CUDA is not usable here: " + why));
            check(released([&] {
              return g.copy(direction == "backup" ? kv::Direction::kBackup : kv::Direction::kRestore, a.copy,
                            reinterpret_cast<void*>(stream),
                            path == "sm"            ? kv::CopyPath::kSmKernel
                            : path == "copy_engine" ? kv::CopyPath::kCopyEngine
                                                    : kv::CopyPath::kFewSm);
            }));
          },
          py::arg("direction"), py::arg("plan_ptr"), py::arg("layout"), py::arg("layer_num"), py::arg("page_size"),
          py::arg("item_bytes"), py::arg("k_ptrs"), py::arg("v_ptrs"), py::arg("page_indices"), py::arg("layer") = -1,
          py::arg("stream") = 0, py::arg("path") = "sm");
#else
  m.attr("HAVE_CUDA") = false;
#endif

  m.def(
      "plan_copy",
      [](uint64_t plan, py::object ptrs, py::object sizes, size_t pages, bool into_plan, unsigned threads) {
        auto p = int_array<uint64_t>(ptrs, "ptrs");
        auto s = int_array<uint64_t>(sizes, "sizes");
        check(released([&] { return plan_copy(plan, p, s, pages, into_plan, threads); }));
      },
      py::arg("plan_ptr"), py::arg("ptrs"), py::arg("sizes"), py::arg("pages"), py::arg("into_plan"),
      py::arg("threads") = 0);

  py::class_<KvFuture>(m, "_Future")
      .def("done", &KvFuture::done)
      .def("wait",
           [](const KvFuture& f, py::object timeout) {
             double t = timeout.is_none() ? -1.0 : timeout.cast<double>();
             return released([&] { return f.wait(t); });
           },
           py::arg("timeout_s") = py::none())
      .def("result",
           [](const KvFuture& f, py::object timeout) {
             double t = timeout.is_none() ? -1.0 : timeout.cast<double>();
             check(released([&] { return f.result(t); }));
           },
           py::arg("timeout_s") = py::none())
      .def_property_readonly("put_id", &KvFuture::put_id);

  py::class_<PyClient>(m, "_Client")
      .def(py::init<const std::string&, bool, uint32_t>(), py::arg("config"), py::arg("from_file"),
           py::arg("max_wait_ms") = 0)
      .def("wait_local_segments_ready",
           [](PyClient& self) {
             auto segs = unwrap(released([&, cl = self.c()] { return cl->wait_local_segments_ready(); }));
             py::list out;
             for (auto& s : segs) {
               py::dict d;
               d["segment_label"] = s.segment_label;
               d["write_ptr"] = s.write_ptr;
               d["read_ptr"] = s.read_ptr;
               d["len"] = s.len;
               d["generation"] = s.generation;
               d["node_id"] = s.node_id;
               out.append(d);
             }
             return out;
           })
      .def("local_fast_put_start",
           [](PyClient& self, std::vector<std::string> keys, int64_t value_len, py::object opts) {
             PutOptionalArgs a = to_opts(opts);
             return unwrap(released([&, cl = self.c()] { return cl->local_fast_put_start(keys, value_len, a); }));
           })
      .def("local_fast_put_commit",
           [](PyClient& self, uint64_t plan) {
             return unwrap(released([&, cl = self.c()] { return cl->local_fast_put_commit(plan); }));
           })
      .def("put_abort",
           [](PyClient& self, uint64_t plan) { check(released([&, cl = self.c()] { return cl->put_abort(plan); })); })
      .def("get_start",
           [](PyClient& self, std::vector<std::string> keys, bool best_effort, py::object groups) {
             std::optional<std::vector<uint32_t>> g;
             if (!groups.is_none()) g = groups.cast<std::vector<uint32_t>>();
             auto [h, r] = unwrap(released([&, cl = self.c()] { return cl->get_start(keys, best_effort, g); }));
             py::dict d;
             d["raw_prefix_hit_len"] = r.raw_prefix_hit_len;
             d["transferable_len"] = r.transferable_len;
             d["prefix_hit_groups"] = r.prefix_hit_groups;
             d["first_miss_index"] = opt_int(r.first_miss_index);
             d["first_miss_group_index"] = opt_int(r.first_miss_group_index);
             d["all_hit"] = r.all_hit;
             d["local_keys"] = r.local_keys;
             d["joined_keys"] = r.joined_keys;
             d["leader_keys"] = r.leader_keys;
             d["remote_keys"] = r.remote_keys();
             d["sources"] = py::bytes(reinterpret_cast<const char*>(r.sources.data()), r.sources.size());
             return py::make_tuple(h, d);
           })
      .def("get_transfer",
           [](PyClient& self, uint64_t handle, py::object consume) {
             std::optional<int64_t> n;
             if (!consume.is_none()) n = consume.cast<int64_t>();
             return unwrap(released([&, cl = self.c()] { return cl->get_transfer(handle, n); }));
           })
      .def("cancel_get_transfer",
           [](PyClient& self, uint64_t handle) {
             check(released([&, cl = self.c()] { return cl->cancel_get_transfer(handle); }));
           })
      .def("release_views",
           [](PyClient& self, uint64_t plan) { check(released([&, cl = self.c()] { return cl->release_views(plan); })); })
      .def("exists_prefix",
           [](PyClient& self, std::vector<std::string> keys, py::object groups, uint64_t expected_len,
              const std::string& key_prefix, const std::string& key_suffix) {
             std::optional<std::vector<uint32_t>> g;
             if (!groups.is_none()) g = groups.cast<std::vector<uint32_t>>();
             auto r = unwrap(released(
                 [&, cl = self.c()] { return cl->exists_prefix(keys, g, expected_len, key_prefix, key_suffix); }));
             py::dict d;
             d["prefix_len"] = r.prefix_len;
             d["local_len"] = r.local_len;
             d["master_answered"] = r.master_answered;
             return d;
           },
           py::arg("keys"), py::arg("groups"), py::arg("expected_len"), py::arg("key_prefix") = "",
           py::arg("key_suffix") = "")
      .def("remove_prefix",
           [](PyClient& self, const std::string& prefix) {
             return unwrap(released([&, cl = self.c()] { return cl->remove_prefix(prefix); }));
           })
      .def("stats", [](PyClient& self) { return unwrap(released([&, cl = self.c()] { return cl->stats(); })); })
      .def(
          "wait_ready",
          [](PyClient& self, double timeout_s) {
            if (!(timeout_s >= 0)) check(invalid_argument("wait_ready: timeout_s must be >= 0"));
            const auto ms = uint64_t(timeout_s * 1000);
            return unwrap(released([&, cl = self.c()] { return cl->wait_ready(ms); }));
          },
          py::arg("timeout_s") = 600.0)
      .def("ping", [](PyClient& self) { check(released([&, cl = self.c()] { return cl->ping(); })); })
      .def("register_segments_with_cuda",
           [](PyClient& self) {
             auto segs = unwrap(released([&, cl = self.c()] { return register_segments_with_cuda(*cl); }));
             return segs.size();
           })
      .def("master_stats",
           [](PyClient& self) { return unwrap(released([&, cl = self.c()] { return cl->master_stats(); })); })
      .def("kv_events",
           [](PyClient& self, const std::string& prefix, uint64_t epoch, uint64_t seq, uint32_t max) {
             auto b = unwrap(released([&, cl = self.c()] { return cl->kv_events(prefix, epoch, seq, max); }));
             py::list events;
             for (const auto& e : b.events)
               events.append(py::make_tuple(e.seq, e.stored ? "stored" : "removed", e.key, e.node, e.origin_node,
                                            e.origin_generation, e.put_id, e.cause));
             py::dict d;
             d["events"] = events;
             d["epoch"] = b.epoch;
             d["next_seq"] = b.next_seq;
             d["first_seq"] = b.first_seq;
             d["lost"] = b.lost;
             return d;
           })
      .def("master_route_count",
           [](PyClient& self) { return unwrap(released([&, cl = self.c()] { return cl->master_route_count(); })); })
      .def("_send_raw_for_test",
           [](PyClient& self, py::bytes b) {
             std::string s = b;
             std::vector<uint8_t> v(s.begin(), s.end());
             check(released([&, cl = self.c()] { return cl->send_raw_for_test(v); }));
           })
      .def("close", [](PyClient& self) {
        if (!self.client_) return;
        std::shared_ptr<KvClient> cl = std::move(self.client_);
        released([&] {
          cl->close();
          return 0;
        });
      });
}
