"""Build a board's bitstream with Vivado and install it where the runtime finds it.

:func:`build_bitstream` (``tessera hw bitstream``) writes the ready-to-run Vivado
project of :func:`tessera.bitstreams.flow.write_project` into a work folder, runs Vivado in
batch mode on it when Vivado is on the PATH (a progress bar follows the flow's
stages: synthesis, implementation, write_bitstream), checks the result (exit status,
timing met) and installs it as ``<root>/<board>/<config-id>/``: ``tessera.bit``,
``tessera.hwh``, the reports, the Vivado log and ``manifest.json``
(:mod:`tessera.bitstreams` says where roots are and finds them again).

Without Vivado nothing fails: the project folder is left complete with one message
saying how to run it (on a machine with Vivado) and install the result with
:func:`install_build` (``tessera hw bitstream --install DIR``).
"""
from __future__ import annotations

import json
import os
import queue
import re
import shutil
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from tessera.boards import Board, get_board
from tessera.config import PRESETS, HwConfig, get_config
from tessera.errors import HardwareToolError
from tessera.hwh import IP_VLNV
from tessera.regmap import config_id
from tessera.progress import Progress
from tessera.bitstreams import (BIT_NAME, HWH_NAME, MANIFEST_FORMAT, MANIFEST_NAME,
                                check_bitstream_dir, config_key, install_root, sha256_file)
from tessera.bitstreams.plan import EXPECTED_HWH_NAME, OUT_DIR, REPORTS_DIR
from tessera.bitstreams.reports import parse_timing_summary, parse_utilization, parse_vivado_version

__all__ = ["CONFIG_NAME", "LOG_NAME", "STAGES", "BuildResult", "build_bitstream", "install_build"]

#: The stages of the Vivado flow the progress bar advances on.
STAGES = ("synthesis", "implementation", "write_bitstream")
#: The Vivado log, in the project folder (Vivado's own default name there).
LOG_NAME = "vivado.log"
#: A config that is not a preset is saved in the project folder under this name.
CONFIG_NAME = "tessera_config.json"

# What starts each stage in the log, in a non-project flow (``Command: synth_design``)
# and in a project flow (``launch_runs synth_1``). ``launch_runs impl_1 -to_step
# write_bitstream`` starts implementation, hence the anchors on write_bitstream.
_STAGE_PATTERNS = (
    (0, re.compile(r"\bsynth_design\b|\blaunch_runs\s+\S*synth")),
    (1, re.compile(r"\b(opt_design|place_design|phys_opt_design|route_design)\b"
                   r"|\blaunch_runs\s+\S*impl")),
    (2, re.compile(r"^\s*(Command:\s*)?write_bitstream\b|Starting write_bitstream"
                   r"|Writing bitstream")),
)
_SESSION_START_RE = re.compile(r"Start of session at:\s*(.+?)\s*$", re.MULTILINE)
_SESSION_END_RE = re.compile(r"Exiting Vivado at\s*(.+?)\.{0,3}\s*$", re.MULTILINE)
#: Lines of the log quoted in an error.
_ERROR_LINES = 3
#: Seconds between two looks at the run logs while Vivado prints nothing.
_POLL_SECONDS = 1.0

ProgressCallback = Callable[[str, int, int], None]


@dataclass(frozen=True)
class BuildResult:
    """What :func:`build_bitstream` or :func:`install_build` did.

    ``project_dir`` is the Vivado project folder (``project`` the
    :class:`~tessera.bitstreams.plan.VivadoProject` when this call wrote it);
    ``installed`` the installed bitstream folder, or ``None`` when Vivado was not
    available; ``manifest`` what ``manifest.json`` holds; ``message`` the one line to
    show the user.
    """

    project_dir: Path
    installed: Path | None
    manifest: dict[str, Any] | None
    message: str
    project: Any = None
    notes: tuple[str, ...] = field(default=())

    @property
    def built(self) -> bool:
        """Whether a bitstream was installed."""
        return self.installed is not None

    @property
    def bitstream(self) -> Path | None:
        """The installed ``.bit`` (its ``.hwh`` beside it), or ``None``."""
        return self.installed / BIT_NAME if self.installed is not None else None


