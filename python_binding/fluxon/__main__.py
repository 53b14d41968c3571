"""`python -m fluxon --version`; any other arguments run the `fluxon` CLI installed with the
package (`python -m fluxon cluster up FILE`, `python -m fluxon owner --config FILE`, ...)."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path


def cli_path():
    bundled = Path(__file__).resolve().parent / "bin" / "fluxon"
    if bundled.exists():
        return str(bundled)
    return shutil.which("fluxon")


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv in (["--version"], ["-V"]):
        import fluxon
        from fluxon import _fluxon
        print(f"fluxon {fluxon.__version__} (python {sys.version.split()[0]}, native {_fluxon.__file__}, "
              f"cli {cli_path() or 'not installed'})")
        return 0
    cli = cli_path()
    if cli is None:
        print("fluxon: the CLI is not installed with this package (build it: tools/build.sh)", file=sys.stderr)
        return 2
    os.execv(cli, [cli, *argv])
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
