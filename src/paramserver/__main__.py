"""Entry point for `python -m paramserver`: the same CLI as the console script."""

from paramserver.cli.main import main

if __name__ == "__main__":
    raise SystemExit(main())
