"""The native task-table runner: steps stay ordered across threads, every task runs exactly once,
and programs without fallbacks run as one native call."""

from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from onnxsat.kernels.build import compile_kernels
from onnxsat.kernels.compile_options import CompileOptions
from onnxsat.kernels.compiled import CompiledModel
from onnxsat.kernels.native_runner import (
    IDLE_SPINS,
    KIND_KERNEL,
    SLEEPERS,
    TIMESPEC,
    NativeWorkers,
    TaskTable,
)
from onnxsat.lowering.kernel_ir import Binary, Buffer, Const, Kernel, Load, Store, Var
from onnxsat.lowering.program import KernelStep, MatMulStep


def _add_one(name: str, src: Buffer, dst: Buffer) -> Kernel:
    body = (Store(dst, Var("p"), Binary("add", Load(src, Var("p")), Const(1.0))),)
    return Kernel(name, (src, dst), (dst.name,), "p", dst.numel, body, float(dst.numel))


def test_steps_run_in_order_and_each_task_once_on_two_threads() -> None:
    """Step 2 reads what step 1 writes and step 3 what step 2 writes, each cut into many small
    tasks: a task run twice, skipped, or started before its step's predecessors finished shows."""
    n, parts = 1 << 14, 64
    x, y, z, w = (Buffer(name, "f32", (n,)) for name in "xyzw")
    kernels = [_add_one("first", x, y), _add_one("second", y, z), _add_one("third", z, w)]
    module, symbols, _ = compile_kernels(kernels, CompileOptions(cache=False))
    arrays = {b.name: np.zeros(n, np.float32) for b in (x, y, z, w)}
    arrays["x"][:] = np.arange(n, dtype=np.float32)
    keep = []
    steps = []
    for kernel in kernels:
        args = (ctypes.c_void_p * 2)(*[arrays[b.name].ctypes.data for b in kernel.params])
        keep.append(args)
        address = module.address(symbols[kernel.name])
        size = n // parts
        steps.append([[KIND_KERNEL, address, ctypes.addressof(args), i * size, (i + 1) * size] for i in range(parts)])
    table = TaskTable(steps, None)
    workers = NativeWorkers(1, None)
    for _ in range(20):
        for b in "yzw":
            arrays[b][:] = -1.0
        table.run(workers)
        np.testing.assert_array_equal(arrays["w"], arrays["x"] + 3.0)
    workers.close()


def _mlp(batch: int) -> tuple[object, dict[str, np.ndarray]]:
    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(rng.standard_normal((64, 96)).astype(np.float32), "w1"),
        numpy_helper.from_array(rng.standard_normal(96).astype(np.float32), "b1"),
        numpy_helper.from_array(rng.standard_normal((96, 40)).astype(np.float32), "w2"),
    ]
    n = helper.make_node
    nodes = [n("MatMul", ["x", "w1"], ["h"]), n("Add", ["h", "b1"], ["a"]), n("Relu", ["a"], ["r"]), n("MatMul", ["r", "w2"], ["y"])]
    graph = helper.make_graph(
        nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 40])], inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return model, {"x": rng.standard_normal((batch, 64)).astype(np.float32)}


def test_a_program_without_fallbacks_is_one_native_call_and_matches_numpy() -> None:
    model, feeds = _mlp(50)
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}  # type: ignore[attr-defined]
    want = np.maximum(feeds["x"] @ inits["w1"] + inits["b1"], 0) @ inits["w2"]
    for threads in (1, 2):
        compiled = CompiledModel(model, CompileOptions(threads=threads, cache=False))  # type: ignore[arg-type]
        assert compiled.stats(feeds).one_native_call
        first = compiled(feeds)["y"]
        second = compiled(feeds)["y"]
        assert first is not second  # outputs are copied out of the table's buffers
        np.testing.assert_allclose(first, want, rtol=1e-4, atol=1e-4)
        np.testing.assert_array_equal(first, second)
        compiled.close()


def test_a_program_with_a_fallback_runs_step_by_step() -> None:
    import onnx

    from onnxsat.latency import ort_session
    from onnxsat.verification import make_inputs

    model = onnx.load(str(Path(__file__).resolve().parent.parent / "examples" / "control_flow.onnx"))
    feeds = make_inputs(model, seed=0)
    compiled = CompiledModel(model, CompileOptions(threads=2, cache=False))
    got = compiled(feeds)
    stats = compiled.stats(feeds)
    assert stats.fallbacks and not stats.one_native_call
    session = ort_session(model, threads=1)
    for name, want in zip([o.name for o in session.get_outputs()], session.run(None, feeds), strict=True):
        np.testing.assert_allclose(got[name], want, rtol=1e-5, atol=1e-6)


