"""`paramserver keys generate|list DIR`: CURVE key pairs (per role, or named) for jobs."""

from __future__ import annotations

import stat
import sys
from pathlib import Path

from paramserver.cli import args as flag
from paramserver.cli import catalog


def _generate(args) -> int:
    from paramserver.transport import security
    try:
        written = security.generate(args.dir, args.name or security.ROLES)
    except (security.SecurityError, OSError) as exc:
        print(f"paramserver keys generate: {exc}", file=sys.stderr)
        return 2
    for path in written:
        print(path)
    if args.name:
        print(f"Copy the new public/*.key to every host and restart the job: the allow-list is "
              f"read at start. Start each process with --keys {args.dir} --key-name NAME.",
              file=sys.stderr)
    else:
        print(f"Give every host {args.dir}/public/ and the private/ROLE.key_secret of the roles "
              f"it runs; start each role with --keys {args.dir}.", file=sys.stderr)
    return 0


def _key_row(path: Path, seen: dict) -> tuple[str, str, str, str]:
    """(name, role, private key, problem) for one public key file; `seen`: key -> name."""
    from paramserver.transport import security
    name = path.stem
    try:
        security.check_name(name)
        role, problem = security.role_of(name), ""
    except security.SecurityError as exc:
        role, problem = "-", str(exc).split(":")[0]  # "bad key name 'x'"
    try:
        key = security.load_public(path)
    except security.SecurityError as exc:
        return name, role, "-", str(exc)
    if key in seen:
        problem = problem or f"same key as {seen[key]}"
    seen.setdefault(key, name)
    secret = path.parent.parent / "private" / f"{name}.key_secret"
    if not secret.exists():
        return name, role, "not here", problem
    mode = stat.S_IMODE(secret.stat().st_mode)
    if mode & 0o077:
        problem = problem or f"private key readable by others (mode {mode:o})"
    return name, role, f"here ({mode:o})", problem


def _list(args) -> int:
    public = Path(args.dir) / "public"
    if not public.is_dir():
        print(f"paramserver keys list: {args.dir} is no key folder (no public/ inside)",
              file=sys.stderr)
        return 2
    seen: dict = {}
    rows = [_key_row(path, seen) for path in sorted(public.glob("*.key"))]
    print(f"{'name':24s} {'acts as':12s} {'private key':12s} problem")
    for name, role, secret, problem in rows:
        print(f"{name:24s} {role:12s} {secret:12s} {problem}".rstrip())
    problems = [row[3] for row in rows if row[3]]
    if problems:
        # What each kind of problem found does to a process that loads the folder.
        effects = [effect for kind, effect in (
            ("same key as", "processes loading this folder refuse it while two files hold "
                            "one key"),
            ("bad key name", "a bad name acts in no role"),
            ("readable by others", "a process refuses a private key others can read "
                                   "(chmod 600 it)"))
            if any(kind in p for p in problems)]
        print(f"{len(problems)} key(s) with a problem" + (": " + "; ".join(effects)
                                                          if effects else ""), file=sys.stderr)
    return 1 if problems else 0


# The one-line help of each command here (cli.main lists them without building parsers).
SUMMARY = {"keys": "create and list the keys of an authenticated job"}


def register(sub) -> None:
    p = sub.add_parser("keys", help=SUMMARY["keys"],
                       description="Manage CURVE keys: every socket of a job started with "
                                   "--keys DIR is encrypted, and only peers holding a key "
                                   "listed in DIR/public/ may connect (docs/security.md).")
    ksub = p.add_subparsers(dest="keys_command", metavar="ACTION", required=True)
    g = ksub.add_parser("generate", help="write a key pair per role into DIR",
                        description=f"Write DIR/public/NAME.key (public, 0644) and "
                                    f"DIR/private/NAME.key_secret (0600, folder 0700) for the "
                                    f"roles {', '.join(catalog.KEY_ROLES)}, or for the names given "
                                    f"with --name. Refuses to overwrite.")
    g.add_argument("dir", metavar="DIR", type=flag.out_folder,
                   help="key folder to create (or add to, with --name)")
    g.add_argument("--name", action="append", metavar="NAME",
                   help="write only this key pair, into a new or existing folder: a role, or "
                        "worker/observer, '-' and a suffix (worker-hostB: a worker key of its "
                        "own for one host, which can be revoked alone by deleting "
                        "public/worker-hostB.key); repeat for more")
    g.set_defaults(func=_generate)
    ls = ksub.add_parser("list", help="show a key folder's keys, the role each acts in, and "
                                      "problems",
                         description="One line per public key in DIR/public: its name, the "
                                     "role it may act in, whether its private key is in "
                                     "DIR/private (and its mode), and any problem (a bad name, "
                                     "one key under two names, a private key others can read). "
                                     "Exit status 1 when there is a problem.")
    ls.add_argument("dir", metavar="DIR", help="key folder")
    ls.set_defaults(func=_list)