# ------------------------------------------------------------------ building
def build_bitstream(board: str | Board, config: str | Path | HwConfig, *,
                    output: str | Path | None = None, vivado: str | Path | None = None,
                    progress: Progress | ProgressCallback | bool | None = None,
                    install_root: str | Path | None = None) -> BuildResult:
    """Write the Vivado project for ``config`` on ``board`` into ``output`` (default
    ``./tessera-<board>-<config-id>``), run Vivado on it and install the bitstream under
    ``install_root`` (default :func:`tessera.bitstreams.install_root`).

    ``vivado`` is the Vivado executable (default: ``vivado`` on the PATH). Without one
    nothing is raised: the result has ``installed=None`` and a message saying how to
    run the project elsewhere and install it with :func:`install_build`.

    ``progress``: ``None`` draws a :class:`~tessera.progress.Progress` bar on stderr
    (on a terminal, see ``TESSERA_PROGRESS``), ``False`` none, a ``Progress`` is
    advanced, a callable is called as ``progress(stage, done, total)``.

    Raises :class:`ConfigError` when the config does not fit the board and
    :class:`HardwareToolError` when Vivado fails, writes no bitstream or misses timing
    (naming the log and its last errors; the project folder is kept).
    """
    from .flow import write_project  # needs Amaranth (the Verilog), so only here

    board = get_board(board)
    config = get_config(config)
    board.check(config)
    exe = _find_vivado(vivado)
    directory = Path(output).absolute() if output is not None else \
        Path.cwd() / f"tessera-{board.name}-{config_key(config)}"
    project = write_project(board.name, config, directory)
    directory = Path(project.directory)
    root = Path(install_root) if install_root is not None else _default_root()
    if exe is None:
        if PRESETS.get(config.name) == config:
            config_arg = config.name
        else:
            # not a preset: keep the config with the project, for the --install to come
            config_arg = str(directory / CONFIG_NAME)
            config.save(config_arg)
        message = (f"Vivado is not on the PATH: the ready-to-run project is in {directory}; "
                   f"run `vivado -mode batch -source {Path(project.tcl).name}` there, then "
                   f"`tessera hw bitstream --board {board.name} --config {config_arg} "
                   f"--install {directory}` to install the bitstream into "
                   f"{root / board.name / config_key(config)}")
        return BuildResult(directory, None, None, message, project)
    started = _now()
    log = _run_vivado(exe, project, progress)
    finished = _now()
    return _install(directory, Path(project.bitstream), Path(project.hwh),
                    Path(project.reports), log, board, config, root, started, finished,
                    project)


def install_build(project_dir: str | Path, board: str | Board,
                  config: str | Path | HwConfig,
                  install_root: str | Path | None = None) -> BuildResult:
    """Install the bitstream of a project folder :func:`build_bitstream` wrote and Vivado
    ran elsewhere (``vivado -mode batch -source build.tcl`` in it): the same checks and
    installed folder as a build here, the times taken from the Vivado log."""
    board = get_board(board)
    config = get_config(config)
    board.check(config)
    directory = Path(project_dir)
    if not directory.is_dir():
        raise HardwareToolError(f"--install {directory}: no such folder; give the project "
                                "folder tessera hw bitstream wrote (the one with build.tcl)")
    paths = _project_paths(directory)
    log = directory / LOG_NAME
    text = _read(log)
    started = _log_time(_SESSION_START_RE, text)
    finished = _log_time(_SESSION_END_RE, text)
    if finished is None and paths["bitstream"].is_file():
        finished = datetime.fromtimestamp(paths["bitstream"].stat().st_mtime,
                                          timezone.utc).isoformat(timespec="seconds")
    root = Path(install_root) if install_root is not None else _default_root()
    return _install(directory, paths["bitstream"], paths["hwh"], paths["reports"], log,
                    board, config, root, started, finished, None)


def _default_root() -> Path:
    return install_root()


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _find_vivado(vivado: str | Path | None) -> str | None:
    """The Vivado executable: ``vivado`` when given (an error if it is not one), else
    ``vivado`` on the PATH, else ``None``."""
    if vivado is None:
        return shutil.which("vivado")
    found = shutil.which(str(vivado))
    if found is None:
        raise HardwareToolError(f"Vivado executable {vivado} not found or not executable: give "
                                "the path of bin/vivado in a Vivado installation (or leave "
                                "--vivado out to use the one on the PATH)")
    return found