def _split_outputs_model(fallback: bool) -> tuple[object, dict[str, np.ndarray], dict[str, np.ndarray]]:
    """A product split three ways, each part a graph output, next to a 1x1 conv's output (the
    conv's product writes a buffer of another shape) and, with ``fallback``, a CumSum that runs on
    numpy (the step-by-step path)."""
    rng = np.random.default_rng(4)
    n = helper.make_node
    w = rng.standard_normal((32, 96)).astype(np.float32)
    k = rng.standard_normal((8, 4, 1, 1)).astype(np.float32)
    nodes = [
        n("MatMul", ["x", "w"], ["p"]),
        n("Split", ["p"], ["y0", "y1", "y2"], axis=1, num_outputs=3),
        n("Conv", ["img", "k"], ["c"]),
    ]
    outputs = [helper.make_tensor_value_info(y, TensorProto.FLOAT, [24, 32]) for y in ("y0", "y1", "y2")]
    outputs.append(helper.make_tensor_value_info("c", TensorProto.FLOAT, [1, 8, 5, 5]))
    inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(k, "k")]
    if fallback:
        nodes.append(n("CumSum", ["x", "axis"], ["s"]))
        outputs.append(helper.make_tensor_value_info("s", TensorProto.FLOAT, [24, 32]))
        inits.append(numpy_helper.from_array(np.array(1, np.int64), "axis"))
    inputs = [
        helper.make_tensor_value_info("x", TensorProto.FLOAT, [24, 32]),
        helper.make_tensor_value_info("img", TensorProto.FLOAT, [1, 4, 5, 5]),
    ]
    model = helper.make_model(helper.make_graph(nodes, "g", inputs, outputs, inits), opset_imports=[helper.make_opsetid("", 18)])
    feeds = {"x": rng.standard_normal((24, 32)).astype(np.float32), "img": rng.standard_normal((1, 4, 5, 5)).astype(np.float32)}
    product = feeds["x"] @ w
    want = {f"y{i}": product[:, 32 * i : 32 * (i + 1)] for i in range(3)}
    want["c"] = np.einsum("oc,nchw->nohw", k[:, :, 0, 0], feeds["img"])
    if fallback:
        want["s"] = np.cumsum(feeds["x"], axis=1)
    return model, feeds, want


def test_outputs_that_are_parts_of_a_buffer_are_copied_once_into_arrays_of_their_own() -> None:
    """A Split's parts of a product and a conv's output, all graph outputs, are handed back from
    the buffers the products wrote (no copy kernel); each call returns new contiguous arrays that
    share no memory, on the native path and the step-by-step one."""
    for fallback in (False, True):
        model, feeds, want = _split_outputs_model(fallback)
        compiled = CompiledModel(model, CompileOptions(threads=2, cache=False))  # type: ignore[arg-type]
        exe = compiled.executable_for(feeds)
        assert set(exe.program.output_views) == {"y0", "y1", "y2", "c"}
        products = {step.out.name for step in exe.program.steps if isinstance(step, MatMulStep)}
        assert len(products) == 2
        copies = [step for step in exe.program.steps if isinstance(step, KernelStep) and products & {b.name for b in step.kernel.params}]
        assert not copies  # nothing reads what the products wrote
        assert (exe.native is None) == fallback
        first, second = compiled(feeds), compiled(feeds)
        for name, value in want.items():
            np.testing.assert_allclose(first[name], value, rtol=1e-5, atol=1e-5)
            np.testing.assert_array_equal(first[name], second[name])
            assert first[name].flags.c_contiguous and first[name].shape == value.shape
        arrays = list(first.values()) + list(second.values())
        assert not any(np.shares_memory(a, b) for i, a in enumerate(arrays) for b in arrays[i + 1 :])
        compiled.close()


def test_independent_steps_share_a_phase_and_dependent_ones_do_not() -> None:
    rng = np.random.default_rng(2)
    n = helper.make_node
    inits = [numpy_helper.from_array(rng.standard_normal((32, 48)).astype(np.float32), w) for w in ("wq", "wk")]
    model = helper.make_model(
        helper.make_graph(
            [n("MatMul", ["x", "wq"], ["q"]), n("MatMul", ["x", "wk"], ["k"]), n("Mul", ["q", "k"], ["y"])], "g",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [24, 32])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [24, 48])], inits,
        ),
        opset_imports=[helper.make_opsetid("", 17)],
    )
    feeds = {"x": rng.standard_normal((24, 32)).astype(np.float32)}
    compiled = CompiledModel(model, CompileOptions(threads=2, cache=False))
    got = compiled(feeds)["y"]
    exe = compiled.executable_for(feeds)
    assert exe.native is not None and len(exe.program.steps) == 3
    assert len(exe.native.step_ends) == 2  # the two products together, then the product that reads both
    w = {t.name: numpy_helper.to_array(t) for t in inits}
    np.testing.assert_allclose(got, (feeds["x"] @ w["wq"]) * (feeds["x"] @ w["wk"]), rtol=1e-5, atol=1e-5)


