"""The deployments of ``deploy/prefect.yaml`` as Prefect ``RunnerDeployment``s, for ``shardflow
serve``: one file declares them for both ``prefect deploy`` and serving. Serving may override
parameters (``--set``) and replace the replan cron with an interval (``--replan-every``).

A relative path in a deployment file (an entry point, a path parameter or setting) is relative to
the file's directory, as for ``prefect deploy`` run there; one given with ``--set``, to the working
directory. Serving makes both absolute, so a flow run does not depend on where serve started."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import os
import typing
from collections import Counter
from collections.abc import Iterable, Mapping
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from rec.errors import InputError, Problem, printable, show
from rec.input_files import read_yaml_file
from rec.settings import check, from_dict, is_path, resolve_paths, setting_at
from rec.validation import did_you_mean
from tasks.tracking import TrackingSettings, sqlite_path, sqlite_uri

if TYPE_CHECKING:
    from prefect import Flow
    from prefect.deployments.runner import RunnerDeployment
    from prefect.schedules import Schedule

ROOT = Path(__file__).resolve().parents[1]
PREFECT_FILE = ROOT / "deploy" / "prefect.yaml"
# A flow parameter that names a file or directory ends so (tests/flows/test_serve_watch.py checks);
# inside a settings parameter its knob says so (``knob(path=True)``). Every run reads the input
# files first: serving refuses to start when they are missing.
MAX_DEPLOYMENT_FILE_BYTES = 1 << 24
PATH_SUFFIXES = ("_path", "_dir")
INPUT_FILES = ("spec_path", "topology_path")


def read_deployments(prefect_file: str | Path = PREFECT_FILE) -> list[dict[str, Any]]:
    """The ``deployments`` entries of a prefect.yaml; InputError naming what is wrong: every entry's
    keys of the wrong kind and every schedule Prefect would refuse, at once."""
    entries, problems = _read_entries(Path(prefect_file))
    if problems:
        raise InputError("Cannot use the Prefect deployments:", problems)
    return entries


def _read_entries(path: Path) -> tuple[list[Any], list[Problem]]:
    """The ``deployments`` entries of a prefect.yaml and the problems of each (``_entry_problems``);
    InputError for a file with no list of entries to look into."""
    # strictly, as specs and topologies: a key written twice or an alias bomb is named, not taken
    doc = read_yaml_file(path, "the Prefect deployments", MAX_DEPLOYMENT_FILE_BYTES, "a list under 'deployments'")
    if not isinstance(doc, dict):
        raise InputError("Cannot use the Prefect deployments:", [Problem(str(path), (
            f"holds {type(doc).__name__}, not a mapping with a list of deployments under 'deployments'"))])
    entries = doc.get("deployments") or []
    if not isinstance(entries, list):
        raise InputError("Cannot use the Prefect deployments:", [Problem(f"{path}: deployments", "is not a list")])
    problems = [p for i, d in enumerate(entries) for p in _entry_problems(f"{path}: deployment {i}", d)]
    named = Counter((d["entrypoint"], d["name"]) for d in entries if _names_a_flow(d))
    problems += [Problem(f"{path}: {name}", f"{count} deployments of {entrypoint} have this name: one would "
                                            "replace the others on the server") for (entrypoint, name), count
                 in named.items() if count > 1]
    if not entries:
        problems.append(Problem(str(path), "declares no deployments"))
    return entries, problems


# The keys of a deployment that Prefect reads (DeploymentConfig of prefect/cli/deploy/_models.py;
# tests/flows/test_serve_flows.py checks them against the installed Prefect). It ignores any other,
# so a misspelled one (``schedule_s``) would leave a deployment unscheduled without a word.
DEPLOYMENT_KEYS = ("name", "version", "version_type", "tags", "description", "schedule", "schedules", "paused",
                   "concurrency_limit", "flow_name", "entrypoint", "parameters", "enforce_parameter_schema",
                   "build", "push", "pull", "work_pool", "triggers", "sla")


def _entry_problems(where: str, d: object) -> list[Problem]:
    if not isinstance(d, dict):
        return [Problem(where, "is not a mapping")]
    problems = [Problem(where, f"needs {key!r} (text)") for key in ("name", "entrypoint")
                if not isinstance(d.get(key), str) or not d[key].strip()]
    problems += [Problem(f"{where}: {key}", _unknown_key(key)) for key in d if key not in DEPLOYMENT_KEYS]
    if not isinstance(d.get("parameters") or {}, dict):
        problems.append(Problem(f"{where}: parameters", "is not a mapping of parameter names to values"))
    limit = d.get("concurrency_limit")
    wrong = {"paused": "true or false" if not isinstance(d.get("paused"), bool) else None,
             "version": "text" if not isinstance(d.get("version"), str) else None,
             "concurrency_limit": None if isinstance(limit, int) and not isinstance(limit, bool) and limit >= 1
             else "a number of runs at once, at least 1"}
    problems += [Problem(f"{where}: {key}", f"needs {expected}, not {show(d[key])}")
                 for key, expected in wrong.items() if expected is not None and d.get(key) is not None]
    if d.get("schedule") is not None and not isinstance(d["schedule"], dict):
        problems.append(Problem(f"{where}: schedule", "is not a mapping (one schedule: a cron or an interval)"))
    elif d.get("schedule") and d.get("schedules") is not None:
        problems.append(Problem(f"{where}: schedule", "given beside 'schedules', which Prefect refuses: move it "
                                                     "into 'schedules'"))
    if d.get("schedules") and not isinstance(d["schedules"], list):
        return [*problems, Problem(f"{where}: schedules", "is not a list")]
    for i, s in enumerate(_schedules(d)):
        if (why := _schedule_problem(s)) is not None:
            problems.append(Problem(f"{where}: schedule {i}", why))
    return problems


def _unknown_key(key: object) -> str:
    close = did_you_mean(str(key), DEPLOYMENT_KEYS).strip()
    return ("is no key of a Prefect deployment, which Prefect (and serve) would ignore"
            + (f": {close}" if close else f"; it reads {', '.join(DEPLOYMENT_KEYS)}"))


def _schedules(d: Mapping[str, Any]) -> list[Any]:
    """A deployment's schedules as Prefect reads them: ``schedules``, or the one of ``schedule``; none
    where ``schedules`` is no list (named by ``_entry_problems``)."""
    one, many = d.get("schedule"), d.get("schedules")
    if isinstance(one, dict) and one and many is None:
        return [one]
    return many if isinstance(many, list) else []


MAX_INTERVAL_S = 366 * 86400  # a year and a day: Prefect's interval is a timedelta


# The keys of a schedule Prefect reads (RawScheduleConfig of prefect/cli/deploy/_models.py, which
# refuses any other; tests/flows/test_serve_flows.py checks them). ``replaces`` names a schedule of a
# deployment already on a server, which serving, each time anew, has none of.
SCHEDULE_KEYS = ("cron", "interval", "rrule", "timezone", "anchor_date", "active", "parameters", "slug", "replaces",
                 "day_or")


def _schedule_problem(s: object) -> str | None:
    """Why Prefect would refuse schedule ``s`` of a prefect.yaml (a cron or an interval in seconds)."""
    if not isinstance(s, dict) or ("cron" in s) == ("interval" in s):
        return "needs exactly one of 'cron' (text) or 'interval' (seconds)"
    unknown = [str(key) for key in s if key not in SCHEDULE_KEYS]
    if unknown:
        hints = [did_you_mean(key, SCHEDULE_KEYS).strip() for key in unknown]
        return "; ".join(f"{key}: is no key of a schedule, which Prefect refuses" + (f" ({hint})" if hint else "")
                         for key, hint in zip(unknown, hints, strict=True))
    for key in ("active", "day_or"):
        if key in s and not isinstance(s[key], bool):
            return f"{key}: needs true or false, not {show(s[key])}"
    if "parameters" in s and not isinstance(s["parameters"], dict):
        return "parameters: is not a mapping of parameter names to values"
    interval = s.get("interval")
    if "interval" in s and (isinstance(interval, bool) or not isinstance(interval, (int, float))
                            or not 0 < interval <= MAX_INTERVAL_S):
        return f"interval: needs a number of seconds above 0, at most {MAX_INTERVAL_S:,}, not {show(interval)}"
    zone = s.get("timezone")
    if zone is not None and not _known_zone(zone):
        return f"timezone: {show(zone)} is no IANA time zone (e.g. 'UTC', 'Europe/Berlin')"
    try:
        schedule_of(s)
    except (ValueError, TypeError) as e:  # pydantic's ValidationError is a ValueError
        first = str(e).strip().splitlines()
        return f"Prefect refuses it: {printable(first[-1] if first else type(e).__name__)}"
    return None


def _known_zone(zone: object) -> bool:
    from zoneinfo import ZoneInfo

    try:
        return isinstance(zone, str) and ZoneInfo(zone) is not None
    except (KeyError, ValueError, OSError):  # ZoneInfoNotFoundError is a KeyError; a malformed key a ValueError
        return False


def schedule_of(s: Mapping[str, Any]) -> Schedule:
    """A prefect.yaml schedule as Prefect's (``Cron`` or ``Interval``)."""
    from prefect.schedules import Cron, Interval

    options = {"active": s.get("active", True), "parameters": s.get("parameters"), "slug": s.get("slug")}
    if "cron" in s:
        return Cron(s["cron"], timezone=s.get("timezone"), day_or=s.get("day_or", True), **options)
    anchor = s.get("anchor_date")
    return Interval(s["interval"], anchor_date=datetime.fromisoformat(anchor) if isinstance(anchor, str) else anchor,
                    timezone=s.get("timezone"), **options)


