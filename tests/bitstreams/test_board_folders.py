"""The per-board folders of ``bitstreams/``: the checked-in ``build.tcl`` is the generator's
output for the board's preset, and the README names the facts it documents."""
from __future__ import annotations

import pytest

from tessera.bitstreams import config_key
from tessera.bitstreams.flow import FLOWS_DIR, checked_in_tcl, flow_tcl, regenerate
from tessera.boards import BOARDS
from tessera.config import PRESETS

REGENERATE = "python -m tessera.bitstreams.flow --regenerate"


@pytest.mark.parametrize("name", sorted(BOARDS))
def test_checked_in_tcl_is_the_generators_output(name, tmp_path):
    written = {path.parent.name: path for path in regenerate(tmp_path)}
    assert sorted(written) == sorted(BOARDS)
    path = checked_in_tcl(name)
    assert path == FLOWS_DIR / name / "build.tcl" and path.is_file(), \
        f"{path} is missing: write it with `{REGENERATE}`"
    assert path.read_bytes() == written[name].read_bytes(), \
        f"{path} is not what tessera.bitstreams.flow writes: rewrite it with `{REGENERATE}`"
    assert written[name].read_text() == flow_tcl(name, BOARDS[name].preset)


@pytest.mark.parametrize("name", sorted(BOARDS))
def test_board_readme(name):
    board = BOARDS[name]
    readme = (FLOWS_DIR / name / "README.md").read_text()
    preset = board.preset
    for fact in (f"tessera hw bitstream --board {name}", board.part, board.board_part,
                 board.ps.module, f"`{preset}`", config_key(PRESETS[preset]), REGENERATE,
                 f"{PRESETS[preset].clock_mhz:g} MHz"):
        assert fact in readme, f"{name}/README.md does not mention {fact!r}"
    # The flow reaches the PL only through the PS: no constraints file to ship.
    assert not list((FLOWS_DIR / name).glob("*.xdc"))
