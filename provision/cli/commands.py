"""The core commands: devices, plan, apply, status, teardown, schema. Parsing and
presentation only: the work is in the modules each command imports when it runs."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, List, Optional

import typer

from hotcache.provision.cli.common import (DryRunOpt, FstabOpt, JsonOpt, StateOpt, YesOpt,
                                           carry_out, confirm, console, dry_run_report, emit,
                                           holding_state, make_env, need_root, print_table,
                                           refresh_index, run_steps, show_plan)
from hotcache.provision.errors import ExitCode, HotcacheError, UsageError
from hotcache.provision.system.runner import Runner
from hotcache.provision.system.sizes import size
from hotcache.provision.system.statepath import state_path

if TYPE_CHECKING:
    from hotcache.provision.engine.reattach import WaitingRow
    from hotcache.provision.engine.statusrow import StatusRow
    from hotcache.provision.records import CacheEntry


def devices(
    as_json: bool = JsonOpt,
    all_: bool = typer.Option(False, "--all", help="Include loop devices that are not attached."),
    backends: bool = typer.Option(False, "--backends",
                                  help="Show which cache backends this host can use."),
) -> None:
    """List block devices: size, SSD or HDD, model, serial, by-id links, signatures,
    mountpoints, holders, and whether hotcache may use each one."""
    from hotcache.provision.observe.discover import backend_report, discover  # slow to import; loaded only when used

    if backends:
        usable = backend_report()
        if as_json:
            return emit({"backends": usable}, "backends")
        c = console()
        for r in usable:
            state = "[green]available[/]" if r["available"] else f"[red]unavailable[/]: {r['why']}"
            c.print(f"{r['backend']:<9} {state}")
        return
    rows = discover(include_empty_loops=all_)
    if as_json:
        return emit({"devices": rows, "root": os.geteuid() == 0}, "devices")
    print_table(
        ("device", "size", "kind", "model / serial", "by-id", "signatures", "mounted", "safe"),
        ((d["node"], size(d["size"]), d["kind"],
          " / ".join(x for x in (d["model"], d["serial"]) if x) or "-",
          [os.path.basename(b) for b in d["by_id"]] or "-",
          ",".join(sorted({s.get("type", "?") for s in d["signatures"]})) or "-",
          ",".join(d["mountpoints"]) or "-",
          "yes" if d["safe"] else "no: " + "; ".join(d["problems"])) for d in rows))
    if os.geteuid() != 0:       # on stderr: stdout holds the rows alone
        sys.stderr.write("note: not root, so on-disk signatures could not be read\n")


def plan(
    spec: Path = typer.Argument(..., help="Host spec (YAML); - reads it from stdin."),
    dataset: List[Path] = typer.Option([], "--dataset", metavar="PATH",
                                       help="A dataset to be cached: compare its size with "
                                            "each cache's fast tier (repeatable)."),
    as_json: bool = JsonOpt, state: Optional[Path] = StateOpt, fstab: Optional[Path] = FstabOpt,
) -> None:
    """Show what `apply` would do: each step with the exact command it runs. Changes nothing
    (the same as `hotcache apply SPEC --dry-run`).

    With --dataset PATH, also say whether that dataset fits each cache's fast tier with
    the 1.2-1.5x margin, without margin, or not at all (then a block cache thrashes: pin
    a subset with `hotcache copy --fit` instead)."""
    from hotcache.provision.engine.apply import plan_apply  # slow to import; loaded only when used
    from hotcache.provision.engine.spec import load_spec  # slow to import; loaded only when used

    host = load_spec(spec)
    for d in dataset:
        if not d.is_dir():
            raise UsageError(f"--dataset {d}: not a folder", hint="give the dataset's folder")
    need_root("plan")
    result = plan_apply(host, make_env(state, fstab, dry_run=True))
    sizing: list[dict[str, Any]] = []
    if dataset:
        from hotcache.provision.engine.workingset import plan_advice  # slow to import; loaded only when used

        sizing = plan_advice(host, [d.resolve() for d in dataset])
        result.notes += [f"sizing: {a['message']}" for a in sizing]
    if as_json:
        return emit({**result.to_json(), **({"sizing": sizing} if dataset else {})}, "plan")
    show_plan(result, "plan")


def apply(
    spec: Path = typer.Argument(..., help="Host spec (YAML); - reads it from stdin."),
    yes: bool = YesOpt, dry_run: bool = DryRunOpt, as_json: bool = JsonOpt,
    state: Optional[Path] = StateOpt, fstab: Optional[Path] = FstabOpt,
) -> None:
    """Make the host match the spec. Idempotent: a second apply changes nothing, and an
    interrupted apply finishes when run again. Devices with existing signatures are
    refused unless the spec says `wipe: true` for them. --dry-run shows the plan (as
    `hotcache plan SPEC` does) and changes nothing."""
    from hotcache.provision.engine.apply import plan_apply  # slow to import; loaded only when used
    from hotcache.provision.engine.spec import load_spec  # slow to import; loaded only when used

    host = load_spec(spec)
    need_root("apply")
    env = make_env(state, fstab, dry_run=dry_run)
    with holding_state(env, f"apply {spec}"):
        carry_out(plan_apply(host, env), env, "apply", yes=yes, as_json=as_json,
                  done="applied; `hotcache status` shows the result", dry_run=dry_run)
    if not dry_run:
        refresh_index(state, fstab)


def status(
    name: Optional[str] = typer.Argument(None, help="One cache (default: all)."),
    as_json: bool = JsonOpt, state: Optional[Path] = StateOpt, fstab: Optional[Path] = FstabOpt,
    prometheus: Optional[Path] = typer.Option(
        None, "--prometheus", metavar="FILE",
        help="Also write the metrics to FILE for node_exporter's textfile collector "
             "(atomically), e.g. /var/lib/prometheus/node-exporter/hotcache.prom."),
    node_labels: Optional[Path] = typer.Option(
        None, "--node-labels", metavar="FILE",
        help="Also write a node-feature-discovery feature file (atomically) labelling "
             "this node with its caches and verified hot copies, e.g. /etc/kubernetes/"
             "node-feature-discovery/features.d/hotcache. See `hotcache kube --help`."),
    slurm_push: bool = typer.Option(
        False, "--slurm-push", help="Also set this node's Slurm features to its verified "
        "hot copies with scontrol (for clusters without the node_features/helpers plugin; "
        "see `hotcache slurm push`)."),
    interval: float = typer.Option(
        0, "--interval", metavar="SECONDS", min=0,
        help="Read the cache statistics twice, SECONDS apart, and show promotions against "
             "demotions over that interval (a cache that demotes as fast as it promotes "
             "is thrashing)."),
) -> None:
    """Compare the mapping with the host: device present, mounted, noatime, filesystem
    UUID, space used, cache statistics. Exits 5 when anything has drifted."""
    from hotcache.provision.mapping import load  # slow to import; loaded only when used

    path = state_path(state and str(state))
    _refuse_whole_host_options(name, node_labels=node_labels, slurm_push=slurm_push)
    if os.geteuid() != 0:
        if prometheus is not None or node_labels is not None or slurm_push:
            need_root("status --prometheus/--node-labels/--slurm-push",
                      "writes what root proved for the node")
        return _records_status(path, name, as_json)
    from hotcache.provision.engine.reattach import waiting as waiting_for_ssd  # slow to import; loaded only when used

    data = load(path)       # parsed once: every step below reads this one
    waiting = [w for w in waiting_for_ssd(data) if name is None or w["name"] == name]
    if name is not None and name not in data["caches"] and not waiting:
        raise _no_such_cache(name, path)
    rows = [] if waiting and name is not None else _probe(path, fstab, name, data)
    if interval:
        rows = _over_interval(rows, path, fstab, name, interval)
    drift = any(not r["ok"] for r in rows)
    _publish(rows, path, data["caches"], whole_host=name is None, prometheus=prometheus,
             node_labels=node_labels, slurm_push=slurm_push)
    if as_json:
        emit({"state": str(path), "caches": rows, "waiting_for_ssd": waiting,
              "ok": not drift}, "status")
    else:
        c = console()
        for line in _status_lines(rows, waiting, path):
            c.print(line)
    if drift:
        raise typer.Exit(ExitCode.DRIFT)


def _refuse_whole_host_options(name: Optional[str], *, node_labels: Optional[Path],
                               slurm_push: bool) -> None:
    """--node-labels and --slurm-push publish what the whole host offers: a status of one
    cache cannot write them."""
    if name is not None and node_labels is not None:
        raise UsageError(f"--node-labels describes the whole host, not only cache {name!r}",
                         hint="run `hotcache status --node-labels FILE` without a cache name")
    if name is not None and slurm_push:
        raise UsageError(f"--slurm-push describes the whole host, not only cache {name!r}",
                         hint="run `hotcache status --slurm-push` without a cache name")


def _no_such_cache(name: str, path: Path) -> UsageError:
    return UsageError(f"no cache named {name!r} in the mapping {path}",
                      hint="`hotcache status` without a name lists them all")


def _probe(path: Path, fstab: Optional[Path], name: Optional[str],
           data: dict[str, Any]) -> list[StatusRow]:
    """Each cache's row, as root proves it on the host. When the probe fails for the
    whole host, the verified-copies index goes: what jobs read must not outlive what
    root can still prove."""
    from hotcache.provision.engine.status import host_status  # slow to import; loaded only when used

    try:
        return host_status(path, fstab, Runner(), name, data)
    except (HotcacheError, OSError):
        if name is None:
            from hotcache.provision.observe.verified_index import clear  # slow to import; loaded only when used

            clear(path)
        raise


def _publish(rows: list[StatusRow], path: Path, caches: dict[str, CacheEntry], *, whole_host: bool,
             prometheus: Optional[Path], node_labels: Optional[Path], slurm_push: bool) -> None:
    """Write what root proved where others read it: the verified-copies index (a status
    of the whole host: the metrics timer), and the outputs the options name."""
    if whole_host:     # root (the metrics timer): what jobs and other accounts read
        from hotcache.provision.observe.verified_index import write as write_index  # slow to import; loaded only when used

        write_index(path, rows, caches)
    if prometheus is not None:
        from hotcache.provision.observe.metrics import write_textfile  # slow to import; loaded only when used

        write_textfile(prometheus, rows, path, caches)
        from hotcache.provision.observe.progress import sweep  # slow to import; loaded only when used

        sweep(Path(os.path.abspath(prometheus)).parent)
    if node_labels is not None:
        from hotcache.provision.observe.nodelabels import write as write_labels  # slow to import; loaded only when used

        write_labels(node_labels, rows, path, caches=caches)
    if slurm_push:
        from hotcache.provision.observe.slurm import push as push_features  # slow to import; loaded only when used

        push_features(rows, caches)


def _status_lines(rows: list[StatusRow], waiting: list[WaitingRow], path: Path) -> list[str]:
    """What status prints (console markup), a line each: the caches waiting for a new
    SSD, then each cache's verdict, its mount, space, statistics, advice and problems."""
    lines = []
    if not rows and not waiting:
        lines.append(f"no caches in {path}; `hotcache apply SPEC` builds one")
    for w in waiting:
        lines.append(f"[bold]{w['name']}[/] ({w['backend']}): [yellow]no cache[/]: "
                     f"{w['message']}")
    for r in rows:
        mark = "[green]ok[/]" if r["ok"] else "[red]DRIFT[/]"
        lines.append(f"[bold]{r['name']}[/] ({r['backend']}, mode {r['mode']}): {mark}")
        lines.append(f"  device {r['cached_device'] or '-'} mounted on {r['mountpoint']}: "
                     f"{'yes' if r['mounted'] else 'no'}, noatime: "
                     f"{'yes' if r['noatime'] else 'no'}")
        if r["size_bytes"]:
            lines.append(f"  used {size(r['used_bytes'])} of {size(r['size_bytes'])}, "
                         f"free {size(r['free_bytes'])}")
        lines += [f"  {k}: {v}" for k, v in (r.get("cache") or {}).items()]
        ws = r["working_set"]
        lines += [f"  {label}: {v['message']}"
                  for label, v in (("sizing", ws["sizing"]), ("working set", ws["activity"]))
                  if v]
        lines += [f"  [red]problem[/]: {problem}" for problem in r["problems"]]
    return lines