def load_flow(entrypoint: str, base: Path = ROOT) -> Flow[..., Any]:
    """``../flows/plan.py:plan_flow`` (a file of shardflow, relative to ``base``) or the module path
    ``flows.plan.plan_flow`` -> the flow object, imported as ``flows.plan``; InputError if none."""
    from prefect import Flow

    if ":" in entrypoint:
        file, _, name = entrypoint.rpartition(":")
        path = Path(os.path.abspath(base / file))
        if not path.is_file():
            raise InputError("Cannot load the flow:", [Problem(entrypoint, f"no such file: {path}")])
        if not path.is_relative_to(ROOT):
            raise InputError("Cannot load the flow:", [Problem(entrypoint, f"{path} is not in shardflow ({ROOT})")])
        module_name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
    else:
        module_name, _, name = entrypoint.rpartition(".")
    if not module_name:
        raise InputError("Cannot load the flow:", [Problem(entrypoint, "expected FILE.py:FLOW or MODULE.FLOW")])
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name is None or not f"{module_name}.".startswith(f"{e.name}."):
            raise  # shardflow's own import failed: a bug, not a wrong entry point
        raise InputError("Cannot load the flow:", [Problem(entrypoint, f"no module {module_name}")]) from None
    flow = getattr(module, name, None)
    if not isinstance(flow, Flow):
        raise InputError("Cannot load the flow:", [Problem(entrypoint, f"{module_name} has no flow {name!r}")])
    return flow


