"""npu tensors that compute: host memory, the device API around them, and the boundary without a compiler."""

from __future__ import annotations

import re

import pytest

from tests.sim.npu_backend import needs_backend, npu_backend_built, sim_json, sim_run

#: torch and Ray alone, pinned alike in every stack: stack-a runs these (noxfile.SHARED_PINS)
pytestmark = pytest.mark.same_on_every_stack
pytest.importorskip("torch", reason="needs torch (installed by the upstream stack sessions)")

__all__ = ["npu_backend_built"]  # the fixture, used by name below


def computes(test):  # type: ignore[no-untyped-def]
    """A test of npu compute: skipped without the toolchain, after the one build."""
    return pytest.mark.usefixtures("npu_backend_built")(needs_backend(test))


@computes
def test_npu_tensors_compute_and_alias_like_cpu_tensors() -> None:
    out = sim_json(
        """
        import json, torch
        from npu_compat.testing import _torch_sim
        x = torch.arange(12, dtype=torch.float32).reshape(3, 4)
        n = x.npu()
        back = n.cpu()
        view = n[1:, ::2]                 # a view aliases its base
        view.mul_(10)
        t = n.t()
        t[0, 0] = -1.0                    # a write through a transposed view
        n2 = torch.ones(2, 3, device="npu:1")
        n2 += 1                           # in place, on the other device
        torch.manual_seed(0)
        lin = torch.nn.Linear(4, 3)
        lin_npu = torch.nn.Linear(4, 3, device="npu")
        lin_npu.load_state_dict(lin.state_dict())
        inp = torch.randn(5, 4)
        y = lin(inp); y.square().sum().backward()
        y_npu = lin_npu(inp.npu()); y_npu.square().sum().backward()
        p = torch.nn.Parameter(torch.zeros(3))
        p.data = p.to("npu")             # the line FSDP2's fully_shard runs
        native = _torch_sim.NATIVE
        print(json.dumps({
            "device": str(n.device), "is_npu": [n.is_npu, x.is_npu], "roundtrip": torch.equal(back, x),
            "aliased": n.cpu().tolist(), "same_memory": view.data_ptr() - n.data_ptr() == 4 * 4,
            "other": [str(n2.device), n2.cpu().tolist()],
            "linear_device": [str(y_npu.device), str(lin_npu.weight.grad.device)],
            "y": torch.allclose(y, y_npu.cpu(), rtol=0, atol=0),
            "grads": [torch.equal(lin.weight.grad, lin_npu.weight.grad.cpu()),
                      torch.equal(lin.bias.grad, lin_npu.bias.grad.cpu())],
            "param": str(p.device), "item": n.sum().item(),
            "pinned": [torch.ones(4).pin_memory().is_pinned(), torch.ones(4).is_pinned()],
            "host_alias": native.host_alias(n).data_ptr() == n.data_ptr(),
        }))
        """
    )
    assert out["device"] == "npu:0" and out["is_npu"] == [True, False] and out["roundtrip"]
    assert out["aliased"] == [[-1.0, 1.0, 2.0, 3.0], [40.0, 5.0, 60.0, 7.0], [80.0, 9.0, 100.0, 11.0]]
    assert out["same_memory"]
    assert out["other"] == ["npu:1", [[2.0, 2.0, 2.0], [2.0, 2.0, 2.0]]]
    assert out["linear_device"] == ["npu:0", "npu:0"]
    assert out["y"] and out["grads"] == [True, True]
    assert out["param"] == "npu:0"
    assert out["item"] == sum([-1.0, 1.0, 2.0, 3.0, 40.0, 5.0, 60.0, 7.0, 80.0, 9.0, 100.0, 11.0])
    assert out["pinned"] == [True, False]
    assert out["host_alias"]


