"""`paramserver keys generate DIR`: CURVE key pairs (one per role, or named ones) for jobs."""

from __future__ import annotations

import sys

from paramserver.transport import security


def _generate(args) -> int:
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


def register(sub) -> None:
    p = sub.add_parser("keys", help="create the keys of an authenticated job",
                       description="Manage CURVE keys: every socket of a job started with "
                                   "--keys DIR is encrypted, and only peers holding a key "
                                   "listed in DIR/public/ may connect (docs/security.md).")
    ksub = p.add_subparsers(dest="keys_command", metavar="ACTION", required=True)
    g = ksub.add_parser("generate", help="write a key pair per role into DIR",
                        description=f"Write DIR/public/NAME.key (public, 0644) and "
                                    f"DIR/private/NAME.key_secret (0600, folder 0700) for the "
                                    f"roles {', '.join(security.ROLES)}, or for the names given "
                                    f"with --name. Refuses to overwrite.")
    g.add_argument("dir", metavar="DIR", help="key folder to create (or add to, with --name)")
    g.add_argument("--name", action="append", metavar="NAME",
                   help="write only this key pair, into a new or existing folder: a role, or "
                        "worker/observer, '-' and a suffix (worker-hostB: a worker key of its "
                        "own for one host, which can be revoked alone by deleting "
                        "public/worker-hostB.key); repeat for more")
    g.set_defaults(func=_generate)
