r"""Run a VeRL entry point with the nvtx_phases hooks installed in its driver process too.

VeRL's disaggregated trainers declare their controller actors with a module-level ``@ray.remote``
(``FullyAsyncTrainer``, ``FullyAsyncRollouter``). Such an actor class travels by value: the
driver pickles it inside the task runner it launches, and the task runner exports that copy
when it creates the actors, so the actors run the methods the *driver's* copy had. Ray's
``worker_process_setup_hook`` installs the hooks in every worker, but not in the driver: there
the controllers would stay unhooked. This launcher installs them first, then runs the module
as ``python -m`` would::

    python -m nvtx_phases.verl_launch verl.experimental.fully_async_policy.fully_async_main \
        ... +ray_kwargs.ray_init.runtime_env.worker_process_setup_hook=nvtx_phases.verl.install

(The colocated ``verl.trainer.main_ppo`` needs only the setup hook; launched this way it gets
the same ranges.)
"""

from __future__ import annotations

import runpy
import sys


def main(argv: list[str] | None = None) -> None:
    """``MODULE [ARGS…]``: install the hooks, then run ``MODULE`` as ``__main__`` with ``ARGS``."""
    args = sys.argv[1:] if argv is None else list(argv)
    if not args or args[0].startswith("-"):
        raise SystemExit("usage: python -m nvtx_phases.verl_launch MODULE [ARGS...]")
    from nvtx_phases.verl import install

    install()
    module, *rest = args
    sys.argv = [module, *rest]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
