"""``llmsla deploy render|validate``: the Kubernetes manifests in ``deploy/k8s`` (docs/deploy.md)."""

from __future__ import annotations

import argparse

from llmsla import argtypes
from llmsla.config import Config


def register(subparsers: argparse._SubParsersAction) -> None:
    d = subparsers.add_parser("deploy", help="Kubernetes manifests: render the generated parts, validate offline")
    ds = d.add_subparsers(dest="deploy_command", required=True, metavar="SUBCOMMAND")
    r = ds.add_parser("render", help="write deploy/k8s: PrometheusRule, AlertmanagerConfig, strict CRD schemas")
    r.add_argument("--out", type=argtypes.writable_dir, default=None, help="manifest root (default deploy/k8s)")
    r.add_argument("--check", action="store_true", help="write nothing; exit 1 if the generated files are stale")
    r.set_defaults(handler=cmd_render)
    v = ds.add_parser("validate", help="kustomize the base and every overlay; check every object offline")
    v.add_argument("--dir", type=argtypes.input_dir, default=None,
                   help="manifest root (default deploy/k8s, else the installed one)")
    v.add_argument("--kube-version", action="append", metavar="X.Y.Z",
                   help="Kubernetes schema version (repeatable; default 1.30.0 and 1.37.0)")
    v.set_defaults(handler=cmd_validate)


def cmd_render(args: argparse.Namespace, cfg: Config) -> int:
    from llmsla.app.k8s import render
    from llmsla.errors import CliError
    from llmsla.resources import LOCAL, deploy
    from llmsla.yamlsrc import SourceError

    # --check compares with the installed manifests when there is no deploy/k8s here
    out = args.out or (deploy("k8s") if args.check else LOCAL / "k8s")
    try:
        generated = render.files(cfg, out)
    except (SourceError, ValueError) as exc:
        raise CliError(str(exc)) from None
    if args.check:
        problems = render.stale(generated)
        for p in problems:
            print(p)
        if problems:
            print("run `llmsla deploy render` and commit the result")
            return 1
        print(f"{len(generated)} generated files are current")
        return 0
    for path in render.write(generated):
        print(f"wrote {path}")
    return 0


def cmd_validate(args: argparse.Namespace, cfg: Config) -> int:
    from llmsla import extras
    from llmsla.errors import CliError

    extras.require("deploy", "llmsla deploy validate")
    from llmsla.app.k8s import validate

    versions = tuple(args.kube_version or validate.KUBE_VERSIONS)
    import kubernetes_validate.utils as kvu

    known = {kvu.major_minor(v) for v in kvu.all_versions()}
    bad = [v for v in versions if kvu.major_minor(v) not in known]
    if bad:
        raise CliError(f"--kube-version: no schemas for {bad[0]} (kubernetes-validate has {min(known)} .. {max(known)})")
    from llmsla.resources import deploy

    args.dir = args.dir or deploy("k8s")
    if not (args.dir / "base" / "kustomization.yaml").is_file():
        raise CliError(f"--dir: {args.dir}/base/kustomization.yaml not found")
    failed = 0
    for directory in validate.kustomizations(args.dir):
        objects = validate.build(directory)
        problems = validate.problems(objects, versions)
        for p in problems:
            print(f"{directory}: {p}")
        failed += len(problems)
        print(f"{directory}: {len(objects)} objects, {len(problems)} problems (Kubernetes {', '.join(versions)})")
    return 1 if failed else 0