def test_running_a_model_leaves_the_callers_blas_threads_alone() -> None:
    """The runtime makes BLAS single-threaded on its threads while it runs, and gives the calling
    thread its setting back (numpy matmuls after a compiled call stay multithreaded)."""
    import threadpoolctl

    with threadpoolctl.threadpool_limits(2, user_api="blas"):
        before = [d["num_threads"] for d in threadpoolctl.threadpool_info() if d["user_api"] == "blas"]
        model, feeds = _mlp(512)  # big enough to split over helper threads
        for threads in (1, 2):
            compiled = CompiledModel(model, CompileOptions(threads=threads, cache=False))  # type: ignore[arg-type]
            for _ in range(3):
                compiled(feeds)
            compiled.close()
        after = [d["num_threads"] for d in threadpoolctl.threadpool_info() if d["user_api"] == "blas"]
    assert before == after


def _native_threads() -> list[object]:
    import threading

    # alive only: a helper of an earlier test's model may still be listed for a moment after it stopped
    return [t for t in threading.enumerate() if t.name.startswith("onnxsat-native-") and t.is_alive()]


def test_helper_threads_start_once_and_are_joined_on_close_and_collection() -> None:
    """Helpers are started with the model, serve every call (the same threads), and are gone after
    ``close`` or once the model is garbage-collected; one and two threads give equal results."""
    import gc

    model, feeds = _mlp(256)
    before = set(_native_threads())  # an earlier test's helper may stop meanwhile: compare new threads only
    single = CompiledModel(model, CompileOptions(threads=1, cache=False))  # type: ignore[arg-type]
    assert not set(_native_threads()) - before
    want = single(feeds)["y"]
    batch = model.graph.input[0].type.tensor_type.shape.dim[0]  # type: ignore[attr-defined]
    batch.dim_param = "batch"  # two signatures: two task tables served by the same helpers
    compiled = CompiledModel(model, CompileOptions(threads=3, cache=False))  # type: ignore[arg-type]
    started = set(_native_threads()) - before
    assert len(started) == 2
    small = {"x": feeds["x"][:200]}
    for _ in range(20):
        np.testing.assert_allclose(compiled(feeds)["y"], want, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(compiled(small)["y"], want[:200], rtol=1e-5, atol=1e-5)
    assert len(compiled._executables) == 2
    assert all(exe.native is not None and exe.native.widest > 1 for exe in compiled._executables.values())
    assert set(_native_threads()) - before == started
    compiled.close()
    compiled.close()  # idempotent
    assert not any(t.is_alive() for t in started)  # type: ignore[attr-defined]
    dropped = CompiledModel(model, CompileOptions(threads=2, cache=False))  # type: ignore[arg-type]
    dropped(feeds)
    (helper_thread,) = set(_native_threads()) - before
    del dropped
    gc.collect()
    assert not helper_thread.is_alive()  # type: ignore[attr-defined]


def test_an_idle_helper_spins_a_while_then_parks_and_answers_the_next_run() -> None:
    """After a run the helper spins (``IDLE_SPINS`` rounds, ~2 ms) so calls a moment apart find it
    awake, then parks on its futex (an idle model costs nothing); a parked helper joins the next run."""
    import time

    model, feeds = _mlp(256)
    compiled = CompiledModel(model, CompileOptions(threads=2, cache=False))  # type: ignore[arg-type]
    want = CompiledModel(model, CompileOptions(threads=1, cache=False))(feeds)["y"]  # type: ignore[arg-type]
    workers = compiled.workers
    assert workers is not None
    assert ctypes.c_int64.from_address(workers.start + IDLE_SPINS * 8).value >= 50_000
    sleepers = ctypes.c_int64.from_address(workers.start + SLEEPERS * 8)
    compiled(feeds)
    deadline = time.monotonic() + 5.0
    while sleepers.value != 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert sleepers.value == 1
    np.testing.assert_allclose(compiled(feeds)["y"], want, rtol=1e-5, atol=1e-5)
    compiled.close()


def test_a_parked_helper_whose_wait_times_out_parks_again_without_spinning() -> None:
    """A parked helper wakes every ``PARK_TIMEOUT_NS`` to re-check; with no run it must park again
    at once. (It used to spin its whole idle spin again after every timeout: each idle model kept
    ~5% of a core busy, and a process holding the calibration's 130 compiled models ran a product
    four times slower.) The timeout is cut to 1 ms here, so spinning after each would show."""
    import time

    model, feeds = _mlp(256)
    compiled = CompiledModel(model, CompileOptions(threads=2, cache=False))  # type: ignore[arg-type]
    workers = compiled.workers
    assert workers is not None
    ctypes.c_int64.from_address(workers.start + (TIMESPEC + 1) * 8).value = 1_000_000  # tv_nsec
    ctypes.c_int64.from_address(workers.start + TIMESPEC * 8).value = 0  # tv_sec
    compiled(feeds)
    sleepers = ctypes.c_int64.from_address(workers.start + SLEEPERS * 8)
    deadline = time.monotonic() + 5.0
    while sleepers.value != 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert sleepers.value == 1
    (helper_thread,) = workers.threads
    clock = time.pthread_getcpuclockid(helper_thread.ident)  # type: ignore[arg-type]
    before = time.clock_gettime(clock)
    time.sleep(0.5)
    busy = time.clock_gettime(clock) - before
    assert busy < 0.05, f"an idle helper ran {busy * 1e3:.0f} ms of 500 ms (500 timeouts)"
    compiled.close()