def settings_parameters(flow: Flow[..., Any]) -> dict[str, type]:
    """The parameters of ``flow`` that take a settings dataclass whole (``training``, ``cost``...)."""
    hints = typing.get_type_hints(flow.fn)
    return {name: tp for name, tp in hints.items()
            if name in flow_parameters(flow) and isinstance(tp, type) and dataclasses.is_dataclass(tp)}


def setting_of(flow: Flow[..., Any], key: str) -> dataclasses.Field[Any] | None:
    """The settings field that ``key`` names in ``flow``'s parameters, a path into a settings
    parameter (``training.job.data``); None for anything else."""
    head, *rest = key.split(".")
    settings = settings_parameters(flow).get(head)
    return setting_at(settings, rest) if settings is not None and rest else None


def names_a_path(flow: Flow[..., Any], key: str) -> bool:
    """Whether the parameter (or settings field) ``key`` of ``flow`` names a file or directory."""
    if key.endswith(PATH_SUFFIXES):
        return True
    field = setting_of(flow, key)
    return field is not None and is_path(field)


def absolute_paths(flow: Flow[..., Any], parameters: Mapping[str, Any], base: Path) -> dict[str, Any]:
    """``parameters`` of ``flow`` with each relative path (``names_a_path``, the path knobs inside
    a settings parameter, a SQLite ``tracking.tracking_uri``) made absolute against ``base``."""

    def absolute(path: str) -> str:
        return os.path.abspath(base / Path(path).expanduser())

    settings = settings_parameters(flow)
    out = dict(parameters)
    for key, value in parameters.items():
        if isinstance(value, Mapping) and key in settings:
            out[key] = resolve_paths(settings[key], value, absolute)
            uri = value.get("tracking_uri")
            if isinstance(uri, str) and (db := sqlite_path(uri)) is not None and not db.is_absolute():
                out[key]["tracking_uri"] = sqlite_uri(absolute(str(db)))
        elif isinstance(value, str) and value and names_a_path(flow, key):
            out[key] = absolute(value)
    return out