@computes
def test_autocast_on_npu_casts_as_on_cuda_and_passes_every_other_op_through() -> None:
    """Under ``torch.autocast("npu", bfloat16)`` (verl's FSDP forward), as under CUDA's policy: a linear
    runs in bfloat16, softmax and the loss in float32, mixed inputs promote, everything else passes
    through unchanged -- and each result equals the same casts written out by hand on CPU."""
    out = sim_json(
        """
        import json, torch
        import torch.nn.functional as F
        torch.manual_seed(0)
        lin, x, t = torch.nn.Linear(8, 4), torch.randn(3, 8), torch.tensor([0, 3, 1])
        npu = torch.nn.Linear(8, 4, device="npu")
        npu.load_state_dict(lin.state_dict())
        xn, tn = x.npu(), t.npu()
        with torch.autocast("npu", dtype=torch.bfloat16):
            y = npu(xn)                                     # lower_precision_fp
            soft = torch.softmax(y, dim=-1)                 # fp32_set_opt_dtype
            loss = F.cross_entropy(y, tn)                   # nll_loss: fp32 (see below)
            copied = torch.empty_like(xn).copy_(xn)         # on no list: passes through
            promoted = torch.addcmul(xn, y.sum(-1, keepdim=True).expand(3, 8), xn)  # promote
        loss.backward()
        # by hand on CPU: the casts the policy makes
        y_ref = F.linear(x.bfloat16(), lin.weight.bfloat16(), lin.bias.bfloat16())
        # cross_entropy's composite passes log_softmax an explicit dtype (bfloat16), which the policy keeps
        loss_ref = F.nll_loss(torch.log_softmax(y_ref, -1, dtype=torch.bfloat16).float(), t)
        loss_ref.backward()
        same = lambda a, b: torch.equal(a.cpu(), b)
        print(json.dumps({
            "dtypes": [str(v.dtype) for v in (y, soft, loss, copied, promoted)], "device": str(y.device),
            "y": same(y, y_ref), "soft": same(soft, torch.softmax(y_ref.float(), -1)),
            "loss": same(loss, loss_ref), "grad": same(npu.weight.grad, lin.weight.grad),
        }))
        """
    )
    assert out["device"] == "npu:0"
    assert out["dtypes"] == [
        "torch.bfloat16",
        "torch.float32",
        "torch.float32",
        "torch.float32",
        "torch.float32",
    ]
    assert out["y"] and out["soft"] and out["loss"] and out["grad"]


@computes
def test_memory_stats_count_real_allocations_against_the_capacity() -> None:
    out = sim_json(
        """
        import json, torch
        npu = torch.npu
        base = [npu.memory_allocated(0), npu.memory_allocated(1)]
        a = torch.empty(256 * 1024, dtype=torch.uint8, device="npu:0")    # 256 KiB
        b = torch.empty(128 * 1024, dtype=torch.uint8, device="npu:1")
        during = [npu.memory_allocated(0) - base[0], npu.memory_allocated(1) - base[1], npu.memory_reserved(0) - base[0]]
        free, total = npu.mem_get_info(0)
        s = a.untyped_storage(); s.resize_(0)                               # FSDP2 frees unsharded storage so
        freed_storage = npu.memory_allocated(0) - base[0]
        s.resize_(256 * 1024)
        del a, b, s
        after = [npu.memory_allocated(0) - base[0], npu.memory_allocated(1) - base[1]]
        peak = npu.max_memory_allocated(0) - base[0]
        npu.reset_peak_memory_stats(0)
        peak_after_reset = npu.max_memory_allocated(0) - base[0]
        errors = []
        keep = torch.empty(700 * 1024, dtype=torch.uint8, device="npu:0")
        catches = {}
        try:
            torch.empty(400 * 1024, dtype=torch.uint8, device="npu:0")     # past 1 MiB
        except torch.OutOfMemoryError as exc:
            errors.append(str(exc))
            # how upstream recovers from an OOM: vLLM's load_model and p2p engine catch
            # torch.cuda.OutOfMemoryError, its sampler warm-up a RuntimeError saying "out of memory",
            # accelerate's find_executable_batch_size asks should_reduce_batch_size
            catches["torch.cuda.OutOfMemoryError"] = isinstance(exc, torch.cuda.OutOfMemoryError)
            catches["RuntimeError, 'out of memory'"] = isinstance(exc, RuntimeError) and "out of memory" in str(exc)
            try:
                from accelerate.utils.memory import should_reduce_batch_size
            except ImportError:
                pass
            else:
                catches["accelerate should_reduce_batch_size"] = should_reduce_batch_size(exc)
        ok_elsewhere = torch.empty(400 * 1024, dtype=torch.uint8, device="npu:1").numel()   # its own capacity
        npu.empty_cache()
        print(json.dumps({"during": during, "mem": [free, total], "freed_storage": freed_storage,
                          "after": after, "peak": peak, "reset": peak_after_reset, "errors": errors, "catches": catches,
                          "elsewhere": ok_elsewhere, "stats": npu.memory_stats(0)["num_ooms"],
                          "props": npu.get_device_properties(0).total_memory}))
        """,
        NPU_COMPAT_SIMULATE_NPU_MEMORY="1MiB",
    )
    kib = 1024
    assert out["during"] == [256 * kib, 128 * kib, 256 * kib]
    assert out["mem"][1] == 1024 * kib and out["mem"][0] <= 768 * kib
    assert out["freed_storage"] == 0
    assert out["after"] == [0, 0]
    assert out["peak"] == 256 * kib and out["reset"] == 0
    assert len(out["errors"]) == 1
    # torch_npu's own message (NPUCachingAllocator.cpp, DeviceCachingAllocator::malloc), its sizes
    # in its format_size; with no caching allocator, active and reserved are what is allocated
    assert re.match(
        r"NPU out of memory\. Tried to allocate 400\.00 KiB \(NPU 0; 1024\.00 KiB total capacity; "
        r"(\d+\.\d\d KiB) already allocated; \1 current active; \d+\.\d\d KiB free; \1 reserved in total "
        r"by PyTorch\) If reserved memory is >> allocated memory try setting max_split_size_mb to avoid "
        r"fragmentation\. \(simulated NPU: NPU_COMPAT_SIMULATE_NPU_MEMORY sets its capacity\)$",
        out["errors"][0],
    ), out["errors"][0]
    assert out["catches"] and all(out["catches"].values()), out["catches"]
    assert out["elsewhere"] == 400 * kib and out["stats"] == 1
    assert out["props"] == 1024 * kib


