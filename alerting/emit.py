"""Deterministic YAML for generated files (golden files must not change between runs)."""

from __future__ import annotations

from typing import Any

import yaml

from llmsla.alerting.rules import Literal


class _Dumper(yaml.SafeDumper):
    pass


def _literal(dumper: yaml.SafeDumper, data: Literal) -> yaml.ScalarNode:
    return dumper.represent_scalar("tag:yaml.org,2002:str", str(data), style="|")


_Dumper.add_representer(Literal, _literal)


def dump(data: Any, header: str = "") -> str:
    body = yaml.dump(data, Dumper=_Dumper, sort_keys=False, default_flow_style=False, width=1000,
                     allow_unicode=True)
    head = "".join(f"# {line}\n" if line else "#\n" for line in header.splitlines())
    return head + body