def parse_overrides(pairs: Iterable[str]) -> dict[str, Any]:
    """``["out_dir=/tmp/out", "training.job.iterations=5"]`` -> parameters, a dotted KEY naming a
    field of a settings parameter; values are YAML, as in prefect.yaml (``5`` is an int, ``null``
    is None)."""
    out: dict[str, Any] = {}
    problems = []
    for pair in pairs:
        key, sep, text = pair.partition("=")
        if not sep or not key.strip():
            problems.append(Problem(repr(pair), "expected KEY=VALUE"))
            continue
        try:
            out[key.strip()] = yaml.safe_load(text) if text else ""
        except yaml.YAMLError as e:
            problems.append(Problem(repr(pair), f"VALUE is not YAML: {e}"))
    if problems:
        raise InputError("Cannot use the parameter overrides:", problems)
    return out


def flow_parameters(flow: Flow[..., Any]) -> set[str]:
    return set(inspect.signature(flow.fn).parameters)


def override_problem(flows: Iterable[Flow[..., Any]], key: str) -> str | None:
    """Why ``--set KEY=...`` fits none of ``flows``; None if it fits one."""
    head, dot, _ = key.partition(".")
    having = [flow for flow in flows if head in flow_parameters(flow)]
    if not having:
        accepted = sorted(set().union(*(flow_parameters(flow) for flow in flows)))
        return f"no served flow has this parameter; they have {accepted}"
    if dot and not any(setting_of(flow, key) for flow in having):
        return f"{head} has no setting {key.removeprefix(head + '.')}"
    return None