@computes
def test_per_process_memory_fraction_limits_what_this_process_may_allocate() -> None:
    out = sim_json(
        """
        import json, torch
        npu, kib, errors = torch.npu, 1024, []
        npu.set_per_process_memory_fraction(0.5, 0)                        # 512 KiB of npu:0's 1 MiB
        keep = torch.empty(400 * kib, dtype=torch.uint8, device="npu:0")
        try:
            torch.empty(200 * kib, dtype=torch.uint8, device="npu:0")
        except torch.OutOfMemoryError as exc:
            errors.append(str(exc))
        elsewhere = torch.empty(800 * kib, dtype=torch.uint8, device="npu:1").numel()   # npu:1 keeps it all
        del elsewhere
        total = npu.mem_get_info(0)[1]
        for bad in (1.5, -0.1, 1):
            try:
                npu.set_per_process_memory_fraction(bad, 0)
            except (TypeError, ValueError) as exc:
                errors.append(f"{type(exc).__name__}: {exc}")
        npu.set_per_process_memory_fraction(1.0, 0)
        after = torch.empty(200 * kib, dtype=torch.uint8, device="npu:0").numel()
        print(json.dumps({"errors": errors, "total": total, "after": after}))
        """,
        NPU_COMPAT_SIMULATE_NPU_MEMORY="1MiB",
    )
    (oom, *bad) = out["errors"]
    assert oom.startswith(
        "NPU out of memory. Tried to allocate 200.00 KiB (NPU 0; 1024.00 KiB total capacity; 400.00 KiB already "
        "allocated; 400.00 KiB current active; 624.00 KiB free; 512.00 KiB allowed; 400.00 KiB reserved in "
        "total by PyTorch)"
    ), oom
    assert bad == [
        "ValueError: Invalid fraction value: 1.5. Allowed range: 0~1",
        "ValueError: Invalid fraction value: -0.1. Allowed range: 0~1",
        "TypeError: Invalid type for fraction argument, must be `float`",
    ]
    assert out["total"] == 1024 * 1024  # the device's memory is what it was
    assert out["after"] == 200 * 1024


