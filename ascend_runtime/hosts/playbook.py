"""The playbook file model: ``playbooks/<name>.yaml``.

A playbook is a list of named steps of five types:

``command``  run a command; ``expect`` on ``rc`` / ``stdout`` / ``stderr``.
``parse``    run a command, parse its output with a named parser
             (:data:`ascend_runtime.hosts.parsers.PARSERS`), ``expect`` on fields.
``file``     read a file's content (``path``), parse it (``key_value`` by default),
             ``expect`` on its keys (e.g. a version against the playbook's matrix).
``compare``  like ``parse``, then ``field`` must have one value across all hosts
             (a cross-host check, evaluated once every host is done).
``set``      read the current value (``get`` + ``parser``), compare it with ``want``;
             only if it differs run ``set`` (never in ``--check``) and verify.

Common keys: ``foreach`` (``host``, ``device``: every device the hardware kind
has, with the inventory's plan for it merged in; ``peer``: each device paired
with the same device id on every other host; ``file``: each entry of the
``model_files`` variable, a map of file name to size, as ``model_file`` /
``model_file_size``), ``when`` (names that must be set
and truthy, e.g. ``device_ip`` or a variable), ``hardware`` (kinds the step
applies to), ``become`` (sudo), ``timeout_s`` (one deadline for the step on a
host, all its devices or peers together: a command still running then is
killed, one not started is not run), ``ignore_rc`` (parse the output even
when the command exits non-zero) and ``register`` (keep the parsed result as a
fact). Templates see the playbook ``vars`` (overridable per run and per host),
``hardware``, ``devices_per_node``, ``applying`` (false in ``--check``) and the
node's ``name``, ``host_ip``, ``nic`` and per device ``device_id``, ``card``,
``chip``, ``device_ip`` (the RoCE port IP, ``-ip -g``), ``netmask``, ``gateway``,
``netdetect`` and ``vnic_ip`` (A3 VNIC IP, ``-vnic -g``; unset on A2). Expectations map a field to a value (equality) or to one
operator: ``eq``, ``ne``, ``in``, ``not_in``, ``regex``, ``present``,
``ge``/``le`` (numbers), ``version`` (a component of the matrix),
``min_version``/``max_version``. A ``set`` step with ``replace_guard: VAR``
sets values that are unset but refuses to replace one the host already has
unless the playbook variable ``VAR`` is true (``--var VAR=true``). ``after: [STEP, ...]``
(``foreach: device`` steps) names earlier device steps that must not have failed on a
device for this step to run there: a device whose RoCE address could not be set (or
was refused) gets no netdetect or gateway either, so nothing is applied half.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from ascend_runtime.config.errors import ConfigError, Problem
from ascend_runtime.config.loader import parse_yaml, read_text
from ascend_runtime.hosts.parsers import PARSERS

StepType = Literal["command", "parse", "file", "compare", "set"]
HARDWARE_KINDS = ("atlas-800i-a2", "cm384")

#: Default directory of the shipped playbooks (repo-root/playbooks).
PLAYBOOK_DIR = Path(__file__).resolve().parents[2] / "playbooks"


class VersionRange(BaseModel):
    """Supported range of one component (inclusive bounds)."""

    model_config = ConfigDict(extra="forbid")

    min: str | None = None
    max: str | None = None


class Step(BaseModel):
    """One named check or action."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    name: str = Field(min_length=1)
    type: StepType
    description: str = ""
    foreach: Literal["host", "device", "peer", "file"] = "host"
    when: list[str] = Field(default_factory=list)
    hardware: list[str] | None = None
    become: bool = False
    timeout_s: float = Field(30.0, gt=0)
    ignore_rc: bool = False
    command: str | None = None
    path: str | None = None
    parser: str | None = None
    expect: dict[str, Any] = Field(default_factory=dict)
    register_as: str | None = Field(None, alias="register")
    field: str | None = None
    get: str | None = None
    want: dict[str, Any] = Field(default_factory=dict)
    set: str | None = None
    #: ``set`` steps: a playbook variable that must be true to *replace* a value the host already has (one that
    #: is set and differs); values that are unset are set regardless. Unset variable: no guard.
    replace_guard: str | None = None
    #: ``foreach: device`` steps: earlier device steps that must not have failed on a device for this one to
    #: run on it (the device is then reported as not run, naming the step that failed).
    after: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _shape(self) -> Step:
        need = {
            "command": ["command"],
            "parse": ["command", "parser"],
            "file": ["path"],
            "compare": ["command", "parser", "field"],
            "set": ["get", "parser", "want", "set"],
        }[self.type]
        missing = [k for k in need if not getattr(self, k)]
        if missing:
            raise ValueError(f"step {self.name!r} of type {self.type} needs {', '.join(missing)}")
        if self.parser and self.parser not in PARSERS:
            raise ValueError(f"step {self.name!r}: unknown parser {self.parser!r} (known: {', '.join(sorted(PARSERS))})")
        if self.after and self.foreach != "device":
            raise ValueError(f"step {self.name!r}: `after` applies to foreach: device steps only")
        return self


class FactsSpec(BaseModel):
    """Where the facts playbook finds each inventory field among its registered results.

    Values are ``register.field`` references.
    """

    model_config = ConfigDict(extra="forbid")

    addresses: str | None = Field(None, description="Register holding ip_addr output (finds the host NIC).")
    versions: dict[str, str] = Field(default_factory=dict)
    device: dict[str, str] = Field(default_factory=dict)


class Playbook(BaseModel):
    """A playbook file."""

    model_config = ConfigDict(extra="forbid")

    name: str
    description: str = ""
    hardware: list[Literal["atlas-800i-a2", "cm384"]] = Field(min_length=1)
    vars: dict[str, Any] = Field(default_factory=dict)
    matrix: dict[str, dict[str, VersionRange]] = Field(default_factory=dict)
    facts: FactsSpec | None = None
    steps: list[Step] = Field(min_length=1)

    @model_validator(mode="after")
    def _unique(self) -> Playbook:
        names = [s.name for s in self.steps]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"duplicate step names: {', '.join(dupes)}")
        for i, step in enumerate(self.steps):
            earlier = {s.name: s for s in self.steps[:i]}
            for name in step.after:
                if name not in earlier or earlier[name].foreach != "device":
                    raise ValueError(f"step {step.name!r}: `after: {name}` must name an earlier foreach: device step")
        return self


def available(directory: Path | None = None) -> dict[str, Path]:
    """Playbook names and files in ``directory`` (default: the shipped playbooks)."""
    d = directory or PLAYBOOK_DIR
    return {p.stem: p for p in sorted(d.glob("*.yaml"))}


def load(name_or_path: str, directory: Path | None = None) -> Playbook:
    """Load a playbook by name (``preflight``) or path; raises ConfigError naming the bad field."""
    path = Path(name_or_path)
    if not path.suffix:
        found = available(directory)
        if name_or_path not in found:
            raise ConfigError.single(
                "playbook", "no such playbook", name_or_path, hint=f"known: {', '.join(found) or 'none'}"
            )
        path = found[name_or_path]
    data = parse_yaml(read_text(path, "playbook"), "playbook", str(path))
    try:
        return Playbook.model_validate(data)
    except ValidationError as exc:
        problems = [Problem(".".join(str(p) for p in e["loc"]) or "playbook", e["msg"]) for e in exc.errors()]
        raise ConfigError(problems, str(path)) from None