def _project_paths(directory: Path) -> dict[str, Path]:
    """Where a project folder keeps what Vivado writes: the layout of
    :class:`tessera.bitstreams.plan.VivadoProject` (``write_project`` would write the folder
    again, so the paths are taken from its layout; a test checks they agree)."""
    out = directory / OUT_DIR
    return {"bitstream": out / BIT_NAME, "hwh": out / HWH_NAME,
            "reports": directory / REPORTS_DIR, "expected_hwh": directory / EXPECTED_HWH_NAME}


# ------------------------------------------------------------------ running
def _run_vivado(exe: str, project: Any, progress: Progress | ProgressCallback | bool | None
                ) -> Path:
    """Run Vivado in batch mode in the project folder, following its output for the
    stages; the log path, or :class:`HardwareToolError` on a non-zero exit."""
    directory = Path(project.directory)
    log = directory / LOG_NAME
    command = [exe, "-mode", "batch", "-source", Path(project.tcl).name,
               "-log", LOG_NAME, "-journal", "vivado.jou"]
    report = _stage_reporter(progress)
    try:
        proc = subprocess.Popen(command, cwd=directory, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, errors="replace",
                                bufsize=1)
    except OSError as exc:
        report.close()
        raise HardwareToolError(f"cannot start Vivado ({exe}): {exc.strerror or exc}") from None
    transcript: list[str] = []
    follower = _StageFollower(directory, report)
    # A thread reads Vivado's output so this one can also watch the run logs while
    # Vivado prints nothing (a project flow's wait_on_run is silent for many minutes),
    # and so the progress bar is only touched from this thread.
    lines: queue.Queue[str | None] = queue.Queue()
    reader = threading.Thread(target=_pump, args=(proc.stdout, lines), daemon=True)
    reader.start()
    try:
        while True:
            try:
                line = lines.get(timeout=_POLL_SECONDS)
            except queue.Empty:
                follower.poll()
                continue
            if line is None:
                break
            transcript.append(line)
            follower.line(line)
        code = proc.wait()
        follower.poll()
    except BaseException:
        # Ctrl-C or a failing callback: do not leave Vivado running on its own
        proc.kill()
        proc.wait()
        report.close()
        raise
    finally:
        reader.join(timeout=5)
    if not log.is_file():
        # A wrapper that ignored -log: keep what it printed as the log
        log.write_text("".join(transcript))
    if code != 0:
        report.close()
        raise HardwareToolError(
            f"Vivado failed (exit status {code}) in {directory}: see {log}; last errors: "
            f"{_last_errors(transcript)}. Fix the cause and run the build again (the project "
            "folder is kept, and opens in the Vivado GUI too)")
    report(STAGES[-1], len(STAGES))
    report.close()
    return log


def _pump(stream: Any, lines: queue.Queue[str | None]) -> None:
    """Copy ``stream``'s lines into ``lines``, then ``None``."""
    try:
        for line in stream:
            lines.put(line)
    finally:
        lines.put(None)


class _StageFollower:
    """Tells the stage of the flow from Vivado's output and from the run logs a project
    flow writes (``<project>/<name>.runs/<run>/runme.log``: ``launch_runs`` runs
    synthesis and implementation in child processes whose commands appear only there)."""

    def __init__(self, directory: Path, report: _StageReporter) -> None:
        self.directory = directory
        self.report = report
        self.stage = -1
        self.offsets: dict[Path, int] = {}
        # run logs of an earlier build in the same folder are not this build's progress
        self.since = time.time()

    def line(self, line: str) -> None:
        for index, pattern in _STAGE_PATTERNS:
            # stages only move forward: a later line naming an earlier command (a report,
            # a summary) must not move the bar back
            if index > self.stage and pattern.search(line):
                self.stage = index
                self.report(STAGES[index], index)

    def poll(self) -> None:
        for path in sorted(self.directory.glob("*/*.runs/*/runme.log")):
            try:
                status = path.stat()
                if status.st_mtime < self.since - 1:
                    continue
                offset = self.offsets.get(path, 0)
                if status.st_size < offset:       # the run was reset: a new log
                    offset = 0
                with open(path, "rb") as f:
                    f.seek(offset)
                    data = f.read()
            except OSError:
                continue
            # whole lines only: a partial last line is read again at the next poll
            cut = data.rfind(b"\n") + 1
            self.offsets[path] = offset + cut
            for line in data[:cut].decode(errors="replace").splitlines():
                self.line(line)


