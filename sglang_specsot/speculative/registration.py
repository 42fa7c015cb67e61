"""Registering SPECSOT with SGLang: the algorithm (algorithm.py) and the worker it builds.

Apart from algorithm.py because it ties the algorithm to its worker: the worker's modules
read the algorithm's identity (`NAME`), so the algorithm cannot name the worker itself.
"""

from __future__ import annotations

from sglang_specsot.host import adapter as sgl
from sglang_specsot.speculative.algorithm import NAME, SpecSoTAlgo


def register_specsot() -> None:
    """Register SPECSOT with SGLang once per process (load_plugins may run us twice), and
    its attention-backend choice on CUDA, which argument resolution asks before the algorithm."""
    from sglang_specsot.speculative.backend_choice import register_tree_backend_choice

    register_tree_backend_choice()
    try:
        sgl.SpeculativeAlgorithm.from_string(NAME)
        return
    except ValueError:
        pass

    @sgl.SpeculativeAlgorithm.register(NAME, supports_overlap=True, spec_class=SpecSoTAlgo)
    def _worker_class(server_args):
        # One worker for every drafter: it picks the drafter from the server's flags.
        # Heavy imports: only in schedulers.
        from sglang_specsot.speculative.worker import SpecSoTWorker

        return SpecSoTWorker
