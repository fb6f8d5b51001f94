"""Which of the command's parts this install holds, and the one line that says how to add one.

The operator and the gateway need only the base install; the sandbox and the demo need their
extras (`pip install 'snooze[sandbox]'`, `'snooze[demo]'`, pyproject.toml's one list of them),
and the operator's image leaves their code out.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import re

# Subcommand -> the extra it needs. The others need the base install alone.
NEEDS = {"sandbox": "sandbox", "demo": "demo"}
# One line of the metadata's Requires-Dist, as setuptools writes an extra's:
# `kmock==0.8; extra == "sandbox"`, `snooze[sandbox]; extra == "demo"` (no base install
# carries `packaging`, which parses the general form).
REQUIREMENT = re.compile(
    r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[(?P<extras>[^\]]*)\])?[^;]*"
    r"(?:;\s*extra\s*==\s*[\"'](?P<extra>[^\"']+)[\"']\s*)?$"
)


def distributions(extra: str) -> list[str]:
    """What `pip install 'snooze[EXTRA]'` adds to the base install, by distribution name
    (following extras that name others, as `demo` names `sandbox`); none when this install
    has no metadata (run from a source tree)."""
    try:
        requires = importlib.metadata.requires("snooze") or []
    except importlib.metadata.PackageNotFoundError:
        return []
    names: list[str] = []
    wanted, seen = [extra], {extra}
    while wanted:
        current = wanted.pop()
        for text in requires:
            match = REQUIREMENT.match(text)
            if match is None or match["extra"] != current:
                continue
            name = match["name"]
            if name == "snooze":
                named = [e.strip() for e in (match["extras"] or "").split(",") if e.strip()]
                wanted += [e for e in named if e not in seen]
                seen.update(named)
            elif name not in names:
                names.append(name)
    return names


def install_command(extra: str) -> str:
    """The pip command that adds EXTRA to this install: from where it was installed (no index
    publishes Snooze), or by name when pip recorded no place."""
    try:
        recorded = importlib.metadata.distribution("snooze").read_text("direct_url.json")
    except importlib.metadata.PackageNotFoundError:
        recorded = None
    origin = json.loads(recorded) if recorded else {}
    url = str(origin.get("url", ""))
    if url.startswith("file://"):
        editable = "-e " if origin.get("dir_info", {}).get("editable") else ""
        return f"pip install {editable}'{url.removeprefix('file://')}[{extra}]'"
    return f"pip install 'snooze[{extra}]'"


def missing(command: str) -> str | None:
    """Why COMMAND cannot run in this install, in one line that says what to run; None if it can."""
    extra = NEEDS.get(command)
    if extra is None:
        return None
    if importlib.util.find_spec(f"snooze.{command}") is None:
        return (
            f"snooze {command} is not part of this install (the operator's image holds what a "
            f"cluster runs): run it from Snooze's source after pip install -e '.[{extra}]'"
        )
    absent = []
    for name in distributions(extra):
        try:
            importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            absent.append(name)
    if not absent:
        return None
    return (
        f"snooze {command} needs the {extra} extra ({', '.join(absent)} not installed): "
        f"{install_command(extra)}"
    )
