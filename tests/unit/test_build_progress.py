"""The compilation's progress as llama_build_wait shows it (action_plugins/llama_build_wait.py), from the output of
the build tools CMake drives. The action itself runs in the mixed scenario, whose upgrade compiles on two releases."""

import pytest
from conftest import ROOT, load

build_wait = load("llama_build_wait", ROOT / "action_plugins" / "llama_build_wait.py")

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