class _StageReporter:
    """Progress on the Vivado stages to a :class:`Progress` bar or a callback."""

    def __init__(self, bar: Progress | None, callback: ProgressCallback | None,
                 own: bool) -> None:
        self.bar, self.callback, self.own = bar, callback, own

    def __call__(self, stage: str, done: int) -> None:
        if self.bar is not None:
            self.bar.set(done, item=stage)
        if self.callback is not None:
            self.callback(stage, done, len(STAGES))

    def close(self) -> None:
        if self.bar is not None and self.own:
            self.bar.close()


def _stage_reporter(progress: Progress | ProgressCallback | bool | None) -> _StageReporter:
    if progress is None or progress is True:
        return _StageReporter(Progress(len(STAGES), "vivado", unit="stages",
                                       enabled=None if progress is None else True), None, True)
    if progress is False:
        return _StageReporter(None, None, False)
    if isinstance(progress, Progress):
        return _StageReporter(progress, None, False)
    return _StageReporter(None, progress, False)


def _last_errors(lines: Iterable[str]) -> str:
    """The last ``ERROR:`` lines of a log, else its last non-empty lines, on one line."""
    errors: deque[str] = deque(maxlen=_ERROR_LINES)
    tail: deque[str] = deque(maxlen=_ERROR_LINES)
    for line in lines:
        line = line.strip()
        if not line:
            continue
        tail.append(line)
        if line.startswith("ERROR:"):
            errors.append(line)
    chosen = errors or tail
    return " | ".join(chosen) if chosen else "(the log is empty)"


# ------------------------------------------------------------------ installing
def _install(directory: Path, bit: Path, hwh: Path, reports: Path, log: Path, board: Board,
             config: HwConfig, root: Path, started: str | None, finished: str | None,
             project: Any) -> BuildResult:
    """Check the results of a Vivado run and install them as ``root/board/config-id``."""
    log_text = _read(log)
    if not bit.is_file() and not log.is_file():
        raise HardwareToolError(
            f"no bitstream at {bit} and no {LOG_NAME}: Vivado has not run in {directory}; run "
            "`vivado -mode batch -source build.tcl` there first, then install")
    if not bit.is_file():
        raise HardwareToolError(
            f"Vivado wrote no bitstream at {bit}: see {log}; last errors: "
            f"{_last_errors(log_text.splitlines())}. Run `vivado -mode batch -source build.tcl` "
            f"in {directory} to completion first")
    if not hwh.is_file():
        raise HardwareToolError(f"Vivado wrote {bit} but no hardware handoff {hwh} beside it: "
                                "pynq needs it; see the log and the project's build.tcl")
    expected = _project_paths(directory)["expected_hwh"]
    if expected.is_file():
        _check_hwh(expected, config)     # the project was written for this config
    notes = _check_hwh(hwh, config)
    timing_report = _pick_report(reports, ("timing",), directory)
    if timing_report is None:
        raise HardwareToolError(f"no timing report in {reports}: cannot tell whether the design "
                                f"meets timing at {config.clock_mhz:g} MHz, so it is not "
                                f"installed; see {log}")
    timing = parse_timing_summary(_read(timing_report))
    if not timing["met"]:
        raise HardwareToolError(
            f"the design misses timing at {config.clock_mhz:g} MHz (WNS {timing['wns_ns']} ns, "
            f"TNS {timing['tns_ns']} ns, WHS {timing['whs_ns']} ns): see {timing_report} and "
            f"{log}; lower clock_mhz in the config (a bitstream that misses timing computes "
            "wrong results), so it is not installed")
    util_report = _pick_report(reports, ("util",), directory)
    resources = parse_utilization(_read(util_report)) if util_report is not None else {}
    if not resources:
        notes.append(f"no resource summary: no utilisation report found in {reports}")
    key = config_key(config)
    manifest: dict[str, Any] = {
        "format": MANIFEST_FORMAT,
        "config_name": config.name,
        "config_id": key,
        "config": config.to_dict(),
        "board": board.name,
        "board_part": board.board_part,
        "part": board.part,
        # the accelerator's clock; PL clock 0 is the closest the PS's divisors give,
        # and when that is too far off the flow adds a Clocking Wizard that makes the
        # exact frequency from it (the zcu104 preset's 200 MHz)
        "clock_mhz": config.clock_mhz,
        "pl_clock_mhz": board.pl_clock(config.clock_mhz).mhz,
        "clock_wizard": board.needs_clock_wizard(config.clock_mhz),
        "vivado_version": parse_vivado_version(log_text),
        "started": started,
        "finished": finished,
        "sha256": {BIT_NAME: sha256_file(bit), HWH_NAME: sha256_file(hwh)},
        "resources": resources,
        "timing": timing,
        "tessera_version": _tessera_version(),
    }
    dest = root / board.name / key
    _place(dest, bit, hwh, reports, log, manifest)
    check_bitstream_dir(dest, config, board.name)   # what the runtime will check
    message = f"installed the bitstream of config {config.name!r} for {board.name} in {dest}"
    if notes:
        message += " (" + "; ".join(notes) + ")"
    return BuildResult(directory, dest, manifest, message, project, tuple(notes))


