// The Python bindings of the kernels: the one file that includes pybind11 and torch's tensor
// casters. Not <torch/extension.h> (torch's whole C++ API besides): 26.7 s -> 13.2 s to compile this
// file (g++ 13, Zen 4 EPYC), the longest step of a first run's kernel build (torch_lite.h).
#include <torch/csrc/utils/pybind.h>

#include "ops.h"
#include "gguf_common.h"

namespace py = pybind11;

namespace {

// (parts [(kind, records, out)], bias or None) -> a decoder projection
NativeDecoder::Projection read_projection(const py::handle& spec) {
    auto t = spec.cast<py::tuple>();
    NativeDecoder::Projection p;
    for (const auto& part : t[0].cast<py::list>()) {
        auto pt = part.cast<py::tuple>();
        p.parts.push_back({pt[0].cast<int64_t>(), pt[1].cast<at::Tensor>(), pt[2].cast<int64_t>()});
        p.out += p.parts.back().out;
    }
    if (!t[1].is_none()) p.bias = t[1].cast<at::Tensor>().contiguous();
    return p;
}

// Decoder(layers, num_heads, eps): one tuple a layer, (ln1, ln2, k_cache, v_cache, qkv, o, gate_up, down[, q_norm, k_norm])
NativeDecoder read_decoder(const py::list& layers, int64_t num_heads, double eps) {
    std::vector<NativeDecoder::Layer> read;
    for (const auto& item : layers) {
        auto t = item.cast<py::tuple>();
        TORCH_CHECK(t.size() == 8 || t.size() == 10, "a layer is (ln1, ln2, k_cache, v_cache, qkv, o, gate_up, down[, q_norm, k_norm])");
        NativeDecoder::Layer l{t[0].cast<at::Tensor>(), t[1].cast<at::Tensor>(), t[2].cast<at::Tensor>(), t[3].cast<at::Tensor>(),
                               read_projection(t[4]), read_projection(t[5]), read_projection(t[6]), read_projection(t[7]),
                               std::nullopt, std::nullopt};
        if (t.size() == 10 && !t[8].is_none()) {
            l.q_norm = t[8].cast<at::Tensor>().contiguous();
            l.k_norm = t[9].cast<at::Tensor>().contiguous();
        }
        read.push_back(std::move(l));
    }
    return NativeDecoder(std::move(read), num_heads, eps);
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.def("quantize_q8k", &quantize_q8k, "x [T, in] float32 -> (qx int8 [T, in'], xs f32 [T, in'/256], bsums i16 [T, in'/16]), in' = in rounded up to 256 (zeros)");
    m.def("q4k_matmul", &q4k_matmul, "Q8_K activations x Q4_K records of 8 rows, out_features -> y [T, O] float32");
    m.def("q6k_matmul", &q6k_matmul, "Q8_K activations x Q6_K weight records, out_features -> y [T, O] float32");
    m.def("kernel_path", &kernel_path, "the ISA path the Q4_K / Q6_K kernels take: avx2, avx-vnni, avx512-vnni or amx-int8");
    m.def("set_kernel_path", &set_kernel_path, "force a kernel path (avx2, avx-vnni, avx512-vnni, amx-int8) or auto (the best this CPU has)");
    m.def("kernel_paths", &kernel_paths, "the kernel paths this CPU can run");
    m.def("issue_rates", &issue_rates, "[vpaddw, vpmaddubsw] ymm instructions per second on this thread, timed for ~seconds in all (the machine's phase)",
          pybind11::arg("seconds") = 0.02);
    m.def("amx_emulated", &gguf::amx_emulated, "whether the amx-int8 path runs its tiles emulated (tests)");
    m.def("amx_min_rows", &gguf::amx_min_rows, "rows of x from which the amx-int8 path takes the tiles (fewer: AVX-512 VNNI)");
    m.def("set_amx_min_rows", &gguf::set_amx_min_rows, "set those rows (n <= 0: SPECDRAFT_AMX_MIN_ROWS or the built-in default)");
    m.def("set_amx_emulated", &set_amx_emulated, "emulate the AMX tiles (on an AVX-512 VNNI CPU: the amx-int8 path becomes available, slow; tests)");
    m.def("vnni_forms", &vnni_forms, "the AVX-512 VNNI form masks [Q4_K short, Q4_K long, Q6_K short, Q6_K long rows]: bit n set = n rows a pass a zmm");
    m.def("set_vnni_forms", &set_vnni_forms, "set the AVX-512 VNNI form masks [Q4_K short, Q4_K long, Q6_K short, Q6_K long rows]");
    m.def("vnni_forms_timed", &gguf::vnni_forms_timed, "whether the VNNI form of 1..8 rows is chosen per product by timing (else by the masks)");
    m.def("set_vnni_forms_timed", &gguf::set_vnni_forms_timed, "choose the VNNI forms by timing (True, the default) or by the masks");
    m.def("vnni_form_stats", &gguf::vnni_form_stats, "[key, timed ymm, timed zmm, mean ns ymm, mean ns zmm] per product the timing saw");
    m.def("clear_vnni_form_stats", &gguf::clear_vnni_form_stats, "forget every product's times");
    m.def("simulate_form_choice", &gguf::simulate_form_choice, "the timed choice's picks (0 ymm, 1 zmm) for made-up times per product, the fixed form first",
          pybind11::arg("ymm_ns"), pybind11::arg("zmm_ns"), pybind11::arg("fixed") = 0);
    m.def("block_attention", &block_attention, "q [nh, T, hd], k/v cache [nkv, C, hd], length L, mask [T, L] or None -> [T, nh, hd]",
          pybind11::arg("q"), pybind11::arg("k"), pybind11::arg("v"), pybind11::arg("length"), pybind11::arg("mask") = pybind11::none());
    m.def("rms_quantize", &rms_quantize, "x [T, H], w [H], eps -> quantize_q8k(RMSNorm(x) * w)");
    m.def("swiglu_quantize", &swiglu_quantize, "gate_up [T, 2I] -> quantize_q8k(silu(gate) * up)");
    m.def("rope_cache", &rope_cache, "qkv [T, (nh + 2 nkv) hd], cos, sin_signed [T, hd], k/v caches, start, nh[, q_norm, k_norm [hd], eps] -> q [nh, T, hd]; k, v stored",
          pybind11::arg("qkv"), pybind11::arg("cos"), pybind11::arg("sin_signed"), pybind11::arg("k_cache"), pybind11::arg("v_cache"),
          pybind11::arg("start"), pybind11::arg("num_heads"), pybind11::arg("q_norm") = pybind11::none(),
          pybind11::arg("k_norm") = pybind11::none(), pybind11::arg("eps") = 0.0);
    // module_local: builds of other sources can load beside this one (scripts/kernel_ab.py)
    pybind11::class_<NativeDecoder>(m, "Decoder", pybind11::module_local())
        .def(pybind11::init(&read_decoder), "layers: [(ln1, ln2, k_cache, v_cache, qkv, o, gate_up, down[, q_norm, k_norm])], num_heads, eps")
        .def("forward", &NativeDecoder::forward, "x [T, H], start, cos, sin_signed [T, hd], mask [T, start + T] or None -> x after every layer",
             pybind11::arg("x"), pybind11::arg("start"), pybind11::arg("cos"), pybind11::arg("sin_signed"), pybind11::arg("mask") = pybind11::none())
        .def("forward_tapped", &NativeDecoder::forward_tapped,
             "x [T, H], start, cos, sin_signed, mask or None, taps (ascending layer indices) -> (x after every layer, "
             "x after each tapped layer [T, len(taps), H])",
             pybind11::arg("x"), pybind11::arg("start"), pybind11::arg("cos"), pybind11::arg("sin_signed"),
             pybind11::arg("mask"), pybind11::arg("taps"))
        .def("step_seconds", &NativeDecoder::step_seconds, "seconds in each step kind (step_names) since the last clear, over layers and forwards")
        .def("clear_step_seconds", &NativeDecoder::clear_step_seconds, "zero the step times")
        .def_property_readonly_static("step_names", [](pybind11::object) {
            return std::vector<std::string>(std::begin(NativeDecoder::STEP_NAMES), std::end(NativeDecoder::STEP_NAMES));
        });
}