def overrides_for(flow: Flow[..., Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """The ``overrides`` (keys as ``--set`` names them) that ``flow`` takes, a dotted key nested:
    ``{"training.job.iterations": 5}`` -> ``{"training": {"job": {"iterations": 5}}}``."""
    out: dict[str, Any] = {}
    for key, value in overrides.items():
        *outer, name = key.split(".")
        if (outer[0] if outer else name) not in flow_parameters(flow):
            continue
        nested = out
        for part in outer:
            nested = nested.setdefault(part, {})
        nested[name] = value
    return out


def merged(parameters: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """``parameters`` with ``overrides`` in them: mappings (settings) merged, key by key."""
    out = dict(parameters)
    for key, value in overrides.items():
        inner = out.get(key)
        out[key] = merged(inner, value) if isinstance(inner, Mapping) and isinstance(value, Mapping) else value
    return out


def runner_deployments(prefect_file: str | Path = PREFECT_FILE, *,
                       overrides: Mapping[str, Any] | None = None,
                       replan_every: float | None = None) -> list[RunnerDeployment]:
    """Each deployment with its parameters, tags and cron/interval schedules (work pools are for
    workers; serving runs the flows in this process's subprocesses).

    ``overrides`` replace parameters of every deployment whose flow has them; ``replan_every``
    (seconds) replaces the schedules of the deployments that run ``replan_flow``. A parameter
    that a deployment gives and its flow does not have is an InputError, not a failed flow run later."""
    from prefect.deployments.runner import RunnerDeployment
    from prefect.schedules import Interval
    from prefect.types.entrypoint import EntrypointType

    from flows.replan import replan_flow

    base = Path(os.path.abspath(prefect_file)).parent
    overrides = overrides or {}
    read, problems = _read_entries(Path(prefect_file))  # named with the rest below, not alone first
    entries = []
    for d in read:
        if not _names_a_flow(d):
            continue  # named by _read_entries
        try:
            entries.append((d, load_flow(d["entrypoint"], base)))
        except InputError as e:
            problems += [Problem(f"{prefect_file}: {d['name']}: {p.where}", p.reason) for p in e.problems]
    flows = [flow for _, flow in entries]
    problems += [Problem(f"{prefect_file}: {d['name']}: {key}", f"{flow.name} has no such parameter; it has "
                                                                 f"{sorted(flow_parameters(flow))} (docs/prefect.md)")
                 for d, flow in entries for key in _given(d) if key not in flow_parameters(flow)]
    problems += [Problem(f"{prefect_file}: {d['name']}: parameters", f"{flow.name} needs {key!r} (it has no default)")
                 for d, flow in entries for key in flow.parameters.required or []
                 if key not in _parameters(d) and key not in overrides]
    refused = {key: why for key in overrides if (why := override_problem(flows, key)) is not None}
    problems += [Problem(f"--set {key}", why) for key, why in refused.items()]
    if replan_every is not None:
        if not 0 < replan_every <= MAX_INTERVAL_S:
            problems.append(Problem("--replan-every", f"needs a number of seconds above 0, at most "
                                                      f"{MAX_INTERVAL_S:,}, not {replan_every:g}"))
        if not any(flow is replan_flow for _, flow in entries):
            problems.append(Problem("--replan-every", f"{prefect_file} has no deployment of replan_flow"))
    # a --set key named above would be named again as an unknown setting
    taken = {key: value for key, value in overrides.items() if key not in refused}
    parameters = [merged(absolute_paths(flow, _parameters(d), base),
                         absolute_paths(flow, overrides_for(flow, taken), Path.cwd()))
                  for d, flow in entries]
    problems += [p for (d, flow), params in zip(entries, parameters, strict=True)
                 for p in settings_problems(flow, params, f"{prefect_file}: {d['name']}")]
    missing = {(key, params[key]) for params in parameters for key in INPUT_FILES
               if isinstance(params.get(key), str) and not Path(params[key]).is_file()}
    problems += [Problem(key, f"no such file: {path}") for key, path in sorted(missing)]
    if problems:
        raise InputError("Cannot serve the deployments:", problems)

    out = []
    for (d, flow), params in zip(entries, parameters, strict=True):
        schedules: list[Schedule] = [schedule_of(s) for s in _schedules(d)]
        if replan_every is not None and flow is replan_flow:
            schedules = [Interval(replan_every)]
        deployment = flow.to_deployment(
            name=d["name"], description=d.get("description"), tags=d.get("tags"), version=d.get("version"),
            paused=d.get("paused"), concurrency_limit=d.get("concurrency_limit"),
            parameters=params, schedules=schedules, entrypoint_type=EntrypointType.MODULE_PATH)
        assert isinstance(deployment, RunnerDeployment)  # called outside an event loop: not a coroutine
        out.append(deployment)
    return out


def _names_a_flow(d: object) -> bool:
    return isinstance(d, dict) and all(isinstance(d.get(key), str) and d[key].strip() for key in ("name", "entrypoint"))


def _parameters(d: Mapping[str, Any]) -> dict[str, Any]:
    """A deployment's parameters; none where they are no mapping (named by ``_read_entries``)."""
    parameters = d.get("parameters") or {}
    return parameters if isinstance(parameters, dict) else {}


def _given(d: Mapping[str, Any]) -> list[str]:
    """The parameter names a deployment gives: its own, and its schedules' (each run of a schedule
    takes the deployment's, with the schedule's over them)."""
    return list(dict.fromkeys([*_parameters(d), *(key for s in _schedules(d)
                                                  if isinstance(s, dict) and isinstance(s.get("parameters"), dict)
                                                  for key in s["parameters"])]))


def settings_problems(flow: Flow[..., Any], parameters: Mapping[str, Any], where: str) -> list[Problem]:
    """What every run of ``flow`` with ``parameters`` would refuse in its settings parameters (a
    value of the wrong type, out of its bounds, a setting the flows refuse): named before serving."""
    problems = []
    for key, tp in settings_parameters(flow).items():
        if key not in parameters:
            continue
        try:
            settings: Any = from_dict(tp, parameters[key], key)
            check(settings, "")
        except InputError as e:
            problems += [Problem(f"{where}: {p.where}", p.reason) for p in e.problems]
            continue
        if isinstance(settings, TrackingSettings) and not settings.track:
            problems.append(Problem(f"{where}: {key}.track", "is false; the flows always record"))
    return problems


def describe_schedules(deployment: RunnerDeployment) -> str:
    """``cron '*/15 * * * *'``, ``every 5 s`` or ``on demand``."""
    described = []
    for s in deployment.schedules or []:
        schedule = s.schedule
        if cron := getattr(schedule, "cron", None):
            described.append(f"cron {cron!r}")
        elif interval := getattr(schedule, "interval", None):
            described.append(f"every {interval.total_seconds():g} s")
        else:
            continue
        if s.active is False:
            described[-1] += " (inactive)"
    return (", ".join(described) or "on demand") + (" (paused)" if deployment.paused else "")