def _records_status(path: Path, name: Optional[str], as_json: bool) -> None:
    """`status` for an account that is not root: the records' view, never a probe."""
    from hotcache.provision.mapping import load  # slow to import; loaded only when used
    from hotcache.provision.observe.records_view import view  # slow to import; loaded only when used

    if name is not None and name not in load(path)["caches"]:
        raise _no_such_cache(name, path)
    doc = view(path, name)
    if as_json:
        return emit(doc, "status")
    c = console()
    c.print(doc["note"], soft_wrap=True)
    if not doc["caches"]:
        c.print(f"no caches in {path}")
    for r in doc["caches"]:
        c.print(f"[bold]{r['name']}[/] ({r['backend']}, mode {r['mode']}): recorded "
                f"{r['recorded_state']}")
        c.print(f"  mounted on {r['mountpoint']}: {'yes' if r['mounted'] else 'no'}, "
                f"noatime: {'yes' if r['noatime'] else 'no'}")
        if r["size_bytes"]:
            c.print(f"  free {size(r['free_bytes'])} of {size(r['size_bytes'])}")
        for cp in r["verified_copies"]:
            c.print(f"  verified hot copy {cp['name']} version {cp['version']}: {cp['path']} "
                    f"(verified {cp['verified_at']})", soft_wrap=True)
    for note in doc["index_notes"]:
        c.print(f"  [yellow]not offered[/]: {note}", soft_wrap=True)


