"""Differences between a recorded answer shape and another server's, minus the intentional ones.

A difference is a :class:`Difference`: the case, ``where`` it is (``status``, ``header content-type``,
``body path choices[].text``, ``sse events``, ``metrics family vllm:x``, ...) and what was recorded
and what was found. The intentional ones (``intentional.json``) are matched by target, case and
``where`` (shell-style globs).
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Difference:
    """One way a target's answer differs from the recording."""

    case: str
    where: str
    recorded: Any
    found: Any

    def __str__(self) -> str:
        return f"{self.case}: {self.where}: recorded {self.recorded!r}, found {self.found!r}"


def _compare_maps(case: str, prefix: str, recorded: dict[str, Any], found: dict[str, Any]) -> list[Difference]:
    out = []
    for key in sorted(set(recorded) | set(found)):
        if recorded.get(key) != found.get(key):
            out.append(Difference(case, f"{prefix} {key}", recorded.get(key, "absent"), found.get(key, "absent")))
    return out


def _compare_json(case: str, prefix: str, rec: dict[str, Any], got: dict[str, Any]) -> list[Difference]:
    out = _compare_maps(case, f"{prefix}path", rec.get("paths", {}), got.get("paths", {}))
    out += _compare_maps(case, f"{prefix}value", rec.get("values", {}), got.get("values", {}))
    if rec.get("message_class") != got.get("message_class"):
        out.append(Difference(case, f"{prefix}error message", rec.get("message_class"), got.get("message_class")))
    return out


def _compare_sse(case: str, rec: dict[str, Any], got: dict[str, Any]) -> list[Difference]:
    out = _compare_maps(case, "sse framing", rec["framing"], got["framing"])
    for key in ("events", "per_choice"):
        if rec[key] != got[key]:
            out.append(Difference(case, f"sse {key}", rec[key], got[key]))
    for kind in sorted(set(rec["by_kind"]) | set(got["by_kind"])):
        if kind not in rec["by_kind"] or kind not in got["by_kind"]:
            continue  # already an events difference
        out += _compare_json(case, f"sse {kind} ", rec["by_kind"][kind], got["by_kind"][kind])
    return out


def _compare_metrics(case: str, rec: dict[str, Any], got: dict[str, Any]) -> list[Difference]:
    out = []
    rf, gf = rec["families"], got["families"]
    for name in sorted(set(rf) | set(gf)):
        if name not in gf:
            out.append(Difference(case, f"metrics family {name}", rf[name]["type"], "absent"))
        elif name not in rf:
            out.append(Difference(case, f"metrics family {name}", "absent", gf[name]["type"]))
        else:
            rec_f, got_f = dict(rf[name]), dict(gf[name])
            # the creation-time series is a difference of its own, so it can be listed apart from the others
            rec_c, got_c = "_created" in rec_f["samples"], "_created" in got_f["samples"]
            if rec_c != got_c:
                out.append(Difference(case, f"metrics family {name} created", rec_c, got_c))
            rec_f["samples"] = [s for s in rec_f["samples"] if s != "_created"]
            got_f["samples"] = [s for s in got_f["samples"] if s != "_created"]
            out += _compare_maps(case, f"metrics family {name}", rec_f, got_f)
    return out


def compare_case(case: str, rec: dict[str, Any], got: dict[str, Any]) -> list[Difference]:
    """Every difference between a recorded case and the target's answer to it."""
    out = []
    if rec["status"] != got["status"]:
        out.append(Difference(case, "status", rec["status"], got["status"]))
    out += _compare_maps(case, "header", rec["headers"], got["headers"])
    rb, gb = rec["body"], got["body"]
    if rb["kind"] != gb["kind"]:
        return out + [Difference(case, "body kind", rb["kind"], gb["kind"])]
    if rb["kind"] == "json":
        out += _compare_json(case, "body ", rb, gb)
    elif rb["kind"] == "sse":
        out += _compare_sse(case, rb, gb)
    elif rb["kind"] == "metrics":
        out += _compare_metrics(case, rb, gb)
    return out


def compare(recorded: dict[str, dict[str, Any]], found: dict[str, dict[str, Any]]) -> list[Difference]:
    """Every difference over the recorded cases (a case the target was not sent is one too)."""
    out = []
    for case in recorded:
        if case not in found:
            out.append(Difference(case, "case", "recorded", "not sent"))
        else:
            out += compare_case(case, recorded[case], found[case])
    return out


def is_intentional(diff: Difference, target: str, table: list[dict[str, str]]) -> bool:
    """Whether ``diff`` is listed for ``target`` (``simulator`` or ``proxy``; ``both`` covers each)."""
    return any(entry["target"] in (target, "both") and fnmatch.fnmatchcase(diff.case, entry["case"])
               and fnmatch.fnmatchcase(diff.where, entry["where"]) for entry in table)


def unexplained(recorded: dict[str, dict[str, Any]], found: dict[str, dict[str, Any]], target: str,
                table: list[dict[str, str]]) -> list[Difference]:
    """The differences not listed as intentional for ``target``."""
    return [d for d in compare(recorded, found) if not is_intentional(d, target, table)]


def unused_entries(diffs: list[Difference], target: str, table: list[dict[str, str]]) -> list[dict[str, str]]:
    """Entries for ``target`` alone that match none of ``diffs`` (a stale table hides nothing but misleads)."""
    return [e for e in table if e["target"] == target
            and not any(fnmatch.fnmatchcase(d.case, e["case"]) and fnmatch.fnmatchcase(d.where, e["where"])
                        for d in diffs)]
