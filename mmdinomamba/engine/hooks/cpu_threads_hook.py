"""The CPU thread default for every runner that runs a config of ours."""
from mmengine.hooks import Hook

from ..cpu_threads import setup_cpu_threads


class CPUThreadsHook(Hook):
    """One intra-op thread on a CPU-only machine unless ``OMP_NUM_THREADS`` is set
    (:func:`mmdinomamba.engine.setup_cpu_threads`), applied before the run.

    The shipped configs' shared fragments list it under ``default_hooks``
    (``cpu_threads``), so the policy reaches every tool that runs them through a
    Runner (mmpretrain's, mmseg's and mmdet's ``train.py`` / ``test.py`` too), not
    only ours: DinoVim's thousands of small CPU operations per step run many
    times slower with several threads on a busy machine. It runs first
    (``VERY_HIGH``), before any other hook computes.
    """
    priority = 'VERY_HIGH'

    def before_run(self, runner) -> None:
        setup_cpu_threads()