@computes
def test_each_device_has_a_generator_and_seeds_reproduce() -> None:
    out = sim_json(
        """
        import json, torch
        torch.manual_seed(7)                       # seeds every npu, as with CUDA
        a = torch.randn(4, device="npu:0").tolist()
        torch.manual_seed(7)
        b = torch.randn(4, device="npu:0").tolist()
        torch.npu.manual_seed_all(3)
        state = torch.npu.get_rng_state(1)
        c = torch.rand(3, device="npu:1").tolist()
        torch.npu.set_rng_state(state, 1)
        d = torch.rand(3, device="npu:1").tolist()
        torch.npu.manual_seed_all(3)
        zero_first = torch.rand(3, device="npu:0").tolist()
        one_untouched = torch.rand(3, device="npu:1").tolist()   # npu:0's draw did not advance npu:1
        g = torch.Generator(device="npu:1"); g.manual_seed(11)
        e = torch.randn(2, device="npu:1", generator=g).tolist()
        g.manual_seed(11)
        f = torch.randn(2, device="npu:1", generator=g).tolist()
        drop = torch.nn.functional.dropout(torch.ones(1000, device="npu"), 0.5)
        print(json.dumps({"seeded": a == b, "state": c == d, "per_device": one_untouched == c,
                          "generator": [e == f, str(g.device)], "initial": torch.npu.initial_seed(),
                          "dropout": [str(drop.device), 300 < int((drop == 0).sum()) < 700]}))
        """
    )
    assert out["seeded"] and out["state"] and out["per_device"]
    assert out["generator"] == [True, "npu:1"]
    assert out["initial"] == 3
    assert out["dropout"] == ["npu:0", True]


@computes
def test_dropout_on_npu_draws_from_the_npu_generator_and_matches_cpu_under_one_seed() -> None:
    out = sim_json(
        """
        import json, torch
        F = torch.nn.functional
        x = torch.arange(1.0, 2001.0)
        torch.manual_seed(5)                                   # seeds the CPU and every npu alike
        on_cpu = F.dropout(x, 0.3)
        torch.manual_seed(5)
        xn = x.to("npu:1").requires_grad_()
        on_npu = F.dropout(xn, 0.3)
        on_npu.sum().backward()
        torch.npu.manual_seed(9)                               # the npu's seed alone decides its masks
        cpu_state = torch.get_rng_state()
        first = F.dropout(x.to("npu:0"), 0.5).cpu()
        torch.npu.manual_seed(9)
        again = F.dropout(x.to("npu:0"), 0.5).cpu()
        print(json.dumps({
            "equal_to_cpu": torch.equal(on_npu.detach().cpu(), on_cpu), "device": str(on_npu.device),
            "grad": torch.equal(xn.grad.cpu(), (on_cpu != 0).float() / 0.7),
            "reproduced": torch.equal(first, again), "cpu_untouched": torch.equal(cpu_state, torch.get_rng_state()),
            "eval": torch.equal(F.dropout(x.to("npu:0"), 0.5, training=False).cpu(), x),
        }))
        """
    )
    assert out == {
        "equal_to_cpu": True, "device": "npu:1", "grad": True, "reproduced": True, "cpu_untouched": True,
        "eval": True,
    }  # fmt: skip


@computes
def test_a_process_that_ran_backward_on_npu_exits_cleanly_when_its_autograd_worker_is_late() -> None:
    # torch's autograd worker for npu:1 drops its last reference to the finished graph task after
    # it has woken the caller; that drop frees a Python object and needs the GIL.  Here the worker
    # is made late on purpose: one CPU for the whole process (the woken caller preempts the
    # worker) and a switch interval that lets the caller keep the GIL until the interpreter
    # finalizes.  Without the simulation's drain at exit, the worker then wakes into finalization
    # and the process aborts ("terminate called without an active exception"), every time.
    # A loaded CI machine does the same by chance.
    proc = sim_run(
        """
        import os, sys, torch
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})   # before the workers start
        sys.setswitchinterval(60)
        x = torch.ones(8, device="npu:1", requires_grad=True)
        (x * 2).sum().backward()
        assert x.grad.device == torch.device("npu:1")
        """,
        check=False,
    )
    assert (proc.returncode, proc.stderr.strip()[-300:]) == (0, "")


@computes
def test_save_and_load_of_npu_tensors_with_map_location(tmp_path) -> None:  # type: ignore[no-untyped-def]
    out = sim_json(
        f"""
        import json, torch
        path = {str(tmp_path / "t.pt")!r}
        torch.save({{"w": torch.arange(6.0, device="npu:1").reshape(2, 3), "c": torch.ones(2)}}, path)
        as_saved = torch.load(path)
        to_cpu = torch.load(path, map_location="cpu")
        to_zero = torch.load(path, map_location="npu:0")
        print(json.dumps({{"saved": [str(as_saved["w"].device), str(as_saved["c"].device)],
                          "cpu": str(to_cpu["w"].device), "zero": str(to_zero["w"].device),
                          "values": to_zero["w"].cpu().tolist()}}))
        """
    )
    assert out["saved"] == ["npu:1", "cpu"]
    assert out["cpu"] == "cpu" and out["zero"] == "npu:0"
    assert out["values"] == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]