def _place(dest: Path, bit: Path, hwh: Path, reports: Path, log: Path,
           manifest: dict[str, Any]) -> None:
    """Write the installed folder next to ``dest`` and rename it into place, so a reader
    never sees half a folder and a failed copy leaves the old one."""
    parent = dest.parent
    staging = parent / f".{dest.name}.partial-{os.getpid()}"
    try:
        parent.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir()
        shutil.copyfile(bit, staging / BIT_NAME)
        shutil.copyfile(hwh, staging / HWH_NAME)
        out_reports = staging / "reports"
        if reports.is_dir():
            shutil.copytree(reports, out_reports)
        else:
            out_reports.mkdir()
        if log.is_file():
            shutil.copyfile(log, out_reports / LOG_NAME)
        manifest["reports"] = sorted(p.relative_to(staging).as_posix()
                                     for p in out_reports.rglob("*") if p.is_file())
        (staging / MANIFEST_NAME).write_text(json.dumps(manifest, indent=2) + "\n")
        old = parent / f".{dest.name}.old-{os.getpid()}"
        if dest.exists():
            dest.rename(old)
        staging.rename(dest)
        shutil.rmtree(old, ignore_errors=True)
    except OSError as exc:
        shutil.rmtree(staging, ignore_errors=True)
        raise HardwareToolError(f"cannot install the bitstream into {dest}: {exc}; set "
                                "TESSERA_BITSTREAMS to a folder you can write") from None


def _check_hwh(hwh: Path, config: HwConfig) -> list[str]:
    """Refuse a ``.hwh`` whose CONFIG_ID parameter names another config (the expected
    ``.hwh`` of :mod:`tessera.hwh` has one; Vivado's need not); notes on what cannot be
    checked."""
    text = _read(hwh)
    m = re.search(r'NAME="CONFIG_ID"\s+VALUE="(0x[0-9a-fA-F]+)"', text)
    if m and int(m.group(1), 16) != config_id(config):
        raise HardwareToolError(f"{hwh} describes an accelerator of config id {m.group(1)}, not "
                                f"{config.name!r} ({config_id(config):#010x}): the "
                                "project was written for another config; install it with that "
                                "config, or write and build this one")
    notes = []
    if text and IP_VLNV not in text:
        notes.append(f"{hwh.name} does not name the IP {IP_VLNV}: open it with "
                     "PynqDevice(ip_name=...)")
    return notes


def _pick_report(reports: Path, words: tuple[str, ...], directory: Path) -> Path | None:
    """The report whose name has one of ``words``, preferring the post-route one."""
    found = [p for folder in (reports, directory) if folder.is_dir()
             for p in sorted(folder.glob("*.rpt")) + sorted(folder.glob("*.txt"))
             if any(w in p.name.lower() for w in words)]
    if not found:
        return None

    def rank(p: Path) -> int:
        name = p.name.lower()
        if "hier" in name:          # per-instance tables, not the design summary
            return 10
        for i, stage in enumerate(("route", "impl", "place", "opt")):
            if stage in name:
                return i
        return 9 if "synth" in name else 5
    return min(found, key=rank)


def _read(path: Path | None) -> str:
    if path is None:
        return ""
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def _log_time(pattern: re.Pattern[str], text: str) -> str | None:
    """A Vivado log's ``Tue Nov 21 10:00:00 2023`` as ISO 8601 (local time, as logged)."""
    matches = pattern.findall(text)
    if not matches:
        return None
    try:
        return datetime.strptime(matches[-1].strip(), "%a %b %d %H:%M:%S %Y").isoformat()
    except ValueError:
        return matches[-1].strip()


def _tessera_version() -> str:
    from tessera import __version__
    return __version__
