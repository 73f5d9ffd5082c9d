"""The Ray Data executor's own promises: the tokenizer is loaded once per worker process, by the warm-up, before
any item runs there; a resource request that can never be met fails at once or after a bounded wait, never hangs."""
from __future__ import annotations

import pytest

from cluster.allocators import MMAP_THRESHOLD
from corpus.create_instances import InstanceConfig
from corpus.readers import ReadOptions
from pipeline.work import StepContext, process_state


def _ctx(tmp_path) -> StepContext:
    return StepContext(work=str(tmp_path / "_work"), output=str(tmp_path), read=ReadOptions(),
                       instances=InstanceConfig(), do_lower_case=True, dupe_factor=1, vocab_size=30522)


@pytest.mark.timeout(180)
def test_warm_up_loads_the_tokenizer_once_per_worker_before_any_item(ray_local, tmp_path, sample_dir):
    from pipeline.docs import SplitTokenize
    from pipeline.ray_data import RayDataExecutor

    tokens = (sample_dir / "reference" / "bert-base-uncased-vocab.txt").read_text().splitlines()
    executor = RayDataExecutor(num_cpus=2)
    executor.begin()
    vocab = executor.share("vocab-test-warm", tokens)
    executor.warm(SplitTokenize(_ctx(tmp_path), vocab).setup, items=16)
    # A stage waits for the warm-up before its first task (its tasks then take the warmed processes); here we
    # wait first, to see where it went: one warm-up per worker process.
    warmed = ray_local.get(executor._warming)
    assert len(set(warmed)) == 2, warmed
    # Steps that load nothing see what the warm-up left in their process: the tokenizer, loaded by the warm-up
    # (the session's earlier tests may have loaded other vocabularies' encoders in these processes: counted per pid).
    seen = list(executor.map(process_state, list(range(16))))
    assert len(seen) == 16
    assert {s["pid"] for s in seen} <= set(warmed)  # Ray Data's tasks run in the warmed processes
    # and every build task first fixes glibc's mmap threshold in its process (cluster/allocators.py)
    assert {s["mmap_threshold"] for s in seen} == {MMAP_THRESHOLD}, seen
    loads = {s["pid"]: s["loads"].get("encoder") for s in seen}
    assert all(n >= 1 for n in loads.values()) and len({(s["pid"], s["loads"].get("encoder")) for s in seen}) == len(
        loads), seen
    # A second stage: the same processes, nothing loaded again.
    again = list(executor.map(process_state, list(range(8))))
    assert {s["pid"] for s in again} <= set(warmed)
    assert all(s["loads"].get("encoder") == loads[s["pid"]] for s in again)


@pytest.mark.parametrize("n", [0, -2])
def test_num_cpus_below_one_is_refused_before_ray_starts(n):
    from pipeline.ray_data import RayDataExecutor

    with pytest.raises(ValueError, match=rf"--num-cpus {n}: .*use at least 1"):
        RayDataExecutor(num_cpus=n)


@pytest.mark.timeout(120)
def test_a_cluster_without_cpus_is_refused_after_a_bounded_wait(ray_shutdown, ray_tmpdir, monkeypatch):
    import ray

    import pipeline.ray_data.cluster as ray_cluster
    from pipeline.ray_data import RayDataExecutor

    monkeypatch.setattr(ray_cluster, "CPU_WAIT_S", 1.0)
    ray.init(address="local", num_cpus=0, include_dashboard=False, _temp_dir=ray_tmpdir, log_to_driver=False,
             configure_logging=False)
    try:
        executor = RayDataExecutor()
        with pytest.raises(ValueError, match="no CPU for 1 s.*add worker nodes"):
            executor.share("x", [1])
    finally:
        ray.shutdown()


@pytest.mark.timeout(180)
def test_ray_objects_in_reference_cycles_are_freed_before_ray_shuts_down(ray_tmpdir):
    """`end()` frees cyclic garbage while Ray is up: an ObjectRef collected after the shutdown (by a collection in
    another thread, such as the build job's MLflow writer) reaches the shut-down core worker, which ends the process
    with exit code 1. Seen as a build that printed "built ..." and exited 1, about one run in four."""
    import subprocess
    import sys
    from pathlib import Path

    code = (
        "import gc, threading, ray\n"
        "from pipeline.ray_data import RayDataExecutor\n"
        f"init = lambda: ray.init(address='local', num_cpus=1, include_dashboard=False, _temp_dir={ray_tmpdir!r})\n"
        "executor = RayDataExecutor(1, init=init)\n"
        "executor.begin().result()\n"
        "class Cycle: pass\n"
        "c = Cycle(); c.me = c; c.ref = ray.put(b'x'); del c\n"
        "executor.end()\n"
        "t = threading.Thread(target=gc.collect); t.start(); t.join()\n"
        "print('exited cleanly')\n")
    repo = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", code], cwd=repo, capture_output=True, text=True, timeout=150)
    assert out.returncode == 0 and out.stdout.strip() == "exited cleanly", out.stderr[-2000:]