@computes
def test_current_device_per_thread_streams_and_events() -> None:
    out = sim_json(
        """
        import json, threading, torch
        torch.npu.set_device(1)
        seen = []
        t = threading.Thread(target=lambda: seen.append([torch.npu.current_device(), str(torch.ones(1, device="npu").device)]))
        t.start(); t.join()
        with torch.npu.device(0):
            inner = [torch.npu.current_device(), str(torch.empty(1, device="npu").device)]
        main = [torch.npu.current_device(), str(torch.empty(1, device="npu").device)]
        s = torch.npu.Stream()
        with torch.npu.stream(s):
            on_s = torch.npu.current_stream() == s
        start, end = torch.npu.Event(enable_timing=True), torch.npu.Event(enable_timing=True)
        start.record(); x = torch.ones(100, 100, device="npu") @ torch.ones(100, 100, device="npu"); end.record()
        end.synchronize(); s.wait_event(end); s.wait_stream(torch.npu.current_stream())
        x.record_stream(s)
        print(json.dumps({"thread": seen[0], "inner": inner, "main": main, "on_s": on_s,
                          "back": torch.npu.current_stream() == torch.npu.default_stream(),
                          "elapsed": start.elapsed_time(end) >= 0, "query": [s.query(), end.query()],
                          "accelerator": str(torch.accelerator.current_accelerator()),
                          "count": torch.accelerator.device_count()}))
        """,
        devices=3,
    )
    assert out["thread"] == [0, "npu:0"]  # a new thread starts on device 0, as with CUDA
    assert out["inner"] == [0, "npu:0"] and out["main"] == [1, "npu:1"]
    assert out["on_s"] and out["back"] and out["elapsed"] and out["query"] == [True, True]
    assert out["accelerator"] == "npu" and out["count"] == 3


def test_without_a_compiler_npu_tensors_are_the_boundary_and_say_what_to_install() -> None:
    out = sim_json(
        """
        import json, warnings
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            import torch
        try:
            torch.ones(2, device="npu")
            error = None
        except Exception as exc:
            error = [type(exc).__name__, str(exc)]
        print(json.dumps({"error": error, "warnings": [str(w.message) for w in caught if "npu backend" in str(w.message)],
                          "collective_device": torch.npu.memory_allocated()}))
        """,
        CXX="no-such-c++-compiler",
    )
    assert out["error"][0] == "SimulatedComputeBoundary"
    assert (
        "needs a real NPU" in out["error"][1] and "'no-such-c++-compiler' is not on PATH" in out["error"][1]
    )
    assert len(out["warnings"]) == 1 and "install g++ or clang++" in out["warnings"][0]


@needs_backend
def test_processes_starting_at_once_build_the_backend_once(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Ray workers and vLLM children import torch together on a fresh host: one builds, all load."""
    import json
    import subprocess
    import sys

    from tests.conftest import REPO
    from tests.sim.npu_backend import child_env

    code = (
        "import json, torch; from npu_compat.testing import _npu_backend as b, _torch_sim as s; "
        "print(json.dumps([b.built_here, s.NATIVE.__file__, str(torch.ones(1, device='npu').device)]))"
    )
    env = child_env(NPU_COMPAT_SIMULATE_BUILD_DIR=str(tmp_path / "cache"))
    procs = [
        subprocess.Popen([sys.executable, "-c", code], env=env, cwd=str(REPO), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
        for _ in range(3)
    ]  # fmt: skip
    outs = []
    for proc in procs:
        stdout, stderr = proc.communicate(timeout=900)
        assert proc.returncode == 0, stderr[-4000:]
        outs.append(json.loads(stdout.strip().splitlines()[-1]))
    assert sorted(built for built, _, _ in outs) == [False, False, True]
    assert len({path for _, path, _ in outs}) == 1 and outs[0][1].startswith(str(tmp_path / "cache"))
    assert {device for _, _, device in outs} == {"npu:0"}
