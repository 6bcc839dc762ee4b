"""The paper's claims a sweep can test: electra_ablate/report/claims.yaml (which variant beats which, per paper
table or figure) checked on loading, and the claims of one sweep, with the paper's numbers for each and a
pre-trained-against-random-init check for each arm without pre-training."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import yaml

CLAIMS = Path(__file__).with_name("claims.yaml")
NO_PRETRAINING = "none"  # the `pretrained` value of a random-init variant
CLAIM_KEYS = {"claim", "figure", "better", "worse", "axis"}


class ClaimsError(ValueError):
    """A claims file entry that cannot work."""


@dataclass(frozen=True)
class Claim:
    text: str
    figure: str
    better: tuple[str, ...]  # variant labels: the best of these ...
    worse: tuple[str, ...]  # ... beats the best of these
    paper: str = ""  # the paper's numbers for it, from paper_results.yaml, e.g. "85.0 vs 82.2"


@cache
def _claims(path: str) -> dict:
    raw = yaml.safe_load(Path(path).read_text()) or {}
    for section, entries in raw.items():
        for i, entry in enumerate(entries or []):
            where = f"{Path(path).name}: {section}[{i}]"
            unknown = sorted(set(entry) - CLAIM_KEYS)
            if unknown:
                raise ClaimsError(f"{where}: unknown key(s) {unknown}; valid: {sorted(CLAIM_KEYS)}")
            if not entry.get("claim") or not entry.get("figure"):
                raise ClaimsError(f"{where}: needs `claim` (text) and `figure` (where the paper shows it)")
            if section != "no_pretraining" and not (entry.get("better") and entry.get("worse")):
                raise ClaimsError(f"{where}: needs `better` and `worse` (lists of variant labels)")
    return raw


def load_claims(path: str | Path | None = None) -> dict:
    """electra_ablate/report/claims.yaml: {section: [{claim, figure, better, worse, axis?}]}."""
    return _claims(str(path or CLAIMS))


def _paper_numbers(section: Mapping | None, better: Sequence[str], worse: Sequence[str]) -> str:
    rows = (section or {}).get("rows") or {}
    if len(better) == 1 and len(worse) == 1 and "glue" in rows.get(better[0], {}) and "glue" in rows.get(worse[0], {}):
        a, b = rows[better[0]]["glue"], rows[worse[0]]["glue"]
        return f"{a:.1f} vs {b:.1f} ({a - b:+.1f})"
    return ""


def sweep_claims(spec, paper: Mapping, claims: Mapping | None = None) -> list[Claim]:
    """The claims of the sweep's paper section whose variants it has (per setting of the other axes for an
    `axis` claim), then pre-trained vs each `pretrained: none` variant."""
    claims = load_claims() if claims is None else claims
    labels = {v.label for v in spec.variants}
    out = []
    for entry in claims.get(spec.paper, []) if spec.paper else []:
        better, worse = tuple(entry["better"]), tuple(entry["worse"])
        axis = entry.get("axis")
        if axis is None:
            if set(better) | set(worse) <= labels:
                out.append(Claim(entry["claim"], entry["figure"], better, worse,
                                 _paper_numbers(paper.get(spec.paper), better, worse)))
            continue
        settings: dict[tuple, dict[str, str]] = {}  # other axes' options -> {this axis' option: label}
        for v in spec.variants:
            if axis in v.axes:
                rest = tuple(sorted((a, o) for a, o in v.axes.items() if a != axis))
                settings.setdefault(rest, {})[v.axes[axis]] = v.label
        for rest, by_option in settings.items():
            b = tuple(by_option[o] for o in better if o in by_option)
            w = tuple(by_option[o] for o in worse if o in by_option)
            if b and w:
                where = ", ".join(f"{a}={o}" for a, o in rest)
                out.append(Claim(entry["claim"] + (f" ({where})" if where else ""), entry["figure"], b, w))
    floors = [v.label for v in spec.variants if not pretrained(v)]
    for entry in claims.get("no_pretraining", []) if floors else []:
        for floor in floors:
            for v in spec.variants:
                if pretrained(v):
                    out.append(Claim(f"{entry['claim']}: {v.label} > {floor}", entry["figure"], (v.label,), (floor,)))
    return out


def pretrained(variant) -> bool:
    """False for a variant fine-tuned from random weights: `pretrained: none` or `random_init_of: <label>`."""
    return variant.pretrained != NO_PRETRAINING and getattr(variant, "random_init_of", None) is None
