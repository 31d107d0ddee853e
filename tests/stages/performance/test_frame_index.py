"""Where a frame is in the target's code: one site per call instruction, found once."""

from __future__ import annotations

import sys
from pathlib import Path

from traingate.stages.performance.probe.frame_index import FrameIndex, Site


def _site_of_caller(index: FrameIndex) -> Site:
    return index.site(sys._getframe(1))  # while the caller's call is under way, as an operator's


def _two_call_sites(index: FrameIndex) -> list[Site]:
    sites = []
    for _ in range(2):
        sites.append(_site_of_caller(index))  # marker: first site
    sites.append(_site_of_caller(index))  # marker: second site
    return sites


def _line(marker: str) -> int:
    return next(number for number, text in enumerate(Path(__file__).read_text().splitlines(), 1) if text.endswith(f"# marker: {marker}"))


def test_a_call_site_is_named_once_and_each_call_site_by_its_own_line() -> None:
    index = FrameIndex(Path(__file__).parent)
    first, again, second = _two_call_sites(index)
    assert first == ("test_frame_index.py", _line("first site"), "_two_call_sites")
    assert again is first  # the same call instruction: the site found the first time
    assert second == ("test_frame_index.py", _line("second site"), "_two_call_sites")
