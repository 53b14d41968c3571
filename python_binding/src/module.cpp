// pybind11 module `fluxon._fluxon`: the C++ KvClient, with every failure raised as the matching
// exception class of `fluxon.errors` (one hierarchy rooted at fluxon.Error). Calls release the
// GIL while they wait on the owner.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "fluxon/client/cuda_registration.hpp"
#include "fluxon/client/kv_client.hpp"

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
  explicit PyClient(const std::string& config_text, bool from_file) {
    auto cfg = from_file ? load_config_file(config_text) : parse_config_text(config_text);
    if (!cfg.ok()) raise_status(cfg.status());
    auto c = released([&] { return KvClient::open(*cfg); });
    client_ = unwrap(std::move(c));
  }
  KvClient& c() {
    if (!client_) raise_status(Status(Code::kClosed, "client is closed"));
    return *client_;
  }
  std::unique_ptr<KvClient> client_;
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
  return a;
}

py::object opt_int(const std::optional<uint32_t>& v) { return v ? py::object(py::int_(*v)) : py::object(py::none()); }

}  // namespace

PYBIND11_MODULE(_fluxon, m) {
  m.doc() = "Fluxon native client";
  m.attr("PLAN_MAGIC") = py::int_(kPlanMagic);

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
      .def(py::init<const std::string&, bool>())
      .def("wait_local_segments_ready",
           [](PyClient& self) {
             auto segs = unwrap(released([&] { return self.c().wait_local_segments_ready(); }));
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
             return unwrap(released([&] { return self.c().local_fast_put_start(keys, value_len, a); }));
           })
      .def("local_fast_put_commit",
           [](PyClient& self, uint64_t plan) {
             return unwrap(released([&] { return self.c().local_fast_put_commit(plan); }));
           })
      .def("put_abort",
           [](PyClient& self, uint64_t plan) { check(released([&] { return self.c().put_abort(plan); })); })
      .def("get_start",
           [](PyClient& self, std::vector<std::string> keys, bool best_effort, py::object groups) {
             std::optional<std::vector<uint32_t>> g;
             if (!groups.is_none()) g = groups.cast<std::vector<uint32_t>>();
             auto [h, r] = unwrap(released([&] { return self.c().get_start(keys, best_effort, g); }));
             py::dict d;
             d["raw_prefix_hit_len"] = r.raw_prefix_hit_len;
             d["transferable_len"] = r.transferable_len;
             d["prefix_hit_groups"] = r.prefix_hit_groups;
             d["first_miss_index"] = opt_int(r.first_miss_index);
             d["first_miss_group_index"] = opt_int(r.first_miss_group_index);
             d["all_hit"] = r.all_hit;
             return py::make_tuple(h, d);
           })
      .def("get_transfer",
           [](PyClient& self, uint64_t handle, py::object consume) {
             std::optional<int64_t> n;
             if (!consume.is_none()) n = consume.cast<int64_t>();
             return unwrap(released([&] { return self.c().get_transfer(handle, n); }));
           })
      .def("cancel_get_transfer",
           [](PyClient& self, uint64_t handle) {
             check(released([&] { return self.c().cancel_get_transfer(handle); }));
           })
      .def("release_views",
           [](PyClient& self, uint64_t plan) { check(released([&] { return self.c().release_views(plan); })); })
      .def("stats", [](PyClient& self) { return unwrap(released([&] { return self.c().stats(); })); })
      .def("ping", [](PyClient& self) { check(released([&] { return self.c().ping(); })); })
      .def("register_segments_with_cuda",
           [](PyClient& self) {
             auto segs = unwrap(released([&] { return register_segments_with_cuda(self.c()); }));
             return segs.size();
           })
      .def("master_route_count",
           [](PyClient& self) { return unwrap(released([&] { return self.c().master_route_count(); })); })
      .def("_send_raw_for_test",
           [](PyClient& self, py::bytes b) {
             std::string s = b;
             std::vector<uint8_t> v(s.begin(), s.end());
             check(released([&] { return self.c().send_raw_for_test(v); }));
           })
      .def("close", [](PyClient& self) {
        if (!self.client_) return;
        released([&] {
          self.client_->close();
          return 0;
        });
        self.client_.reset();
      });
}
