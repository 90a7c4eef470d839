"""`paramserver keys generate DIR`: a CURVE key pair per role, for authenticated jobs."""

from __future__ import annotations

import sys

from paramserver.transport import security


def _generate(args) -> int:
    try:
        written = security.generate(args.dir)
    except (security.SecurityError, OSError) as exc:
        print(f"paramserver keys generate: {exc}", file=sys.stderr)
        return 2
    for path in written:
        print(path)
    print(f"Give every host {args.dir}/public/ and the private/ROLE.key_secret of the roles it "
          f"runs; start each role with --keys {args.dir}.", file=sys.stderr)
    return 0


def register(sub) -> None:
    p = sub.add_parser("keys", help="create the keys of an authenticated job",
                       description="Manage CURVE keys: every socket of a job started with "
                                   "--keys DIR is encrypted, and only peers holding a key "
                                   "listed in DIR/public/ may connect (docs/security.md).")
    ksub = p.add_subparsers(dest="keys_command", metavar="ACTION", required=True)
    g = ksub.add_parser("generate", help="write a key pair per role into DIR",
                        description=f"Write DIR/public/ROLE.key (public, 0644) and "
                                    f"DIR/private/ROLE.key_secret (0600, folder 0700) for the "
                                    f"roles {', '.join(security.ROLES)}. Refuses to overwrite.")
    g.add_argument("dir", metavar="DIR", help="key folder to create")
    g.set_defaults(func=_generate)
