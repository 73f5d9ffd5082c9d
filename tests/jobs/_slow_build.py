"""`python tests/jobs/_slow_build.py SECONDS BUILD_FLAGS...`: jobs/build_dataset.py with every unit's instances
held for SECONDS before they are written, so that a small real build stays busy long enough for a second writer to
meet it (the sample corpora build in about a second here). Nothing else differs from the job."""
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import pipeline.instances as instances  # noqa: E402
from jobs import build_dataset  # noqa: E402

_real = instances.write_unit


def _slow(*args, **kwargs):
    time.sleep(float(sys.argv[1]))
    return _real(*args, **kwargs)


instances.write_unit = _slow  # the plain loop (--no-ray) calls it in this process
if __name__ == "__main__":
    try:
        sys.exit(build_dataset.main(sys.argv[2:]))
    except ValueError as e:
        print(f"build_dataset: error: {e}", file=sys.stderr)
        sys.exit(2)
