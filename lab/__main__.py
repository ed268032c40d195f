"""python -m lab {env,compile,session,experiment,log,prune}: env, compile, session and experiment need the lab's
toolchain; log and prune need no torch."""
from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("env", help="check the environment (under 5 s) and print the fingerprint")
    comp = sub.add_parser("compile", help="compile-check every kernel with nvcc (no GPU needed)")
    comp.add_argument("--arch", action="append", help="targets (default: sm_80 and sm_90a)")
    comp.add_argument("--cost", action="store_true", help="also print what each file and target cost nvcc in CPU "
                      "seconds when it was built (the cache keeps it), costliest first")
    sub.add_parser("session", help="execute every chapter with papermill and record a session", add_help=False)
    sub.add_parser("experiment", help="run one experiment notebook with papermill; it writes an experiment record",
                   add_help=False)
    sub.add_parser("log", help="generate the log pages and the book's chapter copies from outputs/", add_help=False)
    sub.add_parser("prune", help="remove the executed copies of superseded sessions (git history keeps them)",
                   add_help=False)
    sub.add_parser("readme", help="regenerate the kernel READMEs' version tables from lab/registry.py")
    args, rest = parser.parse_known_args(argv)

    if args.command == "env":
        from . import env

        report = env.check()
        print(report.table())
        return 0 if report.ok else 1
    if args.command == "compile":
        from . import build

        archs = tuple(args.arch) if args.arch else build.CHECK_ARCHS
        try:
            rows = build.compile_check(archs)
        except build.BuildError as err:
            print(err, file=sys.stderr)
            return 1
        print(build.resource_table(rows))
        if args.cost:
            print()
            print(build.cost_table(build.compile_costs(archs)))
        spills = [r for r in rows if r["spills"]]
        serialized = [r for r in rows if r.get("wgmma_serialized")]
        print(f"\n{len(rows)} kernel instantiations compiled; {len(spills)} spill"
              + (f"; {len(serialized)} with wgmma serialized by ptxas" if serialized else ""))
        return 0
    if args.command == "session":
        from . import session

        return session.main(rest)
    if args.command == "experiment":
        from . import launch

        return launch.main(rest)
    if args.command == "log":
        from .publish import log

        return log.main(rest)
    if args.command == "prune":
        from .publish import prune

        return prune.main(rest)
    if args.command == "readme":
        from .publish import readme_tables

        return readme_tables.main(rest)
    return 2


if __name__ == "__main__":
    sys.exit(main())
