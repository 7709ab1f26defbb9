"""grader/hub/z2jh/values.yaml is valid configuration of the Zero to JupyterHub chart it names: merged over the
chart's own defaults as Helm merges values, it passes the chart's values schema (the check ``helm install`` makes
before rendering anything), from copies of both in grader/hub/z2jh/chart-4.4.0/ (nothing is downloaded). A broken
file fails the same check. Its per-user limits are those of grader/README.md's sizing table, where that exists.

No cluster, Helm or Docker here: what this does not show is in grader/hub/z2jh/README.md.
"""
from __future__ import annotations

import copy
import re
from pathlib import Path

import jsonschema
import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
Z2JH = REPO / "grader" / "hub" / "z2jh"
CHART = Z2JH / "chart-4.4.0"
SIZING_TITLE = "sizing a machine for a class"


def _yaml(path: Path):
    return yaml.safe_load(path.read_text())


def helm_merge(base, over):
    """Helm's coalescing of user values over a chart's defaults: maps merge key by key, a null removes the key,
    anything else (lists included) replaces."""
    out = dict(base)
    for key, value in over.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = helm_merge(out[key], value)
        else:
            out[key] = value
    return out


def schema_errors(values: dict) -> list[str]:
    schema = _yaml(CHART / "values.schema.yaml")
    merged = helm_merge(_yaml(CHART / "values.yaml"), values)
    validator = jsonschema.Draft7Validator(schema)
    return sorted(f"{'.'.join(map(str, e.absolute_path)) or '(top)'}: {e.message}"
                  for e in validator.iter_errors(merged))


@pytest.fixture(scope="module")
def values() -> dict:
    return _yaml(Z2JH / "values.yaml")


def test_the_charts_own_defaults_pass_its_schema():
    """The copied schema and defaults belong together (the chart's CI makes the same check)."""
    assert schema_errors({}) == []


def test_the_course_values_pass_the_charts_schema(values):
    assert schema_errors(values) == []


@pytest.mark.parametrize("break_it, expected", [
    (lambda v: v["singleuser"]["cpu"].update(limit="two"), "singleuser.cpu.limit: 'two' is not of type"),
    (lambda v: v.update(singeluser={"cpu": {"limit": 2}}), "'singeluser' was unexpected"),
    (lambda v: v["cull"].update(timeout="1h"), "cull.timeout: '1h' is not of type"),
    # an unquoted numeric tag is read as a number: Helm refuses it
    (lambda v: v["singleuser"]["image"].update(tag=yaml.safe_load("2026.1")), "singleuser.image.tag: 2026.1 is not of"),
])
def test_a_broken_values_file_fails_the_check(values, break_it, expected):
    broken = copy.deepcopy(values)
    break_it(broken)
    errors = schema_errors(broken)
    assert any(expected in e for e in errors), errors


def test_what_the_course_needs_is_set(values):
    single = values["singleuser"]
    assert set(single["cpu"]) == {"limit", "guarantee"} and set(single["memory"]) == {"limit", "guarantee"}
    assert values["cull"] == {"enabled": True, "timeout": 3600, "every": 300}
    mounts = {m["name"]: m["mountPath"] for m in single["storage"]["extraVolumeMounts"]}
    claims = {v["name"]: v["persistentVolumeClaim"]["claimName"] for v in single["storage"]["extraVolumes"]}
    pvc = _yaml(Z2JH / "nbgrader-exchange-pvc.yaml")
    assert "ReadWriteMany" in pvc["spec"]["accessModes"]
    assert claims == {"nbgrader-exchange": pvc["metadata"]["name"]}
    # the exchange where the one-machine hub has it, and the course's nbgrader config says so
    exchange = re.search(r"^EXCHANGE=\$\{DTLABS_EXCHANGE:-([^}]+)\}", (REPO / "grader/hub/hub.sh").read_text(), re.M)
    assert mounts == {"nbgrader-exchange": exchange.group(1)}
    nbconfig = single["extraFiles"]["nbgrader-config"]
    assert nbconfig["mountPath"] == "/etc/jupyter/nbgrader_config.py"
    assert f'c.Exchange.root = "{exchange.group(1)}"' in nbconfig["stringData"]
    assert 'c.CourseDirectory.course_id = "dtlabs"' in nbconfig["stringData"]


def _memory_gb(text: str) -> float | None:
    m = re.search(r"(\d+(?:\.\d+)?)\s*(GiB|GB|G|MiB|MB|M)\b", text)
    if not m:
        return None
    return float(m.group(1)) / (1024 if m.group(2).startswith("M") else 1)


def _cpus(text: str) -> float | None:
    m = re.search(r"(\d+(?:\.\d+)?)", text)
    return float(m.group(1)) if m else None


def _sizing_section() -> str | None:
    """grader/README.md's section "Sizing a machine for a class" (to the next heading of its level or above)."""
    lines = (REPO / "grader" / "README.md").read_text().splitlines()
    for i, line in enumerate(lines):
        m = re.match(r"(#+)\s+(.*?)\s*$", line)
        if m and m.group(2).lower().startswith(SIZING_TITLE):
            level, body = len(m.group(1)), []
            for nxt in lines[i + 1:]:
                h = re.match(r"(#+)\s", nxt)
                if h and len(h.group(1)) <= level:
                    break
                body.append(nxt)
            return "\n".join(body)
    return None


def test_the_limits_are_the_sizing_tables(values):
    """The per-user numbers of values.yaml are the ones grader/README.md's sizing table gives: a table row whose first
    cell names the quantity ("memory limit", "CPU guarantee", ...), its number in a later cell."""
    section = _sizing_section()
    assert section is not None, 'grader/README.md has no section "Sizing a machine for a class"'
    rows = [[c.strip() for c in line.strip().strip("|").split("|")] for line in section.splitlines()
            if line.lstrip().startswith("|") and not re.match(r"^\s*\|[\s:|-]+\|\s*$", line)]
    single = values["singleuser"]
    ours = {("memory", "limit"): _memory_gb(str(single["memory"]["limit"])),
            ("memory", "guarantee"): _memory_gb(str(single["memory"]["guarantee"])),
            ("cpu", "limit"): float(single["cpu"]["limit"]),
            ("cpu", "guarantee"): float(single["cpu"]["guarantee"])}
    found = {}
    for (what, kind), mine in ours.items():
        for row in rows:
            label = row[0].lower()
            if what in label and (kind in label or (kind == "guarantee" and "request" in label)):
                rest = " ".join(row[1:])
                found[(what, kind)] = _memory_gb(rest) if what == "memory" else _cpus(rest)
                break
    assert set(found) == set(ours), (f'grader/README.md\'s "Sizing a machine for a class" names {sorted(found)} of '
                                     f"{sorted(ours)} in the first cell of a table row: nothing to compare the rest with")
    mismatched = {f"{w} {k}": (found[(w, k)], ours[(w, k)]) for (w, k) in found if found[(w, k)] != ours[(w, k)]}
    assert not mismatched, f"(README's, values.yaml's): {mismatched}: change one of them, and jupyterhub_config.py"
