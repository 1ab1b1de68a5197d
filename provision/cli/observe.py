"""CLI commands for observability: `doctor` and `metrics-timer` (the metrics themselves
are `hotcache status --prometheus FILE`). Registered on the app by cli/app.py; only
typer is imported here, the work is imported inside each command."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

from hotcache.provision.cli.common import (DryRunOpt, FstabOpt, JsonOpt, StateOpt,
                                           UnitDirOpt, console, emit, need_root)
from hotcache.provision.errors import ExitCode
from hotcache.provision.system.runner import Runner
from hotcache.provision.system.statepath import state_path


def doctor(
    as_json: bool = JsonOpt, state: Optional[Path] = StateOpt,
    fstab: Optional[Path] = FstabOpt, unit_dir: Optional[Path] = UnitDirOpt,
    system_fstab: Path = typer.Option(
        Path("/etc/fstab"), "--system-fstab", envvar="HOTCACHE_SYSTEM_FSTAB",
        help="The boot fstab, searched for other mounts of hotcache filesystems."),
    min_free: float = typer.Option(10.0, "--min-free-percent", min=0, max=100,
                                   help="Below this share of free space a cache is a problem."),
    max_age: float = typer.Option(7.0, "--max-verify-age-days", min=0,
                                  help="Warn about hot copies verified longer ago."),
) -> None:
    """Look the host over and say how to fix each thing found: kernel support for each
    backend, required programs, `nofail` on every boot mount of a cache, boot-time
    restore of bcache tunables and dm-cache tables, drift between the mapping and the
    devices, free space and verification of hot copies. Exits 9 when it finds a
    problem (warnings alone exit 0)."""
    # start-up: doctor's probes, the metrics and fstab's writer, for this command only
    from hotcache.provision.observe.doctor import PROBLEM, WARNING, Options, report, run
    from hotcache.provision.observe.metrics import DEFAULT_UNIT_DIR
    from hotcache.provision.system.fstab import fstab_path

    need_root("doctor", "probes block devices (their signatures, the caches' health)",
              hint="sudo hotcache doctor; without root, `hotcache status` shows what the "
                   "records say")
    opts = Options(state_path(state and str(state)),
                   fstab_path(str(fstab)) if fstab else None, system_fstab,
                   Path(unit_dir or DEFAULT_UNIT_DIR), min_free, max_age)
    doc = report(run(opts))
    if as_json:
        emit(doc, "doctor")
    else:
        c = console()
        for f in doc["findings"]:
            if f["severity"] == "ok":
                c.print(f"[green]ok[/]      {f['check']}: {f['message']}", soft_wrap=True)
        for severity, colour in ((WARNING, "yellow"), (PROBLEM, "red")):
            for f in (f for f in doc["findings"] if f["severity"] == severity):
                c.print(f"[{colour}]{severity:<7}[/] {f['check']}: {f['message']}",
                        soft_wrap=True)
                c.print(f"        fix: {f['fix']}", soft_wrap=True)
        c.print(f"{doc['problems']} problem(s), {doc['warnings']} warning(s)")
    if not doc["ok"]:
        raise typer.Exit(ExitCode.UNHEALTHY)


def metrics_timer(
    textfile: Path = typer.Option(None, "--textfile", metavar="FILE",
                                  help="Metrics file [default: /var/lib/prometheus/"
                                       "node-exporter/hotcache.prom]."),
    node_labels: Optional[Path] = typer.Option(
        None, "--node-labels", metavar="FILE",
        help="Also refresh this node-feature-discovery feature file, e.g. /etc/kubernetes/"
             "node-feature-discovery/features.d/hotcache (node labels for Kubernetes)."),
    slurm_push: bool = typer.Option(
        False, "--slurm-push", help="Each run also sets this node's Slurm features to its "
        "verified hot copies (`hotcache status --slurm-push`)."),
    interval: str = typer.Option("1min", "--interval",
                                 help="How often to refresh (systemd time span)."),
    unit_dir: Optional[Path] = UnitDirOpt,
    remove: bool = typer.Option(False, "--remove", help="Remove the units instead."),
    dry_run: bool = DryRunOpt,
    check: bool = typer.Option(False, "--check", hidden=True, help="Old name of --dry-run."),
    as_json: bool = JsonOpt, state: Optional[Path] = StateOpt,
    fstab: Optional[Path] = FstabOpt,
) -> None:
    """Install a systemd service and timer that run `hotcache status --prometheus FILE`
    every --interval, for node_exporter's textfile collector
    (--collector.textfile.directory), and with --node-labels the node labels that
    Kubernetes schedules on. The current --state and --fstab go into the service. Idempotent; --json reports {"changed": ...}."""
    check = check or dry_run
    # start-up: the metrics (prometheus_client, the mapping's pydantic models), for this command only
    from hotcache.provision.observe.metrics import DEFAULT_TEXTFILE, DEFAULT_UNIT_DIR, install_timer, timer_units

    if not check:
        need_root("metrics-timer")
    units = None
    if not remove:
        # The hotcache next to this interpreter: the venv the role installed (imported
        # here, as the metrics above, to keep the engine out of start-up).
        from hotcache.provision.engine.bootunit import hotcache_program

        env = {k: str(Path(v).absolute()) for k, v in
               (("HOTCACHE_STATE", state), ("HOTCACHE_FSTAB", fstab)) if v}
        units = timer_units(hotcache_program(),   # root-only, or refused with the fix
                            str(Path(textfile or DEFAULT_TEXTFILE).absolute()),
                            interval, env,
                            str(node_labels.absolute()) if node_labels else None,
                            slurm_push=slurm_push)
    doc = install_timer(Path(unit_dir or DEFAULT_UNIT_DIR), units, Runner(), check=check)
    if as_json:
        return emit(doc, "metrics-timer")
    verb = "would change" if check else "changed"
    msg = f"{verb}: {', '.join(doc['files'])}" if doc["changed"] else "no changes"
    sys.stdout.write(msg + "\n" + "".join(f"note: {n}\n" for n in doc["notes"]))


def register(app: typer.Typer) -> None:
    app.command()(doctor)
    app.command("metrics-timer")(metrics_timer)
