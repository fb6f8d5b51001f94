"""The policies `snooze whatif` compares, from their command-line form: `always-on`,
`fixed:10m`, `tiers:10m,24h`, `auto[:MIN,MAX]`, `schedule:FILE`, `prewake[:LEAD[,IDLE]]`, or an
InferenceModel YAML file. Each becomes an InferenceModelSpec that the real policy reads."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from snooze.api.durations import DurationError, parse_duration
from snooze.api.models import AUTO, KIND, NEVER, InferenceModelSpec, describe_validation_error

# Whatif serves no pods: the selector only satisfies the schema; the scale target names the
# workload that tiers scale (simulated).
SELECTOR = {"matchLabels": {"app.kubernetes.io/name": "whatif"}}
TARGET = {"kind": "Deployment", "name": "whatif"}
FORMS = (
    "always-on, fixed:DURATION (such as fixed:10m), tiers:IDLE,ZERO (such as tiers:10m,24h), "
    "auto or auto:MIN,MAX, schedule:FILE, prewake or prewake:LEAD or prewake:LEAD,IDLE "
    "(IDLE a duration or Auto), an InferenceModel YAML file, or declared (each model as the "
    "InferenceModels given with --pools say)"
)


class PolicyError(ValueError):
    """A policy spec that cannot be used; the message says which and what to write."""


@dataclass(frozen=True, kw_only=True)
class Policy:
    name: str
    spec: InferenceModelSpec
    engines: int | None = None
    """Engines per model; None: one, or the most any minAwake asks for."""
    note: str = ""
    """What whatif leaves out of this policy (said once on the terminal)."""
    per_model: Mapping[str, InferenceModelSpec] = field(default_factory=dict)
    """Specs of their own for some models (the `declared` policy); the others take `spec`."""
    model_engines: Mapping[str, int] = field(default_factory=dict)
    """Engines of some models (the others take `engines`)."""

    def spec_for(self, model: str) -> InferenceModelSpec:
        return self.per_model.get(model, self.spec)


DECLARED = "declared"


def declared(specs: Mapping[str, InferenceModelSpec]) -> Policy:
    """Each model as its InferenceModel manifest says (pools aside: the layout places them);
    a model no manifest declares stays awake."""
    if not specs:
        raise PolicyError(
            f"policy {DECLARED!r} replays the InferenceModels given with --pools: give them"
        )
    always = policy_of("always-on", {"idle": {"after": NEVER}})
    return Policy(name=DECLARED, spec=always.spec, per_model=dict(specs))


def parse(text: str) -> Policy:
    """The policy that `text` names."""
    kind, _, arg = text.partition(":")
    try:
        if text == "always-on":
            return policy_of(text, {"idle": {"after": NEVER}})
        if kind == "fixed" and arg:
            return policy_of(text, {"idle": {"after": _duration(arg)}})
        if kind == "tiers" and arg.count(",") == 1:
            idle, zero = (_duration(part) for part in arg.split(","))
            return policy_of(
                text,
                {"idle": {"after": idle}, "scaleTargetRef": TARGET, "scaleToZeroAfter": zero},
            )
        if text == "auto" or (kind == "auto" and arg.count(",") == 1):
            bounds = dict(zip(("min", "max"), arg.split(","), strict=True)) if arg else {}
            return policy_of(text, {"idle": {"after": AUTO, "auto": bounds}})
        if text == "prewake" or kind == "prewake":
            lead, _, idle = arg.partition(",")
            return policy_of(
                text,
                {
                    "prewake": {"lead": _duration(lead)} if lead else {},
                    "idle": {"after": AUTO if idle in ("", AUTO) else _duration(idle)},
                },
            )
        if kind == "schedule" and arg:
            return _schedule(text, Path(arg))
        if text.endswith((".yaml", ".yml")):
            return _manifest(Path(text))
    except DurationError as exc:
        raise PolicyError(f"policy {text!r}: {exc}") from None
    raise PolicyError(f"policy {text!r} is not one of: {FORMS}")


def _duration(text: str) -> str:
    parse_duration(text)
    return text


def policy_of(name: str, raw: dict[str, Any], *, note: str = "") -> Policy:
    """A policy named `name` from InferenceModel spec fields (the selector is filled in)."""
    try:
        spec = InferenceModelSpec.model_validate({"selector": SELECTOR, **raw})
    except ValidationError as exc:
        raise PolicyError(
            f"policy {name!r}: {describe_validation_error(exc, prefix='spec')}"
        ) from None
    return Policy(name=name, spec=spec, note=note)


def _load(path: Path, name: str) -> Any:
    try:
        return yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise PolicyError(f"policy {name!r}: cannot read {path}: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        raise PolicyError(f"policy {name!r}: {path} is not YAML: {exc}") from None


def _schedule(name: str, path: Path) -> Policy:
    """A file with the windows (a list, as in spec.schedule), or spec fields with `schedule`
    among them (`idle`, `minAwake`...); the idle policy defaults to idle.after: 10m."""
    loaded = _load(path, name)
    raw = {"schedule": loaded} if isinstance(loaded, list) else loaded
    if not isinstance(raw, dict) or not raw.get("schedule"):
        raise PolicyError(
            f"policy {name!r}: {path} holds no windows: write a list of windows (cron, "
            "duration, timeZone, minAwake), or spec fields with a `schedule:` list"
        )
    return policy_of(name, {"idle": {"after": "10m"}, **raw})


def _manifest(path: Path) -> Policy:
    name = str(path)
    loaded = _load(path, name)
    if not isinstance(loaded, dict) or loaded.get("kind") != KIND:
        raise PolicyError(f"policy {name!r}: {path} is not an {KIND} manifest (kind: {KIND})")
    spec = dict(loaded.get("spec") or {})
    notes = []
    if spec.pop("pool", None) is not None:
        notes.append("spec.pool is left out: give pools with --pools or --pool")
    if "scaleToZeroAfter" in spec:
        spec.setdefault("scaleTargetRef", TARGET)
    label = str((loaded.get("metadata") or {}).get("name") or path.stem)
    policy = policy_of(label, spec, note="; ".join(notes))
    return policy
