"""pocket.train.heap: after `import pocket.train`, blocks that a step allocates and frees are
served again from mapped pages (counted as minor page faults in a fresh process)."""

import subprocess
import sys

import pytest

# A step's pattern that glibc's defaults turn into fresh pages each round: one 8 MiB block
# (it raises the dynamic mmap threshold to 8 MiB and the trim threshold to 16 MiB), then
# 24 MiB in 1 MiB blocks freed together, more than the trim threshold at the heap's top.
_PROBE = """
import resource, sys
import numpy as np
if sys.argv[1] == "pocket":
    import pocket.train  # noqa: F401
def round_():
    big = np.ones(1 << 20)
    del big
    blocks = [np.ones(1 << 17) for _ in range(24)]
    del blocks
round_(); round_()
r0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(10):
    round_()
print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - r0) / 10)
"""


def _faults_a_round(*args: str, env=None) -> float:
    out = subprocess.run([sys.executable, "-c", _PROBE, *args], capture_output=True, text=True,
                         check=True, env=env)
    return float(out.stdout.strip())


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_freed_blocks_stay_mapped():
    from pocket.train import heap

    if not heap.keep_freed_memory():
        pytest.skip("no glibc mallopt in this process")
    # 32 MiB of touched blocks a round: 8192 pages if each came back fresh
    assert _faults_a_round("pocket") < 200