def _over_interval(rows: list[StatusRow], path: Path, fstab: Optional[Path], name: Optional[str],
                   seconds: float) -> list[StatusRow]:
    """Read the statistics again after `seconds`; churn is judged on the difference."""
    from hotcache.provision.engine.status import host_status, working_set  # slow to import; loaded only when used
    from hotcache.provision.mapping import load  # slow to import; loaded only when used

    time.sleep(seconds)
    before = {r["name"]: r.get("cache") for r in rows}
    entries = load(path)["caches"]
    later = host_status(path, fstab, Runner(), name)
    for r in later:
        r["working_set"] = working_set(r, entries[r["name"]], before.get(r["name"]), seconds)
    return later


def teardown(
    name: str = typer.Argument(..., help="The cache to take down."),
    yes: bool = YesOpt,
    wipe: bool = typer.Option(False, "--wipe", help="Also erase signatures on its devices "
                              "(each found by its recorded identity, never by kernel name)."),
    forget: bool = typer.Option(False, "--forget", help="Only remove the entry (and its fstab "
                                "line and boot unit) of a cache that is not live because its "
                                "devices are gone for good; says what is lost first. Touches "
                                "no device."),
    remove_images: bool = typer.Option(False, "--remove-images",
                                       help="Delete the image files of a loop-backed cache "
                                            "(and the data on them) once detached."),
    cache_failed: bool = typer.Option(False, "--cache-failed",
                                      help="The SSD failed (`hotcache status` says so): take "
                                           "the cache apart without flushing it, leaving the "
                                           "origin with its filesystem."),
    accept_loss: Optional[str] = typer.Option(None, "--accept-loss", metavar="SIZE|all",
                                              help="With --cache-failed: accept losing up "
                                                   "to SIZE of writes that were on the failed "
                                                   "SSD only (status names the amount)."),
    dry_run: bool = DryRunOpt, as_json: bool = JsonOpt, state: Optional[Path] = StateOpt,
    fstab: Optional[Path] = FstabOpt,
) -> None:
    """Unmount, flush dirty cache data, dismantle the cache, remove the boot entry, detach
    loop devices and forget it in the mapping. The data stays on the origin device.

    A cache that is not live (after a boot, before `hotcache restore NAME`) is refused:
    restore it, then tear it down. Nothing is reported done unless the flush completed.

    When the SSD failed (`hotcache status` reports CACHE_FAILED), --cache-failed takes the
    cache apart without it; writes that were on the SSD only are lost, and it asks for
    --accept-loss naming at least that much.

    A loop-backed cache's image files are kept (the plan says so) and stay known as
    hotcache's, so applying the same spec again mounts them again; --remove-images
    deletes them."""
    from hotcache.provision.engine.teardown import plan_teardown  # slow to import; loaded only when used

    need_root("teardown")
    env = make_env(state, fstab, dry_run=dry_run)
    with holding_state(env, f"teardown {name}"):
        result = plan_teardown(name, env, wipe=wipe, forget=forget, remove_images=remove_images,
                               cache_failed=cache_failed, accept_loss=accept_loss)
        if dry_run:
            return dry_run_report(result, "teardown", as_json)
        if not as_json:
            show_plan(result, "teardown")
        what = f"forget {name}" if forget else f"take {name} down"
        confirm(f"{what} ({len(result.steps)} steps)", yes)
        run_steps(result, env, quiet=as_json)
    refresh_index(state, fstab)
    if as_json:
        return emit({"changed": True, **result.to_json()}, "teardown")
    console().print(f"[green]done[/]: {name} is " + ("forgotten" if forget else "down"))


def schema() -> None:
    """Print the JSON Schema of the host spec (for editors and CI validation)."""
    from hotcache.provision.engine.spec import json_schema  # slow to import; loaded only when used

    emit(json_schema(), None)


def register(app: typer.Typer) -> None:
    for command in (devices, plan, apply, status, teardown, schema):
        app.command()(command)
