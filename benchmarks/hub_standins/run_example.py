"""One example on one framework, in a fresh process (``python run_example.py ...``).

The example's file sits on ``sys.path`` under its own name, so its functions travel to the
workers by reference (both launchers' workers import it). Its ``main()`` runs as written with
``training_function`` swapped for a catcher, so the script's own argparse and config dict give
``(config, args)``; then ``notebook_launcher(training_function, (config, args),
num_processes=2, mixed_precision="no")`` of the chosen framework runs it. An example without a
``training_function`` (the DeepSpeed one) is launched as ``main()`` with its argv.

Options the harness adds to every parser that has them: ``--cpu`` and ``--mixed_precision no``;
``--config`` (JSON) replaces entries of the config dict ``main()`` built (off by default).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import sys
from collections.abc import Iterator
from typing import Any

_CPU_OPTIONS = (("--cpu",), ("--mixed_precision", "no"))


@contextlib.contextmanager
def cpu_options() -> Iterator[None]:
    """While inside: a parser that has ``--cpu`` / ``--mixed_precision`` gets them from us."""
    parse_args = argparse.ArgumentParser.parse_args

    def with_cpu(self: argparse.ArgumentParser, args: Any = None, namespace: Any = None) -> Any:
        argv = list(sys.argv[1:] if args is None else args)
        for option in _CPU_OPTIONS:
            if option[0] in self._option_string_actions and option[0] not in argv:
                argv += option
        return parse_args(self, argv, namespace)

    argparse.ArgumentParser.parse_args = with_cpu  # type: ignore[method-assign]
    try:
        yield
    finally:
        argparse.ArgumentParser.parse_args = parse_args  # type: ignore[method-assign]


def run_main(module_name: str, argv: list[str]) -> None:
    """A worker's body for an example that parses its own arguments in ``main()``."""
    module = importlib.import_module(module_name)
    sys.argv = [module.__file__ or module_name, *argv]
    with cpu_options():
        module.main()


class _Caught(Exception):
    def __init__(self, config: Any, args: Any) -> None:
        super().__init__("caught")
        self.config, self.namespace = config, args


def _catch(config: Any, args: Any) -> None:
    raise _Caught(config, args)


def config_and_args(module: Any, argv: list[str]) -> tuple[Any, Any]:
    """What the example's ``main()`` passes to ``training_function`` for this argv."""
    real = module.training_function
    module.training_function = _catch
    sys.argv = [module.__file__, *argv]
    try:
        with cpu_options():
            module.main()
    except _Caught as caught:
        return caught.config, caught.namespace
    finally:
        module.training_function = real
    raise RuntimeError(f"{module.__name__}.main() returned without calling training_function")


def cli() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--framework", choices=["accelerate", "ours"], required=True)
    parser.add_argument("--module", required=True)
    parser.add_argument("--argv", default="[]", help="JSON list of the example's arguments")
    parser.add_argument("--config", default="{}", help="JSON object: entries of its config dict")
    parser.add_argument(
        "--deepspeed",
        help="a DeepSpeed config file: ours gets notebook_launcher(deepspeed={'hf_ds_config': "
        "it}); accelerate reads it from ACCELERATE_DEEPSPEED_CONFIG_FILE (set by the harness)",
    )
    options = parser.parse_args()
    argv = json.loads(options.argv)
    launch: dict[str, Any] = {"num_processes": 2, "mixed_precision": "no"}
    if options.deepspeed and options.framework == "ours":
        launch["deepspeed"] = {"hf_ds_config": options.deepspeed}
    if options.framework == "accelerate":
        from accelerate import notebook_launcher
    else:
        from notebook_accel import notebook_launcher  # type: ignore[no-redef]
    print(
        f"@@harness {options.framework} from {sys.modules[notebook_launcher.__module__].__file__}"
    )
    module = importlib.import_module(options.module)
    if hasattr(module, "training_function"):
        config, args = config_and_args(module, argv)
        config.update(json.loads(options.config))
        print(f"@@harness config {config!r} args {vars(args)!r}", flush=True)
        notebook_launcher(module.training_function, (config, args), **launch)
    else:
        notebook_launcher(run_main, (options.module, argv), **launch)
    print("@@harness done", flush=True)


if __name__ == "__main__":
    cli()
