"""``scripts/llama_cmake_args.py``: the llama.cpp build flags follow the processor, never AMX."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "llama_cmake_args.py"
_spec = importlib.util.spec_from_file_location("llama_cmake_args", SCRIPT)
assert _spec is not None and _spec.loader is not None
flags_mod = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(flags_mod)

EPYC = ("fpu sse4_2 avx f16c avx2 bmi2 fma avx512f avx512dq avx512cd avx512bw avx512vl avx512_bf16 "
        "avx512vbmi avx512_vnni")
SAPPHIRE_RAPIDS = EPYC + " avx512_fp16 amx_bf16 amx_tile amx_int8 avx_vnni"
OLD_X86 = "fpu sse sse2 ssse3 sse4_1 sse4_2 popcnt"


def _args(flags: str) -> dict[str, str]:
    text = flags_mod.cmake_args(flags_mod.cpu_flags(f"processor\t: 0\nflags\t\t: {flags}\n"))
    return dict(a.removeprefix("-D").split("=") for a in text.split())


def test_an_avx512_processor_gets_avx512_and_vnni() -> None:
    a = _args(EPYC)
    assert a["GGML_NATIVE"] == "OFF"
    assert {a[k] for k in ("GGML_AVX2", "GGML_FMA", "GGML_AVX512", "GGML_AVX512_VNNI", "GGML_AVX512_BF16",
                           "GGML_AVX512_VBMI")} == {"ON"}
    assert a["GGML_AVX_VNNI"] == "OFF"


def test_amx_stays_off_where_the_processor_has_it() -> None:
    a = _args(SAPPHIRE_RAPIDS)
    assert a["GGML_AVX512"] == "ON" and a["GGML_AVX_VNNI"] == "ON"
    assert a["GGML_AMX_TILE"] == a["GGML_AMX_INT8"] == a["GGML_AMX_BF16"] == "OFF"


def test_a_processor_without_avx2_gets_a_build_without_it() -> None:
    a = _args(OLD_X86)
    assert {v for k, v in a.items() if k != "GGML_NATIVE"} == {"OFF"}


def test_unknown_or_other_processors_get_the_portable_build() -> None:
    assert flags_mod.cmake_args(None) == "-DGGML_NATIVE=OFF"
    assert flags_mod.cmake_args({"avx2"}, "aarch64") == "-DGGML_NATIVE=OFF"
    assert flags_mod.cpu_flags("no flags line here") == set()


def test_the_script_prints_one_line_of_cmake_args() -> None:
    out = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, check=True, timeout=30).stdout
    assert out.count("\n") == 1 and out.startswith("-DGGML_NATIVE=OFF")
