"""``python -m hooks.native build``: compile the fused statistics kernel ahead of time.

Builds into the same private cache folder that the hook's lazy build uses (see
``hooks.native``), so the first ``DumpHook.begin()`` only loads it instead of compiling it
in training's critical path. Run it after installing TensorFlow: in CI before
the tests, or in a Docker image build (``RUN python -m hooks.native build``; set
``TF_INSPECTOR_CACHE`` if the image runs as another user than the build). Prints the
shared object's path; exits 1, saying why, if there is no compiler or the build fails.

Example::

    $ python -m hooks.native build
    /home/me/.cache/tf-inspector/stats_ops-tf2.15.1-0123456789abcdef.so
"""
from __future__ import annotations

import argparse
import logging
import sys

from . import UnsafeCacheError, build, compiler


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hooks.native",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=["build"],
                        help="compile (or reuse) the kernel in the private cache")
    parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    try:
        path = build(compiler())
    except (RuntimeError, UnsafeCacheError, OSError) as e:
        print(f"error: the fused statistics kernel was not built: {e}", file=sys.stderr)
        return 1
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
