"""Parse command lines with a real package's own parser; run inside that package's venv.

    PYTHON scripts/real_sglang/parse_args.py server < argvs.json     # sglang.launch_server's
    PYTHON scripts/real_sglang/parse_args.py smg < argvs.json        # smg.launch_router's
    PYTHON scripts/real_sglang/parse_args.py sglang-router < argvs.json
    PYTHON scripts/real_sglang/parse_args.py server --flags          # every flag it knows

stdin: a JSON list of argument lists (what follows ``python -m MODULE``). stdout: one JSON
list, per argument list ``{"ok": true}`` or ``{"ok": false, "error": "..."}`` with the
parser's own message. The parsers are the packages' real ones: SGLang's
``ServerArgs.add_cli_args`` (exactly what ``sglang.launch_server`` parses with), each router's
``RouterArgs.add_cli_args`` and ``from_cli_args``. Standard library only, besides the package.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys


def _server_parser() -> argparse.ArgumentParser:
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser(prog="sglang.launch_server")
    ServerArgs.add_cli_args(parser)
    return parser


def _router_args(package: str):
    if package == "smg":
        from smg.router_args import RouterArgs
    else:
        from sglang_router.router_args import RouterArgs
    return RouterArgs


def _router_parser(package: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=f"{package} launch_router")
    _router_args(package).add_cli_args(parser, use_router_prefix=False)
    return parser


def parser_of(kind: str) -> argparse.ArgumentParser:
    return _server_parser() if kind == "server" else _router_parser(kind)


def check(kind: str, parser: argparse.ArgumentParser, argv: list[str]) -> dict[str, object]:
    """Parse ``argv`` as the package does at start-up; the parser's message on failure."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            namespace = parser.parse_args(argv)
    except SystemExit:
        lines = [line for line in err.getvalue().splitlines() if "error:" in line]
        return {"ok": False, "error": (lines or [err.getvalue().strip()])[-1]}
    if kind != "server":  # the router's own checks of the values (PD workers, policies)
        try:
            args = _router_args(kind).from_cli_args(namespace, use_router_prefix=False)
            validate = getattr(args, "_validate_router_args", None)
            if validate is not None:
                validate()
        except Exception as exc:
            return {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    return {"ok": True}


def main() -> int:
    cli = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    cli.add_argument("kind", choices=("server", "smg", "sglang-router"))
    cli.add_argument("--flags", action="store_true", help="list every flag the parser knows")
    args = cli.parse_args()
    parser = parser_of(args.kind)
    if args.flags:
        flags = sorted(s for s in parser._option_string_actions if s.startswith("--"))
        print(json.dumps(flags))
        return 0
    argvs = json.load(sys.stdin)
    print(json.dumps([check(args.kind, parser, list(argv)) for argv in argvs]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
