"""The compilation's progress as llama_job_wait shows it (plugins/action/llama_job_wait.py), from the output of
the build tools CMake drives. The action itself runs in the mixed scenario, whose upgrade compiles on two releases."""

import importlib
import pytest
from conftest import ROOT, load

build_wait = importlib.import_module("ansible_collections.llamacpp.rpc_cluster.plugins.action.llama_job_wait")

MAKE = """[ 12%] Building CXX object ggml/src/CMakeFiles/ggml-base.dir/ggml.cpp.o
[ 13%] Building C object ggml/src/CMakeFiles/ggml-base.dir/ggml-alloc.c.o
In file included from /src/ggml.c:1:
/src/ggml.c:10: warning: unused variable [-Wunused-variable]
[ 45%] Linking CXX shared library ../bin/libllama.so
"""
NINJA = """[1/271] Building C object ggml/src/CMakeFiles/ggml-base.dir/ggml.c.o
[2/271] Building CXX object ggml/src/CMakeFiles/ggml-base.dir/ggml.cpp.o
[123/271] Linking CXX shared library bin/libllama.so
"""


@pytest.mark.parametrize("text, shown", [(MAKE, "45%"), (NINJA, "123 of 271 steps"), ("-- Configuring done\n", None),
                                         ("", None), (MAKE[-30:], None), ("[ 99%] Built target llama-server\n", "99%")])
def test_the_last_progress_mark_is_shown(text, shown):
    assert build_wait.progress(text) == shown


def test_a_tail_cut_in_the_middle_of_a_line_still_finds_the_last_whole_mark():
    assert build_wait.progress(MAKE[MAKE.index("3%]"):]) == "45%"


@pytest.mark.parametrize("seconds, text", [(0, "0 s"), (59.9, "59 s"), (60, "1 min 00 s"), (200, "3 min 20 s")])
def test_elapsed_time(seconds, text):
    assert build_wait.minutes(seconds) == text


def test_the_project_s_own_progress_line_is_shown_whole():
    """A job of the project's (the pre-fill, a load) writes `progress: ...` lines; read over a terminal, they end in
    \r\n, which must not reach the play's line."""
    text = "progress: written 10.0 MiB of 202.5 MiB (4 %), 12 MB/s\r\nprogress: written 20.0 MiB of 202.5 MiB\r\n"
    assert build_wait.progress(text) == "written 20.0 MiB of 202.5 MiB"
    assert build_wait.progress("progress: half a li") is None


def test_the_shown_progress_never_goes_back():
    """make's percentages as a compilation of several targets printed them (98 %, then 90 % of the next target):
    what the play shows only goes forward; the project's own marks are shown as they come."""
    best, shown = None, []
    for mark in ["configured, starting", "12%", "98%", "90%", "100%", "96%", "123 of 271 steps", "written 5 MiB"]:
        mark, best = build_wait.forward(mark, best)
        if mark is not None:
            shown.append(mark)
    assert shown == ["configured, starting", "12%", "98%", "100%", "written 5 MiB"]
